"""The guarded http(s) fetcher: which addresses it refuses, and that it connects to the address it checked."""

from __future__ import annotations

import errno
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpcore
import pytest

from glimmer.cancellation import Cancelled, CancelToken
from glimmer.errors import ConfigError, ServiceBusyError
from glimmer.multimodal.errors import MediaFetchBusyError
from glimmer.multimodal.remote_fetch import (
    MAX_PENDING_LOOKUPS,
    LookupsBusyError,
    RemoteMediaError,
    _GuardedBackend,
    _resolve,
    fetch_remote,
    is_public_address,
)
from glimmer.multimodal.settings import MediaFetchPolicy
from glimmer.multimodal.sources import load_media_reference


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254",
                                     "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "192.0.2.1", "::1",
                                     "fe80::1", "fc00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "64:ff9b::7f00:1",
                                     "2002:7f00:1::", "::", "ff02::1", "::7f00:1", "::a00:1", "::ffff:0:7f00:1",
                                     "64:ff9b:1::a00:1", "fec0::1"])
def test_non_public_addresses_are_refused(address):
    assert not is_public_address(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8"])
def test_public_addresses_are_allowed(address):
    assert is_public_address(address)


def record_connections(monkeypatch) -> list[str]:
    """The hosts the fetcher connects to (each attempt then fails: the tests have no network)."""
    connected: list[str] = []

    def record(self, host, port, *args, **kwargs):
        connected.append(host)
        raise httpcore.ConnectError("no network in tests")

    monkeypatch.setattr(_GuardedBackend, "_connect", record)
    return connected


def test_the_connection_goes_to_the_address_that_was_checked(monkeypatch):
    """DNS rebinding: a name that first resolves to a public address and then to loopback must not reach
    loopback; the fetcher resolves once and connects to what it checked."""
    answers = iter(["93.184.216.34", "127.0.0.1"])
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, **kwargs: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))])
    connected = record_connections(monkeypatch)
    policy = MediaFetchPolicy.create(allow_remote=True, timeout_s=30.0)  # (each connection fails at once)
    with pytest.raises(RemoteMediaError, match="cannot connect"):
        fetch_remote("http://rebind.example/cat.png", policy)
    assert connected == ["93.184.216.34"]


@pytest.fixture
def unanswered_lookups(monkeypatch):
    """A resolver that answers no lookup (for a minute) while the test runs; its lookups end with the test, so none
    holds a place among MAX_PENDING_LOOKUPS in the next one."""
    answer = threading.Event()
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: answer.wait(60) and [])
    yield
    answer.set()
    for thread in resolver_threads():
        thread.join()


def test_a_resolver_that_does_not_answer_ends_the_fetch_by_its_time_limit(unanswered_lookups):
    """getaddrinfo has no timeout: a resolver dropping queries held the request for its own retries (seconds per
    nameserver) whatever the policy's timeout_s said."""
    started = time.monotonic()
    with pytest.raises(RemoteMediaError, match="cannot resolve 'slow-dns.example' within 0.3 s"):
        fetch_remote("http://slow-dns.example/cat.png", MediaFetchPolicy.create(allow_remote=True, timeout_s=0.3))
    assert time.monotonic() - started < 30  # 0.3 s, not the resolver's minute


def test_a_slow_lookup_late_in_the_fetch_names_the_fetch_limit_not_the_seconds_left(unanswered_lookups):
    """The lookup gets what is left of the fetch's time; the error named those seconds (0.1 s of a 0.3 s limit, or
    0.2 s when the machine was slow to get there) instead of the limit the user set."""
    backend = _GuardedBackend(MediaFetchPolicy.create(allow_remote=True, timeout_s=0.3), time.monotonic() + 0.1, None)
    backend.time_left = lambda doing: 0.1  # the fetch's last tenth of a second, however slowly the test got here
    with pytest.raises(RemoteMediaError, match=r"cannot resolve 'slow-dns.example' within 0.3 s"):
        backend.connect_tcp("slow-dns.example", 80)


def test_connections_to_many_silent_addresses_end_by_the_time_limit(monkeypatch):
    """Each address got the whole connect timeout: six addresses that never answer took six times the limit."""
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, **kwargs: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"93.184.216.{i}", port)) for i in range(6)])

    given: list[float] = []

    def silent(self, host, port, timeout=None, *args, **kwargs):
        given.append(timeout)
        time.sleep(timeout)
        raise httpcore.ConnectTimeout("no answer")

    monkeypatch.setattr(_GuardedBackend, "_connect", silent)
    with pytest.raises(RemoteMediaError, match="no answer within 0.4 s"):
        fetch_remote("http://silent.example/cat.png", MediaFetchPolicy.create(allow_remote=True, timeout_s=0.4))
    assert given and sum(given) <= 0.4  # each address got what was left of the limit, however slow the machine


def test_a_name_with_any_private_address_is_refused(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, **kwargs: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))])
    monkeypatch.setattr(_GuardedBackend, "_connect", lambda *a, **k: pytest.fail("connected"))
    with pytest.raises(RemoteMediaError, match="non-public"):
        fetch_remote("http://mixed.example/x.png", MediaFetchPolicy.create(allow_remote=True))


def test_allowed_domains_may_be_private_but_only_they_are_fetched(monkeypatch):
    policy = MediaFetchPolicy.create(allowed_domains=["Images.Internal."])
    assert policy.allowed_domains == ("images.internal",) and policy.allows_remote
    assert policy.allows_host("images.internal") and not policy.allows_host("example.com")
    with pytest.raises(RemoteMediaError, match="not among --allowed-media-domains"):
        fetch_remote("http://example.com/x.png", policy)
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, **kwargs: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))])
    connected = record_connections(monkeypatch)
    with pytest.raises(RemoteMediaError, match="cannot connect"):
        fetch_remote("http://images.internal/x.png", policy)
    assert connected == ["10.0.0.7"]


@pytest.mark.parametrize("name", ["http://x.org", "x.org/path", "a b", ""])
def test_allowed_domains_must_be_host_names(name):
    with pytest.raises(ConfigError, match="not a host name"):
        MediaFetchPolicy.create(allowed_domains=[name])


def test_a_server_trickling_its_headers_is_cut_off_at_the_time_limit():
    """A socket timeout bounds one read: headers sent a line every 50 ms never let a read time out, so a 0.3 s fetch
    waited the 2 s the server took and then returned its body."""
    listener = socket.create_server(("127.0.0.1", 0))
    body = b"GIF89a" + b"\0" * 20

    def trickle():
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            try:
                connection.sendall(b"HTTP/1.1 200 OK\r\n")
                for i in range(40):
                    connection.sendall(f"X-Line-{i}: a\r\n".encode())
                    time.sleep(0.05)
                connection.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            except OSError:  # the fetcher hung up
                pass

    server = threading.Thread(target=trickle, daemon=True)
    server.start()
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=0.3)
    with listener, pytest.raises(RemoteMediaError, match=r"no answer within 0.3 s"):
        fetch_remote(f"http://127.0.0.1:{listener.getsockname()[1]}/cat.gif", policy)
    server.join()


def test_cancelling_a_fetch_ends_its_wait_on_a_server_that_does_not_answer():
    """The cancel token was looked at only between chunks of the body: a fetch waiting on a server that did not answer
    went on until its time limit after its request was cancelled, and `glimmer serve`, which waits for its fetch
    threads as it exits, stayed up that long after SIGTERM (10 s by default, an hour here)."""
    listener = socket.create_server(("127.0.0.1", 0))
    asked, hung_up = threading.Event(), threading.Event()

    def never_answer():
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            asked.set()
            if connection.recv(4096) == b"":  # the fetcher shut the connection down
                hung_up.set()

    threading.Thread(target=never_answer, daemon=True).start()
    cancel = CancelToken()
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=3600)
    outcome: list[BaseException] = []

    def fetch():
        try:
            fetch_remote(f"http://127.0.0.1:{listener.getsockname()[1]}/cat.gif", policy, cancel)
        except BaseException as error:
            outcome.append(error)

    fetching = threading.Thread(target=fetch, daemon=True)  # (before the fix it waited the hour)
    with listener:
        fetching.start()
        assert asked.wait(60)
        cancel.cancel()
        assert hung_up.wait(60), "the cancelled fetch still waits on the server"
        fetching.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], Cancelled), outcome


def test_cancelling_a_fetch_ends_its_connect_to_an_address_that_never_answers(monkeypatch):
    """The TCP handshake was one blocking connect: to an address whose firewall drops it (a blackhole) a cancelled
    fetch went on connecting until its time limit, and the watchdog had no connection to cut yet. A listener whose
    queue is full and that never accepts drops each handshake as such an address does."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = [socket.create_connection(("127.0.0.1", port), timeout=5)]  # fills the queue (Linux holds one more)
    probe = socket.socket()
    probe.setblocking(False)
    probe.connect_ex(("127.0.0.1", port))
    queued.append(probe)
    connecting = threading.Event()
    time_left = _GuardedBackend.time_left

    def noting_the_connect(self, doing):
        left = time_left(self, doing)
        if doing == "connecting":
            connecting.set()
        return left

    monkeypatch.setattr(_GuardedBackend, "time_left", noting_the_connect)
    try:  # (before the fix it waited the hour)
        cancel_once_waiting(f"http://127.0.0.1:{port}/cat.gif",
                            MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=3600), connecting)
    finally:
        listener.close()  # the connects left answer a reset
        for connection in queued:
            connection.close()


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def fetched_from_a_server_answering_ok(host: str, policy: MediaFetchPolicy) -> bytes:
    """What `fetch_remote` returns for `http://HOST:PORT/cat.gif`, PORT a server's on 127.0.0.1 that answers every GET
    with the body `ok` (`host` resolves there, or a test's getaddrinfo makes it)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        return fetch_remote(f"http://{host}:{server.server_address[1]}/cat.gif", policy)
    finally:
        server.shutdown()
        server.server_close()


def test_a_time_limit_past_what_a_socket_takes_is_no_limit_not_a_failed_fetch():
    """The fetch's time limit was each socket wait's timeout too, and a socket takes none past about 9.2e9 s
    (nanoseconds in 64 bits): under `--media-fetch-timeout 1e12`, an operator's "no limit", every http(s) image
    failed with `OverflowError: timestamp out of range for platform time_t`."""
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=1e12)
    assert fetched_from_a_server_answering_ok("127.0.0.1", policy) == b"ok"


def test_an_address_family_the_kernel_lacks_moves_on_to_the_next_address(monkeypatch):
    """A dual-stack name resolves to its IPv6 address first; on a kernel without IPv6 the socket itself cannot be
    made (EAFNOSUPPORT). httpcore's connect reads that as a failed connection and tries the next address; the
    cancellable connect let the OSError out of the loop, and every such fetch failed where IPv4 would answer."""
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, **kwargs: [
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))])
    real_socket = socket.socket

    def no_ipv6(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real_socket(family, *args, **kwargs)

    monkeypatch.setattr(socket, "socket", no_ipv6)
    policy = MediaFetchPolicy.create(allowed_domains=["dual.test"], timeout_s=30.0)
    assert fetched_from_a_server_answering_ok("dual.test", policy) == b"ok"


def test_cancelling_a_fetch_ends_its_wait_on_a_lookup_that_does_not_answer(monkeypatch):
    """The lookup of the host was waited on to the fetch's time limit whatever the cancel token said (the watchdog cuts
    connections, and there is none yet): a fetch of a host whose DNS did not answer kept its thread, and `glimmer
    serve`'s exit, that long after its request was cancelled."""
    looking_up, answer = threading.Event(), threading.Event()

    def slow_lookup(host, port, **kwargs):
        looking_up.set()
        answer.wait(60)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))]

    monkeypatch.setattr(socket, "getaddrinfo", slow_lookup)
    try:  # (before the fix it waited the hour)
        cancel_once_waiting("http://slow.example/cat.gif", MediaFetchPolicy.create(allow_remote=True, timeout_s=3600),
                            looking_up)
    finally:
        answer.set()
        for thread in resolver_threads():
            thread.join()


def cancel_once_waiting(url: str, policy: MediaFetchPolicy, waiting: threading.Event) -> None:
    """Fetch `url` on a thread, cancel it once `waiting` is set, and check that the fetch then ends, Cancelled."""
    cancel = CancelToken()
    outcome: list[BaseException] = []

    def fetch():
        try:
            fetch_remote(url, policy, cancel)
        except BaseException as error:
            outcome.append(error)

    fetching = threading.Thread(target=fetch, daemon=True)
    fetching.start()
    assert waiting.wait(60)
    cancel.cancel()
    fetching.join(60)
    assert not fetching.is_alive(), "the cancelled fetch still waits"
    assert len(outcome) == 1 and isinstance(outcome[0], Cancelled), outcome


def resolver_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "glimmer-media-resolve"]


def test_lookups_a_resolver_never_answers_are_bounded_and_fetches_past_them_are_refused_at_once(monkeypatch):
    """A lookup outlives its fetch until the resolver answers: a flood of requests naming a host whose resolver never
    answers left a thread each. At most MAX_PENDING_LOOKUPS wait; a fetch past them is a 503 to retry, naming the
    part, and a lookup that answers frees its place."""
    for thread in resolver_threads():  # other tests' slow lookups, ending within seconds
        thread.join()
    answer = threading.Event()
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: answer.wait() and [])
    policy = MediaFetchPolicy(allow_remote=True, timeout_s=5.0)

    def fetch(index: int) -> Exception:
        with pytest.raises((RemoteMediaError, LookupsBusyError)) as failed:
            fetch_remote(f"http://stuck-{index}.example/a.png", policy)
        return failed.value

    try:
        with ThreadPoolExecutor(2 * MAX_PENDING_LOOKUPS) as pool:
            errors = list(pool.map(fetch, range(2 * MAX_PENDING_LOOKUPS)))
        assert len(resolver_threads()) == MAX_PENDING_LOOKUPS
        assert sum(isinstance(error, LookupsBusyError) for error in errors) == MAX_PENDING_LOOKUPS
        assert all("cannot resolve" in str(error) for error in errors if isinstance(error, RemoteMediaError))
        with pytest.raises(MediaFetchBusyError, match=r"messages\[0\]\.content\[1\] \(image 0\): "
                           r"http://stuck\.example/a\.png cannot be fetched now.*try again later") as refused:
            try:
                load_media_reference("http://stuck.example/a.png", "image", 0, policy)
            except MediaFetchBusyError as error:
                raise error.at("messages[0].content[1]") from None
        assert isinstance(refused.value, ServiceBusyError) and refused.value.param == "messages[0].content[1]"
    finally:
        answer.set()
        for thread in resolver_threads():
            thread.join()
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, **kwargs: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))])
    with pytest.raises(RemoteMediaError, match="non-public"):  # resolved: the lookups' places are free again
        fetch_remote("http://answered.example/a.png", policy)


def test_a_lookup_whose_thread_cannot_start_gives_its_place_back(monkeypatch):
    """The place among MAX_PENDING_LOOKUPS is taken before the lookup's thread starts; where the thread cannot start
    (the process is out of threads) no thread would release it, so each such failure lost a place for good, until
    every fetch was refused as busy."""
    def refuse(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    for _ in range(MAX_PENDING_LOOKUPS + 1):
        with pytest.raises(RuntimeError, match="can't start new thread"):
            _resolve("example.com", 80, 1.0, 1.0, None)
    monkeypatch.undo()
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, **kwargs: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))])
    assert _resolve("example.com", 80, 5.0, 5.0, None)[0][4] == ("10.0.0.7", 80)
