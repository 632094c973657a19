"""vLLM's POST /tokenize and POST /detokenize through the real server on a random tiny model: the counts agree with
the generating endpoints' usage, bad input is a 400 naming the field, and the routes sit behind the API key."""

from __future__ import annotations

import httpx
import pytest
from server_support import PINNED_DATE, WEATHER_TOOL, live_server

KEY = "sk-tokenize"
AUTH = {"Authorization": f"Bearer {KEY}"}
MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny(), api_key=KEY) as live:
        yield live


def post(server, path: str, **body) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=30)


def error_param(response: httpx.Response) -> str | None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error["param"]


def error_message(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    return response.json()["error"]["message"]


def test_a_prompt_counts_as_completions_count_it_with_the_bos_unless_add_special_tokens_is_false(server):
    usage = post(server, "/v1/completions", model="tiny", prompt="The sky is blue", max_tokens=1).json()["usage"]
    tokenized = post(server, "/tokenize", model="tiny", prompt="The sky is blue").json()
    assert tokenized["count"] == len(tokenized["tokens"]) == usage["prompt_tokens"]
    assert tokenized["max_model_len"] == 2048
    assert tokenized["token_strs"] is None  # vLLM's TokenizeResponse sends the field as null
    bos_id = server.engine.engine.tokenizer.bos_token_id
    assert tokenized["tokens"][0] == bos_id
    bare = post(server, "/tokenize", prompt="The sky is blue", add_special_tokens=False).json()
    assert bare["tokens"] == tokenized["tokens"][1:]


def test_completions_read_a_text_without_the_bos_under_vllms_add_special_tokens_false_as_tokenize_does(server):
    bare = post(server, "/tokenize", prompt="The sky is blue", add_special_tokens=False).json()["tokens"]
    scored = {"model": "tiny", "max_tokens": 0, "echo": True, "logprobs": 0}
    as_text = post(server, "/v1/completions", prompt="The sky is blue", add_special_tokens=False, **scored).json()
    as_ids = post(server, "/v1/completions", prompt=bare, **scored).json()
    assert as_text["usage"]["prompt_tokens"] == len(bare) and as_text["choices"][0]["text"] == "The sky is blue"
    assert as_text["choices"][0]["logprobs"] == as_ids["choices"][0]["logprobs"]
    batch = post(server, "/v1/completions", prompt=["The sky", "is blue"], add_special_tokens=False, **scored).json()
    counts = [post(server, "/tokenize", prompt=text, add_special_tokens=False).json()["count"]
              for text in ("The sky", "is blue")]
    assert batch["usage"]["prompt_tokens"] == sum(counts)
    with_bos = post(server, "/v1/completions", prompt="The sky is blue", add_special_tokens=True, **scored).json()
    assert with_bos["usage"]["prompt_tokens"] == len(bare) + 1
    assert error_param(post(server, "/v1/completions", model="tiny", prompt="hi", add_special_tokens="no")) == \
        "add_special_tokens"


def test_token_strs_are_the_vocabulary_entries_of_the_tokens(server):
    tokenized = post(server, "/tokenize", prompt="The sky", return_token_strs=True).json()
    tokenizer = server.engine.engine.tokenizer
    assert tokenized["token_strs"] == [tokenizer.id_to_token(token_id) for token_id in tokenized["tokens"]]


@pytest.mark.parametrize("fields", [{}, {"tools": [WEATHER_TOOL]}], ids=["plain", "tools"])
def test_messages_count_as_the_chat_endpoint_renders_them(server, fields):
    chat = {"messages": MESSAGES, "chat_template_kwargs": PINNED_DATE, **fields}
    usage = post(server, "/v1/chat/completions", model="tiny", max_tokens=1, **chat).json()["usage"]
    tokenized = post(server, "/tokenize", model="tiny", **chat).json()
    assert tokenized["count"] == usage["prompt_tokens"]


def test_add_generation_prompt_and_continue_final_message_end_the_prompt_where_chat_would(server):
    def tokens(**fields) -> list[int]:
        return post(server, "/tokenize", chat_template_kwargs=PINNED_DATE, **fields).json()["tokens"]

    with_prompt = tokens(messages=MESSAGES)
    without = tokens(messages=MESSAGES, add_generation_prompt=False)
    assert with_prompt[:len(without)] == without and len(with_prompt) > len(without)
    continued = [*MESSAGES, {"role": "assistant", "content": "It is"}]
    text = post(server, "/detokenize", tokens=tokens(messages=continued, continue_final_message=True)).json()
    assert text["prompt"].endswith("It is")


def test_mm_processor_kwargs_is_taken_with_messages_as_the_chat_endpoint_takes_it(server):
    """vLLM's TokenizeChatRequest has chat's mm_processor_kwargs: a client counting a chat request's prompt by sending
    its fields to /tokenize, `mm_processor_kwargs: {}` among them, was refused for an unknown field where the chat
    endpoint took it; an override is refused as chat refuses it, and beside a prompt it is a chat field."""
    plain = post(server, "/tokenize", messages=MESSAGES, chat_template_kwargs=PINNED_DATE).json()
    assert post(server, "/tokenize", messages=MESSAGES, chat_template_kwargs=PINNED_DATE,
                mm_processor_kwargs={}).json() == plain
    refused = post(server, "/tokenize", messages=MESSAGES, mm_processor_kwargs={"max_pixels": 4})
    assert error_param(refused) == "mm_processor_kwargs.max_pixels"
    assert refused.json()["error"]["message"] == error_message(post(
        server, "/v1/chat/completions", model="tiny", messages=MESSAGES, mm_processor_kwargs={"max_pixels": 4}))
    assert error_param(post(server, "/tokenize", prompt="hi", mm_processor_kwargs={})) == "mm_processor_kwargs"


def test_detokenize_gives_back_the_text_special_tokens_kept(server):
    tokenized = post(server, "/tokenize", prompt="Hello there<|eot|>").json()
    detokenized = post(server, "/detokenize", model="tiny", tokens=tokenized["tokens"]).json()
    bos = server.engine.engine.tokenizer.bos_token
    assert detokenized == {"prompt": bos + "Hello there<|eot|>"}
    assert post(server, "/detokenize", tokens=[]).json() == {"prompt": ""}


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/detokenize", {"tokens": [5, 10**9]}, "tokens[1]"),
    ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
    ("/detokenize", {"tokens": [2**70]}, "tokens[0]"),
    ("/detokenize", {"tokens": "5 6"}, "tokens"),
    ("/detokenize", {"tokens": [5, "6"]}, "tokens[1]"),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": [5] * 2049}, "tokens"),
    ("/tokenize", {"prompt": "hi", "messages": MESSAGES}, "prompt"),
    ("/tokenize", {}, "messages"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "hi", "tools": [WEATHER_TOOL]}, "tools"),
    ("/tokenize", {"messages": MESSAGES, "add_special_tokens": True}, "add_special_tokens"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("/tokenize", {"prompt": "hi", "truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
], ids=lambda value: value if isinstance(value, str) and len(value) < 40 else None)
def test_bad_input_is_a_400_naming_the_field(server, path, body, param):
    assert error_param(post(server, path, **body)) == param


@pytest.mark.parametrize("prompt", [5, ["one", "two"], [5, 6], [[5]], True])
def test_a_prompt_that_is_no_string_is_refused_saying_tokenize_takes_one_text(server, prompt):
    """It was told that a prompt "must be a string, a list of strings, a list of token ids or a list of lists of token
    ids", the completions endpoint's shapes: a client sending a list of strings read that it sent what it must."""
    response = post(server, "/tokenize", prompt=prompt)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == {
        "message": "prompt: must be a string: /tokenize takes one text prompt (send one request per text)",
        "type": "invalid_request_error", "param": "prompt", "code": None}


@pytest.mark.parametrize("fields", [{"prompt": "The sky", "messages": None, "tools": None},
                                    {"prompt": None, "messages": MESSAGES, "chat_template_kwargs": PINNED_DATE}],
                         ids=["prompt", "messages"])
def test_a_field_sent_as_null_is_unset(server, fields):
    """A client that sends its unset fields as null (None in Python) was refused for giving both prompt and messages,
    or a chat field beside a prompt."""
    sent = {name: value for name, value in fields.items() if value is not None}
    assert post(server, "/tokenize", **fields).json() == post(server, "/tokenize", **sent).json()


def test_a_null_prompt_is_none_sent_not_an_empty_text(server):
    assert error_param(post(server, "/tokenize", prompt=None)) == "messages"


@pytest.mark.parametrize("fields", [{}, {"add_special_tokens": False}])
def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_tokenizing(server, fields):
    too_long = "x" * (server.engine.engine.max_prompt_chars + 1)
    response = post(server, "/tokenize", prompt=too_long, **fields)
    assert error_param(response) == "prompt" and "shorten the prompt" in response.json()["error"]["message"]
    too_long_chat = [{"role": "user", "content": too_long}]
    assert error_param(post(server, "/tokenize", messages=too_long_chat)) == "messages"


def test_an_unknown_model_is_a_404(server):
    response = post(server, "/tokenize", model="other", prompt="hi")
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_the_routes_are_behind_the_api_key_and_counted_in_the_metrics(server, path):
    response = httpx.post(server.url + path, json={"prompt": "hi", "tokens": [5]}, timeout=30)
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    samples = server.metrics()
    assert samples[f'glimmer_requests_total{{endpoint="{path}",status="401"}}'] >= 1


def test_a_checkpoint_that_splits_special_tokens_has_a_text_prompts_spellings_tokenized_as_text(server, make_tiny,
                                                                                                tmp_path):
    """tokenizer_config.json's split_special_tokens: /tokenize and /v1/completions read a text prompt's `<|eot|>` as
    its characters, as transformers and vLLM do (it was the control token); a chat's markup stays control tokens."""
    import json
    import shutil

    from transformers import AutoTokenizer

    checkpoint = tmp_path / "split"
    shutil.copytree(make_tiny(), checkpoint)
    config_file = checkpoint / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "split_special_tokens": True}))
    hf = AutoTokenizer.from_pretrained(str(checkpoint))
    text = "<|begin_of_text|>Stop at <|eot|> here"
    scored = {"model": "tiny", "max_tokens": 0, "echo": True, "logprobs": 0}
    with live_server(checkpoint, api_key=KEY) as split:
        for add_special_tokens in (True, False):
            expected = hf(text, add_special_tokens=add_special_tokens)["input_ids"]
            assert post(split, "/tokenize", prompt=text, add_special_tokens=add_special_tokens).json()["tokens"] == \
                expected
            completion = post(split, "/v1/completions", prompt=text, add_special_tokens=add_special_tokens, **scored)
            assert completion.json()["usage"]["prompt_tokens"] == len(expected)
        chat = post(split, "/tokenize", messages=MESSAGES, add_generation_prompt=True).json()["tokens"]
    assert chat == post(server, "/tokenize", messages=MESSAGES, add_generation_prompt=True).json()["tokens"]
