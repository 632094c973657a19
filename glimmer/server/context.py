"""What every request handler needs, built once when the app is created."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from anyio import CapacityLimiter

from glimmer.engine.async_engine import AsyncEngine
from glimmer.engine.grammar import GrammarCompiler
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import ConfigError, RequestError
from glimmer.protocol import ChatTemplate
from glimmer.server.errors import APIError
from glimmer.server.metrics import ServerMetrics
from glimmer.server.response_store import ResponseStore
from glimmer.server.settings import REMOTE_MEDIA_THREADS, ServerSettings

_media_fetches: ThreadPoolExecutor | None = None  # ServingContext.media_fetches, one for the process
_media_fetches_lock = threading.Lock()


@dataclass
class ServingContext:
    engine: AsyncEngine
    settings: ServerSettings
    tokenizer: Tokenizer
    template: ChatTemplate
    metrics: ServerMetrics
    grammars: GrammarCompiler
    created: int = field(default_factory=lambda: int(time.time()))
    hidden_special_tokens: frozenset[int] = frozenset()
    """Special tokens chat answers do not show (every one but the framing markers), `Tokenizer.hidden_in_replies`."""
    responses: ResponseStore = field(default_factory=lambda: ResponseStore(0, 0.0))
    _remote_media_limiters: WeakKeyDictionary[asyncio.AbstractEventLoop, CapacityLimiter] = field(
        default_factory=WeakKeyDictionary, repr=False)

    @classmethod
    def create(cls, engine: AsyncEngine, settings: ServerSettings) -> ServingContext:
        """Raises CheckpointError (no chat template) or ConfigError (a template that breaks the protocol: the engine
        probes it as it compiles it; default chat template kwargs every request would be refused for)."""
        llm_engine = engine.engine
        tokenizer = llm_engine.tokenizer
        template = llm_engine.chat_template
        try:  # refused in every request, a default the client never sent would be blamed on its chat_template_kwargs
            template.check_kwargs(settings.default_chat_template_kwargs, tokenizer.special_tokens)
        except RequestError as error:
            raise ConfigError(f"default_chat_template_kwargs (--default-chat-template-kwargs): {error}") from None
        # index the vocabulary for the grammar engine at startup, not on the first structured request
        return cls(engine, settings, tokenizer, template, ServerMetrics(engine, settings.served_model_names[0]),
                   llm_engine.grammars, hidden_special_tokens=tokenizer.hidden_in_replies,
                   responses=ResponseStore(settings.responses_store_bytes, settings.responses_store_age_s))

    def remote_media_threads(self) -> CapacityLimiter:
        """The worker threads that build the prompts fetching media over http(s) (`chat_prompt.prompt_threads`), a pool
        of REMOTE_MEDIA_THREADS for each event loop serving this context, as anyio's default pool is. One limiter is
        bound to one loop: a thread returning its token wakes the next waiter on the returning thread's loop, so a
        limiter shared by two loops (two servers over one engine, a test client's portals) left the other loop's
        waiters asleep for good once the pool was full."""
        loop = asyncio.get_running_loop()
        limiter = self._remote_media_limiters.get(loop)
        if limiter is None:
            limiter = self._remote_media_limiters.setdefault(loop, CapacityLimiter(REMOTE_MEDIA_THREADS))
        return limiter

    @property
    def media_fetches(self) -> ThreadPoolExecutor:
        """The threads that download a request's http(s) images and videos beside each other (`chat_prompt._loaded`):
        one pool of REMOTE_MEDIA_THREADS for the process, whatever its servers and contexts, as the host-name lookups
        are one bound for the process (`remote_fetch.MAX_PENDING_LOOKUPS`), started on first use and left to Python's
        exit to end, as anyio's own worker threads are. A prompt's thread waits on them, never the other way round,
        so none waits for a thread it holds."""
        global _media_fetches
        with _media_fetches_lock:
            if _media_fetches is None:
                _media_fetches = ThreadPoolExecutor(REMOTE_MEDIA_THREADS, thread_name_prefix="glimmer-media-fetch")
            return _media_fetches

    @property
    def model_has_vision(self) -> bool:
        return self.engine.engine.model_config.vision is not None

    @property
    def no_vision_fix(self) -> str:
        """What to do when media is sent to a model without a vision tower ("" or "; ..."), ModelConfig's."""
        return self.engine.engine.model_config.no_vision_fix

    @property
    def video_unsupported_reason(self) -> str | None:
        """Why a model with a vision tower still cannot take videos (a GGUF mmproj), or None."""
        return self.engine.engine.model_config.video_unsupported_reason

    def check_model(self, requested: str | None) -> str:
        """The served name to report; raises APIError 404 for a model this server does not serve. An empty name is
        none given, as vLLM takes it (clients whose model setting is blank send `"model": ""`)."""
        names = self.settings.served_model_names
        if not requested:
            return names[0]
        if requested not in names:
            raise APIError(404, f"the model {requested!r} does not exist here; this server serves "
                           f"{', '.join(repr(n) for n in names)}", param="model", code="model_not_found")
        return requested
