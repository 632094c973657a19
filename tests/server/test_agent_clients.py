"""Agent frameworks against the real server: the OpenAI Agents SDK (its default Responses model) and
LangChain's ChatOpenAI with `use_responses_api=True`. The network is scripted; the clients are unmodified."""

from __future__ import annotations

import asyncio

import openai
import pytest
from server_support import agent_server

agents = pytest.importorskip("agents")
langchain_openai = pytest.importorskip("langchain_openai")


@pytest.fixture(scope="module")
def server(make_tiny):
    with agent_server(make_tiny()) as live:
        yield live


def test_an_agents_sdk_agent_calls_a_tool_and_answers(server, monkeypatch):
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    agents.set_tracing_disabled(True)
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return "Sunny [sunny-result]"

    async def run() -> object:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        agents.set_default_openai_client(client, use_for_tracing=False)
        agents.set_default_openai_api("responses")
        agent = agents.Agent(name="weather", instructions="Answer about the weather.", model="tiny",
                             tools=[get_weather])
        return await agents.Runner.run(agent, "[weather] What is the weather in Paris?")

    result = asyncio.run(run())
    assert seen == ["Paris"]
    assert result.final_output == "It is sunny in Paris."


def test_an_agents_sdk_stream_yields_the_text(server):
    agents.set_tracing_disabled(True)

    async def run() -> str:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        model = agents.OpenAIResponsesModel(model="tiny", openai_client=client)
        agent = agents.Agent(name="greeter", instructions="Greet.", model=model)
        streamed = agents.Runner.run_streamed(agent, "[greet] Hello!")
        deltas = [event.data.delta async for event in streamed.stream_events()
                  if event.type == "raw_response_event" and event.data.type == "response.output_text.delta"]
        assert streamed.final_output == "Hello there!"
        return "".join(deltas)

    assert asyncio.run(run()) == "Hello there!"


def test_langchain_with_the_responses_api_answers_and_calls_tools(server):
    chat = langchain_openai.ChatOpenAI(model="tiny", base_url=server.base_url, api_key="unused", temperature=0,
                                       use_responses_api=True, max_retries=0)
    reply = chat.invoke("[greet] Hello!")
    assert reply.text == "Hello there!"
    assert reply.usage_metadata["output_tokens"] > 0

    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "sunny"

    call = chat.bind_tools([get_weather]).invoke("[weather] What is the weather in Paris?")
    assert [(c["name"], c["args"]) for c in call.tool_calls] == [("get_weather", {"city": "Paris"})]
    chunks = list(chat.stream("[greet] Hello!"))
    assert "".join(chunk.text for chunk in chunks) == "Hello there!"
