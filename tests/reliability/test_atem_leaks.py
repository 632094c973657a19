"""The two ATEM leaks through the real server: no `<atem:` markup in content, streamed or not (issue 8).

Only the network is scripted; engine, detokenizer, parser and HTTP layers are real. Protocol-level shapes and
all chunkings are in tests/protocol/test_atem_markup.py (P-CHAN-2, P-CHAN-7, P-STREAM-2, P-STREAM-6).
"""

from __future__ import annotations

import httpx
import pytest
from reliability_support import chat_body, sse_events
from server_support import WEATHER_TOOL, live_server

ANSWER_CUT_IN_A_TAG = ' to=user<|message|>Let me check the weather. <atem:invoke name="get_wea'
VALUE_WITH_A_HEADER = (' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
                       '<atem:parameter name="city">Paris to=user<|message|>It is sunny, I think.</atem:parameter>\n'
                       '<atem:parameter name="days">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls>')
SCRIPTS = {"[cut]": ANSWER_CUT_IN_A_TAG, "[value-header]": VALUE_WITH_A_HEADER}


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny(), scripted=True) as live:
        for key, transcript in SCRIPTS.items():
            live.engine.engine.runner.add(key, transcript)
        yield live


def content_both_ways(server, key: str) -> tuple[str, str]:
    body = chat_body(messages=[{"role": "user", "content": key}], max_tokens=200, temperature=0,
                     tools=[WEATHER_TOOL])
    whole = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    assert whole.status_code == 200, whole.text
    streamed = httpx.post(server.base_url + "/chat/completions", json={**body, "stream": True}, timeout=60)
    deltas = [choice["delta"].get("content") or "" for event in sse_events(streamed.text)
              for choice in event["choices"]]
    return whole.json()["choices"][0]["message"]["content"] or "", "".join(deltas)


@pytest.mark.parametrize(("key", "expected"), [("[cut]", "Let me check the weather. "),
                                               ("[value-header]", "It is sunny, I think.3")])
def test_no_atem_markup_reaches_content(server, key, expected):
    whole, streamed = content_both_ways(server, key)
    assert whole == streamed == expected
    assert "<atem:" not in whole and "</atem:" not in whole
