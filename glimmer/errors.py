"""Exceptions that are part of Glimmer's interface.

Every error names the field or file at fault and, where one exists, the fix. The server maps them to
OpenAI-style error bodies; the CLI prints them without a traceback. Pure Python: safe to import from
`glimmer.protocol`.
"""


class GlimmerError(Exception):
    """Base class of every error Glimmer raises on purpose."""


class ConfigError(GlimmerError, ValueError):
    """A checkpoint's config.json (or generation_config.json) cannot be turned into a valid model config."""


class CheckpointError(GlimmerError):
    """A checkpoint's files are missing, unreadable, or do not match its config."""


class RequestError(GlimmerError, ValueError):
    """A generation request (sampling parameters, prompt, messages) is invalid.

    `param` names the offending field, as OpenAI error bodies do.
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class UnsupportedArgumentError(RequestError, TypeError):
    """An argument the callee does not take, named in `param`, with what to pass instead: a TypeError as Python's
    own for an unexpected keyword argument (code catching that still does), and a RequestError like the errors
    about the values of the arguments it does take."""


class ToolChoiceUnsatisfiedError(GlimmerError):
    """`tool_choice` required or named, and a reply holds no valid call of an allowed tool (P-REQ-4): the server
    answers it as a 500 of type `tool_choice_unsatisfied` (streamed, an error event); `LLM.chat` raises it."""
