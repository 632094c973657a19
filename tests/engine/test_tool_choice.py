"""The tool-choice controller: it forces the channel structure at decision points and lets go after a call.

Token ids come from the tiny tokenizer, whose special tokens sit at ids unlike the release's (P-TOK-1).
"""

from __future__ import annotations

import pytest

from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.engine.sampling_params import SamplingParams
from glimmer.engine.tool_choice import ToolChoiceSteering
from glimmer.protocol import normalize_tools, parse_output

TOOLS = normalize_tools([
    {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"name": "get_time", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
])
CALL = ('<atem:function_calls>\n<atem:invoke name="{name}">\n<atem:parameter name="city">Oslo</atem:parameter>\n'
        '</atem:invoke>\n</atem:function_calls>')


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return LLMEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=16 << 20,
                                  max_model_len=2048))


@pytest.fixture(scope="module")
def steering(engine):
    return ToolChoiceSteering(engine.tokenizer, engine.generation_defaults.stop_token_ids)


def drive(controller, tokenizer, text: str) -> None:
    """Feed `text` token by token, checking each token was allowed."""
    for token_id in tokenizer.encode(text):
        allowed = controller.allowed_token_ids()
        assert allowed is None or token_id in allowed, (text, tokenizer.decode([token_id]))
        assert token_id not in controller.banned_token_ids(), (text, tokenizer.decode([token_id]))
        assert controller.observe(token_id) is False


def first_tokens(tokenizer, *texts: str) -> set[int]:
    return {tokenizer.encode(text)[0] for text in texts}


def test_the_bare_first_header_allows_only_reasoning_or_an_allowed_tool(engine, steering):
    tokenizer = engine.tokenizer
    controller = steering.controller_factory(TOOLS, ["get_weather"])()
    drive(controller, tokenizer, " to=")
    after_to = set(controller.allowed_token_ids())
    assert after_to == first_tokens(tokenizer, "self", "get_weather")
    assert not after_to & first_tokens(tokenizer, "user")


def test_required_allows_every_declared_tool_header(engine, steering):
    controller = steering.controller_factory(TOOLS, ["get_weather", "get_time"])()
    drive(controller, engine.tokenizer, " to=get_time<|message|>")  # a whole header of the second tool is legal


def test_a_body_may_not_end_the_turn_or_open_another_header(engine, steering):
    tokenizer = engine.tokenizer
    controller = steering.controller_factory(TOOLS, ["get_weather"])()
    drive(controller, tokenizer, " to=self<|message|>thinking")
    assert controller.allowed_token_ids() is None
    refused = set(controller.banned_token_ids())
    for token in ("<|eot|>", "<|end_of_text|>", "<|start|>", "<|message|>", "<|begin_of_text|>"):
        assert tokenizer.token_to_id(token) in refused, token
    assert tokenizer.token_to_id("<|eom|>") not in refused
    drive(controller, tokenizer, "<|eom|>")
    assert controller.allowed_token_ids() == [tokenizer.token_to_id("<|start|>")]
    drive(controller, tokenizer, "<|start|>assistant to=")
    assert set(controller.allowed_token_ids()) == first_tokens(tokenizer, "self", "get_weather")


def test_the_controller_lets_go_once_the_named_call_is_complete(engine, steering):
    tokenizer = engine.tokenizer
    controller = steering.controller_factory(TOOLS, ["get_weather"])()
    drive(controller, tokenizer, " to=self<|message|>Weather, then.<|eom|><|start|>assistant to=get_weather<|message|>")
    drive(controller, tokenizer, CALL.format(name="get_weather"))
    assert controller.satisfied
    assert controller.allowed_token_ids() is None  # <|eot|> (and anything else) may follow
    assert controller.banned_token_ids() == ()


def test_a_call_of_another_tool_does_not_satisfy_a_named_choice(engine, steering):
    tokenizer = engine.tokenizer
    controller = steering.controller_factory(TOOLS, ["get_weather"])()
    # the header is the named tool's, but the invoke names another declared tool: the invoke wins (P-NAME-2)
    drive(controller, tokenizer, " to=get_weather<|message|>" + CALL.format(name="get_time") + "<|eom|>")
    assert not controller.satisfied
    assert controller.allowed_token_ids() == [tokenizer.token_to_id("<|start|>")]


def test_an_invoke_of_an_unknown_name_in_the_forced_channel_counts_as_that_tool(engine, steering):
    # P-NAME-2: an unresolved invoke name takes the channel recipient's resolution
    controller = steering.controller_factory(TOOLS, ["get_weather", "get_time"])()
    drive(controller, engine.tokenizer, " to=get_time<|message|>" + CALL.format(name="send_mail"))
    assert controller.satisfied


def test_the_body_refusals_are_built_once_and_shared(steering):
    first = steering.controller_factory(TOOLS, ["get_weather"])()
    second = steering.controller_factory(TOOLS, ["get_time"])()
    first.observe(first.allowed_token_ids()[0])
    for controller in (first, second):
        while controller._header is not None:
            controller.observe(controller.allowed_token_ids()[-1])
    assert first.banned_token_ids() is second.banned_token_ids() is steering.body_refused


@pytest.mark.parametrize("seed", range(4))
def test_on_the_random_model_a_named_choice_yields_that_call_or_no_answer_at_all(engine, steering, seed):
    tokenizer = engine.tokenizer
    prompt = engine.chat_template.render([{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS,
                                         special_tokens=tokenizer.special_tokens,
                                         chat_template_kwargs={"current_date": "2026-01-01"})
    request_id = f"named-{seed}"
    engine.add_request(request_id, tokenizer.encode(prompt), SamplingParams(max_tokens=64, seed=seed),
                       controller_factory=steering.controller_factory(TOOLS, ["get_weather"]))
    text = ""
    while engine.has_unfinished_requests:
        text += "".join(delta.text for delta in engine.step() if delta.request_id == request_id)
    assert text.startswith((" to=self<|message|>", " to=get_weather<|message|>"))
    parsed = parse_output(text, TOOLS)
    if not any(call.name == "get_weather" for call in parsed.tool_calls):
        # steering never let the model answer: no content, no other header, the budget simply ran out
        assert parsed.content is None
        assert "<|eot|>" not in text and "to=user" not in text
