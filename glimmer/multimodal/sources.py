"""Where a request's images and videos come from: data URLs, allowed local files, or (if enabled) http(s).

Media references are untrusted input. Local files are read only under directories the operator allowed
(`--allowed-local-media-path`), after resolving symlinks; remote fetching is off unless the operator
enables it (`--allow-remote-media`, `--allowed-media-domains`), and then bounded in size, time and
redirects and kept off the server's own network (`remote_fetch`). Every refusal is a RequestError (HTTP 400)
naming the item, and says no more than the client may learn: whether a file exists outside the allowed
directories, or whether a port is open, reads the same as any other failure.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from glimmer.cancellation import CancelToken
from glimmer.errors import RequestError
from glimmer.multimodal.image import is_image_data
from glimmer.multimodal.remote_fetch import RemoteMediaError, fetch_remote
from glimmer.multimodal.settings import MediaFetchPolicy
from glimmer.multimodal.video import is_video_data

__all__ = ["MEDIA_KINDS", "MediaFetchPolicy", "collect_media", "load_media_reference", "media_from_part"]

logger = logging.getLogger(__name__)

MEDIA_KINDS = ("image", "video")


def _error(kind: str, index: int, message: str) -> RequestError:
    return RequestError(f"{kind} {index}: {message}", param="messages")


def _decode_data_url(url: str, kind: str, index: int, policy: MediaFetchPolicy) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep:
        raise _error(kind, index, "malformed data URL (no ',' separating the header from the data)")
    if len(payload) > policy.max_bytes * 4 // 3 + 4:
        raise _error(kind, index, f"data URL is larger than the limit of {policy.max_bytes:,} bytes")
    if header.endswith(";base64"):
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise _error(kind, index, "data URL is not valid base64") from None
    else:
        data = unquote(payload).encode("latin-1", errors="replace")
    if not data:
        raise _error(kind, index, "data URL is empty")
    return data


def _read_local(path_text: str, kind: str, index: int, policy: MediaFetchPolicy) -> bytes:
    if not policy.allowed_local_paths:
        raise _error(kind, index, "local files are not allowed; the server operator can allow a directory with "
                                  "--allowed-local-media-path")
    # One answer for a missing file, one outside the allowed directories and one that is not a regular file,
    # so that a request cannot learn which files exist on the machine.
    refused = _error(kind, index, f"{path_text!r} is not a readable file under the allowed media directories")
    try:
        resolved = Path(path_text).expanduser().resolve(strict=True)
        allowed = any(resolved.is_relative_to(root) for root in policy.allowed_local_paths) and resolved.is_file()
        size = resolved.stat().st_size if allowed else 0
    except (OSError, RuntimeError, ValueError):  # missing, unreadable, a NUL byte, a symlink loop
        allowed = False
    if not allowed:
        raise refused
    if size > policy.max_bytes:
        raise _error(kind, index, f"file is {size:,} bytes, more than the limit of {policy.max_bytes:,}")
    try:
        return resolved.read_bytes()
    except OSError:
        raise refused from None


def _fetch_remote(url: str, kind: str, index: int, policy: MediaFetchPolicy, cancel: CancelToken | None) -> bytes:
    if not policy.allows_remote:
        raise _error(kind, index, "fetching media over http(s) is disabled; send a data: URL, or start the server "
                                  "with --allow-remote-media")
    try:
        data = fetch_remote(url, policy, cancel)
        if not (is_image_data(data) if kind == "image" else is_video_data(data)):
            # a decoding error would tell the client that something answered 200 there
            raise RemoteMediaError(f"the body ({len(data):,} bytes) is not a recognizable {kind}")
        return data
    except RemoteMediaError as error:
        logger.info("%s %d: fetching %s failed: %s", kind, index, url[:200], error.reason)
        what = "an image" if kind == "image" else "a video"
        raise _error(kind, index, f"{url[:200]} could not be fetched (an unreachable or refused address, an "
                                  f"answer other than HTTP 200 with {what}, more than {policy.max_redirects} "
                                  f"redirects, more than {policy.max_bytes:,} bytes or more than {policy.timeout_s} "
                                  "s)") from None


def load_media_reference(reference: Any, kind: str, index: int, policy: MediaFetchPolicy,
                         cancel: CancelToken | None = None) -> Any:
    """Bytes for a URL or path string; anything else (PIL image, frames array, bytes) passes through.

    Raises RequestError naming the item, or Cancelled (during a download) once `cancel` is cancelled.
    """
    if not isinstance(reference, str):
        return reference
    scheme = urlparse(reference).scheme.lower()
    if scheme == "data":
        return _decode_data_url(reference, kind, index, policy)
    if scheme in ("http", "https"):
        return _fetch_remote(reference, kind, index, policy, cancel)
    if scheme == "file":
        return _read_local(unquote(urlparse(reference).path), kind, index, policy)
    if scheme and len(scheme) > 1:
        raise _error(kind, index, f"unsupported URL scheme {scheme!r}; use data:, a local path or http(s)")
    return _read_local(reference, kind, index, policy)


def media_from_part(part: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(kind, reference) of a normalized `image` / `video` content part, or None for other parts.

    Accepts OpenAI parts kept by normalization ({"type": "image", "image_url": {"url": ...}}) and
    HF-style parts ({"type": "image", "image": <PIL image | path | URL | bytes>}).
    """
    kind = part.get("type")
    if kind not in MEDIA_KINDS:
        return None
    for key in (kind, f"{kind}_url", "url", "path"):
        if key in part and part[key] is not None:
            value = part[key]
            if isinstance(value, Mapping):
                value = value.get("url")
            return kind, value
    raise RequestError(f"a {kind} content part has no {kind}, {kind}_url.url or url field", param="messages")


def collect_media(messages: list[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    """Every (kind, reference) in message order, the order the template renders their placeholders."""
    found = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping):
                    media = media_from_part(part)
                    if media is not None:
                        found.append(media)
    return found
