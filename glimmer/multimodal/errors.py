"""Errors raised while turning a request's images and videos into model inputs.

All of them are `RequestError`s, so the server answers 400 with the message. A message names the item
("image 1", "video 0", counted from 0 in request order) and the problem, and where there is one, the fix;
`MediaError.at` names the content part too (`messages[0].content[2] (image 1): …`) where the caller knows it.
"""

from __future__ import annotations

from glimmer.errors import RequestError


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


class MediaDecodeError(MediaError):
    """The bytes are not a decodable image or video (corrupt, truncated, unsupported format or codec)."""


class MediaLimitError(MediaError):
    """An item (or all items together) exceeds a configured limit: pixels, frames or tokens."""


class PlaceholderMismatchError(RequestError):
    """The prompt's `<|patch|>` / `<|video|>` placeholders do not match the number of media items."""
