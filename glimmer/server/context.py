"""What every request handler needs, built once when the app is created."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from glimmer.engine.async_engine import AsyncEngine
from glimmer.engine.grammar import GrammarCompiler
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import ConfigError
from glimmer.protocol import GENERATION_PROMPT, ChatTemplate
from glimmer.server.errors import APIError
from glimmer.server.metrics import ServerMetrics
from glimmer.server.response_store import ResponseStore
from glimmer.server.settings import ServerSettings

_PROBE_KWARGS = {"current_date": "2026-01-01"}


@dataclass
class ServingContext:
    engine: AsyncEngine
    settings: ServerSettings
    tokenizer: Tokenizer
    template: ChatTemplate
    metrics: ServerMetrics
    grammars: GrammarCompiler
    created: int = field(default_factory=lambda: int(time.time()))
    hidden_special_tokens: dict[int, str] = field(default_factory=dict)
    """Special tokens chat answers do not show (every one but the framing markers): id → spelling."""
    responses: ResponseStore = field(default_factory=lambda: ResponseStore(0, 0.0))

    @classmethod
    def create(cls, engine: AsyncEngine, settings: ServerSettings) -> ServingContext:
        """Raises CheckpointError (no chat template) or ConfigError (a template that breaks the protocol)."""
        llm_engine = engine.engine
        tokenizer = llm_engine.tokenizer
        template = llm_engine.chat_template
        check_chat_template(template, tokenizer)
        # index the vocabulary for the grammar engine at startup, not on the first structured request
        return cls(engine, settings, tokenizer, template, ServerMetrics(engine), llm_engine.grammars,
                   hidden_special_tokens=tokenizer.hidden_in_replies,
                   responses=ResponseStore(settings.responses_store_bytes, settings.responses_store_age_s))

    @property
    def model_has_vision(self) -> bool:
        return self.engine.engine.model_config.vision is not None

    def check_model(self, requested: str | None) -> str:
        """The served name to report; raises APIError 404 for a model this server does not serve."""
        names = self.settings.served_model_names
        if requested is None:
            return names[0]
        if requested not in names:
            raise APIError(404, f"the model {requested!r} does not exist here; this server serves "
                           f"{', '.join(repr(n) for n in names)}", param="model", code="model_not_found")
        return requested


def check_chat_template(template: ChatTemplate, tokenizer: Tokenizer) -> None:
    """Render a probe chat: the prompt must end with the generation prompt (P-TMPL-8) and hold one bos (P-TMPL-5).
    Raises ConfigError, or ChatTemplateError where the template fails to render (`glimmer inspect` runs it too)."""
    prompt = template.render([{"role": "user", "content": "hello"}], special_tokens=tokenizer.special_tokens,
                             chat_template_kwargs=_PROBE_KWARGS)
    if not prompt.endswith(GENERATION_PROMPT):
        raise ConfigError(f"the chat template's generation prompt must be exactly {GENERATION_PROMPT!r} "
                          f"(P-TMPL-8); a probe prompt ends {prompt[-40:]!r}")
    bos_id = tokenizer.bos_token_id
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    if bos_id is not None and (ids.count(bos_id) != 1 or ids[0] != bos_id):
        raise ConfigError(f"the chat template must start the prompt with exactly one {tokenizer.bos_token!r} "
                          f"(P-TMPL-5); a probe prompt has {ids.count(bos_id)}")
