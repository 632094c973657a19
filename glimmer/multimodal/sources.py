"""Where a request's images and videos come from: data URLs, allowed local files, or (if enabled) http(s).

Media references are untrusted input. Local files are read only under directories the operator allowed
(`--allowed-local-media-path`), after resolving symlinks; remote fetching is off unless the operator
enables it (`--allow-remote-media`), and then bounded in size, time and redirects. Every refusal is a
RequestError (HTTP 400) naming the item.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from glimmer.errors import RequestError

MEDIA_KINDS = ("image", "video")


@dataclass(frozen=True)
class MediaFetchPolicy:
    allowed_local_paths: tuple[Path, ...] = ()
    allow_remote: bool = False
    max_bytes: int = 64 << 20
    timeout_s: float = 10.0
    max_redirects: int = 3

    @classmethod
    def create(cls, allowed_local_paths: list[str | os.PathLike] | None = None, **kwargs: Any) -> MediaFetchPolicy:
        roots = tuple(Path(p).expanduser().resolve() for p in (allowed_local_paths or []))
        return cls(allowed_local_paths=roots, **kwargs)


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
    path = Path(path_text).expanduser()
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise _error(kind, index, f"file {path_text!r} does not exist") from None
    if not any(resolved.is_relative_to(root) for root in policy.allowed_local_paths):
        raise _error(kind, index, f"file {path_text!r} is outside the allowed media directories")
    if not resolved.is_file():
        raise _error(kind, index, f"{path_text!r} is not a regular file")
    size = resolved.stat().st_size
    if size > policy.max_bytes:
        raise _error(kind, index, f"file is {size:,} bytes, more than the limit of {policy.max_bytes:,}")
    return resolved.read_bytes()


def _fetch_remote(url: str, kind: str, index: int, policy: MediaFetchPolicy) -> bytes:
    if not policy.allow_remote:
        raise _error(kind, index, "fetching media over http(s) is disabled; send a data: URL, or start the server "
                                  "with --allow-remote-media")
    import httpx

    try:
        client = httpx.Client(follow_redirects=True, max_redirects=policy.max_redirects, timeout=policy.timeout_s)
        with client, client.stream("GET", url) as response:
            if response.status_code != 200:
                raise _error(kind, index, f"fetching {url} returned HTTP {response.status_code}")
            chunks, total = [], 0
            deadline = time.monotonic() + policy.timeout_s
            for chunk in response.iter_bytes():
                if time.monotonic() > deadline:  # httpx's timeout is per read; bound the whole download
                    raise httpx.ReadTimeout("total time")
                total += len(chunk)
                if total > policy.max_bytes:
                    raise _error(kind, index, f"{url} is larger than the limit of {policy.max_bytes:,} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
    except httpx.TooManyRedirects:
        raise _error(kind, index, f"{url} redirected more than {policy.max_redirects} times") from None
    except httpx.TimeoutException:
        raise _error(kind, index, f"fetching {url} took longer than {policy.timeout_s} s") from None
    except httpx.HTTPError as exc:
        raise _error(kind, index, f"fetching {url} failed: {type(exc).__name__}") from None


def load_media_reference(reference: Any, kind: str, index: int, policy: MediaFetchPolicy) -> Any:
    """Bytes for a URL or path string; anything else (PIL image, frames array, bytes) passes through."""
    if not isinstance(reference, str):
        return reference
    scheme = urlparse(reference).scheme.lower()
    if scheme == "data":
        return _decode_data_url(reference, kind, index, policy)
    if scheme in ("http", "https"):
        return _fetch_remote(reference, kind, index, policy)
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
