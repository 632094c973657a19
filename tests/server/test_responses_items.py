"""GET /v1/responses/{id}/input_items, POST /v1/responses/{id}/cancel, POST /v1/responses/input_tokens and
POST /v1/responses/compact through the official `openai` SDK (`responses.input_items.list`, `responses.cancel`,
`responses.input_tokens.count`, `responses.compact`): routes that did not exist (404, 404, 405 and 405)."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_support import PINNED_DATE, agent_server

from glimmer.server.responses_items import input_items_page

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
EXTRA = {"chat_template_kwargs": PINNED_DATE}


@pytest.fixture(scope="module")
def server(make_tiny):
    with agent_server(make_tiny()) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def chain(client):
    """A call, then its result sent with previous_response_id: (first response, the one continuing it)."""
    first = client.responses.create(model="tiny", temperature=0, extra_body=EXTRA, tools=[WEATHER_TOOL],
                                    input=[{"role": "user", "content": "[weather] Weather in Paris?"}])
    call = next(item for item in first.output if item.type == "function_call")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny [sunny-result]"}
    second = client.responses.create(model="tiny", temperature=0, extra_body=EXTRA, tools=[WEATHER_TOOL],
                                     input=[result], previous_response_id=first.id)
    return first, second


def test_input_items_are_the_chain_then_the_own_input_newest_first_by_default(client, chain):
    first, second = chain
    listed = client.responses.input_items.list(second.id)
    assert listed.has_more is False
    items = list(reversed(listed.data))  # desc by default, as OpenAI's
    assert [item.type for item in items] == ["message", *(item.type for item in first.output),
                                            "function_call_output"]
    user = items[0]
    assert user.role == "user" and [part.model_dump(exclude_none=True) for part in user.content] == [
        {"type": "input_text", "text": "[weather] Weather in Paris?"}]
    assert [item.id for item in items[1:-1]] == [item.id for item in first.output]  # the chain's outputs, as they were
    assert items[-1].call_id == first.output[-1].call_id and items[-1].output == "Sunny [sunny-result]"
    assert all(item.id and item.status == "completed" for item in items)
    asc = client.responses.input_items.list(second.id, order="asc")
    assert [item.id for item in asc.data] == [item.id for item in items]
    assert (asc.first_id, asc.last_id) == (items[0].id, items[-1].id)


def test_an_input_item_keeps_its_id_in_the_lists_of_the_responses_continuing_it(client, chain):
    first, second = chain
    own = client.responses.input_items.list(first.id).data
    assert len(own) == 1 and own[0].id.startswith("msg_")
    assert own[0].id == client.responses.input_items.list(second.id, order="asc").data[0].id


def test_the_sdk_pages_through_the_items_with_after(client, chain):
    _, second = chain
    every = client.responses.input_items.list(second.id, order="asc").data
    page = client.responses.input_items.list(second.id, order="asc", limit=2)
    assert [item.id for item in page.data] == [item.id for item in every[:2]] and page.has_more is True
    assert [item.id for item in page] == [item.id for item in every]  # auto-pagination follows `after`
    tail = client.responses.input_items.list(second.id, order="asc", after=every[-2].id, limit=5)
    assert [item.id for item in tail.data] == [every[-1].id] and tail.has_more is False


def test_before_lists_the_page_nearest_the_cursor(server, chain):
    _, second = chain
    url = f"{server.base_url}/responses/{second.id}/input_items"
    ids = [item["id"] for item in httpx.get(url, params={"order": "asc"}).json()["data"]]
    page = httpx.get(url, params={"order": "asc", "before": ids[-1], "limit": 2}).json()
    assert [item["id"] for item in page["data"]] == ids[-3:-1] and page["has_more"] is True
    first_page = httpx.get(url, params={"order": "asc", "before": ids[1], "limit": 2}).json()
    assert [item["id"] for item in first_page["data"]] == ids[:1] and first_page["has_more"] is False


def test_an_item_sent_with_an_id_is_listed_under_it(client):
    response = client.responses.create(model="tiny", temperature=0, extra_body=EXTRA, input=[
        {"type": "message", "role": "user", "content": "[greet] Hi", "id": "msg_mine"}])
    assert [item.id for item in client.responses.input_items.list(response.id).data] == ["msg_mine"]


def test_input_items_of_a_response_not_stored_are_404(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_missing")
    unstored = client.responses.create(model="tiny", temperature=0, extra_body=EXTRA, input="[greet] Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(unstored.id)


@pytest.mark.parametrize(("params", "param"), [
    ({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"limit": "many"}, "limit"), ({"order": "up"}, "order"),
    ({"after": "msg_nowhere"}, "after"), ({"before": "msg_nowhere"}, "before"),
    ({"include[]": "file_search_call.results"}, "include"), ({"cursor": "x"}, "cursor"),
])
def test_a_bad_query_parameter_is_400_naming_it(server, chain, params, param):
    _, second = chain
    response = httpx.get(f"{server.base_url}/responses/{second.id}/input_items", params=params)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_the_sdk_include_parameter_is_taken(client, chain):
    _, second = chain
    listed = client.responses.input_items.list(second.id, include=["message.output_text.logprobs"])
    assert listed.data == client.responses.input_items.list(second.id).data


def test_a_page_of_an_empty_list_names_no_ids():
    page = input_items_page([], {})
    assert page == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


def test_cancel_refuses_a_finished_response_and_404s_an_unknown_one(client, chain):
    """Only background responses can be cancelled (OpenAI), and Glimmer refuses `background: true`."""
    first, _ = chain
    with pytest.raises(openai.BadRequestError, match="only background responses") as refused:
        client.responses.cancel(first.id)
    assert refused.value.body["param"] == "response_id"
    assert client.responses.retrieve(first.id).status == "completed"  # still stored, untouched
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_missing")
    with pytest.raises(openai.BadRequestError) as background:
        client.responses.create(model="tiny", input="[greet] Hi", background=True)
    assert background.value.body["param"] == "background"


def test_input_tokens_count_is_the_usage_the_same_request_reports(client, chain):
    """`responses.input_tokens.count` (POST /v1/responses/input_tokens) was a 405."""
    first, second = chain
    result = {"type": "function_call_output", "call_id": first.output[-1].call_id, "output": "Sunny [sunny-result]"}
    counted = client.responses.input_tokens.count(model="tiny", tools=[WEATHER_TOOL], input=[result],
                                                  previous_response_id=first.id, extra_body=EXTRA)
    assert counted.object == "response.input_tokens" and counted.input_tokens == second.usage.input_tokens
    alone = client.responses.input_tokens.count(model="tiny", input="[greet] Hi", instructions="Be brief.",
                                                extra_body=EXTRA)
    created = client.responses.create(model="tiny", input="[greet] Hi", instructions="Be brief.", extra_body=EXTRA,
                                      store=False)
    assert alone.input_tokens == created.usage.input_tokens


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"input": "[greet] Hi", "temperature": 0}, 400, "temperature"),  # no field of the count: it changes no prompt
    ({"input": "[greet] Hi", "personality": "friendly"}, 400, "personality"),
    ({"input": "[greet] Hi", "conversation": "conv_1"}, 400, "conversation"),
    ({}, 400, "input"),  # nothing to count
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, 400, "input[0].call_id"),
    ({"input": "[greet] Hi", "previous_response_id": "resp_missing"}, 400, "previous_response_id"),
    ({"input": "[greet] Hi", "model": "other"}, 404, "model"),
])
def test_input_tokens_of_a_request_create_would_refuse_is_refused_naming_the_field(server, body, status, param):
    response = httpx.post(f"{server.base_url}/responses/input_tokens", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_compaction_is_refused_by_name_not_with_a_bare_405(client):
    with pytest.raises(openai.BadRequestError, match="compaction is not supported"):
        client.responses.compact(model="tiny", input="[greet] Hi")


def test_each_route_under_a_response_is_counted_under_its_own_endpoint(server, chain):
    """A token count, a page of input items and a cancel were all counted as `/v1/responses/{id}` in /metrics, the
    fetch of a stored response."""
    first, _ = chain
    before = server.metrics()
    assert httpx.post(server.base_url + "/responses/input_tokens", json={"model": "tiny", "input": "hi"},
                      timeout=30).status_code == 200
    assert httpx.get(server.base_url + f"/responses/{first.id}/input_items", timeout=30).status_code == 200
    assert httpx.post(server.base_url + f"/responses/{first.id}/cancel", timeout=30).status_code == 400
    assert httpx.get(server.base_url + f"/responses/{first.id}", timeout=30).status_code == 200
    after = server.metrics()
    key = 'glimmer_requests_total{endpoint="%s",status="%s"}'
    for endpoint, status in (("/v1/responses/input_tokens", 200), ("/v1/responses/{id}/input_items", 200),
                             ("/v1/responses/{id}/cancel", 400), ("/v1/responses/{id}", 200)):
        assert after.get(key % (endpoint, status), 0) - before.get(key % (endpoint, status), 0) == 1, endpoint
