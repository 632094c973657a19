"""Token logprobs in the two OpenAI shapes: chat (`logprobs.content[]`) and legacy completions."""

from __future__ import annotations

from typing import Any

from glimmer.engine.sampler import TokenLogprobs
from glimmer.engine.tokenizer import Tokenizer

# JSON has no -inf; OpenAI clients expect a number
_LOWEST_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    return logprob if logprob >= _LOWEST_LOGPROB else _LOWEST_LOGPROB


def _token(tokenizer: Tokenizer, token_id: int) -> tuple[str, list[int]]:
    """The token's text (a lone byte of a multi-byte character shows as U+FFFD) and its exact bytes."""
    data = tokenizer.token_bytes(token_id)
    return data.decode("utf-8", errors="replace"), list(data)


def chat_logprobs(entries: list[TokenLogprobs], tokenizer: Tokenizer) -> dict[str, Any]:
    content = []
    for entry in entries:
        text, data = _token(tokenizer, entry.token_id)
        top = []
        for token_id, logprob in entry.top.items():
            top_text, top_data = _token(tokenizer, token_id)
            top.append({"token": top_text, "logprob": _finite(logprob), "bytes": top_data})
        content.append({"token": text, "logprob": _finite(entry.logprob), "bytes": data, "top_logprobs": top})
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprobs], text_offsets: list[int], tokenizer: Tokenizer) -> dict[str, Any]:
    """`text_offsets`: where each token's text starts in the choice's text."""
    tokens, token_logprobs, top_logprobs = [], [], []
    for entry in entries:
        tokens.append(_token(tokenizer, entry.token_id)[0])
        token_logprobs.append(_finite(entry.logprob))
        top_logprobs.append({_token(tokenizer, t)[0]: _finite(lp) for t, lp in entry.top.items()})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offsets}
