"""What an operator decides about a server, validated once when the app is created."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from glimmer.errors import ConfigError
from glimmer.multimodal.settings import MediaFetchPolicy
from glimmer.protocol import REASONING_STRENGTHS

DEFAULT_MAX_REQUEST_BYTES = 4 << 20
"""Request bodies above this are refused with 413 before any JSON is parsed."""
DEFAULT_MAX_REQUEST_BYTES_WITH_MEDIA = 32 << 20
"""The default for a model with a vision tower: images arrive base64-encoded in the body."""
DEFAULT_REQUEST_READ_TIMEOUT_S = 30.0
"""How long a connection may keep the server waiting for its request's head, or between two reads of its body
(glimmer/server/connection.py)."""
DEFAULT_MAX_N = 16
"""The most completions one chat or completion request may ask for (`n`)."""
MAX_BATCH_PROMPTS = 64
"""The most prompts one /v1/completions request may carry."""
DEFAULT_RESPONSES_STORE_BYTES = 64 << 20
"""Stored responses (for previous_response_id) beyond this size, as JSON, evict the oldest."""
DEFAULT_RESPONSES_STORE_AGE_S = 3600.0
API_KEY_ROUTES = ("/v1", "/tokenize", "/detokenize", "/invocations", "/openapi.json")
"""The routes, each with every path under it, that a server's API key guards (/metrics too where
metrics_require_api_key): what `glimmer serve --api-key` names. app.py guards its routers itself; a test in
tests/server/test_errors.py checks that the routes answering 401 without the key are these."""
REMOTE_MEDIA_THREADS = 40
"""Prompts that fetch media over http(s) are built on a pool of threads of their own, this many at once (as many as
anyio's default pool, where every other request's prompt is built): a slow image host holds a thread for up to the
fetch's time limit per item, so a few dozen such requests would otherwise leave no thread to any other request."""
MAX_STOP_STRINGS = 16
STOP_STRINGS_SIZE_RULE = f"at most {MAX_STOP_STRINGS} stop strings are allowed"
MAX_STOP_STRING_CHARS = 256


@dataclass(frozen=True)
class ServerSettings:
    """served_model_names: the names clients may put in `model`; a response reports the name its request gave (the
    first where it gave none, or an empty one), as vLLM's does, and /metrics labels its series with the first.
    api_key: if set, every request to API_KEY_ROUTES needs `Authorization: Bearer <api_key>`; several keys (a
    tuple, as vLLM's --api-key takes them): any one of them.
    default_reasoning_strength: passed to the template when a request names none (P-EFF-1).
    media_policy: where images and videos may come from (data URLs always; local files and http(s) only
        as the operator allows).
    max_images_per_request / max_videos_per_request: more items in one request are refused with 400.
    require_cache_salt: refuse (400) chat, completion and responses requests without a `cache_salt`, so no request
        shares cached prompt blocks with another unless they name the same salt.
    responses_store_bytes / responses_store_age_s: how much of the stored /v1/responses (for
        previous_response_id) is kept in memory, and for how long.
    allowed_origins: web origins whose pages may call the API from a browser (CORS); none by default, "*" for any.
    metrics_require_api_key: /metrics also needs the API key (it tells who else uses the server, and how much).
    allow_control_tokens_in_content: render control-token text in messages and template variables as those
        control tokens (only for trusted callers: a user could forge turns); by default it stays plain text.
    trust_request_chat_template: render a chat request's own `chat_template` (vLLM's field and flag): a Jinja
        template the server runs, in the sandbox checkpoint templates run in; off by default, when such a request
        is refused (400).
    request_id_headers: every response carries the request's `X-Request-Id`, or one made for it (vLLM's
        --enable-request-id-headers).
    default_chat_template_kwargs: template variables every chat request gets, under its own chat_template_kwargs,
        whose values win (vLLM's --default-chat-template-kwargs); reasoning variables are default_reasoning_strength.
    max_header_count: more header fields in a request are answered 431 (vLLM's --h11-max-header-count); None: no
        limit but the HTTP parser's on the head's size.
    """

    served_model_names: tuple[str, ...]
    api_key: str | tuple[str, ...] | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_n: int = DEFAULT_MAX_N
    default_reasoning_strength: str | None = None
    media_policy: MediaFetchPolicy = field(default_factory=MediaFetchPolicy)
    max_images_per_request: int = 16
    max_videos_per_request: int = 2
    require_cache_salt: bool = False
    responses_store_bytes: int = DEFAULT_RESPONSES_STORE_BYTES
    responses_store_age_s: float = DEFAULT_RESPONSES_STORE_AGE_S
    allowed_origins: tuple[str, ...] = ()
    metrics_require_api_key: bool = False
    allow_control_tokens_in_content: bool = False
    trust_request_chat_template: bool = False
    request_id_headers: bool = False
    max_header_count: int | None = None
    default_chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.served_model_names or not all(isinstance(n, str) and n for n in self.served_model_names):
            raise ConfigError("served_model_names must hold at least one non-empty name")
        repeated = sorted({n for n in self.served_model_names if self.served_model_names.count(n) > 1})
        if repeated:
            raise ConfigError(f"served_model_names: {', '.join(map(repr, repeated))} given more than once "
                              "(/v1/models would list it twice); give each name once")
        keys = api_keys(self.api_key)
        if self.api_key is not None and not (keys and all(key.strip() for key in keys)):
            raise ConfigError("api_key must not be empty; leave it unset to serve without a key")
        if not all(sendable_in_a_header(key.strip()) for key in keys):  # a secret: the message does not quote it
            raise ConfigError(f"api_key {UNSENDABLE_KEY}")
        if self.max_request_bytes < 1024:
            raise ConfigError(f"max_request_bytes={self.max_request_bytes} is too small; use at least 1024")
        for name in ("max_images_per_request", "max_videos_per_request"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must not be negative")
        if self.metrics_require_api_key and self.api_key is None:
            raise ConfigError("metrics_require_api_key needs an api_key (--api-key) to require")
        if self.max_header_count is not None and self.max_header_count < 1:
            raise ConfigError(f"max_header_count={self.max_header_count} would refuse every request; give at least 1")
        from glimmer.engine.chat_rendering import RENDERING_ARGUMENT_NAMES, STRENGTH_KWARGS  # (torch: not for --help)

        for name in (*RENDERING_ARGUMENT_NAMES, *STRENGTH_KWARGS):
            if name in self.default_chat_template_kwargs:
                fix = "give default_reasoning_strength" if name in STRENGTH_KWARGS else "it is a request's field"
                raise ConfigError(f"default_chat_template_kwargs may not set {name!r}: {fix}")
        if self.max_n < 1:
            raise ConfigError(f"max_n={self.max_n} must be at least 1")
        strength = self.default_reasoning_strength
        if strength is not None and strength not in REASONING_STRENGTHS:
            raise ConfigError(f"default_reasoning_strength={strength!r} is not one of {', '.join(REASONING_STRENGTHS)}")


UNSENDABLE_KEY = ("holds a control character, which no HTTP header can carry (RFC 9110 §5.5), so every request would "
                  "be 401 'incorrect API key'; use a key without one")


def sendable_in_a_header(key: str) -> bool:
    """Whether an HTTP client can send `key` in a header: no control character but a tab inside (RFC 9110 §5.5).
    A key outside ASCII is sent as its UTF-8 bytes (curl) or, up to U+00FF, as Latin-1 (browsers, `requests`);
    `check_api_key` takes either. The openai SDK sends ASCII alone (`ascii_only_clients_warning`)."""
    return not any((char < " " and char != "\t") or char == "\x7f" for char in key)


def ascii_only_clients_warning(keys: tuple[str, ...]) -> str | None:
    """What to tell an operator whose key holds a character outside ASCII, which the openai SDK cannot send (its
    HTTP client encodes header values as ASCII); None for keys of ASCII alone."""
    if all(key.isascii() for key in keys):
        return None
    return ("an API key holds a character outside ASCII: curl (UTF-8) and browsers or `requests` (Latin-1, up to "
            "U+00FF) can send it, the openai SDK cannot (it sends ASCII header values alone)")


def api_keys(api_key: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """ServerSettings.api_key as a tuple of keys (none: no key needed)."""
    if api_key is None:
        return ()
    return (api_key,) if isinstance(api_key, str) else tuple(api_key)
