"""The API key check, on requests built here (the live server's 401s are in test_errors.py)."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from glimmer.errors import ConfigError
from glimmer.server.auth import check_api_key
from glimmer.server.errors import APIError
from glimmer.server.settings import ServerSettings


def _request(*authorization: str) -> Request:
    return _raw_request(*(value.encode() for value in authorization))


def _raw_request(*authorization: bytes) -> Request:
    """A request whose Authorization headers are these bytes, as a client put them on the wire."""
    headers = [(b"authorization", value) for value in authorization]
    return Request({"type": "http", "method": "GET", "path": "/v1/models", "headers": headers})


@pytest.mark.parametrize("key", ["sk-key\n", " sk-key", "sk-key\r\n"])
def test_a_key_read_with_a_trailing_newline_lets_its_clients_in(key):
    """`GLIMMER_API_KEY=$(cat secret)` keeps no newline, but a Kubernetes secret mounted as a variable does: the
    server compared the sent (stripped) token with `sk-key\\n`, and every request was 401 'incorrect API key'."""
    check_api_key(_request("Bearer sk-key"), key)
    with pytest.raises(APIError, match="incorrect API key"):
        check_api_key(_request("Bearer sk-other"), key)


def test_a_key_of_whitespace_alone_is_refused_as_empty():
    with pytest.raises(ConfigError, match="api_key must not be empty"):
        ServerSettings(served_model_names=("m",), api_key=" \n")


def test_any_one_of_several_keys_lets_its_client_in():
    """vLLM's `--api-key KEY1 KEY2` (a key per client, or the old and the new one while rotating): a server took one
    key, the last given."""
    for key in ("sk-old", "sk-new\n"):
        check_api_key(_request(f"Bearer {key.strip()}"), ("sk-old", "sk-new\n"))
    with pytest.raises(APIError, match="incorrect API key"):
        check_api_key(_request("Bearer sk-other"), ("sk-old", "sk-new"))
    with pytest.raises(APIError, match="missing API key"):
        check_api_key(_request(), ("sk-old", "sk-new"))


@pytest.mark.parametrize("authorization", ["sk-key", "Basic c2sta2V5", "Bearer", "Bearer  ", "Token sk-key"])
def test_an_authorization_header_that_is_not_bearer_key_says_so_without_echoing_it(authorization):
    """`curl -H "Authorization: sk-key"` (the key without its scheme) was told "missing API key", though the header
    was there, holding the right key: the 401 says what is wrong with the header, and never repeats its value."""
    with pytest.raises(APIError, match="is not `Bearer KEY`") as caught:
        check_api_key(_request(authorization), "sk-key")
    assert caught.value.status == 401 and "sk-key" not in str(caught.value) and "c2sta2V5" not in str(caught.value)


@pytest.mark.parametrize("keys", [(), ("sk-key", "")])
def test_no_keys_or_an_empty_one_among_them_is_refused_as_empty(keys):
    with pytest.raises(ConfigError, match="api_key must not be empty"):
        ServerSettings(served_model_names=("m",), api_key=keys)


@pytest.mark.parametrize("keys", ["sk-\x00secret", ("sk-old", "sk-\x7fnew"), "sk-\x1bsecret"])
def test_a_key_no_client_can_send_is_refused_at_start_without_quoting_it(keys):
    """A key holding a control character (a tab aside) starts a server no client could use: no HTTP header carries
    one, so every request would be 401 'incorrect API key' with nothing saying why."""
    with pytest.raises(ConfigError, match="holds a control character") as raised:
        ServerSettings(served_model_names=("m",), api_key=keys)
    assert "secret" not in str(raised.value) and "new" not in str(raised.value)


@pytest.mark.parametrize("key", ["clé-secret", "sk-\u200bnew", "ключ", "voilà", "ключх"])
def test_a_key_outside_ascii_lets_in_a_client_sending_it_as_utf8_or_as_latin1(key):
    """A header arrives as Latin-1: curl sends such a key as its UTF-8 bytes, a browser's fetch and `requests` as
    Latin-1 (up to U+00FF). This stop's first refusal of every key outside printable ASCII shut out the chat page and
    `requests`, which the check had let in, where curl's UTF-8 was the client left out; it takes both now. A key
    whose last character ends in byte A0 or 85 as UTF-8 (à, х) lost that byte to str.strip()."""
    ServerSettings(served_model_names=("m",), api_key=key)
    check_api_key(_raw_request(b"Bearer " + key.encode()), key)
    if all(ord(char) <= 0xFF for char in key):
        check_api_key(_raw_request(b"Bearer " + key.encode("latin-1")), key)
    with pytest.raises(APIError, match="incorrect API key"):
        check_api_key(_raw_request(b"Bearer " + key.encode()[:-1]), key)


def test_a_key_of_printable_ascii_with_inner_spaces_is_taken():
    ServerSettings(served_model_names=("m",), api_key="sk key~!")
    check_api_key(_request("Bearer sk key~!"), "sk key~!")
