"""The request path from chat request to prompt ids: tool plans, media checks, strength, roles, one bos."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import anyio.to_thread
import pytest
from chat_fuzz import cases as fuzz_cases
from PIL import Image
from transformers import AutoTokenizer

from glimmer import LLM, SamplingParams
from glimmer.cancellation import Cancelled, CancelToken
from glimmer.engine.async_engine import AsyncEngine
from glimmer.engine.chat_rendering import STRENGTH_KWARGS
from glimmer.engine.llm_engine import EngineConfig
from glimmer.errors import ConfigError, RequestError
from glimmer.multimodal.settings import MediaFetchPolicy
from glimmer.protocol import ChatTemplateError
from glimmer.server import chat_prompt
from glimmer.server.chat_prompt import ResponsesTurn, build_chat_prompt, prompt_threads
from glimmer.server.context import ServingContext
from glimmer.server.responses_input import chat_messages
from glimmer.server.schemas import ChatCompletionRequest
from glimmer.server.settings import REMOTE_MEDIA_THREADS, ServerSettings

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time"}}]
DATE = {"current_date": "2026-01-01"}


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=8 << 20))
    yield engine
    engine.shutdown()


def context(engine, **settings) -> ServingContext:
    return ServingContext.create(engine, ServerSettings(served_model_names=("tiny",), **settings))


def prompt_text(engine, ctx, **fields) -> str:
    return engine.engine.tokenizer.decode(build_chat_prompt(request(**fields), ctx).token_ids)


def test_media_parts_on_a_text_only_model_are_refused_naming_the_part(engine):
    messages = [{"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "video", "video": "x"}]}]
    with pytest.raises(RequestError, match="no vision tower") as raised:
        build_chat_prompt(ChatCompletionRequest.model_validate({"messages": messages}), context(engine))
    assert raised.value.param == "messages[1].content[1]"


INSTRUCTIONS = [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"}]


@pytest.mark.parametrize(("part", "words", "engine_name"), [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "no vision tower", "engine"),
    ({"type": "image_url", "image_url": {}}, "is missing", "vision_engine"),
], ids=["text-only-model", "no-url"])
def test_a_media_error_after_a_merged_developer_message_names_the_clients_message(engine, vision_engine, part, words,
                                                                                   engine_name):
    """The developer message joins the system message before rendering; the error still names the part where the
    client put it (messages[2], not messages[1] of the merged list)."""
    messages = [*INSTRUCTIONS, {"role": "user", "content": [{"type": "text", "text": "look"}, part]}]
    serving = context(vision_engine if engine_name == "vision_engine" else engine)
    with pytest.raises(RequestError, match=words) as raised:
        build_chat_prompt(request(messages=messages), serving)
    assert raised.value.param.startswith("messages[2].content[1]") and "messages[2].content[1]" in str(raised.value)


def test_forced_tool_choices_and_structured_answers_come_with_a_grammar(engine):
    ctx = context(engine)
    assert build_chat_prompt(request(tools=TOOLS), ctx).controller_factory is None
    for fields in ({"tool_choice": "required"}, {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
                   {"response_format": {"type": "json_object"}}, {"thinking_token_budget": 8}):
        factory = build_chat_prompt(request(tools=TOOLS, **fields), ctx).controller_factory
        assert factory is not None and factory() is not factory(), fields  # one controller per completion


def test_the_prompt_has_one_bos_and_ends_with_the_generation_prompt(engine):
    ctx = context(engine)
    ids = build_chat_prompt(request(chat_template_kwargs=DATE), ctx).token_ids
    tokenizer = engine.engine.tokenizer
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id  # P-TMPL-5
    assert tokenizer.decode(ids).endswith("<|start|>assistant")  # P-TMPL-8


def test_reasoning_strength_precedence_and_server_default(engine):
    ctx = context(engine, default_reasoning_strength="medium")
    assert "Reasoning strength: medium." in prompt_text(engine, ctx, chat_template_kwargs=DATE)
    assert "Reasoning strength: xhigh." in prompt_text(engine, ctx, reasoning_effort="xhigh")
    assert "Reasoning strength: low." in prompt_text(engine, ctx, reasoning={"effort": "none"})
    assert "Reasoning strength: low." in prompt_text(engine, ctx, enable_thinking=False)
    assert "Reasoning strength: high." in prompt_text(engine, ctx, reasoning_strength="HIGH", reasoning_effort="low")


def test_a_developer_message_changes_the_prompt_exactly_as_a_system_message_would(engine):
    ctx = context(engine)
    user = {"role": "user", "content": "hi"}

    def rendered(*messages):
        return prompt_text(engine, ctx, messages=[*messages, user], chat_template_kwargs=DATE)

    developer, system = {"role": "developer", "content": "Be brief."}, {"role": "system", "content": "Be brief."}
    assert rendered(developer) == rendered(system)
    assert rendered({"role": "system", "content": "Rules."}, {"role": "developer", "content": "Be brief."}) == (
        rendered({"role": "system", "content": "Rules.\n\nBe brief."}))
    assert rendered({"role": "developer", "content": "Be brief."}) != rendered()


def test_a_role_the_model_does_not_take_is_refused_without_a_warning(engine, caplog):
    """Normalization logged a warning for the role before the request was refused: each hostile request a log line."""
    with caplog.at_level(logging.WARNING), pytest.raises(RequestError, match="critic") as caught:
        prompt_text(engine, context(engine), messages=[{"role": "critic", "content": "x"}])
    assert caught.value.param == "messages[0].role"
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TIME_CALL = {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}


@pytest.mark.parametrize(("messages", "param"), [
    ([{"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "user", "content": "and?"}],
     "messages[1].tool_calls[0]"),
    ([{"role": "assistant", "content": None, "tool_calls": [CALL, TIME_CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], "messages[1].tool_calls[1]"),
    ([{"role": "assistant", "content": None, "tool_calls": [CALL]}], "messages[1].tool_calls[0]"),
    ([{"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "user", "content": "and?"},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], "messages[1].tool_calls[0]"),
], ids=["user-after-call", "one-of-two-answered", "call-then-generation-prompt", "result-after-a-user-message"])
def test_a_tool_call_not_answered_right_after_its_turn_is_refused_naming_the_call(engine, messages, param):
    """OpenAI: "An assistant message with 'tool_calls' must be followed by tool messages responding to each
    'tool_call_id'"; the model would otherwise read a call whose result never came."""
    with pytest.raises(RequestError, match="must be followed by tool messages") as caught:
        prompt_text(engine, context(engine), tools=TOOLS, messages=[{"role": "user", "content": "hi"}, *messages])
    assert caught.value.param == param
    assert '{"role": "tool", "tool_call_id": "call_' in str(caught.value)  # the message to send, as JSON


ANSWERED_CALL = [{"role": "assistant", "content": None, "tool_calls": [CALL]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


@pytest.mark.parametrize(("messages", "param", "words"), [
    ([{"role": "tool", "name": "get_weather", "content": "sunny"}], "messages[1]",
     "no assistant message with tool_calls comes right before it"),
    ([{"role": "assistant", "content": "Let me see."}, {"role": "tool", "name": "get_weather", "content": "sunny"}],
     "messages[2]", "no assistant message with tool_calls"),
    ([*ANSWERED_CALL, {"role": "tool", "name": "get_time", "content": "noon"}], "messages[3]",
     "calls 'get_weather' (id 'call_1')"),
    ([*ANSWERED_CALL, {"role": "tool", "name": "get_weather", "content": "rain"}], "messages[3]",
     "each call has one result"),  # one result too many
    ([{"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_9", "name": "get_time", "content": "noon"},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], "messages[2].tool_call_id",
     "tool_call_id 'call_9' answers no tool call"),
], ids=["after-a-user-message", "after-a-turn-without-calls", "of-another-tool", "one-too-many",
        "id-of-no-call-of-the-turn"])
def test_a_tool_message_answering_no_call_of_the_turn_before_it_is_refused_naming_it(engine, messages, param, words):
    """OpenAI: "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'"; the model
    would read the result of a call it never made. Named by its tool_call_id where it has one, as an id that no
    earlier call has (test_request_normalization), else as the message."""
    with pytest.raises(RequestError, match="answers no tool call") as caught:
        prompt_text(engine, context(engine), tools=TOOLS, messages=[{"role": "user", "content": "hi"}, *messages])
    assert caught.value.param == param
    assert str(caught.value).startswith(param + ": ") and words in str(caught.value)


def test_a_result_whose_id_names_no_call_of_the_turn_answers_by_its_name(engine):
    """As results were matched before (`tool_results_in_call_order` keeps their order then): the id names no call of
    the turn, the name a call not yet answered."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "elsewhere", "name": "get_weather", "content": "sunny"}]
    assert "sunny" in prompt_text(engine, context(engine), tools=TOOLS, messages=messages)


def test_tool_calls_answered_by_id_or_name_in_any_order_are_taken(engine):
    answered = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "assistant", "content": None, "tool_calls": [TIME_CALL]},
                {"role": "tool", "name": "get_time", "content": "noon"},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    assert "sunny" in prompt_text(engine, context(engine), tools=TOOLS, messages=answered)


def test_a_final_turn_of_calls_is_history_where_the_prompt_does_not_start_a_new_turn(engine):
    """With `add_generation_prompt: false` the prompt ends after the calls (scoring a conversation, say): nothing is
    answered without their results, so they are taken; earlier turns are still checked."""
    final_calls = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    text = prompt_text(engine, context(engine), tools=TOOLS, messages=final_calls, add_generation_prompt=False)
    assert text.endswith("</atem:function_calls><|eot|>")
    with pytest.raises(RequestError, match="must be followed by tool messages"):
        prompt_text(engine, context(engine), tools=TOOLS, add_generation_prompt=False,
                    messages=[*final_calls, {"role": "user", "content": "and?"}])




# vLLM's add_generation_prompt and continue_final_message: LLM.chat's rules (P-TMPL-8) --------------------------------

ANSWERED = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]


def test_add_generation_prompt_false_ends_the_prompt_after_the_final_message(engine):
    ctx = context(engine)
    prompt = build_chat_prompt(request(chat_template_kwargs=DATE, add_generation_prompt=False), ctx)
    assert engine.engine.tokenizer.decode(prompt.token_ids).endswith("hi<|eot|>")
    assert prompt.continue_recipient is None  # a turn of its own: the parser reads its header


def test_continue_final_message_ends_the_prompt_inside_the_assistant_message_and_names_its_channel(engine):
    """P-TMPL-8: the prompt ends inside the final message's body, and the parser is told whose body it is."""
    ctx = context(engine)
    prompt = build_chat_prompt(request(messages=ANSWERED, chat_template_kwargs=DATE, continue_final_message=True), ctx)
    text = engine.engine.tokenizer.decode(prompt.token_ids)
    assert text.endswith("<|start|>assistant to=user<|message|>Hello") and prompt.continue_recipient == "user"
    llm_prompt = engine.engine.chat_template.render([*ANSWERED[:1], {"role": "assistant", "content": "Hello"}],
                                                    chat_template_kwargs=DATE, add_generation_prompt=False)
    assert llm_prompt.startswith(text)  # the same prompt, cut where the message's text ends
    call = {"role": "assistant", "recipient": "get_weather", "content": '<atem:function_calls>\n<atem:invoke name="'}
    prompt = build_chat_prompt(request(messages=[ANSWERED[0], call], tools=TOOLS, chat_template_kwargs=DATE,
                                       continue_final_message=True), ctx)
    assert prompt.continue_recipient == "get_weather"


@pytest.mark.parametrize("effort", ["max", ""])
def test_an_unsupported_reasoning_object_effort_is_refused_naming_it(engine, effort):
    """`reasoning: {"effort": "max"}` on /v1/chat/completions was refused as `reasoning_effort='max'`, param
    `reasoning_effort`, a field the client never sent; the 400 names `reasoning.effort` (P-EFF-2)."""
    with pytest.raises(RequestError) as raised:
        build_chat_prompt(request(reasoning={"effort": effort}), context(engine))
    assert raised.value.param == "reasoning.effort"
    assert str(raised.value).startswith(f"reasoning.effort={effort!r} is not supported; use one of none, minimal")


def test_the_servers_default_template_variables_go_under_the_requests_own(engine):
    """vLLM's --default-chat-template-kwargs: each request's chat_template_kwargs win, key by key."""
    ctx = context(engine, default_chat_template_kwargs={"current_date": "2030-05-05"})
    assert prompt_text(engine, ctx) == prompt_text(engine, context(engine), chat_template_kwargs={
        "current_date": "2030-05-05"})
    assert "2030-05-05" in prompt_text(engine, ctx)
    own = prompt_text(engine, ctx, chat_template_kwargs=DATE)
    assert "2026-01-01" in own and "2030-05-05" not in own


@pytest.mark.parametrize("name", ["enable_thinking", "add_generation_prompt"])
def test_default_template_variables_that_are_no_variables_are_refused(name):
    with pytest.raises(ConfigError, match=f"default_chat_template_kwargs may not set '{name}'"):
        ServerSettings(served_model_names=("tiny",), default_chat_template_kwargs={name: False})


@pytest.mark.parametrize(("defaults", "words"), [
    ({"bos_token": "<s>"}, "may not set 'bos_token'"),
    ({"messages": []}, "may not set 'messages'"),
    ({"knowledge_cutoff": float("nan")}, "chat_template_kwargs.knowledge_cutoff is nan"),
    ({"tool_namespace_descriptions": "calendar"}, "chat_template_kwargs.tool_namespace_descriptions is a string"),
])
def test_default_template_variables_every_request_would_be_refused_for_stop_the_start(engine, defaults, words):
    """A server started with such --default-chat-template-kwargs refused every chat request with a 400 naming the
    client's chat_template_kwargs, which the client never sent; the server does not start, naming the option."""
    with pytest.raises(ConfigError) as raised:
        context(engine, default_chat_template_kwargs=defaults)
    assert str(raised.value).startswith("default_chat_template_kwargs (--default-chat-template-kwargs): ")
    assert words in str(raised.value)


@pytest.mark.parametrize(("choice", "declared"), [("none", False), ("auto", True), (None, True)])
def test_tools_are_left_out_of_the_prompt_under_tool_choice_none(engine, choice, declared):
    """P-REQ-3, vLLM's --exclude-tools-when-tool-choice-none (which Glimmer always does): the prompt of a chat request
    and of the same /v1/responses request declares the tools only where they may be called."""
    from glimmer.server.responses import _conversation
    from glimmer.server.responses_schemas import ResponsesRequest

    ctx = context(engine)
    chat = prompt_text(engine, ctx, tools=TOOLS, chat_template_kwargs=DATE,
                       **({"tool_choice": choice} if choice else {}))
    without_tools = prompt_text(engine, ctx, chat_template_kwargs=DATE)
    assert ("get_weather" in chat) is declared and (chat == without_tools) is not declared
    responses_tools = [{"type": "function", "name": tool["function"]["name"],
                        "parameters": tool["function"].get("parameters")} for tool in TOOLS]
    body = {"model": "tiny", "input": "hi", "tools": responses_tools, **({"tool_choice": choice} if choice else {})}
    conversation = _conversation(ResponsesRequest.model_validate(body), ctx.responses)
    responses = engine.engine.tokenizer.decode(build_chat_prompt(
        conversation.chat.model_copy(update={"chat_template_kwargs": DATE}), ctx).token_ids)
    assert responses == chat


@pytest.mark.parametrize("fields", [{}, {"tools": TOOLS, "tool_choice": "none"}], ids=["no-tools", "tool-choice-none"])
def test_a_continued_message_to_a_tool_with_no_tools_offered_is_refused(engine, fields):
    """P-TMPL-8, P-NAME-4: the reply continues the tool's call, and with no tools the parser returns none: the reply
    vanished (content null, no tool_calls)."""
    call = {"role": "assistant", "recipient": "get_weather", "content": '<atem:function_calls>\n<atem:invoke name="'}
    words = "addressed to the tool 'get_weather'.*declare 'get_weather' in tools"
    with pytest.raises(RequestError, match=words) as caught:
        build_chat_prompt(request(messages=[ANSWERED[0], call], chat_template_kwargs=DATE, continue_final_message=True,
                                  **fields), context(engine))
    assert caught.value.param == "continue_final_message"


def test_a_continued_message_hands_the_parser_its_body_as_the_prompt_holds_it(engine):
    """A tool channel's ATEM is read from the body in the prompt on; control-token text in it stays the text."""
    body = '<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city">a <|eot|> b'
    parts = [{"type": "text", "text": body[:20]}, {"type": "text", "text": body[20:]}]
    for content in (body, parts):
        call = {"role": "assistant", "recipient": "get_weather", "content": content}
        prompt = build_chat_prompt(request(messages=[ANSWERED[0], call], tools=TOOLS, chat_template_kwargs=DATE,
                                           continue_final_message=True), context(engine))
        assert prompt.continue_prefix == body


@pytest.fixture(scope="module")
def vision_engine(make_tiny):
    engine = AsyncEngine(EngineConfig(model=str(make_tiny(vision=True)), progress=False, kv_cache_memory=8 << 20))
    yield engine
    engine.shutdown()


def _png_data_url() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), "red").save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_a_continued_message_keeps_an_image_before_its_text(vision_engine):
    image = {"type": "image_url", "image_url": {"url": _png_data_url()}}
    messages = [ANSWERED[0], {"role": "assistant", "content": [image, {"type": "text", "text": "It shows"}]}]
    prompt = build_chat_prompt(request(messages=messages, chat_template_kwargs=DATE, continue_final_message=True),
                               context(vision_engine))
    assert len(prompt.multimodal) == 1
    assert vision_engine.engine.tokenizer.decode(prompt.token_ids).endswith("<|image_end|>It shows")


def test_only_a_prompt_asked_to_keeps_the_bytes_its_images_were_read_as(vision_engine, tmp_path):
    """A response to be stored keeps what its images named by a path were read as (`media_read`); a chat completion
    held them too, a file's bytes for the whole of its generation, though nothing reads them."""
    photo = tmp_path / "photo.png"
    photo.write_bytes(base64.b64decode(_png_data_url().partition(",")[2]))
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(photo)}},
                                             {"type": "image_url", "image_url": {"url": _png_data_url()}}]}]
    served = context(vision_engine, media_policy=MediaFetchPolicy.create([tmp_path]))
    built = request(messages=messages, chat_template_kwargs=DATE)
    assert build_chat_prompt(built, served).media_read == {}
    kept = build_chat_prompt(built, served, turn=ResponsesTurn({}, keep_media_read=True)).media_read
    assert kept == {(0, 0): photo.read_bytes()}  # by (message, part); a data: URL is its data already


def test_a_continued_message_with_an_image_after_its_text_is_refused_naming_the_part(vision_engine):
    """The prompt ends inside the text the reply continues: the image after it had no placeholder left, and the
    request failed with `PlaceholderMismatchError: the prompt has 0 <|patch|> placeholder(s) but 1 image(s)`."""
    image = {"type": "image_url", "image_url": {"url": _png_data_url()}}
    messages = [ANSWERED[0], {"role": "assistant", "content": [{"type": "text", "text": "Look"}, image]}]
    with pytest.raises(RequestError, match=re.escape("messages[1].content[1] is an image after the text the reply "
                                                     "continues")) as caught:
        build_chat_prompt(request(messages=messages, chat_template_kwargs=DATE, continue_final_message=True),
                          context(vision_engine))
    assert caught.value.param == "continue_final_message"
    with pytest.raises(RequestError, match=re.escape("messages[3].content[1] is an image after the text")):
        build_chat_prompt(request(messages=[*INSTRUCTIONS, *messages], chat_template_kwargs=DATE,
                                  continue_final_message=True), context(vision_engine))


@pytest.mark.parametrize(("fields", "param", "message"), [
    ({"messages": ANSWERED, "continue_final_message": True, "add_generation_prompt": True}, "continue_final_message",
     "with add_generation_prompt=True"),
    ({"continue_final_message": True}, "continue_final_message", "the final message has role 'user'"),
    ({"messages": ANSWERED, "continue_final_message": True, "response_format": {"type": "json_object"}},
     "continue_final_message", "cannot be combined with response_format"),
    ({"add_generation_prompt": False, "tools": TOOLS, "tool_choice": "required"}, "add_generation_prompt",
     "cannot be combined with tool_choice"),
    ({"add_generation_prompt": False, "thinking_token_budget": 4}, "add_generation_prompt",
     "cannot be combined with thinking_token_budget"),
    ({"add_generation_prompt": False, "guided_regex": "a+"}, "add_generation_prompt",
     "cannot be combined with guided_regex"),
])
def test_conflicting_rendering_fields_are_refused_naming_the_field(engine, fields, param, message):
    """LLM.chat's refusals: both prompt ends at once, a final message that is not an assistant's, and a turn grammar,
    which starts at the generation prompt, after another prompt end."""
    with pytest.raises(RequestError, match=message) as caught:
        build_chat_prompt(request(chat_template_kwargs=DATE, **fields), context(engine))
    assert caught.value.param == param


@pytest.mark.parametrize("name", ["add_generation_prompt", "continue_final_message", "chat_template"])
def test_rendering_fields_in_template_kwargs_point_to_the_top_level_field(engine, name):
    """P-TMPL-3: vLLM also reads them from chat_template_kwargs; here they are refused, naming where they go."""
    with pytest.raises(RequestError, match=f"send '{name}' at the top level of the request") as caught:
        build_chat_prompt(request(messages=ANSWERED, chat_template_kwargs={**DATE, name: False}), context(engine))
    assert caught.value.param == "chat_template_kwargs"


# vLLM's chat_template: a request's own template, where the operator trusts requests with one -------------------------

SIMPLE_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|eot|>"
                   "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}")


def trusting(engine) -> ServingContext:
    return context(engine, trust_request_chat_template=True)


def test_a_request_template_is_refused_unless_the_server_trusts_requests_with_one(engine):
    with pytest.raises(RequestError, match="--trust-request-chat-template") as caught:
        build_chat_prompt(request(chat_template=SIMPLE_TEMPLATE), context(engine))
    assert caught.value.param == "chat_template"


def test_a_trusted_request_template_renders_the_prompt(engine):
    assert prompt_text(engine, trusting(engine), chat_template=SIMPLE_TEMPLATE) == (
        "<|begin_of_text|><|start|>user<|message|>hi<|eot|><|start|>assistant")
    prompt = build_chat_prompt(request(messages=ANSWERED, chat_template=SIMPLE_TEMPLATE, continue_final_message=True),
                               trusting(engine))
    assert engine.engine.tokenizer.decode(prompt.token_ids).endswith("<|start|>assistant<|message|>Hello")


def test_a_trusted_request_template_naming_one_of_the_checkpoints_templates_renders_with_it(
        named_templates_checkpoint):
    """As vLLM, which hands the request's chat_template to transformers' apply_chat_template, which takes the
    tokenizer's template of that name: the name was rendered as the template, and refused by the start check."""
    named = AsyncEngine(EngineConfig(model=str(named_templates_checkpoint), progress=False, kv_cache_memory=8 << 20))
    try:
        ctx = trusting(named)
        assert prompt_text(named, ctx, chat_template="rag") == prompt_text(named, ctx).replace(
            "<|message|>", "<|message|>RAG:")
        assert "RAG:" not in prompt_text(named, ctx)
    finally:
        named.shutdown()


@pytest.mark.parametrize(("template", "words"), [
    ("{% if %}", "line 1: Expected an expression"),
    ("{{ " + "[" * 100 + "1" + "]" * 100 + " }}", "RecursionError"),
    ("{{ raise_exception('needs a system message') }}", "needs a system message"),
    ("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", "(P-TMPL-8)"),
    ("{{ bos_token }}{{ bos_token }}<|start|>assistant", "(P-TMPL-5)"),
    ("{{ bos_token }}{{ 'x' * 10000000 }}<|start|>assistant", "more than a prompt may have"),
])
def test_a_request_template_that_fails_to_compile_render_or_pass_the_start_check_is_refused(engine, template, words):
    """P-TMPL-2, P-TMPL-5, P-TMPL-8: the check the server's own template passes at start, on a probe conversation."""
    with pytest.raises(RequestError, match=re.escape(words)) as caught:
        build_chat_prompt(request(chat_template=template), trusting(engine))
    assert caught.value.param == "chat_template"


@pytest.mark.parametrize("escape", [
    "{{ lipsum.__globals__['os'].system('touch MARKER') }}",
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ raise_exception.__globals__['os'].system('touch MARKER') }}",
    "{{ (lipsum|attr('__globals__'))['os'].system('touch MARKER') }}",
    "{{ '{0.__class__.__init__.__globals__}'.format(dict) }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ self._TemplateReference__context.environment }}",
    "{% include '/etc/hostname' %}",
    "{% import '/etc/hostname' as hostname %}",
    "{{ messages.pop() }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "{% macro again() %}{{ again() }}{% endmacro %}{{ again() }}",
])
def test_a_request_template_cannot_leave_the_sandbox(engine, tmp_path, escape):
    """P-TMPL-2: a request's template runs in the sandbox checkpoint templates run in; what would reach Python
    internals, files or the inputs is a 400 naming chat_template, and nothing of it ran."""
    marker = tmp_path / "escaped"
    template = "{{ bos_token }}" + escape.replace("MARKER", str(marker)) + "<|start|>assistant"
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(RequestError) as caught:
        build_chat_prompt(request(messages=messages, chat_template=template), trusting(engine))
    assert caught.value.param == "chat_template" and not marker.exists()
    assert messages == [{"role": "user", "content": "hi"}]


def test_a_request_template_that_fails_on_the_request_is_a_chat_template_error(engine):
    """It passed the probe, and fails on these messages: the template's own message, a 400 (P-TMPL-2)."""
    template = ("{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}"
                + SIMPLE_TEMPLATE)
    with pytest.raises(ChatTemplateError, match="one message only"):
        build_chat_prompt(request(messages=ANSWERED, chat_template=template), trusting(engine))


def test_prompt_ids_equal_transformers_for_random_conversations(engine, tiny_checkpoint):
    """Differential fuzz (chat_fuzz.py): a chat request's prompt ids are transformers' `apply_chat_template` ids for
    the conversation normalized per P-TMPL-6, with `reasoning_effort` resolved per P-EFF-2 (P-TMPL-2, P-TMPL-3)."""
    hf = AutoTokenizer.from_pretrained(tiny_checkpoint)
    ctx = context(engine)
    for case in fuzz_cases(media=False):
        knobs = {name: value for name, value in case.knobs.items() if name in STRENGTH_KWARGS}
        template_kwargs = {name: value for name, value in case.knobs.items() if name not in STRENGTH_KWARGS}
        fields = {"messages": case.sent, "tools": case.tools, "chat_template_kwargs": template_kwargs, **knobs,
                  **case.ending}
        token_ids = build_chat_prompt(ChatCompletionRequest.model_validate(fields), ctx).token_ids
        reference = hf.apply_chat_template(case.expected, tools=case.tools, return_dict=False, **case.ending,
                                           **case.kwargs)
        assert token_ids == reference, case


def responses_input(case) -> list[dict] | None:
    """The fuzz case's conversation as Responses input items, or None where items cannot say it (an assistant answer
    null, with an `end_turn` or to a `recipient`). The content of an assistant message with tool calls is a message
    item before them."""
    def parts(content):
        return content if isinstance(content, str) else [{"type": "input_text", "text": p["text"]} for p in content]

    items = []
    for message in case.sent:
        if message["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": parts(message["content"])})
        elif message["role"] != "assistant":
            items.append({"type": "message", "role": message["role"], "content": parts(message["content"])})
        else:
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            if reasoning:
                items.append({"type": "reasoning", "summary": [],
                              "content": [{"type": "reasoning_text", "text": reasoning}]})
            if message.get("tool_calls") and message.get("content"):
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": message["content"]}]})
            for call in message.get("tool_calls") or []:
                arguments = call["function"]["arguments"]
                items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                              "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)})
            if message.get("tool_calls"):
                continue
            if message.get("content") is None or message.get("end_turn") is not None or message.get("recipient"):
                return None
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": message["content"]}]})
    return items


def test_responses_prompt_ids_equal_transformers_for_random_conversations(engine, tiny_checkpoint):
    """Differential fuzz (chat_fuzz.py) of /v1/responses' input items: reasoning, function_call and
    function_call_output items become the assistant turns and tool messages transformers renders (P-TMPL-2,
    P-TMPL-6)."""
    hf = AutoTokenizer.from_pretrained(tiny_checkpoint)
    ctx = context(engine)
    checked = 0
    for case in fuzz_cases(media=False):
        items = responses_input(case)
        if items is None or case.ending != {"add_generation_prompt": True}:
            continue
        knobs = {name: value for name, value in case.knobs.items() if name in STRENGTH_KWARGS}
        template_kwargs = {name: value for name, value in case.knobs.items() if name not in STRENGTH_KWARGS}
        fields = {"messages": chat_messages(items, None), "tools": case.tools,
                  "chat_template_kwargs": template_kwargs, **knobs}
        token_ids = build_chat_prompt(ChatCompletionRequest.model_validate(fields), ctx).token_ids
        expected = [{**message, "content": None} if message.get("tool_calls") else message
                    for message in case.expected]
        reference = hf.apply_chat_template(expected, tools=case.tools, return_dict=False, add_generation_prompt=True,
                                           **case.kwargs)
        assert token_ids == reference, items
        checked += 1
    assert checked >= 30


def test_remote_media_prompts_of_two_event_loops_wait_on_pools_of_their_own(engine):
    """A second loop in the process (another server over the engine, a test client's portal) waiting for a full remote
    media pool is woken when a thread of its own loop returns a token: the pool was one anyio limiter for every loop,
    whose release on one loop left the other loop's waiter asleep for good."""
    ctx = context(engine, media_policy=MediaFetchPolicy(allow_remote=True))
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://images.example/a.png"}}]}]
    first_holds, release_first, outcome = threading.Event(), threading.Event(), {}

    async def hold_the_whole_pool() -> None:
        threads = prompt_threads(messages, ctx)
        threads.total_tokens = 1
        await anyio.to_thread.run_sync(lambda: (first_holds.set(), release_first.wait()), limiter=threads)

    async def run_once_the_first_loop_is_done() -> None:
        threads = prompt_threads(messages, ctx)
        threads.total_tokens = 1
        waiting = asyncio.ensure_future(anyio.to_thread.run_sync(lambda: None, limiter=threads))
        for _ in range(3):  # into the limiter's queue, where a shared pool keeps it
            await asyncio.sleep(0)
        release_first.set()
        outcome["ran"] = await asyncio.wait_for(waiting, timeout=10) is None

    first = threading.Thread(target=lambda: asyncio.run(hold_the_whole_pool()))
    first.start()
    first_holds.wait()
    try:
        asyncio.run(run_once_the_first_loop_is_done())
    finally:
        release_first.set()
        first.join()
    assert outcome == {"ran": True}


class _LeavesOnceChecked(CancelToken):
    """A client that leaves just after the prompt last looked, while its downloads wait in the queue."""

    def check(self) -> None:
        super().check()
        self.cancel()


def test_a_prompt_whose_client_leaves_while_its_downloads_wait_for_a_fetch_thread_stops_at_once(monkeypatch):
    """A prompt waited for its first download's result without looking at its token: where every fetch thread was
    busy with other prompts' downloads, its thread stayed blocked after the client left until one came free."""
    loaded = []
    monkeypatch.setattr(chat_prompt, "load_media_reference", lambda reference, *args: loaded.append(reference))
    busy, outcome = threading.Event(), {}
    references = [("https://images.example/a.png", "image", 0), ("https://images.example/b.png", "image", 1)]
    context = SimpleNamespace(settings=SimpleNamespace(media_policy=MediaFetchPolicy(allow_remote=True)))

    def load() -> None:
        try:
            list(chat_prompt._loaded(references, context, _LeavesOnceChecked()))
        except Cancelled as error:
            outcome["error"] = error

    with ThreadPoolExecutor(1) as pool:
        pool.submit(busy.wait)  # another prompt's download holds the only fetch thread
        context.media_fetches = pool
        prompt = threading.Thread(target=load)
        prompt.start()
        prompt.join(timeout=30)  # blocked for good before the fix: ends when the pool frees, well after this
        stopped_while_busy = not prompt.is_alive()
        busy.set()
        prompt.join()
    assert stopped_while_busy and isinstance(outcome.get("error"), Cancelled)
    assert loaded == []  # the queued downloads were dropped, not run once a thread came free


def test_the_threads_fetching_remote_media_are_one_pool_for_the_process_whatever_its_contexts():
    """Each ServingContext started a pool of REMOTE_MEDIA_THREADS it never shut down, though the bound was said to be
    the whole server's: a process serving several apps (or building contexts in tests) piled up pools."""
    first, second = (ServingContext(*[None] * 6) for _ in range(2))
    assert first.media_fetches is second.media_fetches
    assert first.media_fetches._max_workers == REMOTE_MEDIA_THREADS



@pytest.fixture(scope="module")
def map_bos_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The bos named in special_tokens_map.json alone, beside `added_tokens_decoder`: unread there (as transformers
    5), so `bos_token` is None and the template writes none; tokenizer.json's post-processor still begins a text
    with it."""
    checkpoint = shutil.copytree(tiny_checkpoint, tmp_path_factory.mktemp("map_bos") / "ckpt")
    config_file = checkpoint / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    del config["bos_token"]
    config_file.write_text(json.dumps(config))
    assert "bos_token" in json.loads((checkpoint / "special_tokens_map.json").read_text())
    return checkpoint


@pytest.fixture(scope="module")
def map_bos_engine(map_bos_checkpoint):
    engine = AsyncEngine(EngineConfig(model=str(map_bos_checkpoint), progress=False, kv_cache_memory=8 << 20))
    assert engine.engine.tokenizer.bos_token is None
    yield engine
    engine.shutdown()


def test_a_bos_named_in_special_tokens_map_json_alone_begins_a_chat_request_as_llm_chat(map_bos_checkpoint,
                                                                                        map_bos_engine):
    """P-TMPL-5: the template writes no bos there and the post-processor's is added; a server chat without media was
    tokenized without it, unlike LLM.chat's."""
    bos_id = map_bos_engine.engine.tokenizer.token_to_id("<|begin_of_text|>")
    ids = build_chat_prompt(request(chat_template_kwargs=DATE), context(map_bos_engine)).token_ids
    assert ids[0] == bos_id and ids.count(bos_id) == 1
    llm = LLM(str(map_bos_checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=1024)
    assert ids == llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=1),
                           chat_template_kwargs=DATE)[0].prompt_token_ids


def test_a_second_bos_is_refused_where_only_the_post_processor_names_it(map_bos_engine):
    """P-TMPL-5's checks (the template's probe, and a prompt's count) keyed on `bos_token_id`, None there, so a
    template or a message writing the post-processor's bos gave a prompt of two."""
    doubled = SIMPLE_TEMPLATE.replace("{{ bos_token }}", "<|begin_of_text|><|begin_of_text|>")
    assert doubled != SIMPLE_TEMPLATE
    with pytest.raises(RequestError, match=re.escape("(P-TMPL-5); a probe prompt has 2")) as caught:
        build_chat_prompt(request(chat_template=doubled), trusting(map_bos_engine))
    assert caught.value.param == "chat_template"
    ctx = context(map_bos_engine, allow_control_tokens_in_content=True)
    with pytest.raises(RequestError, match=re.escape("holds 2 '<|begin_of_text|>' tokens")) as caught:
        build_chat_prompt(request(messages=[{"role": "user", "content": "<|begin_of_text|>hi"}],
                                  chat_template_kwargs=DATE), ctx)
    assert caught.value.param == "messages"
    written = SIMPLE_TEMPLATE.replace("{{ bos_token }}", "<|begin_of_text|>")
    ids = build_chat_prompt(request(chat_template=written), trusting(map_bos_engine)).token_ids
    assert ids.count(map_bos_engine.engine.tokenizer.token_to_id("<|begin_of_text|>")) == 1
