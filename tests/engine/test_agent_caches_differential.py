"""Differential test of the caches an agent's requests go through: two LLMs of different tokenizers (the tiny one and
glimmer-nano's) in one process, each with small caches that evict all along (kept prompt pieces, compiled grammars
and turn grammars), take seeded random conversations in turn: unicode, whitespace-only and long messages, text that
spells special tokens or parts of them, tools and JSON schemas that come back after they were evicted. Every prompt
the engine tokenized must have the ids its own tokenizer gives the whole text with no cache, and every finished
answer must follow its own request's schema (a grammar of another schema, or of the other tokenizer, would not).
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from glimmer import LLM, SamplingParams
from glimmer.default_model import default_model_dir
from glimmer.engine import grammar
from glimmer.engine.token_pieces import PieceIds
from glimmer.engine.tokenizer import Tokenizer

KWARGS = {"current_date": "2026-01-01"}
SCHEMAS = 6  # past the 2 compiled grammars each engine keeps here


class CheckedEncode:
    """An engine tokenizer's `encode`, checked against a tokenizer of the same files that keeps no pieces."""

    def __init__(self, tokenizer: Tokenizer, directory: str):
        self.encode = tokenizer.encode
        self.reference = Tokenizer.from_dir(directory)
        self.reference.__dict__["_piece_ids"] = None  # each text tokenized whole
        self.calls = 0

    def __call__(self, text, **kwargs):
        ids = self.encode(text, **kwargs)
        assert ids == self.reference.encode(text, **kwargs), f"cached ids differ for {text[:200]!r}"
        self.calls += 1
        return ids


@pytest.fixture(scope="module")
def llms(tiny_checkpoint):
    made = {}
    for name, directory in (("tiny", str(tiny_checkpoint)), ("nano", str(default_model_dir()))):
        llm = LLM(directory, progress=False, kv_cache_memory=16 << 20, max_model_len=2048)
        tokenizer = llm.engine.tokenizer
        tokenizer.__dict__["_piece_ids"] = PieceIds(tokenizer._backend, max_bytes=8 << 10)
        checked = CheckedEncode(tokenizer, directory)
        tokenizer.encode = checked
        made[name] = (llm, checked)
    return made


def _text(rng: random.Random, specials: list[str]) -> str:
    parts = []
    for _ in range(rng.randrange(1, 8)):
        kind = rng.random()
        if kind < 0.1:
            parts.append(rng.choice(specials))
        elif kind < 0.2:
            special = rng.choice(specials)
            parts.append(special[:rng.randrange(1, len(special))])
        elif kind < 0.35:
            parts.append("".join(rng.choice(" \t\n\r\u00a0\u3000") for _ in range(rng.randrange(1, 4))))
        elif kind < 0.5:
            parts.append("".join(chr(rng.choice([rng.randrange(0xa0, 0x800), rng.randrange(0x4e00, 0x4f00),
                                                 rng.randrange(0x1f300, 0x1f600)])) for _ in range(5)))
        elif kind < 0.53:
            parts.append("line of a long tool result\n" * rng.randrange(10, 40))
        else:
            parts.append(rng.choice(["list the files", " src/main.py", "don't", "{\"path\": 1}", "<|", "|>", "42"]))
    return "".join(parts)


def _schema(index: int) -> dict:
    return {"type": "object", "properties": {f"k{index}": {"enum": [f"a{index}", index]}}, "required": [f"k{index}"],
            "additionalProperties": False}


def _tool(index: int) -> dict:
    return {"type": "function", "function": {"name": f"tool_{index}", "description": "Reads.", "parameters": {
        "type": "object", "properties": {f"p{index}": {"type": "string"}}, "required": [f"p{index}"]}}}


def test_agent_turns_through_evicting_caches_give_each_tokenizer_its_own_ids_and_grammars(llms, monkeypatch):
    monkeypatch.setattr(grammar, "COMPILED_CACHE_SIZE", 2)
    rng = random.Random(5)
    conversations = {name: [] for name in llms}
    finished = 0
    for turn in range(8):
        for name, (llm, _) in llms.items():
            specials = list(llm.engine.tokenizer.control_tokens)
            conversation = conversations[name]
            conversation.append({"role": "user", "content": _text(rng, specials)})
            if sum(len(message["content"]) for message in conversation) > 1500:
                del conversation[:-1]
            index = rng.randrange(SCHEMAS)
            schema = _schema(index)
            tools = [_tool(index) for index in rng.sample(range(SCHEMAS), rng.randrange(3))]
            output = llm.chat(conversation, SamplingParams(max_tokens=16, seed=turn), tools=tools or None,
                              response_format={"type": "json_schema", "json_schema": {"name": f"s{index}",
                                                                                      "schema": schema}},
                              thinking_token_budget=0, chat_template_kwargs=KWARGS)[0]
            if output.finish_reason == "stop":
                jsonschema.validate(json.loads(output.content), schema)
                finished += 1
            conversation.append({"role": "assistant", "content": output.content or "ok"})
    assert finished >= 8  # half the answers at least
    # both tokenizers ran through their caches, and they differ: ids kept for one would be wrong for the other
    assert all(checked.calls >= 8 for _, checked in llms.values())
    text = "list the files in src/main.py"
    assert llms["tiny"][1].reference.encode(text) != llms["nano"][1].reference.encode(text)
