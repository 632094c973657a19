"""Errors raised while turning a request's images and videos into model inputs.

All of them are `RequestError`s, so the server answers 400 with the message. A message names the item
("image 1", "video 0", counted from 0 in request order) and the problem, and where there is one, the fix.
"""

from __future__ import annotations

from glimmer.errors import RequestError


class MediaError(RequestError):
    """An image or video of a request cannot be used.

    `kind` is "image", "video" or "request" (for limits on all media together); `index` is the item's
    position among the request's items of that kind, or None.
    """

    def __init__(self, kind: str, index: int | None, problem: str, param: str | None = "messages"):
        self.kind = kind
        self.index = index
        self.problem = problem
        where = kind if index is None else f"{kind} {index}"
        super().__init__(f"{where}: {problem}", param=param)


class MediaDecodeError(MediaError):
    """The bytes are not a decodable image or video (corrupt, truncated, unsupported format or codec)."""


class MediaLimitError(MediaError):
    """An item (or all items together) exceeds a configured limit: pixels, frames or tokens."""


class PlaceholderMismatchError(RequestError):
    """The prompt's `<|patch|>` / `<|video|>` placeholders do not match the number of media items."""
