"""Glimmer: an exact, fast inference engine and OpenAI-compatible server for Meta's Muse Glimmer models.

`from glimmer import LLM, SamplingParams` gives the Python API. The names are resolved lazily so that
`glimmer.protocol` (pure text, no torch) can be imported on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "LLM": "glimmer.engine.llm",
    "SamplingParams": "glimmer.engine.sampling_params",
    "StructuredOutputsParams": "glimmer.engine.sampling_params",
    "BeamSearchParams": "glimmer.engine.beam_search",
    "BeamSearchOutput": "glimmer.engine.beam_search",
    "RequestOutput": "glimmer.engine.outputs",
    "CompletionOutput": "glimmer.engine.outputs",
    "Logprob": "glimmer.engine.outputs",
    "PositionLogprobs": "glimmer.engine.outputs",
    "ChatOutput": "glimmer.engine.llm",
    "LLMTokenizer": "glimmer.engine.llm",
    "TextPrompt": "glimmer.engine.prompts",
    "TokensPrompt": "glimmer.engine.prompts",
}

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "BeamSearchParams", "BeamSearchOutput", "RequestOutput",
           "CompletionOutput", "Logprob", "PositionLogprobs", "ChatOutput", "LLMTokenizer", "TextPrompt",
           "TokensPrompt", "__version__"]

if TYPE_CHECKING:
    from glimmer.engine.beam_search import BeamSearchOutput, BeamSearchParams
    from glimmer.engine.llm import LLM, ChatOutput, LLMTokenizer
    from glimmer.engine.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
    from glimmer.engine.prompts import TextPrompt, TokensPrompt
    from glimmer.engine.sampling_params import SamplingParams, StructuredOutputsParams


def __dir__() -> list[str]:
    """The lazy names too, so that `dir(glimmer)` and an editor's completion of `glimmer.` list them unimported."""
    return sorted(set(globals()) | set(_LAZY))


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'glimmer' has no attribute {name!r}")
