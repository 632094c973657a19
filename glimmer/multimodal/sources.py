"""Where a request's images and videos come from: data URLs, allowed local files, or (if enabled) http(s).

Media references are untrusted input. Local files are read only under directories the operator allowed
(`--allowed-local-media-path`), after resolving symlinks; remote fetching is off unless the operator
enables it (`--allow-remote-media`, `--allowed-media-domains`), and then bounded in size, time and
redirects and kept off the server's own network (`remote_fetch`). Every refusal is a RequestError (HTTP 400)
naming the item (`naming_media_parts` names its content part instead), and says no more than the client may
learn: whether a file exists outside the allowed directories, or whether a port is open, reads the same as any
other failure.
"""

from __future__ import annotations

import base64
import binascii
import errno
import logging
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple
from urllib.parse import unquote, unquote_to_bytes, urlparse

from glimmer.cancellation import CancelToken
from glimmer.errors import RequestError
from glimmer.multimodal.errors import MediaError, MediaFetchBusyError
from glimmer.multimodal.image import is_image_data, starts_with_image_signature
from glimmer.multimodal.remote_fetch import LookupsBusyError, RemoteMediaError, fetch_remote, loggable_url
from glimmer.multimodal.settings import MediaFetchPolicy
from glimmer.multimodal.video import is_video_data
from glimmer.protocol.request_normalization import MEDIA_PART_TYPES, tool_results_in_call_order

__all__ = ["MEDIA_KINDS", "MediaFetchPolicy", "MediaPart", "collect_media", "load_media_reference", "media_from_part",
           "media_kind", "media_part_paths", "media_parts", "naming_media_parts"]

logger = logging.getLogger(__name__)

MEDIA_KINDS = ("image", "video")
# content part type → media kind, for parts as sent (OpenAI `image_url`) and as normalized (`image`)
_PART_KINDS = {**MEDIA_PART_TYPES, **{kind: kind for kind in MEDIA_KINDS}}


# WHATWG forgiving-base64: ASCII whitespace (tab, LF, FF, CR, space) is dropped; the alphabet has no - or _
_BASE64_WHITESPACE = str.maketrans("", "", "\t\n\f\r ")
_BASE64_ALPHABET = re.compile(r"[A-Za-z0-9+/]*")
_BASE64_MARK = re.compile(r"; *base64$", re.IGNORECASE)


def _error(kind: str, index: int, message: str) -> MediaError:
    return MediaError(kind, index, message)


def _forgiving_base64(text: str) -> bytes:
    """WHATWG's forgiving-base64 decode (what browsers do with a data: URL) of `text` whose ASCII whitespace is
    already dropped (`_BASE64_WHITESPACE`): the final `=` padding may be left out; a character outside A-Z a-z 0-9
    + / (the URL-safe - and _ included) or a misplaced `=` raises binascii.Error."""
    if len(text) % 4 == 0 and text.endswith("="):
        text = text[:-2] if text.endswith("==") else text[:-1]
    if len(text) % 4 == 1 or not _BASE64_ALPHABET.fullmatch(text):
        raise binascii.Error("not forgiving-base64")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _url_safe_hint(payload: str) -> str:
    """The fix for base64 of the URL-safe alphabet (RFC 4648 §5: - and _ for + and /), which a data: URL does not
    read (WHATWG forgiving-base64): Python's `urlsafe_b64encode` and JavaScript's
    `toString("base64url")` give it."""
    if not ("-" in payload or "_" in payload):
        return ""
    return (" (it holds - or _, the URL-safe alphabet's; encode with the standard alphabet: base64.b64encode, "
            "not base64.urlsafe_b64encode)")


def _is_base64_of_media(payload: str, kind: str) -> bool:
    """Whether the text of a data: URL without `;base64` is base64 of an image (or video, as `kind` says): the
    header's `;base64` forgotten. The bytes of a real image never read so: its first bytes (PNG's 0x89, JPEG's 0xff)
    are no base64 characters, and percent-encoded they hold a %."""
    text = payload.translate(_BASE64_WHITESPACE)
    if not text:
        return False
    try:  # text outside the alphabet (a real image's bytes) raises here
        data = _forgiving_base64(text)
    except (binascii.Error, ValueError):
        return False
    return _is_media_data(data, kind)


def _is_media_data(data: bytes, kind: str) -> bool:
    """Whether `data` starts as an image's (or a video's, as `kind` says) bytes do: an image's by its format's
    signature or, for TGA that has none, by Pillow opening its header; the same verdict for a whole image and for its
    first bytes (a JPEG's frame may lie past them, behind an ICC profile), so that no limit changes it."""
    if kind == "image":
        return starts_with_image_signature(data) or is_image_data(data)
    return is_video_data(data)


def _decode_data_url(url: str, kind: str, index: int, policy: MediaFetchPolicy) -> bytes:
    """The bytes of a data: URL as browsers read it (WHATWG fetch, "data: URL processor"): a `#fragment` is no part
    of the data (the processor serializes the URL without it), the body is percent-decoded first (`%2B` is `+`),
    then read as forgiving-base64 where the header ends in `;base64`."""
    header, sep, payload = url.partition("#")[0].partition(",")
    if not sep:
        raise _error(kind, index, "malformed data URL (no ',' separating the header from the data)")
    # the MIME type, stripped of ASCII whitespace, ending in ";base64", spaces allowed before it and in any case, as
    # in browsers (WHATWG fetch)
    base64_encoded = _BASE64_MARK.search(header.strip("\t\n\f\r ")) is not None
    if base64_encoded:
        if "%" in payload:  # one character a byte (isomorphic decode): a non-ASCII byte is no base64 either
            payload = unquote_to_bytes(payload).decode("latin-1")
        payload = payload.translate(_BASE64_WHITESPACE)  # `base64` breaks lines; the size is the data's
    # before decoding, the most text the limit's bytes take: 4 characters for 3 bytes in base64, `%XX` for a byte
    too_large = _error(kind, index, f"data URL is larger than the limit of {policy.max_bytes:,} bytes")
    if len(payload) > (policy.max_bytes * 4 // 3 + 4 if base64_encoded else policy.max_bytes * 3):
        raise too_large
    if base64_encoded:
        try:
            data = _forgiving_base64(payload)
        except (binascii.Error, ValueError):
            raise _error(kind, index, "data URL is not valid base64" + _url_safe_hint(payload)) from None
    else:
        data = unquote_to_bytes(payload)  # %89 is the byte 0x89, not a UTF-8 sequence to decode
        if _is_base64_of_media(payload, kind):
            raise _error(kind, index, f"data URL holds base64 but its header {header[:100]!r} does not end in "
                                      "';base64', so its text would be read as the bytes themselves; add it: "
                                      f"{header[:100]};base64,<data>")
    if not data:
        raise _error(kind, index, "data URL is empty")
    if len(data) > policy.max_bytes:
        raise too_large
    return data


_EXAMPLE_MIME = {"image": "image/png", "video": "video/mp4"}
# what of a path's text longer than the limit's base64 is decoded to see an image's signature or header (a TGA's is
# 18 bytes, after any whitespace a line-broken base64 holds) or a video's: a bounded look whatever the text's length
_BASE64_PREFIX_CHARS = 65_536


def _base64_of_media_and_too_large(text: str, kind: str, max_bytes: int) -> tuple[bool, bool]:
    """Whether `text` is base64 of an image (or video, as `kind` says), and whether it is longer than base64 of
    `max_bytes` bytes. Within that length the whole text is decoded and opened (`_is_base64_of_media`), as a data:
    URL would be, since a JPEG's metadata before its frame (an ICC profile, XMP) may be larger than any prefix; past
    it, a bounded prefix cut to whole groups of 4, by the same test (`_is_media_data`)."""
    too_large = len(text.translate(_BASE64_WHITESPACE)) > max_bytes * 4 // 3 + 4
    if not too_large:
        return _is_base64_of_media(text, kind), False
    prefix = text[:_BASE64_PREFIX_CHARS].translate(_BASE64_WHITESPACE)
    try:
        data = _forgiving_base64(prefix[:len(prefix) // 4 * 4])
    except (binascii.Error, ValueError):
        return False, True
    return _is_media_data(data, kind), True


def _read_local(path_text: str, kind: str, index: int, policy: MediaFetchPolicy) -> bytes:
    payload = path_text.rpartition(",")[2]  # after a header without its `data:` (`image/png;base64,`, `data;...`)
    is_base64, too_large = _base64_of_media_and_too_large(payload, kind, policy.max_bytes)
    if is_base64:
        # no file's name: read as a path, it was "local files are not allowed; allow a directory ..."
        what = f"{'an' if kind == 'image' else 'a'} {kind}"
        if too_large:
            raise _error(kind, index, f"this is base64 of {what} larger than the limit of {policy.max_bytes:,} bytes, "
                                      f"not a path or a URL: send a smaller one as a data: URL, "
                                      f"data:{_EXAMPLE_MIME[kind]};base64,<data> (with the {kind}'s own MIME type)")
        raise _error(kind, index, f"this is base64 of {what}, not a path or a URL: send it as a data: URL, "
                                  f"data:{_EXAMPLE_MIME[kind]};base64,<data> (with the {kind}'s own MIME type)")
    if not policy.allowed_local_paths:
        raise _error(kind, index, "local files are not allowed; allow a directory with --allowed-local-media-path "
                                  "(glimmer serve) or LLM(..., allowed_local_media_path=[...]) (Python)")
    # One answer for a missing file, one outside the allowed directories and one that is not a regular file,
    # so that a request cannot learn which files exist on the machine.
    # The text is the client's own (never the resolved path), and the same for every refusal; cut like a URL, so
    # that a mistyped data URL (`data;...`, no scheme) is not sent back whole.
    shown = repr(path_text) if len(path_text) <= 200 else f"{path_text[:200]!r}…"
    refused = _error(kind, index, f"{shown} is not a readable file under the allowed media directories")
    try:
        resolved = Path(path_text).expanduser().resolve(strict=True)
        root = _allowed_root(resolved, policy.allowed_local_paths)
        allowed = root is not None and resolved.is_file()
    except (OSError, RuntimeError, ValueError):  # missing, unreadable, a NUL byte, a symlink loop
        allowed = False
    if not allowed:
        raise refused
    try:
        with _open_as_checked(resolved, root) as (file, size):
            if size > policy.max_bytes:
                raise _error(kind, index, f"file is {size:,} bytes, more than the limit of {policy.max_bytes:,}")
            # a byte past its size to see it grow while read (or hold more than it reports, as /proc's files do);
            # no more than the limit and a byte in all, and no buffer of the limit's size for a small file
            data = file.read(size + 1)
            if len(data) > size:
                data += file.read(policy.max_bytes + 1 - len(data))
    except OSError:
        raise refused from None
    if len(data) > policy.max_bytes:
        raise _error(kind, index, f"file holds more than the limit of {policy.max_bytes:,} bytes")
    return data


def _allowed_root(path: Path, roots: Sequence[Path]) -> Path | None:
    """The first of the allowed directories `roots` that holds `path`, None if none does."""
    return next((root for root in roots if path.is_relative_to(root)), None)


# Someone writing into an allowed directory can swap a checked file, or a directory above it, before it is opened. So
# the checked path is walked from the allowed directory, each component opened in the one before it without following
# a symlink (ELOOP), a directory as one (ENOTDIR): a symlink swapped in anywhere is refused before anything it names is
# opened. The file is opened without waiting on a FIFO put there (O_NONBLOCK; a read would wait for a writer for ever)
# or making a terminal the server's (O_NOCTTY), to be refused as no regular file. Where os.open takes no directory
# descriptor (Windows), the file is opened by its path, which is then checked again.
_OPEN_WALKS_FROM_A_DIRECTORY = os.open in os.supports_dir_fd
_DIRECTORY_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
_FILE_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
                    | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))


@contextmanager
def _open_as_checked(checked: Path, root: Path) -> Iterator[tuple[BinaryIO, int]]:
    """(the file, its size in bytes) of `checked`, a path resolved under the allowed directory `root`, opened by
    walking it from there (`_open_under_root`) and checked as opened to be a regular file. Raises OSError for anything
    else, or if it cannot be opened."""
    fd = _open_under_root(checked, root) if _OPEN_WALKS_FROM_A_DIRECTORY else _open_and_resolve_again(checked)
    with os.fdopen(fd, "rb") as file:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(checked))
        yield file, opened.st_size


def _open_under_root(checked: Path, root: Path) -> int:
    """A descriptor of `checked`, each component of its path below its allowed directory `root` opened in the one
    before it, none followed if a symlink. Raises OSError if one cannot be opened so."""
    *directories, name = checked.relative_to(root).parts
    fd = os.open(root, _DIRECTORY_OPEN_FLAGS)
    try:
        for directory in directories:
            below = os.open(directory, _DIRECTORY_OPEN_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = below
        return os.open(name, _FILE_OPEN_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


def _open_and_resolve_again(checked: Path) -> int:
    """Where os.open takes no directory descriptor (Windows): a descriptor of `checked`, opened by its path, if the
    path still resolves to itself and names the file opened (its st_dev and st_ino). Raises OSError if not."""
    fd = os.open(checked, _FILE_OPEN_FLAGS)
    try:
        same = checked.resolve(strict=True) == checked and os.path.samestat(os.stat(checked), os.fstat(fd))
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop
        same = False
    if not same:
        os.close(fd)
        raise OSError(errno.ESTALE, "no longer the file opened", str(checked))
    return fd


def _fetch_remote(url: str, kind: str, index: int, policy: MediaFetchPolicy, cancel: CancelToken | None) -> bytes:
    if not policy.allows_remote:
        raise _error(kind, index, "fetching media over http(s) is disabled; send a data: URL, or enable it with "
                                  "--allow-remote-media (glimmer serve) or LLM(..., allow_remote_media=True) "
                                  "(Python)")
    try:
        data = fetch_remote(url, policy, cancel)
        if not _is_media_data(data, kind):
            # a decoding error would tell the client that something answered 200 there
            raise RemoteMediaError(f"the body ({len(data):,} bytes) is not a recognizable {kind}")
        return data
    except LookupsBusyError as error:
        logger.warning("%s %d: not fetching %s: %s", kind, index, loggable_url(url), error)
        raise MediaFetchBusyError(kind, index, f"{loggable_url(url)} cannot be fetched now: the server has too many "
                                               "host-name lookups in progress; try again later") from None
    except RemoteMediaError as error:
        logger.info("%s %d: fetching %s failed: %s", kind, index, loggable_url(url), error.reason)
        what = "an image" if kind == "image" else "a video"
        raise _error(kind, index, f"{loggable_url(url)} could not be fetched (an unreachable or refused address, an "
                                  f"answer other than HTTP 200 with {what}, more than {policy.max_redirects} "
                                  f"redirects, more than {policy.max_bytes:,} bytes or more than {policy.timeout_s} "
                                  "s)") from None


def file_url_path(url: str, kind: str, index: int) -> str:
    """The local path a file: URL names. A host other than localhost names a file on another machine (RFC 8089
    §2), which is refused: reading the local file of that path would read another file than the one named. A host
    name is case-insensitive (RFC 3986 §3.2.2): file://LOCALHOST/path is this machine too."""
    parsed = urlparse(url)
    if parsed.netloc.lower() not in ("", "localhost"):
        raise _error(kind, index, f"file URL names the host {parsed.netloc[:100]!r}; only files on this machine are "
                                  "read: file:///path or file://localhost/path")
    return unquote(parsed.path)


def load_media_reference(reference: Any, kind: str, index: int, policy: MediaFetchPolicy,
                         cancel: CancelToken | None = None) -> Any:
    """Bytes for a URL or path string; anything else (PIL image, frames array, bytes) passes through.

    Raises RequestError naming the item, or Cancelled (during a download) once `cancel` is cancelled.
    """
    if not isinstance(reference, str):
        return reference
    scheme = url_scheme(reference)
    if scheme is None:
        raise _error(kind, index, "not a URL urllib can read (an unclosed '[' of an IPv6 address?)")
    if scheme == "data":
        return _decode_data_url(reference, kind, index, policy)
    if is_remote_reference(reference):
        return _fetch_remote(reference, kind, index, policy, cancel)
    if scheme == "file":
        return _read_local(file_url_path(reference, kind, index), kind, index, policy)
    if scheme and len(scheme) > 1:
        raise _error(kind, index, f"unsupported URL scheme {scheme!r}; use data:, a local path or http(s)")
    return _read_local(reference, kind, index, policy)


def url_scheme(reference: str) -> str | None:
    """The scheme of a media reference, lower-cased ("" for a path); None for a string urllib cannot split (an
    unclosed IPv6 bracket, `http://[::1/x`), which it answers with ValueError."""
    try:
        return urlparse(reference).scheme.lower()
    except ValueError:
        return None


def is_remote_reference(reference: Any) -> bool:
    """Whether a media reference is a URL fetched over http(s) (`remote_fetch`)."""
    return isinstance(reference, str) and url_scheme(reference) in ("http", "https")


# OpenAI's image_url.detail (`original`: the image at its own size); accepted and not acted on, as vLLM does
IMAGE_DETAILS = ("auto", "low", "high", "original")


def media_from_part(part: Mapping[str, Any], where: str | None = None) -> tuple[str, Any] | None:
    """(kind, reference) of a normalized `image` / `video` content part, or None for other parts.

    Accepts OpenAI parts kept by normalization ({"type": "image", "image_url": {"url": ...}}), HF-style parts
    ({"type": "image", "image": <PIL image | path | URL | bytes>}) and vLLM's `image_pil` parts (`"image_pil": image`).
    Raises RequestError naming the missing field, under `where` (the part's path, `messages[i].content[j]`) when
    given.
    """
    kind = part.get("type")
    if kind not in MEDIA_KINDS:
        return None
    if part.get("file_id") is not None:  # an input_image's uploaded file; beside an image_url it was dropped silently
        field = f"{where}.file_id" if where else "file_id"
        raise file_id_error(field, param=field if where else "messages")
    named_part = where or f"{'an' if kind == 'image' else 'a'} {kind} content part"
    keys = (kind, f"{kind}_url", "url", "path", f"{kind}_pil")
    given = [key for key in keys if part.get(key) is not None]
    if len(given) > 1:  # which one the client meant is not known; taking the first dropped the others silently
        times = "twice" if len(given) == 2 else f"{len(given)} times"
        named = f"{', '.join(given[:-1])} and {given[-1]}"
        raise RequestError(f"{named_part} gives its {kind} {times}, as {named}; give it once",
                           param=where or "messages")
    if not given:
        raise RequestError(f"{named_part} has no {kind}, {kind}_url.url or url field",
                           param=where or "messages")
    key = given[0]
    value = part[key]
    if isinstance(value, Mapping):
        field = f"{where}.{key}.url" if where else f"{key}.url"
        if value.get("url") is None:  # `{"image_url": {}}`: OpenAI's shape without its url
            raise RequestError(f"{field} is missing; send {{\"{key}\": {{\"url\": ...}}}} with a data: "
                               "URL, a local path or an http(s) URL", param=field if where else "messages")
        if not isinstance(value["url"], str):  # OpenAI's url is a string; 5 or [1] is no image
            raise RequestError(f"{field} must be a string (a data: URL, a local path or an http(s) URL), "
                               f"not {type(value['url']).__name__}", param=field if where else "messages")
        detail = value.get("detail")
        if key == "image_url" and detail is not None and detail not in IMAGE_DETAILS:
            field = f"{where}.{key}.detail" if where else f"{key}.detail"
            raise image_detail_error(field, detail, param=field if where else "messages")
        # `fps`, `max_frames`: other APIs sample by them, vLLM drops them silently
        asked = sorted(name for name, field_value in value.items() if name != "url" and field_value is not None)
        if key == "video_url" and asked:
            field = f"{where}.{key}.{asked[0]}" if where else f"{key}.{asked[0]}"
            raise RequestError(f"{field}: a video_url object takes only its url (as vLLM's); a video's frames are "
                               "sampled as the model's preprocessor config says whatever a part asks, so it would "
                               "change nothing: leave it out", param=field if where else "messages")
        value = value["url"]
    elif key == "image_url" and part.get("detail") is not None and part["detail"] not in IMAGE_DETAILS:
        # an `input_image` part (the Responses API's, vLLM's chat takes it) has its detail beside its image_url
        field = f"{where}.detail" if where else "detail"
        raise image_detail_error(field, part["detail"], param=field if where else "messages")
    elif key in (f"{kind}_url", "url") and isinstance(value, bool | int | float | list):
        # JSON a client sent (`{"image_url": [url]}`, 5, true), which no image is; Python objects go on
        field = f"{where}.{key}" if where else key
        raise RequestError(f"{field} must be an object {{\"url\": ...}} or a string (a data: URL, a local path "
                           f"or an http(s) URL), not {type(value).__name__}",
                           param=field if where else "messages")
    if isinstance(value, str) and not value.strip():  # names no file: "local files are not allowed" misled
        field = f"{key}.url" if isinstance(part[key], Mapping) else key
        field = f"{where}.{field}" if where else field
        raise empty_url_error(field, param=field if where else "messages")
    return kind, value


def image_detail_error(field: str, detail: Any, param: str) -> RequestError:
    """The refusal of an image part's `detail` (at `field`) that is none of OpenAI's four."""
    return RequestError(f"{field} must be one of {', '.join(map(repr, IMAGE_DETAILS))} (or left out), not {detail!r}; "
                        "Glimmer sends every image at its full size whatever it says", param=param)


def file_id_error(field: str, param: str) -> RequestError:
    """The refusal of an image part's `file_id` (at `field`): the Responses API's input_image names an uploaded file
    by it, and Glimmer has no Files API to read one from."""
    return RequestError(f"{field}: Glimmer has no Files API, so a file id names no image; send the image itself as "
                        "image_url (a data: URL, or a local path or http(s) URL where the server allows them)",
                        param=param)


def empty_url_error(field: str, param: str) -> RequestError:
    """The refusal of an image's or video's url (at `field`) that is empty, which names no file: read as a local path,
    "local files are not allowed" misled."""
    return RequestError(f"{field} is empty; send a data: URL, a local path or an http(s) URL", param=param)


class MediaPart(NamedTuple):
    """An image or video content part of a chat's messages, as `media_parts` finds it."""

    kind: str  # `image` or `video`
    part: Mapping[str, Any]  # the part, with its normalized type (`image`, `video`)
    at: tuple[int, int]  # (i, j): the message's index, the part's index in its content

    @property
    def path(self) -> str:
        """`messages[i].content[j]`, which an error names."""
        i, j = self.at
        return f"messages[{i}].content[{j}]"


def media_parts(messages: Sequence[Mapping[str, Any]]) -> Iterator[MediaPart]:
    """Every image and video part in the order the template renders their placeholders: message order, tool results
    in their calls' order (`tool_results_in_call_order`, as normalization puts them). `messages` as the client sent
    them (`image_url` parts), so that each path (`messages[i].content[j]`) points into the request: normalization
    merges developer messages into the system message, which shifts the messages after them."""
    for i in tool_results_in_call_order(messages):
        message = messages[i]
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = media_kind(part)
                if kind is not None:
                    yield MediaPart(kind, {**part, "type": kind}, (i, j))


def media_kind(part: Any) -> str | None:
    """`image` or `video` for such a content part, as sent (`image_url`) or normalized (`image`); else None."""
    if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
        return None
    return _PART_KINDS.get(part["type"])


def collect_media(messages: list[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    """Every (kind, reference) of `messages` (as sent, see `media_parts`) in the order the template renders their
    placeholders. Raises RequestError naming the part (`messages[i].content[j]`) that has no reference."""
    found = []
    for found_part in media_parts(messages):
        media = media_from_part(found_part.part, found_part.path)
        if media is not None:
            found.append(media)
    return found


def media_part_paths(messages: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The content part path (`messages[i].content[j]`) of each image and each video, by kind, in order:
    `media_part_paths(messages)["image"][n]` is where image n came from."""
    paths: dict[str, list[str]] = {kind: [] for kind in MEDIA_KINDS}
    for media in media_parts(messages):
        paths[media.kind].append(media.path)
    return paths


@contextmanager
def naming_media_parts(messages: Sequence[Mapping[str, Any]]) -> Iterator[None]:
    """Re-raises a MediaError of one item (loading or processing image n / video n of `messages`) as the same
    error naming its content part, `messages[i].content[j]`, in message and param. `messages` as the client
    sent them, so the path points into the request; errors about all items together pass unchanged."""
    try:
        yield
    except MediaError as error:
        paths = media_part_paths(messages).get(error.kind, [])
        if error.index is None or not 0 <= error.index < len(paths):
            raise
        raise error.at(paths[error.index]) from None
