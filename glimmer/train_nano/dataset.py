"""The tokenized training corpus and its length-bucketed batches.

Conversation i of a corpus is `make_conversation(Random(seed * 10**9 + i))`, so a corpus is the same
whatever the number of worker processes. Each is rendered with the chat template (`render.py`) and its
pieces tokenized without added special tokens (the template writes the bos, P-TMPL-5). Every piece
boundary sits at a special token or before the space of ` to=`, where the tokenizer's pre-split cuts
anyway, so piecewise tokens equal whole-text tokens (a test checks it).
"""

from __future__ import annotations

import logging
import multiprocessing
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from glimmer.train_nano.corpus import Conversation, make_conversation
from glimmer.train_nano.render import RenderedConversation, check_spans, render_conversation

logger = logging.getLogger(__name__)

SPAN_CHECK_SAMPLE = 200  # conversations of each corpus whose spans are checked against prefix renders


def conversation_at(seed: int, index: int, *, held_out: bool = False, last_kind: str | None = None) -> Conversation:
    return make_conversation(random.Random(seed * 10**9 + index), held_out=held_out, last_kind=last_kind)


def rendered_at(seed: int, index: int, template: str, *, held_out: bool = False) -> RenderedConversation:
    conversation = conversation_at(seed, index, held_out=held_out)
    rendered = render_conversation(conversation, template)
    if index < SPAN_CHECK_SAMPLE:
        check_spans(conversation, rendered, template)
    return rendered


def encode_rendered(tokenizer: Tokenizer, rendered: RenderedConversation) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, trainable flags): a token is trainable when the model generates it."""
    ids: list[int] = []
    flags: list[bool] = []
    for piece, trainable in rendered.segments():
        piece_ids = tokenizer.encode(piece, add_special_tokens=False).ids
        ids.extend(piece_ids)
        flags.extend([trainable] * len(piece_ids))
    return np.asarray(ids, dtype=np.int32), np.asarray(flags, dtype=np.bool_)


@dataclass
class TokenizedCorpus:
    """Conversations laid end to end: conversation i is tokens[offsets[i]:offsets[i + 1]], generated as
    conversation sources[i] of its seed (the generator's index: too long ones are left out)."""

    tokens: np.ndarray  # int32
    trainable: np.ndarray  # bool
    offsets: np.ndarray  # int64, len = count + 1
    sources: np.ndarray | None = None  # int64, len = count (default: 0, 1, 2, …)

    def __post_init__(self) -> None:
        if self.sources is None:
            self.sources = np.arange(len(self.offsets) - 1, dtype=np.int64)

    def first(self, count: int) -> TokenizedCorpus:
        """The conversations generated as 0..count-1: the corpus build_corpus(count=count) gives."""
        kept = int(np.searchsorted(self.sources, count))
        end = self.offsets[kept]
        return TokenizedCorpus(self.tokens[:end], self.trainable[:end], self.offsets[: kept + 1],
                               self.sources[:kept])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1


_worker_state: dict[str, object] = {}


def _render_range(bounds: tuple[int, int, int, str]) -> list[str]:
    seed, start, end, template = bounds
    return [rendered_at(seed, i, template).text for i in range(start, end)]


def render_texts(template: str, *, seed: int, count: int, workers: int) -> list[str]:
    """The rendered text of conversations 0..count-1 (the tokenizer's training corpus)."""
    chunk = 250
    ranges = [(seed, start, min(start + chunk, count), template) for start in range(0, count, chunk)]
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            return [text for part in pool.imap(_render_range, ranges) for text in part]
    return [text for bounds in ranges for text in _render_range(bounds)]


def _init_worker(tokenizer_file: str, template: str, seed: int, held_out: bool) -> None:
    _worker_state.update(tokenizer=Tokenizer.from_file(tokenizer_file), template=template, seed=seed,
                         held_out=held_out)


def _encode_range(bounds: tuple[int, int]) -> list[tuple[np.ndarray, np.ndarray]]:
    state = _worker_state
    return [encode_rendered(state["tokenizer"], rendered_at(state["seed"], i, state["template"],  # type: ignore
                                                            held_out=state["held_out"]))  # type: ignore[arg-type]
            for i in range(*bounds)]


def build_corpus(tokenizer_file: Path, template: str, *, seed: int, count: int, max_tokens: int,
                 workers: int, held_out: bool = False) -> TokenizedCorpus:
    """Generate, render and tokenize conversations 0..count-1 (held_out: declaring held-out tool names only);
    those over max_tokens are left out."""
    chunk = 500
    ranges = [(start, min(start + chunk, count)) for start in range(0, count, chunk)]
    if workers > 1:
        context = multiprocessing.get_context("fork")
        with context.Pool(workers, _init_worker, (str(tokenizer_file), template, seed, held_out)) as pool:
            parts = [item for part in pool.imap(_encode_range, ranges) for item in part]
    else:
        _init_worker(str(tokenizer_file), template, seed, held_out)
        parts = [item for bounds in ranges for item in _encode_range(bounds)]
    sources = [i for i, (ids, _) in enumerate(parts) if len(ids) <= max_tokens]
    if len(sources) < len(parts):
        logger.info("left out %d conversations longer than %d tokens", len(parts) - len(sources), max_tokens)
    kept = [parts[i] for i in sources]
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(ids) for ids, _ in kept])
    # the empty arrays first: a corpus that kept none is empty, not numpy's ValueError
    return TokenizedCorpus(np.concatenate([np.zeros(0, np.int32), *(ids for ids, _ in kept)]),
                           np.concatenate([np.zeros(0, np.bool_), *(f for _, f in kept)]), offsets,
                           np.asarray(sources, dtype=np.int64))


def length_batches(lengths: np.ndarray, batch_tokens: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Conversation indices grouped by similar length so that count × longest ≤ batch_tokens; shuffled."""
    order = np.lexsort((rng.random(len(lengths)), lengths))
    batches, current, longest = [], [], 0
    for index in order:
        longest_if_added = max(longest, int(lengths[index]))
        if current and longest_if_added * (len(current) + 1) > batch_tokens:
            batches.append(np.asarray(current))
            current, longest_if_added = [], int(lengths[index])
        current.append(index)
        longest = longest_if_added
    if current:
        batches.append(np.asarray(current))
    rng.shuffle(batches)
    return batches
