"""The prompt forms `LLM.generate` takes, named as vLLM names them (`vllm.inputs.TextPrompt`, `TokensPrompt`), so
that code building them runs as written: `generate(TokensPrompt(prompt_token_ids=ids))`."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class TextPrompt(TypedDict):
    """A text prompt, with images or videos for its `<|patch|>` / `<|video|>` placeholders (`{"image": [...]}`);
    `cache_salt` is the request's `SamplingParams.cache_salt`; `mm_processor_kwargs` may only be None or empty."""

    prompt: str
    multi_modal_data: NotRequired[dict[str, Any] | None]
    mm_processor_kwargs: NotRequired[dict[str, Any] | None]
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """A prompt of token ids, taken as they are (no BOS added), with images or videos for its placeholder ids as
    vLLM's takes them; `prompt` is its text as the output reports it."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    multi_modal_data: NotRequired[dict[str, Any] | None]
    mm_processor_kwargs: NotRequired[dict[str, Any] | None]
    cache_salt: NotRequired[str]


PromptType = str | list[int] | TextPrompt | TokensPrompt | dict[str, Any]
PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids", "multi_modal_data", "mm_processor_kwargs", "cache_salt"})
