"""CancelToken (glimmer/cancellation.py): a child stops with its parent, and alone without stopping it."""

from __future__ import annotations

import pytest

from glimmer.cancellation import Cancelled, CancelToken


def test_a_child_token_is_cancelled_with_its_parent_and_alone_without_it():
    parent = CancelToken()
    child, other = parent.child(), parent.child()
    child.cancel()
    assert child.cancelled and not parent.cancelled and not other.cancelled
    with pytest.raises(Cancelled):
        child.check()
    other.check()
    parent.cancel()
    assert other.cancelled
    with pytest.raises(Cancelled):
        other.check()
