"""Errors raised while turning a request's images and videos into model inputs.

All of them are `RequestError`s, so the server answers 400 with the message. A message names the item
("image 1", "video 0", counted from 0 in request order) and the problem, and where there is one, the fix;
`MediaError.at` names the content part too (`messages[0].content[2] (image 1): …`) where the caller knows it.
"""

from __future__ import annotations

from glimmer.errors import ContextLengthError, RequestError, ServiceBusyError


class MediaError(RequestError):
    """An image or video of a request cannot be used.

    `kind` is "image", "video" or "request" (for limits on all media together); `index` is the item's
    position among the request's items of that kind, or None. `part`, when known, is the content part's
    path (`messages[i].content[j]`): the message names it before the item, and `param` is it.
    """

    def __init__(self, kind: str, index: int | None, problem: str, param: str | None = "messages",
                 part: str | None = None):
        self.kind = kind
        self.index = index
        self.problem = problem
        where = kind if index is None else f"{kind} {index}"
        super().__init__(f"{part} ({where}): {problem}" if part else f"{where}: {problem}", param=part or param)

    def at(self, part: str) -> MediaError:
        """The same error (same class) naming the content part `part` it came from."""
        return type(self)(self.kind, self.index, self.problem, part=part)


class MediaFetchBusyError(MediaError, ServiceBusyError):
    """An http(s) reference that cannot be fetched for now: every host-name lookup the process allows is still
    waiting on the resolver (`remote_fetch.MAX_PENDING_LOOKUPS`). A 503 to retry, not a 400: the reference may be
    sound."""


class MediaDecodeError(MediaError):
    """The bytes are not a decodable image or video (corrupt, truncated, unsupported format or codec)."""


class MediaLimitError(MediaError):
    """An item (or all items together) exceeds a configured limit: pixels, frames or tokens."""


class MediaContextLengthError(MediaLimitError, ContextLengthError):
    """A request's items need more tokens than the model's context (max_model_len) holds: a context-length refusal,
    whose message opens as `glimmer.errors.ContextLengthError`'s ("This model's maximum context length is N
    tokens", what clients such as LiteLLM match) and whose code is OpenAI's `context_length_exceeded`. It is a
    `ContextLengthError` too, so code catching that catches it; the prompt's own token count is not measured yet
    when the media refuse it (`prompt_tokens` None, no `parts`)."""

    code = "context_length_exceeded"

    def __init__(self, max_model_len: int, need: str):
        # a refusal of all items together ("request"), never re-raised naming one part (`at`), so its message opens
        # with the context rather than MediaError's "request: "
        self.kind, self.index, self.max_model_len = "request", None, max_model_len
        self.prompt_tokens, self.max_tokens, self.parts = None, None, []
        self.problem = (f"This model's maximum context length is {max_model_len} tokens (max_model_len), but the "
                        f"images and videos need {need} tokens together; send fewer or smaller images or videos")
        RequestError.__init__(self, self.problem, param="messages")


class PlaceholderMismatchError(RequestError):
    """The prompt's `<|patch|>` / `<|video|>` placeholders do not match the number of media items."""
