"""Tool names for the synthetic corpus, split once and for all into training names and held-out names.

A name is drawn in one of several styles — a bare function (`get_weather`), a namespaced one
(`weather.current`), a domain function under an invented namespace (`drelvan.get_weather`), a domain
word with an invented one (`weather_skel`, `get_skel`), or wholly invented (`quoxiskel`, `quoxi.skel`) —
most of them carrying an invented word, so the model learns to read the declared tools instead of
recalling names.
Whether a name is held out is a fixed function of the name itself (`is_held_out`): training never declares a
held-out name and the evaluation declares only held-out names, so every evaluated name is unseen.
"""

from __future__ import annotations

import random
import zlib

from glimmer.train_nano.domains import Domain
from glimmer.train_nano.values import made_up_word

# Names a user is likely to try first (the README's example among them) stay in the training split.
ALWAYS_TRAINING = frozenset({"get_weather", "get_current_weather", "weather.current", "search", "calculator"})
HELD_OUT_SHARE = 7  # one name in this many is held out


def is_held_out(name: str) -> bool:
    if name in ALWAYS_TRAINING:
        return False
    return zlib.crc32(name.encode("utf-8")) % HELD_OUT_SHARE == 0


def _draw_name(domain: Domain, rng: random.Random) -> str:
    # Most names carry an invented word, so the model must copy the declared name: with many plain domain
    # names (`get_weather`) it learns to recall names from the request instead.
    style = rng.random()
    if style < 0.12:
        return rng.choice(domain.stems)
    if style < 0.22:
        return f"{rng.choice(domain.namespaces)}.{rng.choice(domain.verbs)}"
    if style < 0.44:
        return f"{made_up_word(rng, (1, 2))}.{rng.choice(domain.stems)}"
    if style < 0.58:
        return f"{rng.choice(domain.namespaces)}_{made_up_word(rng, (1, 2))}"
    if style < 0.68:
        return f"{rng.choice(domain.verbs)}_{made_up_word(rng, (1, 2))}"
    if style < 0.78:
        return made_up_word(rng, (2, 3))
    return f"{made_up_word(rng, (1, 2))}.{made_up_word(rng, (1, 2))}"


def draw_tool_name(domain: Domain, rng: random.Random, *, held_out: bool, taken: set[str]) -> str:
    """A name for a tool of `domain` from the requested split, distinct from the names in `taken`."""
    while True:
        name = _draw_name(domain, rng)
        if is_held_out(name) == held_out and name not in taken:
            return name
