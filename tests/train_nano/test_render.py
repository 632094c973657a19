"""Rendering the corpus with the real chat template: the trained spans are what the model generates."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer

from glimmer.checkpoint.tiny_tokenizer import write_tiny_tokenizer
from glimmer.protocol import builtin_template_source, parse_output
from glimmer.train_nano.corpus import make_conversation
from glimmer.train_nano.dataset import encode_rendered
from glimmer.train_nano.render import assistant_runs, check_spans, render_conversation

TEMPLATE = builtin_template_source()


@pytest.fixture(scope="module")
def rendered():
    pairs = []
    for i in range(150):
        conversation = make_conversation(random.Random(1000 + i))
        pairs.append((conversation, render_conversation(conversation, TEMPLATE)))
    return pairs


def test_spans_start_where_the_generation_prompt_ends_and_stop_where_the_turn_does(rendered):
    for conversation, result in rendered:
        check_spans(conversation, result, TEMPLATE)
    assert sum(len(result.spans) for _, result in rendered) > len(rendered)


def test_turns_whose_reasoning_a_client_dropped_are_not_trained(rendered):
    dropped = [(c, r) for c, r in rendered if not all(c.trained.values())]
    assert dropped
    for conversation, result in dropped:
        assert len(result.spans) == sum(all(conversation.trained[i] for i in range(*run))
                                        for run in assistant_runs(conversation.messages))


def test_each_span_parses_back_to_its_messages(rendered):
    """Render then parse returns the reasoning, the typed calls and the answer (P-CHAN-4, P-ATEM-4, P-VAL-2)."""
    for conversation, result in rendered:
        runs = [run for run in assistant_runs(conversation.messages)
                if all(conversation.trained[i] for i in range(*run))]
        for (start, end), (first, last) in zip(result.spans, runs, strict=True):
            parsed = parse_output(result.text[start:end], conversation.tools)
            messages = conversation.messages[first:last]
            assert parsed.reasoning == "\n".join(m["reasoning_content"] for m in messages)
            expected_calls = [(c["function"]["name"], c["function"]["arguments"])
                              for m in messages for c in m.get("tool_calls") or []]
            assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == expected_calls
            assert parsed.content == ("".join(m["content"] for m in messages if m["content"]) or None)


def test_piecewise_tokens_equal_whole_text_tokens(rendered, tmp_path):
    write_tiny_tokenizer(tmp_path, [r.text for _, r in rendered[:40]], 700)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for _, result in rendered:
        ids, trainable = encode_rendered(tokenizer, result)
        assert ids.tolist() == tokenizer.encode(result.text, add_special_tokens=False).ids
        assert 0 < trainable.sum() < len(ids) and not trainable[0]
        assert tokenizer.decode(ids[trainable].tolist(), skip_special_tokens=False) == "".join(
            result.text[s:e] for s, e in result.spans)
