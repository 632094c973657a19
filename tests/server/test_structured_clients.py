"""Client libraries' structured outputs and forced tool calls against the real server and a random tiny model.

The openai SDK's `chat.completions.parse`, LangChain's `with_structured_output` and `bind_tools(tool_choice="any")`,
the OpenAI Agents SDK's `output_type` and `tool_choice="required"` (through its Chat Completions model class). The
models' and tools' fields are bounded (literals, ranges, short strings) so a model that follows no instruction finishes
quickly; `thinking_token_budget: 0` keeps it from reasoning forever (it never ends reasoning by itself).
"""

from __future__ import annotations

import asyncio
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field
from server_support import PINNED_DATE, live_server

EXTRA = {"chat_template_kwargs": PINNED_DATE, "thinking_token_budget": 0}


class Weather(BaseModel):
    city: str = Field(max_length=6)
    days: int = Field(ge=1, le=7)
    sky: Literal["clear", "grey"]


def lookup(unit: Literal["c", "f"], detailed: bool) -> str:
    """Look the weather up."""
    return f"{unit} {detailed}"


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny()) as live:
        yield live


def test_openai_sdk_parse_returns_the_pydantic_object(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    for seed in range(3):
        completion = client.chat.completions.parse(model="tiny", messages=[{"role": "user", "content": "Weather?"}],
                                                   response_format=Weather, max_tokens=80, seed=seed, extra_body=EXTRA)
        assert isinstance(completion.choices[0].message.parsed, Weather)


def test_langchain_structured_output_and_forced_tools(server):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model="tiny", base_url=server.base_url, api_key="unused", max_retries=0, max_tokens=80,
                      seed=1, extra_body=EXTRA)
    assert isinstance(chat.with_structured_output(Weather).invoke("Weather in Oslo?"), Weather)

    forced = chat.bind_tools([tool(lookup)], tool_choice="any")
    message = forced.invoke("Weather in Oslo?")
    assert message.tool_calls and all(call["name"] == "lookup" for call in message.tool_calls)
    assert message.tool_calls[0]["args"]["unit"] in ("c", "f")


def test_openai_agents_output_type_and_required_tool_choice(server):
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    async def run() -> tuple[object, object]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
            model = OpenAIChatCompletionsModel(model="tiny", openai_client=client)
            settings = ModelSettings(max_tokens=80, extra_body=EXTRA)
            structured = Agent(name="weather", instructions="Answer with the weather.", model=model,
                               output_type=Weather, model_settings=settings)
            answer = await Runner.run(structured, "Weather in Oslo?")
            calls = []

            @function_tool
            def look_up(unit: Literal["c", "f"], detailed: bool) -> str:
                """Look the weather up."""
                calls.append((unit, detailed))
                return f"looked up {unit}"

            forced = Agent(name="caller", instructions="Use the tool.", model=model, tools=[look_up],
                           tool_use_behavior="stop_on_first_tool",
                           model_settings=ModelSettings(max_tokens=80, tool_choice="required", extra_body=EXTRA,
                                                        parallel_tool_calls=False))
            called = await Runner.run(forced, "Weather in Oslo?")
            assert len(calls) == 1
            return answer.final_output, called.final_output

    answer, called = asyncio.run(run())
    assert isinstance(answer, Weather)
    assert called in ("looked up c", "looked up f")


def test_the_sdk_streams_a_tool_call_reply_to_the_logprobs_it_answers_unstreamed(server):
    """A reply of calls alone has no answer tokens: `logprobs.content` is empty, streamed as not, so the SDK's
    accumulated completion reads `logprobs.content` as the non-streamed one does (README: the entries streamed add
    up to the non-streamed list)."""

    class Forecast(BaseModel):
        sky: Literal["clear", "grey"]

    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    request = {"model": "tiny", "messages": [{"role": "user", "content": "Forecast?"}], "max_tokens": 80,
               "temperature": 0, "logprobs": True, "tools": [openai.pydantic_function_tool(Forecast)],
               "tool_choice": "required", "parallel_tool_calls": False, "extra_body": EXTRA}
    answered = client.chat.completions.parse(**request).choices[0]
    with client.chat.completions.stream(**request) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert answered.finish_reason == streamed.finish_reason == "tool_calls"
    calls = [choice.message.tool_calls[0].function.parsed_arguments for choice in (answered, streamed)]
    assert calls[0] == calls[1]
    assert answered.logprobs is not None and answered.logprobs.content == []
    assert streamed.logprobs is not None and streamed.logprobs.content == []
