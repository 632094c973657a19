"""The tokenized corpus: a smaller corpus of the same seed is a prefix of a larger one."""

from __future__ import annotations

import numpy as np

from glimmer.checkpoint.tiny_tokenizer import write_tiny_tokenizer
from glimmer.protocol import builtin_template_source
from glimmer.train_nano.dataset import build_corpus, render_texts

TEMPLATE = builtin_template_source()


def test_the_first_conversations_of_a_corpus_are_the_corpus_of_that_count(tmp_path):
    write_tiny_tokenizer(tmp_path, render_texts(TEMPLATE, seed=3, count=12, workers=1), 600)
    tokenizer_file = tmp_path / "tokenizer.json"
    lengths = build_corpus(tokenizer_file, TEMPLATE, seed=3, count=30, max_tokens=10**6, workers=1).lengths
    # a cap that leaves some conversations out (so generator indices and corpus indices differ) and keeps the last
    cap = int(max(np.sort(lengths)[-6], lengths[-1]))
    large = build_corpus(tokenizer_file, TEMPLATE, seed=3, count=30, max_tokens=cap, workers=1)
    assert len(large) < 30 and large.sources[-1] == 29
    for count in (7, 20, 30):
        small = build_corpus(tokenizer_file, TEMPLATE, seed=3, count=count, max_tokens=cap, workers=1)
        head = large.first(count)
        assert np.array_equal(head.tokens, small.tokens) and np.array_equal(head.trainable, small.trainable)
        assert np.array_equal(head.offsets, small.offsets) and np.array_equal(head.sources, small.sources)
