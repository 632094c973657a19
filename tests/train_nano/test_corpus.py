"""The synthetic conversations: typed calls a user's words justify, results the answers use, held-out names."""

from __future__ import annotations

import json
import random
import statistics

import jsonschema
import pytest

from glimmer.train_nano.corpus import STRENGTHS, make_conversation
from glimmer.train_nano.names import is_held_out
from glimmer.train_nano.values import NUMBER_WORDS

SAMPLE = 400


@pytest.fixture(scope="module")
def conversations():
    return [make_conversation(random.Random(i)) for i in range(SAMPLE)]


def _calls(conversation):
    """(user text, tool call) for every call of the conversation."""
    user = None
    for message in conversation.messages:
        if message["role"] == "user":
            user = message["content"]
        for call in message.get("tool_calls") or []:
            yield user, call["function"]


def test_a_conversation_is_a_function_of_its_seed():
    assert make_conversation(random.Random(5)) == make_conversation(random.Random(5))
    assert make_conversation(random.Random(5)) != make_conversation(random.Random(6))


def test_every_call_names_a_declared_tool_and_its_arguments_validate(conversations):
    calls = 0
    for conversation in conversations:
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in conversation.tools or []}
        for _, call in _calls(conversation):
            jsonschema.validate(call["arguments"], schemas[call["name"]])
            calls += 1
    assert calls > SAMPLE // 2


def test_arguments_are_copied_or_derived_from_the_users_words(conversations):
    derived = 0
    for conversation in conversations:
        for user, call in _calls(conversation):
            for value in call["arguments"].values():
                if isinstance(value, bool):
                    continue  # said as a word ("off", "urgent"), checked through the domain's choices
                if isinstance(value, list):
                    assert all(item in user for item in value)
                elif isinstance(value, int) and str(value) not in user:
                    assert NUMBER_WORDS[value] in user  # "three" → 3
                    derived += 1
                elif isinstance(value, str) and value not in user:
                    assert value.capitalize() in user  # an enum said with a capital: "Fahrenheit" → "fahrenheit"
                    derived += 1
                else:
                    assert str(value) in user
    assert derived > 0


def test_answers_after_a_tool_result_hold_every_value_of_the_result(conversations):
    checked = 0
    for conversation in conversations:
        turn = conversation.last_turn
        if turn.kind != "call":
            continue
        answer = conversation.messages[-1]["content"]
        for text in turn.tool_results:
            for value in json.loads(text).values():
                assert (str(value) if not isinstance(value, bool) else json.dumps(value)) in answer
        checked += 1
    assert checked > SAMPLE // 3


def test_plain_answers_and_refusals_make_no_call(conversations):
    kinds = set()
    for conversation in conversations:
        turn = conversation.last_turn
        kinds.add(turn.kind)
        if turn.kind in ("plain", "refusal"):
            assert conversation.messages[-1]["role"] == "assistant"
            assert "tool_calls" not in conversation.messages[-1] and conversation.messages[-1]["content"]
    assert kinds == {"call", "plain", "refusal"}


def test_training_never_declares_a_held_out_name_and_evaluation_only_those(conversations):
    training_names = {t["function"]["name"] for c in conversations for t in c.tools or []}
    assert training_names and not any(is_held_out(n) for n in training_names)
    evaluation = [make_conversation(random.Random(i), held_out=True, last_kind="call") for i in range(100)]
    evaluation_names = {t["function"]["name"] for c in evaluation for t in c.tools or []}
    assert evaluation_names and all(is_held_out(n) for n in evaluation_names)


def _walk(conversation, chosen):
    entries = []
    for tool in conversation.tools or []:
        name, description = tool["function"]["name"], tool["function"]["description"].rstrip(".")
        entries.append(f"{name} ({description}): {'yes' if name == chosen else 'no'}")
        if name == chosen:
            break
    return "Tools: " + "; ".join(entries) + "." if entries else ""


def test_every_reasoning_walks_the_declared_tools_in_order_up_to_the_called_one(conversations):
    walked = {"call": 0, "no call": 0}
    for conversation in conversations:
        for index, message in enumerate(conversation.messages):
            reasoning = message.get("reasoning_content")
            follows_user = conversation.messages[index - 1]["role"] == "user"
            if not reasoning or not follows_user or not conversation.tools:
                continue
            if message.get("tool_calls"):
                name = message["tool_calls"][0]["function"]["name"]
                # the call copies the name of the entry just judged yes
                assert _walk(conversation, name) + f" {'Call' if reasoning.startswith('Tools') else 'So I call'} " \
                    f"{name}" in reasoning
                walked["call"] += 1
            else:
                assert _walk(conversation, None) in reasoning
                walked["no call"] += 1
    assert min(walked.values()) > SAMPLE // 10


def test_reasoning_grows_with_the_requested_strength(conversations):
    lengths = {s: [] for s in STRENGTHS}
    for conversation in conversations:
        strength = conversation.reasoning_strength or "high"
        if conversation.messages[0]["role"] == "system" and "Reasoning" in conversation.messages[0]["content"]:
            continue  # the system prompt set its own strength
        for message in conversation.messages:
            if message.get("reasoning_content") and message.get("tool_calls"):
                walk = _walk(conversation, message["tool_calls"][0]["function"]["name"])
                lengths[strength].append(len(message["reasoning_content"].replace(walk, "")))
    # around the same walk over the tools
    means = [statistics.mean(lengths[s]) for s in STRENGTHS]
    assert means == sorted(means) and means[0] * 3 < means[-1]
