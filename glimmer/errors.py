"""Exceptions that are part of Glimmer's interface.

Every error names the field or file at fault and, where one exists, the fix. The server maps them to
OpenAI-style error bodies; the CLI prints them without a traceback. Pure Python: safe to import from
`glimmer.protocol`.
"""

from collections.abc import Sequence
from dataclasses import dataclass


class GlimmerError(Exception):
    """Base class of every error Glimmer raises on purpose."""


class EngineForkedError(GlimmerError, RuntimeError):
    """A model was to run in a process forked from one that had loaded an engine, where it would wait for ever for
    threads that stayed in the parent (glimmer/engine/fork_guard.py)."""


class ConfigError(GlimmerError, ValueError):
    """A checkpoint's config.json (or generation_config.json) cannot be turned into a valid model config."""


class CheckpointError(GlimmerError):
    """A checkpoint's files are missing, unreadable, or do not match its config."""


def option_and_keyword(option: str, value: str = "", keyword_value: str = "") -> str:
    """An engine option as a refusal names it, which the caller may have set on the command line or as `LLM(...)`'s
    keyword: `option_and_keyword("--device", "cuda", '"cuda"')` is `--device cuda / device="cuda"`,
    `option_and_keyword("--kv-cache-memory", "SIZE")` is `--kv-cache-memory SIZE / kv_cache_memory=`. The keyword is
    the option's name with underscores, as vLLM's engine arguments are spelled."""
    keyword = option.removeprefix("--").replace("-", "_")
    return f"{option} {value} / {keyword}={keyword_value}" if value else f"{option} / {keyword}={keyword_value}"


KV_CACHE_MEMORY_OPTION = option_and_keyword("--kv-cache-memory", "SIZE")
"""The KV cache's size as a fix names it, in the engine's refusals and warnings and the host-memory check's."""


class RequestError(GlimmerError, ValueError):
    """A generation request (sampling parameters, prompt, messages) is invalid.

    `param` names the offending field, as OpenAI error bodies do.
    """

    code: str | None = None  # OpenAI's error code, where one names the kind of refusal

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code

    def with_message(self, message: str, param: str | None) -> "RequestError":
        """This error, of its class and code, saying `message` and naming `param` (a caller's own name for the
        field)."""
        renamed = type(self).__new__(type(self))  # copy.copy would call __init__ with the message alone
        renamed.__dict__.update(self.__dict__)
        renamed.args = (message,)
        renamed.param = param
        return renamed

    def naming_prompt(self, name: str) -> "RequestError":
        """This error as a caller whose prompt is `name` words it: the engine names a prompt that cannot fit
        `messages` (chat) or `prompt`; the caller's field is `prompt`, `messages`, or one of several (`prompt[1]` of
        /v1/completions, `prompts[1]` of LLM.generate, `messages[1]` of LLM.chat), so that the client can tell which
        to shorten. A max_tokens or min_tokens the context left by one of several prompts cannot hold, or a
        truncate_prompt_tokens that cut one to fill it, keeps its field and names the prompt too. Itself where
        nothing changes."""
        several = name not in ("prompt", "messages")
        if self.param in ("max_tokens", "min_tokens", "truncate_prompt_tokens") and several:
            return self.with_message(f"{name}: {self}", self.param)
        if self.param not in ("messages", "prompt") or self.param == name or name == "messages":
            return self
        message = str(self)
        if not name.startswith("messages"):  # (one of several conversations is shortened as messages)
            message = message.replace("shorten the messages", "shorten the prompt")
        return self.with_message(f"{name}: {message}" if several else message, name)


class ServiceBusyError(RequestError):
    """A sound request needing something the server shares among requests, none of it free for now: HTTP 503 with
    Retry-After, which clients retry. `param` names the field that needed it."""

    code = "service_busy"


class ConstraintFailure(RequestError):
    """A request's own constraints failed its completion while generating, where they could not be foreseen when it
    was added (a grammar hit a limit; bad_words left none of its allowed_token_ids to sample): the request's fault,
    not the server's (HTTP 400 naming `param`, the field holding the constraint). It ends that request alone."""


_CONVERSATION_FIELDS = ("messages", "input", "prompt")  # shortened, never removed


@dataclass(frozen=True)
class PromptPart:
    """What one part of the request made of a prompt, `size` tokens (characters, in a `PromptTextTooLongError`):
    `name` as the message says it (a field, or "images"), `param` the field a client changes to shorten it, `fix`
    what a refusal whose largest part it is tells to do, where not to shorten it (or remove it): the caller's words.
    """

    name: str
    size: int
    param: str
    fix: str | None = None


class ContextLengthError(RequestError):
    """The prompt, or the prompt with the tokens asked of the completion, does not fit the model's context
    (max_model_len). The message opens as vLLM's and OpenAI's do, "This model's maximum context length is N tokens",
    which clients such as LiteLLM match to tell this 400 from others; the code is OpenAI's. `parts`, where the caller
    measured them, say what made the prompt long, largest first (those of a twentieth of it or more, listed where
    there are several); the largest is the field named (`param`) where the prompt alone is too long, `max_tokens`
    where the prompt fits and the completion asked for does not. `truncated`: the prompt is what truncate_prompt_tokens
    kept of it, filling the context, so that shortening it changes nothing: truncate_prompt_tokens is named."""

    code = "context_length_exceeded"
    truncated = False

    def __init__(self, max_model_len: int, prompt_tokens: int, max_tokens: int | None = None,
                 parts: Sequence[PromptPart] = (), *, truncated: bool = False):
        self.max_model_len = max_model_len
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.truncated = truncated
        self.parts = _largest_parts(parts, prompt_tokens)
        opening = f"This model's maximum context length is {max_model_len} tokens (max_model_len), but"
        shares, shorten = _shares_and_fix(self.parts)
        if truncated:
            super().__init__(f"{opening} truncate_prompt_tokens kept {prompt_tokens} tokens of the prompt, which leave "
                             f"no room to generate; lower truncate_prompt_tokens to at most {max_model_len - 1} (-1 "
                             "keeps max_model_len tokens)", param="truncate_prompt_tokens")
        elif max_tokens is None:
            full = ", which leaves no room to generate" if prompt_tokens == max_model_len else ""
            super().__init__(f"{opening} the prompt has {prompt_tokens} tokens{shares}{full}; {shorten}",
                             param=self.parts[0].param if self.parts else "messages")
        else:
            super().__init__(f"{opening} you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                             f"prompt{shares}, {max_tokens} in the completion); lower max_tokens to at most "
                             f"{max_model_len - prompt_tokens}" + f", or {shorten}" * bool(self.parts),
                             param="max_tokens")

    def naming(self, parts: Sequence[PromptPart]) -> "ContextLengthError":
        """This refusal saying what made the prompt long: `parts` (none made a truncated one long)."""
        if self.truncated:
            return self
        return ContextLengthError(self.max_model_len, self.prompt_tokens, self.max_tokens, parts)


class PromptTextTooLongError(ContextLengthError):
    """A prompt text longer than any prompt the context holds (`max_prompt_chars`: max_model_len - 1 tokens of the
    tokenizer's longest), refused before it is tokenized: a context-length refusal whose `parts`, where the caller
    measured them, are counted in characters (the tokens are not counted); `prompt_tokens` is None."""

    def __init__(self, max_model_len: int, prompt_chars: int, max_prompt_chars: int,
                 parts: Sequence[PromptPart] = ()):
        self.max_model_len, self.max_tokens, self.prompt_tokens = max_model_len, None, None
        self.prompt_chars, self.max_prompt_chars = prompt_chars, max_prompt_chars
        self.parts = _largest_parts(parts, prompt_chars)
        shares, shorten = _shares_and_fix(self.parts)
        RequestError.__init__(self, f"This model's maximum context length is {max_model_len} tokens (max_model_len), "
                              f"but the prompt has {prompt_chars:,} characters{shares}, more than that can hold (at "
                              f"most {max_prompt_chars:,}); {shorten}",
                              param=self.parts[0].param if self.parts else "messages")

    def naming(self, parts: Sequence[PromptPart]) -> "PromptTextTooLongError":
        """This refusal saying what made the prompt long: `parts`, in characters."""
        return PromptTextTooLongError(self.max_model_len, self.prompt_chars, self.max_prompt_chars, parts)


class ForcedCallContextError(ContextLengthError):
    """A prompt that fits the context but leaves less of it than the fewest tokens (`fewest`) of any reply holding the
    call a required or named `tool_choice` asks for (`what`): the reply would run to the end of the context without
    it. Named `messages` (`input` on /v1/responses); its `parts` are not measured."""

    def __init__(self, max_model_len: int, prompt_tokens: int, what: str, fewest: int):
        self.max_model_len, self.prompt_tokens, self.max_tokens, self.parts = max_model_len, prompt_tokens, None, []
        self.what, self.fewest = what, fewest
        room = max_model_len - prompt_tokens
        RequestError.__init__(self, f"This model's maximum context length is {max_model_len} tokens (max_model_len), "
                              f"but the prompt has {prompt_tokens} tokens, which leaves {room} for the reply, and "
                              f"tool_choice asks for {what}: the shortest takes {fewest} tokens (its header and ATEM "
                              f"tags, values empty); shorten the conversation to at most {max_model_len - fewest} "
                              "prompt tokens, fewer for the reasoning and the values", param="messages")

    def naming(self, parts: Sequence[PromptPart]) -> "ForcedCallContextError":
        """This refusal (it names no parts)."""
        return self


def _largest_parts(parts: Sequence[PromptPart], total: int) -> list[PromptPart]:
    """`parts` that made a prompt of `total` long, largest first: a part of less than a twentieth of it did not."""
    return sorted((part for part in parts if part.size > 0 and part.size * 20 >= total),
                  key=lambda part: -part.size)


def _shares_and_fix(parts: list[PromptPart]) -> tuple[str, str]:
    """The parts as a refusal lists them (` (tools 480, messages 40)`; nothing for one, the whole prompt) and what to
    do: the largest's own `fix`, else shorten it."""
    listed = ", ".join(f"{part.name} {part.size}" for part in parts)
    shares = f" ({listed})" if len(parts) > 1 else ""
    if parts and parts[0].fix is not None:
        return shares, parts[0].fix
    largest = parts[0].name if parts else "messages"
    return shares, f"shorten the {largest}" if largest in _CONVERSATION_FIELDS else f"shorten or remove {largest}"


class UnsupportedArgumentError(RequestError, TypeError):
    """An argument the callee does not take, named in `param`, with what to pass instead: a TypeError as Python's
    own for an unexpected keyword argument (code catching that still does), and a RequestError like the errors
    about the values of the arguments it does take."""


class ToolChoiceUnsatisfiedError(GlimmerError):
    """`tool_choice` required or named, and a reply holds no valid call of an allowed tool (P-REQ-4): the server
    answers it as a 500 of type `tool_choice_unsatisfied` (streamed, an error event); `LLM.chat` raises it."""
