"""Media is bounded before work and kept off the server's own network (issue 8), through the real server."""

from __future__ import annotations

import base64
import contextlib
import io
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
from PIL import Image
from reliability_support import assert_healthy, chat_body, raw_request, send_and_hang_up
from server_support import live_server

from glimmer.multimodal.remote_fetch import _GuardedBackend, loggable_url
from glimmer.multimodal.settings import MediaFetchPolicy, MediaLimits


def png_header_only(width: int, height: int) -> bytes:
    """A tiny PNG file that claims width × height pixels (its data is empty)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def real_png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray((np.random.RandomState(1).rand(height, width, 3) * 255).astype("uint8")).save(buffer, "PNG")
    return buffer.getvalue()


def image_request(url: str, **fields) -> dict:
    return chat_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                            {"type": "text", "text": "what is it?"}]}], **fields)


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def post(server, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)


class _Handler(BaseHTTPRequestHandler):
    """/cat.png, /redirect?to=URL, /slow (10 s of bytes; records when the fetcher hangs up), anything else 404."""

    slow_client_left = threading.Event()

    def do_GET(self):  # noqa: N802 - the stdlib's name
        if self.path == "/cat.png":
            body = real_png(30, 20)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith("/redirect?to="):
            self.send_response(302)
            self.send_header("Location", self.path.split("=", 1)[1])
            self.end_headers()
        elif self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(200):
                    self.wfile.write(b"x" * 100)
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                _Handler.slow_client_left.set()
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def media_host() -> Iterator[int]:
    """A loopback HTTP server; yields its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def checkpoint(make_tiny):
    return make_tiny("canonical", vision=True, seed=17)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("allowed-media")
    (directory / "cat.png").write_bytes(real_png(30, 20))
    return directory


@pytest.fixture(scope="module")
def server(checkpoint, media_dir):
    policy = MediaFetchPolicy.create([media_dir], allow_remote=True, timeout_s=10.0)
    with live_server(checkpoint, media_policy=policy) as live:
        yield live


# -- sizes before decoding ------------------------------------------------------------------------------------


def test_a_tiny_png_claiming_100_million_pixels_is_refused_from_its_header(server, monkeypatch):
    """Issue 8: 1 × 100,000,000 px equals the pixel limit, passed it, and took 51 s and 14.5 GB before a 400.
    Its side and aspect ratio are now checked on the header, before any pixel is decoded."""
    bomb = png_header_only(1, 100_000_000)
    assert len(bomb) < 80 and MediaLimits().max_image_pixels == 100_000_000
    decoded = []
    Image.init()  # Pillow's plugins, imported on the first decode, build images of their own (Palm's 1 × 256 colormap)
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(self.size))
    response = post(server, image_request(data_url(bomb)))
    assert response.status_code == 400, response.text
    assert "exceeds the limit" in response.json()["error"]["message"]
    assert decoded == []
    monkeypatch.undo()
    assert_healthy(server)


@pytest.mark.parametrize(("size", "words"), [((100_000_000, 1), "a side of"), ((16_385, 2), "a side of"),
                                            ((10_000, 40), "aspect ratio"), ((12_000, 12_000), "pixels exceeds")])
def test_oversized_image_headers_are_refused_before_decoding(server, size, words):
    response = post(server, image_request(data_url(png_header_only(*size))))
    assert response.status_code == 400 and words in response.json()["error"]["message"], response.text


def test_images_at_each_limit_are_accepted(checkpoint):
    limits = MediaLimits(max_image_pixels=200 * 4, max_image_side=200, max_image_aspect_ratio=50)
    with live_server(checkpoint) as live:
        live.engine.engine.media.limits = limits
        for width, height in ((200, 4), (28, 28)):
            assert post(live, image_request(data_url(real_png(width, height)))).status_code == 200
        for width, height in ((201, 4), (200, 5), (200, 3)):  # side, pixels, aspect ratio
            assert post(live, image_request(data_url(real_png(width, height)))).status_code == 400


def test_video_frames_are_bounded_from_the_container_header(checkpoint, tmp_path):
    import av

    path = tmp_path / "wide.mkv"
    with av.open(str(path), "w", format="matroska") as output:
        stream = output.add_stream("ffv1", rate=4)
        stream.height, stream.width, stream.pix_fmt = 16, 96, "bgr0"
        for _ in range(4):
            frame = av.VideoFrame.from_ndarray(np.zeros((16, 96, 3), dtype=np.uint8), format="rgb24")
            output.mux(stream.encode(frame))
        output.mux(stream.encode())
    with live_server(checkpoint) as live:
        live.engine.engine.media.limits = MediaLimits(max_image_aspect_ratio=4)
        video = {"type": "video_url", "video_url": {"url": data_url(path.read_bytes(), "video/x-matroska")}}
        response = post(live, chat_body(messages=[{"role": "user", "content": [video]}]))
        assert response.status_code == 400
        assert "messages[0].content[0] (video 0): 96×16 per frame: the aspect ratio" in response.text


# -- local files ----------------------------------------------------------------------------------------------


def test_a_nul_byte_in_a_media_path_is_400(server, media_dir):
    """Issue 8: a 500 ('embedded null byte') before."""
    response = post(server, image_request(str(media_dir / "cat\x00.png")))
    assert response.status_code == 400, response.text


def test_local_media_errors_do_not_tell_missing_from_forbidden(server, media_dir, tmp_path):
    (tmp_path / "exists.png").write_bytes(real_png(8, 8))
    messages = set()
    for path in (tmp_path / "exists.png", tmp_path / "missing.png", media_dir / "missing.png", tmp_path):
        response = post(server, image_request(str(path)))
        assert response.status_code == 400
        messages.add(response.json()["error"]["message"].replace(repr(str(path)), "PATH"))
    assert len(messages) == 1, messages
    assert post(server, image_request(str(media_dir / "cat.png"))).status_code == 200


# -- remote media ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}/cat.png", "http://localhost:{port}/cat.png",
                                 "http://[::1]:{port}/cat.png", "http://169.254.169.254/latest/meta-data/",
                                 "http://10.0.0.1/x.png", "http://0.0.0.0:{port}/cat.png",
                                 "http://[::ffff:127.0.0.1]:{port}/cat.png", "{server}/metrics"])
def test_remote_media_never_reaches_loopback_link_local_or_private_addresses(server, url, monkeypatch):
    connected = []
    connect = _GuardedBackend._connect

    def recorded(self, host, *args, **kwargs):  # the server's media fetch (it runs in this process)
        connected.append(host)
        return connect(self, host, *args, **kwargs)

    monkeypatch.setattr(_GuardedBackend, "_connect", recorded)
    with media_host() as port:
        response = post(server, image_request(url.format(port=port, server=server.url)))
    assert response.status_code == 400, response.text
    assert "could not be fetched" in response.json()["error"]["message"]
    assert connected == []  # refused before connecting: nothing waits for a timeout


def test_a_redirect_to_a_private_address_is_refused(checkpoint):
    with media_host() as port:
        policy = MediaFetchPolicy.create(allowed_domains=["localhost"], timeout_s=5.0)
        with live_server(checkpoint, media_policy=policy) as live:
            assert post(live, image_request(f"http://localhost:{port}/cat.png")).status_code == 200
            # localhost is vouched for; 127.0.0.1 is not, wherever the redirect comes from
            target = f"http://127.0.0.1:{port}/cat.png"
            response = post(live, image_request(f"http://localhost:{port}/redirect?to={target}"))
            assert response.status_code == 400 and "could not be fetched" in response.text
            # and with only domains allowed, other hosts are not fetched at all
            assert post(live, image_request("http://example.invalid/x.png")).status_code == 400


def test_remote_errors_do_not_tell_closed_ports_from_open_ones(checkpoint):
    with media_host() as port:
        closed = port + 1 if port < 65535 else port - 1
        policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=5.0)
        with live_server(checkpoint, media_policy=policy) as live:
            messages = set()
            for url in (f"http://127.0.0.1:{closed}/x.png", f"http://127.0.0.1:{port}/missing.png",
                        f"http://127.0.0.1:{port}/redirect?to=/redirect?to=/redirect?to=/redirect?to=/x",
                        f"http://127.0.0.1:{port}/redirect?to=http://[x/y.png",  # a Location urllib cannot split
                        f"{live.url}/v1/models"):
                response = post(live, image_request(url))
                assert response.status_code == 400
                # the message names the URL as the log does, its query cut (a presigned URL's signature)
                messages.add(response.json()["error"]["message"].replace(loggable_url(url), "URL"))
            assert len(messages) == 1, messages


def test_a_url_urllib_cannot_split_is_a_400_naming_its_part(server):
    """An unclosed IPv6 bracket made urllib raise ValueError on the event loop, while the server chose the threads to
    build the prompt on: a 500 with a traceback in the log."""
    response = post(server, image_request("http://[::1/x.png"))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"].startswith("messages[0].content[0] (image 0): ")
    assert_healthy(server)


def test_a_download_stops_when_its_client_leaves(checkpoint):
    """Media fetching runs off the event loop and is cancelled with its request, not finished for nobody."""
    _Handler.slow_client_left.clear()
    with media_host() as port:
        policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=30.0, max_bytes=1 << 30)
        with live_server(checkpoint, media_policy=policy) as live:
            body = httpx.Request("POST", "http://x", json=image_request(f"http://127.0.0.1:{port}/slow")).content
            send_and_hang_up(live.url, raw_request(live.base_url, "/chat/completions", body), after_s=0.5)
            assert _Handler.slow_client_left.wait(5), "the download went on after the client left"
            assert_healthy(live)


# -- text -----------------------------------------------------------------------------------------------------


def test_text_too_long_for_the_context_is_refused_before_tokenizing(server, monkeypatch):
    engine = server.engine.engine
    calls = []
    monkeypatch.setattr(engine.tokenizer, "encode", lambda *a, **k: calls.append(1))
    text = "word " * (engine.max_prompt_chars // 5 + 1)
    response = post(server, chat_body(messages=[{"role": "user", "content": text}]))
    assert response.status_code == 400 and "characters" in response.json()["error"]["message"]
    completion = httpx.post(server.base_url + "/completions", json={"prompt": text, "max_tokens": 1}, timeout=60)
    assert completion.status_code == 400
    assert calls == []
