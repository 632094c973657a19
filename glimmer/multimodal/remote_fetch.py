"""Fetching a request's media over http(s) without lending the server's network position to the request.

A server that fetches URLs for its clients can be aimed at what only it can reach: its own /metrics, a cloud
metadata service at 169.254.169.254, a database port on the private network. So every connection, the first
and each redirect's, goes through `_GuardedBackend`: it resolves the host once, refuses loopback,
link-local, private, shared, reserved and multicast addresses unless the operator vouched for the host
(`MediaFetchPolicy.allowed_domains`), and connects to the very address it checked, so that a second DNS
answer (rebinding) cannot slip another address in. TLS still verifies the certificate against the host name.
Proxy environment variables are not used: the check must see the address that is connected.

The whole fetch, name resolution and connections included, ends by `MediaFetchPolicy.timeout_s`: `getaddrinfo` has
no timeout of its own (a resolver that drops queries holds it for seconds per nameserver), so it runs on a thread
that is waited for only until then. That thread outlives the fetch until the resolver answers, so at most
MAX_PENDING_LOOKUPS lookups wait in the process at once: a flood of requests naming a host whose resolver never
answers would otherwise pile up a thread per request; beyond them a fetch is refused at once (`LookupsBusyError`).
A socket's timeout bounds one read, not the fetch: a server that trickles its
status line, headers or chunk sizes a byte at a time never lets a read time out, so at the deadline
every connection is shut down (`_GuardedBackend.cut`), which ends whatever read is waiting on it. A connection
not yet made has nothing to cut: its handshake is waited on a CANCEL_CHECK_S at a time (`_GuardedBackend._connect`),
so that a cancel ends it too.

A body compressed for the transfer (Content-Encoding gzip or deflate) is decoded, and the size limit bounds what it
decodes to, as it is decoded (`_read_body`), so that a gzip bomb costs no more memory than an honest body.

Every failure, from a refused address to a closed port, a 404 or a download over the size limit, reads the
same to the client (`RemoteMediaError`), so that errors cannot map the network; the server log has the
reason.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import re
import selectors
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Iterator
from typing import NoReturn
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

import httpcore
import idna
from httpcore._backends.sync import SyncStream  # (httpcore's own stream of a socket; not exported)

from glimmer.cancellation import CANCEL_CHECK_S, Cancelled, CancelToken
from glimmer.multimodal.settings import MediaFetchPolicy

logger = logging.getLogger(__name__)

_REDIRECTS = (301, 302, 303, 307, 308)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# IPv6 ranges that Python's is_global (3.11) takes for global but that no public host is reached at: the last 32
# bits of the first two hold an IPv4 address of the network translating them, a site's own for the third
_NOT_PUBLIC_V6 = tuple(ipaddress.ip_network(net) for net in (
    "::/96",  # IPv4-compatible (RFC 4291 §2.5.5.1, deprecated): ::7f00:1 is 127.0.0.1
    "::ffff:0:0:0/96",  # IPv4-translated (RFC 2765 §2.1, SIIT): ::ffff:0:a00:1 is 10.0.0.1
    "64:ff9b:1::/48",  # local-use IPv4/IPv6 translation (RFC 8215): a site's NAT64 to its own IPv4 network
    "fec0::/10",  # site-local (RFC 3879, deprecated), routed inside a site where still configured
))
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:/*)[^/?#]*@")  # RFC 3986 §3.2.1: up to the last @ of the authority


# WHATWG URL: C0 controls and spaces around a URL are no part of it
_C0_CONTROL_OR_SPACE = "".join(map(chr, range(0x21)))
# what a URL holds as it is; anything else is percent-encoded (RFC 3986 §2, with `%` kept: an escape already there)
_URL_CHARACTERS = "!#$%&'()*+,/:;=?@[]~"


def _request_url(url: str) -> str:
    """`url` as HTTP carries it, as browsers and requests and aiohttp (vLLM's HTTP clients) send it: spaces and controls
    around it dropped, a character outside ASCII or one no URL holds (a space, `"`, `<`) percent-encoded as its UTF-8
    bytes (RFC 3986 §2.1; a redirect's raw bytes, read by `_header_text`, as they came), a host outside ASCII in IDNA
    (`xn--`), the fragment left out. httpcore refuses such a URL: `http://host/café.png` or `/photo 1.png` could not
    be fetched. Raises RemoteMediaError for a host IDNA cannot spell, text no bytes spell (a lone surrogate) or a URL
    urllib cannot split."""
    try:
        parts = urlsplit(url.strip(_C0_CONTROL_OR_SPACE))
        userinfo, at, host_and_port = parts.netloc.rpartition("@")
        if not host_and_port.isascii():  # (an IPv6 address is ASCII: the host is all before the port's ':')
            host, colon, port = host_and_port.partition(":")
            host_and_port = _ascii_host(host) + colon + port
        userinfo, path, query = (quote(text, _URL_CHARACTERS, errors="surrogateescape")
                                 for text in (userinfo, parts.path, parts.query))
        return urlunsplit((parts.scheme, userinfo + at + host_and_port, path, query, ""))
    except (UnicodeError, ValueError) as error:  # (ValueError: an unclosed IPv6 bracket)
        raise RemoteMediaError(f"not a URL HTTP can carry: {loggable_url(url)!r} ({error})") from None


def _ascii_host(host: str) -> str:
    """`host` in IDNA 2008 with UTS 46's mapping, as browsers, requests and httpx spell it (Python's "idna" codec is
    IDNA 2003, which spells faß.example fass.example, another host); a host IDNA 2008 refuses (a symbol: i❤.ws, an
    underscore) in IDNA 2003, as browsers and yarl (aiohttp's URLs) fall back to it. Raises UnicodeError for one
    neither spells."""
    try:
        return idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError:
        return host.encode("idna").decode("ascii")


def _header_text(value: bytes) -> str:
    """A header's value as text, its bytes UTF-8 as browsers and requests read a redirect's Location; a byte that is
    no UTF-8 is kept as itself (`surrogateescape`), which `_request_url` sends on as it came."""
    return value.decode("utf-8", errors="surrogateescape")


def loggable_url(url: str) -> str:
    """`url` without its userinfo (`user:password@`, a credential), its query and its fragment, cut at 200
    characters: what may be logged or repeated in an error. A presigned URL's signature or token lives in the query
    (`X-Amz-Signature=`, `sig=`, `token=`), so the query is cut whatever its names; `?…` marks that there was one."""
    without_userinfo = _USERINFO.sub(r"\1", url)
    without_fragment = without_userinfo.split("#", 1)[0]
    address, query_mark, _ = without_fragment.partition("?")
    return address[:200] + ("?…" if query_mark else "")


class RemoteMediaError(Exception):
    """The URL could not be fetched; `reason` is for the server log only."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def is_public_address(address: str) -> bool:
    """True for a globally routable unicast address, also when an IPv4 address hides inside an IPv6 one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None and not is_public_address(str(embedded)):
            return False
        if any(ip in network for network in _NOT_PUBLIC_V6):
            return False
    return ip.is_global and not ip.is_multicast


class LookupsBusyError(Exception):
    """Every host-name lookup the process allows (MAX_PENDING_LOOKUPS) is still waiting on the resolver."""


LONGEST_SOCKET_WAIT_S = 1e9
"""The longest timeout one socket wait is given (31 years): a socket takes none past about 9.2e9 s (nanoseconds in 64
bits), so a longer time limit (`--media-fetch-timeout 1e12`, meaning none) made every wait raise OverflowError; the
whole fetch still ends by its own limit."""
MAX_PENDING_LOOKUPS = 64  # over the 40 fetches a server's loop runs at once, so that only stuck lookups fill it
# one for the process, as the threads it counts are: every server, loop and LLM fetching shares them
_PENDING_LOOKUPS = threading.BoundedSemaphore(MAX_PENDING_LOOKUPS)


def _resolve(host: str, port: int, timeout_s: float, limit_s: float, cancel: CancelToken | None) -> list[tuple]:
    """`socket.getaddrinfo(host, port)`, given up after `timeout_s` or once `cancel` is cancelled (looked at every
    CANCEL_CHECK_S; the lookup itself cannot be interrupted: it ends on its daemon thread, which holds one of the
    MAX_PENDING_LOOKUPS until then). Raises RemoteMediaError naming `limit_s`, the whole fetch's limit; Cancelled;
    LookupsBusyError where all MAX_PENDING_LOOKUPS are held."""
    if not _PENDING_LOOKUPS.acquire(blocking=False):
        raise LookupsBusyError(f"{MAX_PENDING_LOOKUPS} host-name lookups are still waiting on the DNS resolver")
    outcome: list = []

    def look_up() -> None:
        try:
            outcome.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as error:
            outcome.append(error)
        finally:
            _PENDING_LOOKUPS.release()

    thread = threading.Thread(target=look_up, name="glimmer-media-resolve", daemon=True)
    try:
        thread.start()
    except BaseException:  # no thread ("can't start new thread"), so none will release the place taken for it
        _PENDING_LOOKUPS.release()
        raise
    end = time.monotonic() + timeout_s
    while thread.is_alive() and (left := end - time.monotonic()) > 0:
        if cancel is not None:
            cancel.check()
        thread.join(min(CANCEL_CHECK_S, left))
    if not outcome:
        raise RemoteMediaError(f"cannot resolve {host!r} within {limit_s} s")
    if isinstance(outcome[0], Exception):
        raise RemoteMediaError(f"cannot resolve {host!r}: {outcome[0]}")
    return outcome[0]


class _GuardedBackend(httpcore.SyncBackend):
    """The network of one fetch: its connections, which it can cut, the policy, the deadline and the cancel token."""

    def __init__(self, policy: MediaFetchPolicy, deadline: float, cancel: CancelToken | None):
        self.policy = policy
        self.deadline = deadline  # time.monotonic() by which the whole fetch ends
        self.cancel = cancel
        # a duplicate descriptor of each connection: shutdown(2) acts on the connection, whichever descriptor names
        # it, and TLS detaches the socket httpcore was handed
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self.was_cut = False

    def cut(self) -> None:
        """Shut every connection down, ending a read in progress (the deadline has passed, or the fetch was
        cancelled)."""
        with self._lock:
            self.was_cut = True
            for connection in self._connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed by the peer
                    pass

    def cut_at_deadline_or_cancel(self, done: threading.Event) -> None:
        """Cut the connections at the deadline, or once the token is cancelled (looked at every CANCEL_CHECK_S),
        unless the fetch is `done` first (the watchdog thread's work)."""
        while not done.wait(min(CANCEL_CHECK_S, max(self.deadline - time.monotonic(), 0))):
            if time.monotonic() >= self.deadline or (self.cancel is not None and self.cancel.cancelled):
                self.cut()
                return

    def close(self) -> None:
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()

    def time_left(self, doing: str) -> float:
        """Seconds left until the deadline; RemoteMediaError naming what was `doing` once none are, Cancelled once the
        fetch is."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.raise_cut_short(f"no answer within {self.policy.timeout_s} s ({doing})")
        if self.cancel is not None:
            self.cancel.check()
        return left

    def raise_cut_short(self, message: str) -> NoReturn:
        """Raises Cancelled where the fetch was cancelled (which cuts its connections too), else
        RemoteMediaError(`message`): the error of a fetch cut short (its connection cut, a wait timed out)."""
        if self.cancel is not None:
            self.cancel.check()
        raise RemoteMediaError(message) from None

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> httpcore.NetworkStream:
        host = host.lower().rstrip(".")
        found = _resolve(host, port, self.time_left("resolving the host"), self.policy.timeout_s, self.cancel)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
        if host not in self.policy.allowed_domains:
            refused = [address for address in addresses if not is_public_address(address)]
            if refused:  # all or nothing: a name with one private address is a name pointed inward
                raise RemoteMediaError(f"{host!r} resolves to non-public address(es) {refused}; list the host in "
                                       "--allowed-media-domains to allow it")
        error: Exception | None = None
        for address in addresses:  # connect to an address that was checked, never to the name again
            left = self.time_left("connecting")
            try:
                stream = self._connect(address, port, min(timeout or left, left), local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as failure:
                error = failure
                continue
            with self._lock:
                self._connections.append(stream.get_extra_info("socket").dup())
                if self.was_cut:  # the deadline passed while connecting
                    with contextlib.suppress(OSError):  # already closed by the peer
                        self._connections[-1].shutdown(socket.SHUT_RDWR)
            return stream
        raise RemoteMediaError(f"cannot connect to {host!r} port {port}: {error!r}")

    def _connect(self, address: str, port: int, timeout: float, local_address: str | None = None,
                 socket_options=None) -> httpcore.NetworkStream:
        """httpcore's connect_tcp to the IP `address`, its handshake waited on CANCEL_CHECK_S at a time so that a
        cancel ends it at once: a blocking connect to an address that never answers (a firewall that drops it) held a
        cancelled fetch until its time limit, since the watchdog cuts only connections made. Raises ConnectTimeout
        after `timeout` seconds, ConnectError for a refused connection or any other socket error (as httpcore's own
        connect: an address family the host lacks, IPv6 on a kernel without it, moves on to the next address),
        Cancelled once the fetch is."""
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock: socket.socket | None = None
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            if local_address is not None:
                sock.bind((local_address, 0))
            sock.setblocking(False)
            end = time.monotonic() + timeout
            code = sock.connect_ex((address, port))
            with selectors.DefaultSelector() as selector:
                selector.register(sock, selectors.EVENT_WRITE)  # writable (or failed) once the handshake ends
                while code in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
                    left = end - time.monotonic()
                    if left <= 0:
                        raise httpcore.ConnectTimeout(f"no answer to connecting within {timeout:.3g} s")
                    if self.cancel is not None:
                        self.cancel.check()
                    if selector.select(min(CANCEL_CHECK_S, left)):
                        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                raise httpcore.ConnectError(f"[Errno {code}] {os.strerror(code)}")
            sock.setblocking(True)
            for option in socket_options or ():
                sock.setsockopt(*option)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException as error:
            if sock is not None:
                sock.close()
            if isinstance(error, OSError):
                raise httpcore.ConnectError(str(error)) from None
            raise
        return SyncStream(sock)


def fetch_remote(url: str, policy: MediaFetchPolicy, cancel: CancelToken | None = None) -> bytes:
    """The body of a 200 response to GET `url`, following redirects.

    Raises RemoteMediaError for any failure (with the reason for the log), LookupsBusyError where the resolver is
    held up by too many lookups, Cancelled once `cancel` is.
    """
    backend = _GuardedBackend(policy, time.monotonic() + policy.timeout_s, cancel)
    done = threading.Event()
    threading.Thread(target=backend.cut_at_deadline_or_cancel, args=(done,), name="glimmer-media-watchdog",
                     daemon=True).start()
    try:
        return _fetch(url, backend)
    finally:
        done.set()
        backend.close()


def _fetch(url: str, backend: _GuardedBackend) -> bytes:
    policy = backend.policy
    with httpcore.ConnectionPool(ssl_context=ssl.create_default_context(), max_connections=1,
                                 network_backend=backend) as pool:
        for _ in range(policy.max_redirects + 1):
            # each hop's waits end by the deadline too
            left = min(backend.time_left("following redirects"), LONGEST_SOCKET_WAIT_S)
            timeouts = {"connect": left, "read": left, "write": left, "pool": left}
            url = _request_url(url)
            parts = urlsplit(url)
            host = (parts.hostname or "").rstrip(".")
            if parts.scheme not in ("http", "https") or not host:
                raise RemoteMediaError(f"not an http(s) URL with a host: {loggable_url(url)!r}")
            if not policy.allows_host(host):
                raise RemoteMediaError(f"{host!r} is not among --allowed-media-domains")
            answered = False  # whether the answer's head came: a cut after it cut the download, not the wait
            try:
                with pool.stream("GET", url, headers={"Accept": "*/*", "User-Agent": "glimmer"},
                                 extensions={"timeout": timeouts}) as response:
                    answered = True
                    if response.status in _REDIRECTS:
                        # a header's name is case-insensitive (RFC 9110 §5.1): Envoy sends `location:`
                        location = next(_header_values(response, b"location"), None)
                        if location is None:
                            raise RemoteMediaError(f"HTTP {response.status} without a Location header")
                        url = urljoin(url, _header_text(location))
                        continue
                    if response.status != 200:
                        raise RemoteMediaError(f"HTTP {response.status}")
                    body = _read_body(response, backend)
                    if backend.was_cut:  # a body that ends with the connection was cut short, not complete
                        backend.raise_cut_short(f"the download took longer than {policy.timeout_s} s")
                    return body
            except (RemoteMediaError, LookupsBusyError, Cancelled):
                raise
            except Exception as error:  # network, TLS, protocol and URL errors of every kind
                if backend.was_cut or isinstance(error, httpcore.TimeoutException):
                    backend.raise_cut_short(f"the download took longer than {policy.timeout_s} s" if answered
                                            else f"no answer within {policy.timeout_s} s")
                raise RemoteMediaError(f"{type(error).__name__}: {error}") from None
    raise RemoteMediaError(f"more than {policy.max_redirects} redirects")


def _read_body(response: httpcore.Response, backend: _GuardedBackend) -> bytes:
    """The body of `response`, decoded from its content coding (`_content_decoder`); `policy.max_bytes` bounds the
    bytes received and the decoded bytes, of which no more than one past it is ever decoded: a gzip bomb's 64 MiB
    come from 64 KiB."""
    policy = backend.policy
    decoder = _content_decoder(response)
    chunks, total, received = [], 0, 0
    for chunk in response.iter_stream():
        if backend.cancel is not None:
            backend.cancel.check()
        if time.monotonic() > backend.deadline:  # the read timeout is per read; this bounds the whole download
            raise RemoteMediaError(f"the download took longer than {policy.timeout_s} s")
        received += len(chunk)  # the compressed bytes too: empty gzip members decode to nothing, endlessly
        if decoder is not None:
            chunk = decoder.decode(chunk, policy.max_bytes - total + 1)
        total += len(chunk)
        if max(total, received) > policy.max_bytes:
            raise RemoteMediaError(f"the body is larger than {policy.max_bytes:,} bytes")
        chunks.append(chunk)
    if decoder is not None and not decoder.complete:
        raise RemoteMediaError("the compressed body (Content-Encoding) is cut short or has data after its end")
    return b"".join(chunks)


def _header_values(response: httpcore.Response, name: bytes) -> Iterator[bytes]:
    """The values of `response`'s headers called `name` (lower case), whatever the case a server spelt them in (RFC
    9110 §5.1: Envoy writes `location:`)."""
    return (value for header, value in response.headers if header.lower() == name)


class _BodyDecoder:
    """A gzip or deflate body's decoder, reading what requests' urllib3 and aiohttp read: a gzip body of several
    members one after another (RFC 1952 §2.2, as bgzip and `cat a.gz b.gz` write) and a deflate body without zlib's
    header (raw deflate, which servers send for `deflate` though RFC 9110 §8.4.1.2 says zlib's format)."""

    def __init__(self, coding: str):
        self.gzip = coding != "deflate"
        self._zlib = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS if self.gzip else zlib.MAX_WBITS)
        self._unsure = not self.gzip  # whether a deflate body may yet be raw: until its bytes decode as zlib's
        self._seen = b""  # a deflate body's bytes while unsure, decoded again as raw deflate if zlib's header fails

    def decode(self, data: bytes, most: int) -> bytes:
        """`data` decoded, at most `most` bytes of it (the rest is dropped: the caller refuses the body then)."""
        if self._unsure:
            self._seen += data
            try:
                decoded = self._zlib.decompress(data, most)
            except zlib.error:  # no zlib header: raw deflate, from the first byte
                self._unsure, self._zlib = False, zlib.decompressobj(wbits=-zlib.MAX_WBITS)
                return self.decode(self._seen, most)
            self._unsure = not decoded and len(self._seen) < 65536  # (empty blocks must not grow it unbounded)
            if not self._unsure:
                self._seen = b""
            return decoded
        pieces, length = [], 0  # (joined once: adding bytes to bytes per member copied them all, a member each)
        while data and length < most:
            try:
                pieces.append(self._zlib.decompress(data, most - length))
            except zlib.error as error:
                raise RemoteMediaError(f"the compressed body (Content-Encoding) does not decode: {error}") from None
            length += len(pieces[-1])
            data = self._zlib.unused_data if self.gzip and self._zlib.eof else b""
            if data:  # the next gzip member
                self._zlib = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        return b"".join(pieces)

    @property
    def complete(self) -> bool:
        """Whether the body ended where its last member's compressed data does."""
        return self._zlib.eof and not self._zlib.unused_data


# what Content-Encoding names are decoded: gzip (RFC 9110 §8.4.1.3, x-gzip its alias) and deflate (§8.4.1.2)
_DECODED_CODINGS = ("gzip", "x-gzip", "deflate")


def _content_decoder(response: httpcore.Response) -> _BodyDecoder | None:
    """The decoder of the body's Content-Encoding; None for none (or identity). A server may compress a body asked for
    without Accept-Encoding (RFC 9110 §12.5.3: any coding is acceptable then), as S3 serves an object stored with
    `Content-Encoding: gzip`; requests and aiohttp (vLLM's HTTP clients) decode it too. Raises RemoteMediaError for a
    coding other than one gzip or deflate (br, zstd, or several)."""
    codings = [coding.strip().lower() for value in _header_values(response, b"content-encoding")
               for coding in value.decode("latin-1").split(",")]
    codings = [coding for coding in codings if coding not in ("", "identity")]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in _DECODED_CODINGS:
        raise RemoteMediaError(f"the body's Content-Encoding {', '.join(codings)!r} is not read; gzip and deflate are")
    return _BodyDecoder(codings[0])
