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


def _legacy_token(tokenizer: Tokenizer, token_id: int) -> str:
    """The token as legacy completions spell it: its text, or, where its bytes are no UTF-8 text on their own (part
    of a multi-byte character), `bytes:` and the bytes escaped (`bytes:\\xe2\\x80`), as OpenAI does: such tokens
    would all read U+FFFD and share one `top_logprobs` key."""
    data = tokenizer.token_bytes(token_id)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in data)


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


def completion_logprobs(token_ids: list[int], entries: list[TokenLogprobs | None], text_offsets: list[int],
                        tokenizer: Tokenizer, k: int) -> dict[str, Any]:
    """Legacy completions logprobs: one position per token; `text_offsets` tell where each token's text starts
    in the choice's text. An entry is None where nothing predicted the token (an echoed prompt's first token):
    its logprob and top logprobs are null. Per position the `k` most likely tokens and, as OpenAI and vLLM do, the
    token itself when it is not among them (up to k + 1). Tokens are spelled by `_legacy_token`."""
    tokens, token_logprobs, top_logprobs = [], [], []
    for token_id, entry in zip(token_ids, entries, strict=True):
        tokens.append(_legacy_token(tokenizer, token_id))
        if entry is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_finite(entry.logprob))
        top = list(entry.top.items())[:k]
        if all(t != token_id for t, _ in top):
            top.append((token_id, entry.logprob))
        alternatives: dict[str, float] = {}
        for t, lp in top:  # tokens spelled alike share a key: the most likely one keeps it
            alternatives.setdefault(_legacy_token(tokenizer, t), _finite(lp))
        top_logprobs.append(alternatives)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offsets}


def vllm_prompt_logprobs(entries: list[TokenLogprobs | None], tokenizer: Tokenizer, k: int) -> list[Any]:
    """vLLM's `prompt_logprobs`: per prompt token, null for the first, else `{token_id: {logprob, rank,
    decoded_token}}` holding the prompt token and its `k` most likely alternatives."""
    out: list[Any] = []
    for entry in entries:
        if entry is None:
            out.append(None)
            continue
        position = {str(entry.token_id): _vllm_entry(tokenizer, entry.token_id, entry.logprob, entry.rank)}
        for rank, (token_id, logprob) in enumerate(list(entry.top.items())[:k], start=1):
            position.setdefault(str(token_id), _vllm_entry(tokenizer, token_id, logprob, rank))
        out.append(position)
    return out


def _vllm_entry(tokenizer: Tokenizer, token_id: int, logprob: float, rank: int | None) -> dict[str, Any]:
    return {"logprob": _finite(logprob), "rank": rank, "decoded_token": _token(tokenizer, token_id)[0]}
