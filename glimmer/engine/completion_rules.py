"""When a sequence's output ends, and why: the completion rules, pure (no tokenizer, no tensors).

A sequence ends at a token-level stop, decided as each token is appended (`token_stop`): one of its stop ids (the
request's stop_token_ids and, unless ignore_eos, the checkpoint's: `stop_token_ids`), the end of its grammar, or its
length limit (`generation_budget`: max_tokens, or the room max_model_len leaves). A stop string ends it when its
text is made (stop_strings.py). Before min_tokens tokens neither may: the stop ids (the checkpoint's too, under
ignore_eos: `all_stop_ids`) are banned from sampling (`bans_stop_ids`) and a stop string does not count
(`stop_strings_armed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from glimmer.engine.sampling_params import SamplingParams
from glimmer.errors import ContextLengthError, RequestError

if TYPE_CHECKING:
    from glimmer.engine.sequence import Sequence

STOP, LENGTH = "stop", "length"  # finish reasons
_STOPPED, _AT_LENGTH = (STOP, None), (LENGTH, None)


def stop_token_ids(params: SamplingParams, checkpoint_stop_ids: Iterable[int]) -> frozenset[int]:
    """The ids that end a sequence of `params`: its own stop_token_ids and, unless ignore_eos, the checkpoint's
    stop ids (its EOS, generation_config's eos_token_id)."""
    if params.ignore_eos:
        return frozenset(params.stop_token_ids)
    return all_stop_ids(params, checkpoint_stop_ids)


def all_stop_ids(params: SamplingParams, checkpoint_stop_ids: Iterable[int]) -> frozenset[int]:
    """Its own stop_token_ids and the checkpoint's stop ids, ignore_eos or not (vLLM's `all_stop_token_ids`): the
    ids min_tokens bans until that many tokens were generated, which under ignore_eos end nothing but are still held
    off."""
    return frozenset(params.stop_token_ids).union(checkpoint_stop_ids)


def silent_stop_ids(params: SamplingParams, special_ids: Iterable[int]) -> frozenset[int]:
    """The request's own stop ids whose text is left out when one ends it (vLLM's include_stop_str_in_output=False);
    special tokens stay in the text whatever ended the turn (P-TOK-3)."""
    if params.include_stop_str_in_output:
        return frozenset()
    return frozenset(params.stop_token_ids) - frozenset(special_ids)


def token_stop(seq: Sequence, token: int, eos_token_id: int | None, grammar_complete: bool
               ) -> tuple[str, int | None] | None:
    """(finish_reason, stop_reason) where `token`, just appended to `seq`, ends it; None where it goes on.
    `grammar_complete`: its grammar ended with the token. A stop id comes first, then the grammar, then the length.

    As vLLM reports it: no stop_reason for the tokenizer's EOS (`eos_token_id`), unless ignore_eos made it a caller's
    stop id; the id for stop_token_ids and the checkpoint's other stop ids (<|eot|>)."""
    if token in seq.stop_token_ids:
        return _STOPPED if token == eos_token_id and not seq.params.ignore_eos else (STOP, token)
    if grammar_complete:  # its last token ends the output even where the limit does
        return _STOPPED
    if seq.num_tokens >= seq.max_total_tokens:
        return _AT_LENGTH
    return None


def bans_stop_ids(num_output_tokens: int, min_tokens: int) -> bool:
    """Whether a sequence with `num_output_tokens` (those chosen ahead and not yet appended included) may not
    sample a stop id next: it has fewer than min_tokens."""
    return num_output_tokens < min_tokens


def stop_strings_armed(num_released_tokens: int, min_tokens: int) -> bool:
    """Whether a stop string may end in the text of the `num_released_tokens`-th token: as in vLLM, only in a token
    after the min_tokens-th."""
    return num_released_tokens > min_tokens


def generation_budget(max_model_len: int, prompt_len: int, params: SamplingParams, *,
                      clamp_max_tokens: bool = False) -> int:
    """How many tokens a request whose prompt has `prompt_len` tokens may generate: its max_tokens, or the room
    max_model_len leaves where it sets none. `clamp_max_tokens`: a max_tokens past that room ends the output there,
    as vLLM's offline LLM does, instead of being refused; so does a min_tokens past it (vLLM's length limit ends a
    request before its min_tokens is looked at).

    Raises ContextLengthError when the prompt exceeds max_model_len or leaves no room to generate (param
    "messages"; "truncate_prompt_tokens" where it kept them all), or less room than max_tokens (param "max_tokens");
    RequestError when less than min_tokens asks for, unless clamped.
    """
    room = max_model_len - prompt_len
    if room < 0 or (room == 0 and params.max_tokens != 0):
        # a prompt truncate_prompt_tokens cut to max_model_len tokens (-1 or max_model_len: the engine cuts none, LLM
        # and the server cut before it): shortening it would keep as many
        raise ContextLengthError(max_model_len, prompt_len,
                                 truncated=room == 0 and params.truncate_prompt_tokens in (-1, max_model_len))
    max_tokens = params.max_tokens if params.max_tokens is not None else room
    if clamp_max_tokens:
        max_tokens = min(max_tokens, room)
    if max_tokens > room:
        raise ContextLengthError(max_model_len, prompt_len, max_tokens)
    if params.min_tokens > max_tokens and not clamp_max_tokens:  # without max_tokens the context decides too
        raise RequestError(
            f"min_tokens: {params.min_tokens} is more than this request can generate ({max_tokens} tokens: "
            f"the prompt's {prompt_len} leave {room} of max_model_len={max_model_len}); lower min_tokens to "
            f"at most {max_tokens}",
            param="min_tokens",
        )
    return max_tokens
