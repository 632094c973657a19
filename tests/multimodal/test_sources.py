"""Media references from requests: data URLs, allowed local files, remote fetching policy."""

from __future__ import annotations

import base64
import gzip
import io
import logging
import os
import re
import socket
import threading
import tracemalloc
import zlib
from pathlib import Path
from urllib.parse import quote

import pytest
from PIL import Image

from glimmer.errors import RequestError
from glimmer.multimodal import MediaError, MediaLimitError, MediaLimits, MediaProcessor, sources
from glimmer.multimodal.remote_fetch import RemoteMediaError, fetch_remote
from glimmer.multimodal.sources import (
    MediaFetchPolicy,
    collect_media,
    load_media_reference,
    media_from_part,
    media_part_paths,
    naming_media_parts,
)


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_data_url_is_decoded():
    url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    assert load_media_reference(url, "image", 0, MediaFetchPolicy()) == _png()


@pytest.mark.parametrize("url", ["http://[::1/x.png", "https://[x", "file://[::1/etc/passwd"])
def test_a_url_urllib_cannot_split_is_refused_naming_the_item(url):
    with pytest.raises(MediaError, match="image 0.*not a URL"):
        load_media_reference(url, "image", 0, MediaFetchPolicy.create(allow_remote=True))


@pytest.mark.parametrize("header", ["data:image/png; base64", "data:image/png;  BASE64 ", "data:image/png;base64\t"])
def test_data_url_base64_marker_may_follow_spaces_as_browsers_read_it(header):
    """WHATWG fetch's data: URL processor strips the MIME type's ASCII whitespace and reads ";" then spaces then
    "base64" as the marker; `; base64` was read as percent-encoded text, the image refused as no image format."""
    data = _png()
    assert load_media_reference(f"{header}," + base64.b64encode(data).decode(), "image", 0, MediaFetchPolicy()) == data


def test_data_url_base64_marker_is_case_insensitive():
    url = "DATA:image/PNG;BASE64," + base64.b64encode(_png()).decode()
    assert load_media_reference(url, "image", 0, MediaFetchPolicy()) == _png()


@pytest.mark.parametrize("spell", [
    pytest.param(lambda data: base64.encodebytes(data).decode(), id="line-breaks"),  # what `base64` prints
    pytest.param(lambda data: base64.b64encode(data).decode().rstrip("="), id="no-padding"),
    pytest.param(lambda data: " \t" + "\r\n".join(base64.encodebytes(data).decode().rstrip("=\n").split("\n")),
                 id="crlf-spaces-no-padding"),
])
def test_data_url_base64_is_read_forgivingly_as_browsers_do(spell):
    """WHATWG forgiving-base64: ASCII whitespace is ignored and the final padding may be left out."""
    data = _png()
    assert len(base64.b64encode(data)) % 4 == 0 and base64.b64encode(data).endswith(b"=")  # padding to leave out
    assert load_media_reference("data:image/png;base64," + spell(data), "image", 0, MediaFetchPolicy()) == data


@pytest.mark.parametrize("escape", [lambda text: quote(text, safe=""),
                                    lambda text: re.sub("%..", lambda m: m[0].lower(), quote(text, safe=""))],
                         ids=["upper-case", "lower-case"])
def test_a_percent_encoded_base64_payload_is_decoded_first_as_browsers_do(escape):
    """QA: `%2B` for `+` (`%2F`, `%3D`) was refused as not base64; browsers percent-decode a data URL's body before
    reading it as base64 (WHATWG fetch, data: URL processor)."""
    data = bytes([0xFB, 0xFF, 0xBF]) * 8 + b"ab"
    escaped = escape(base64.b64encode(data).decode())
    assert {"%2B", "%2F", "%3D"} <= set(re.findall(r"%..", escaped.upper()))
    assert load_media_reference("data:image/png;base64," + escaped, "image", 0, MediaFetchPolicy()) == data
    png = _png()
    mixed = base64.b64encode(png).decode().replace("=", "%3D").replace("+", "%2B")
    assert load_media_reference("data:image/png;base64," + mixed, "image", 0, MediaFetchPolicy()) == png


@pytest.mark.parametrize("fragment", ["#frag", "#", "#a,b#c"])
def test_a_data_url_s_fragment_is_no_part_of_its_data_as_browsers_read_it(fragment):
    """QA: `data:image/png;base64,…#frag` was refused as not valid base64; the WHATWG data: URL processor reads the
    URL without its fragment."""
    png = _png()
    for url in ("data:image/png;base64," + base64.b64encode(png).decode(), "data:image/png," + quote(png)):
        assert load_media_reference(url + fragment, "image", 0, MediaFetchPolicy()) == png


def test_a_percent_encoded_data_url_without_base64_gives_its_bytes():
    """A body without `;base64` is percent-decoded to bytes: %89 was read as UTF-8 and became `?`."""
    png = _png()
    assert load_media_reference("data:image/png," + quote(png), "image", 0, MediaFetchPolicy()) == png


@pytest.mark.parametrize(
    "payload", ["QUJD%ZZ", "QUJD%4", "QUJ%0BD", "QUJD%C3%A9", "QUJD%2D_", "QUJD%40", "%2541%2542%2543%2544"],
    ids=["bad-escape", "cut-escape", "vertical-tab", "non-ascii", "url-safe", "at-sign", "double-escaped"])
def test_a_percent_encoded_payload_that_is_no_base64_once_decoded_is_still_refused(payload):
    with pytest.raises(RequestError, match="image 2: data URL is not valid base64"):
        load_media_reference("data:image/png;base64," + payload, "image", 2, MediaFetchPolicy())


@pytest.mark.parametrize(
    ("url", "message"),
    [("data:image/png;base64,@@@", "not valid base64"), ("data:image/png;base64", "malformed data URL"),
     ("data:image/png;base64,", "empty"), ("data:image/png;base64,QUJD-_==", "not valid base64"),
     ("data:image/png;base64,QUJDR", "not valid base64"), ("data:image/png;base64,QU=JD", "not valid base64"),
     ("data:image/png;base64,QUI===", "not valid base64"), ("data:image/png;base64,QUJ\vD", "not valid base64")],
)
def test_bad_data_urls_are_request_errors(url, message):
    with pytest.raises(RequestError, match=message) as err:
        load_media_reference(url, "image", 2, MediaFetchPolicy())
    assert str(err.value).startswith("image 2:")


def test_base64_in_a_data_url_without_base64_in_its_header_is_refused_naming_the_fix():
    """QA: "data:image/png,iVBOR…" (the header's ;base64 forgotten) read the base64 text as the image's bytes and was
    refused as "not an image format Glimmer reads (PNG, …)", for what the client knew to be a PNG."""
    png = io.BytesIO()
    Image.new("RGB", (40, 40), "orange").save(png, format="PNG")
    text = base64.b64encode(png.getvalue()).decode()
    with pytest.raises(RequestError) as err:
        load_media_reference("data:image/png," + text, "image", 0, MediaFetchPolicy())
    assert str(err.value) == ("image 0: data URL holds base64 but its header 'data:image/png' does not end in "
                              "';base64', so its text would be read as the bytes themselves; add it: "
                              "data:image/png;base64,<data>")
    # percent-encoded bytes, and base64 text that is no image, are read as they are
    assert load_media_reference("data:image/png," + quote(png.getvalue()), "image", 0,
                                MediaFetchPolicy()) == png.getvalue()
    assert load_media_reference("data:image/png,QUJD", "image", 0, MediaFetchPolicy()) == b"QUJD"


def test_url_safe_base64_is_refused_naming_the_standard_alphabet_as_the_fix():
    """QA: a PNG encoded with base64.urlsafe_b64encode (or JavaScript's "base64url") was refused as "data URL is not
    valid base64" alone; the client could not tell that only the alphabet was wrong."""
    png = io.BytesIO()
    Image.new("RGB", (40, 40), "orange").save(png, format="PNG")
    url_safe = base64.urlsafe_b64encode(png.getvalue()).decode()
    assert "-" in url_safe or "_" in url_safe
    with pytest.raises(RequestError) as err:
        load_media_reference("data:image/png;base64," + url_safe, "image", 0, MediaFetchPolicy())
    assert "URL-safe alphabet" in str(err.value) and "base64.b64encode, not base64.urlsafe_b64encode" in str(err.value)
    with pytest.raises(RequestError) as err:  # no - or _: nothing said of the alphabet
        load_media_reference("data:image/png;base64,@@@", "image", 0, MediaFetchPolicy())
    assert str(err.value) == "image 0: data URL is not valid base64"


def test_data_url_over_the_size_limit_is_refused_before_decoding():
    url = "data:image/png;base64," + "A" * 4000
    with pytest.raises(RequestError, match="larger than the limit"):
        load_media_reference(url, "image", 0, MediaFetchPolicy(max_bytes=1000))


def test_the_data_url_size_limit_is_on_the_decoded_bytes():
    """The limit is --max-media-bytes of data: a percent-encoded data URL of as many bytes (3 characters a byte) was
    refused as larger than it, being measured as base64's 4 characters for 3 bytes, and a base64 one up to 3 bytes
    over the limit was taken."""
    png = _png()
    policy = MediaFetchPolicy(max_bytes=len(png))
    escaped = "".join(f"%{byte:02X}" for byte in png)
    assert load_media_reference("data:image/png," + escaped, "image", 0, policy) == png
    assert load_media_reference("data:image/png;base64," + base64.b64encode(png).decode(), "image", 0, policy) == png
    smaller = MediaFetchPolicy(max_bytes=len(png) - 1)
    for url in ("data:image/png," + escaped, "data:image/png;base64," + base64.b64encode(png).decode()):
        with pytest.raises(RequestError, match=f"larger than the limit of {len(png) - 1:,} bytes"):
            load_media_reference(url, "image", 0, smaller)


def test_local_files_need_an_allowed_directory(tmp_path):
    image = tmp_path / "allowed" / "cat.png"
    image.parent.mkdir()
    image.write_bytes(_png())
    with pytest.raises(RequestError, match="--allowed-local-media-path"):
        load_media_reference(str(image), "image", 0, MediaFetchPolicy())
    policy = MediaFetchPolicy.create([tmp_path / "allowed"])
    assert load_media_reference(str(image), "image", 0, policy) == _png()
    assert load_media_reference(f"file://{image}", "image", 0, policy) == _png()


def test_a_file_url_naming_another_host_is_refused_naming_it(tmp_path):
    """file://HOST/path names a file on HOST (RFC 8089); its host was dropped and the local file of that path read, a
    file other than the one named. localhost and no host are this machine."""
    image = tmp_path / "cat.png"
    image.write_bytes(_png())
    policy = MediaFetchPolicy.create([tmp_path])
    with pytest.raises(RequestError, match="file URL names the host 'fileserver'; only files on this machine"):
        load_media_reference(f"file://fileserver{image}", "image", 0, policy)
    assert load_media_reference(f"file://localhost{image}", "image", 0, policy) == _png()


@pytest.mark.parametrize("host", ["LOCALHOST", "LocalHost"])
def test_a_file_url_naming_localhost_in_any_case_reads_the_local_file(tmp_path, host):
    """A host name is case-insensitive (RFC 3986 §3.2.2, which RFC 8089 follows): file://LOCALHOST/path was refused
    as naming another machine."""
    image = tmp_path / "cat.png"
    image.write_bytes(_png())
    policy = MediaFetchPolicy.create([tmp_path])
    assert load_media_reference(f"file://{host}{image}", "image", 0, policy) == _png()


def test_paths_escaping_the_allowed_directory_are_refused(tmp_path):
    secret = tmp_path / "secret.png"
    secret.write_bytes(_png())
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "link.png").symlink_to(secret)
    policy = MediaFetchPolicy.create([allowed])
    for reference in (str(allowed / ".." / "secret.png"), str(allowed / "link.png")):
        with pytest.raises(RequestError, match="is not a readable file under the allowed media directories"):
            load_media_reference(reference, "image", 0, policy)


def test_a_missing_file_reads_the_same_as_a_forbidden_one(tmp_path):
    """Issue 8: the answer must not tell whether a file exists outside the allowed directories."""
    (tmp_path / "secret.png").write_bytes(_png())
    (tmp_path / "allowed").mkdir()
    policy = MediaFetchPolicy.create([tmp_path / "allowed"])
    messages = set()
    for path in (tmp_path / "secret.png", tmp_path / "missing.png", tmp_path, tmp_path / "allowed" / "nope.png",
                 tmp_path / "a\x00b.png"):
        with pytest.raises(RequestError) as raised:
            load_media_reference(str(path), "image", 0, policy)
        messages.add(str(raised.value).replace(repr(str(path)), "PATH"))
    assert messages == {"image 0: PATH is not a readable file under the allowed media directories"}


def _swapped_when_opened(monkeypatch, path, swap) -> None:
    """`swap()` replaces `path` (or a directory above it) just before it is first opened, by os.open or io.open (what
    Path.read_bytes and os.fdopen call), whether by its path or by walking it from the allowed directory: after every
    check made by its name, as someone writing into the allowed directory can race the server."""
    pending = [path, *path.parents]

    def swapping(real_open):
        def opening(file, *args, **kwargs):
            if pending and isinstance(file, str | os.PathLike) and Path(file) in pending:
                pending.clear()
                swap()
            return real_open(file, *args, **kwargs)
        return opening

    monkeypatch.setattr(os, "open", swapping(os.open))
    monkeypatch.setattr(io, "open", swapping(io.open))


def _loaded_within(timeout_s: float, reference: str, policy: MediaFetchPolicy, fifo: Path) -> bytes | Exception:
    """load_media_reference's bytes or error; a load still waiting after `timeout_s` (a FIFO opened to read waits
    for a writer) fails the test, its thread let go by opening `fifo` to write."""
    outcome: list = []

    def load() -> None:
        try:
            outcome.append(load_media_reference(reference, "image", 0, policy))
        except Exception as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout_s)
        pytest.fail(f"reading {reference} waited more than {timeout_s} s")
    return outcome[0]


def _swap_for_symlink_out(image, secret):
    image.unlink()
    image.symlink_to(secret)


def _swap_for_fifo(image, secret):
    image.unlink()
    os.mkfifo(image)


def _swap_directory_for_symlink_out(image, secret):
    image.parent.rename(image.parent.with_name("moved"))
    image.parent.symlink_to(secret.parent, target_is_directory=True)


def _swap_directory_back(image):
    image.parent.unlink()
    image.parent.with_name("moved").rename(image.parent)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize(("swap", "walk"), [
    pytest.param(_swap_for_symlink_out, "walk", id="symlink-out"),
    pytest.param(_swap_for_fifo, "walk", id="fifo"),
    pytest.param(_swap_directory_for_symlink_out, "walk", id="directory-symlink-out"),
    pytest.param(_swap_directory_for_symlink_out, "none", id="directory-symlink-out-without-dir-fd"),
    pytest.param(_swap_directory_for_symlink_out, "none, swapped back", id="and-back-without-dir-fd"),
])
def test_a_local_file_swapped_after_its_check_is_refused_as_opened(tmp_path, monkeypatch, swap, walk):
    """A file checked by its path and then read by it: swapped in between for a symlink out of the allowed
    directory (or a directory above it for one), the secret it names was sent to the model; swapped for a FIFO, the
    read waited for a writer for ever, holding a worker thread. The path is walked from the allowed directory, no
    symlink followed, and what was opened checked to be a regular file; where os.open takes no directory descriptor,
    the path is opened whole and resolved again, its st_dev and st_ino compared, so that a directory swapped back once
    the file is open is seen too."""
    (tmp_path / "outside").mkdir()
    secret = tmp_path / "outside" / "cat.png"
    secret.write_bytes(b"secret")
    image = tmp_path / "allowed" / "album" / "cat.png"
    image.parent.mkdir(parents=True)
    image.write_bytes(_png())
    policy = MediaFetchPolicy.create([tmp_path / "allowed"])
    _swapped_when_opened(monkeypatch, image, lambda: swap(image, secret))
    if walk != "walk":
        monkeypatch.setattr(sources, "_OPEN_WALKS_FROM_A_DIRECTORY", False)
    if walk == "none, swapped back":
        swapping_open = os.open

        def open_then_swap_back(*args, **kwargs):
            fd = swapping_open(*args, **kwargs)
            if image.parent.is_symlink():
                _swap_directory_back(image)
            return fd

        monkeypatch.setattr(os, "open", open_then_swap_back)
    outcome = _loaded_within(5.0, str(image), policy, fifo=image)
    assert isinstance(outcome, RequestError), outcome
    assert str(outcome) == f"image 0: {str(image)!r} is not a readable file under the allowed media directories"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_directory_swapped_for_a_symlink_out_is_refused_without_opening_what_it_names(tmp_path, monkeypatch):
    """O_NOFOLLOW on the whole path covers its last component only: a directory above the file swapped for a symlink
    out of the allowed directory (to /dev, say) had the file it named opened (a device's open may act, a terminal
    become the server's), to be refused only once it was. Nothing outside the allowed directory is opened now."""
    outside = tmp_path / "outside"
    outside.mkdir()
    os.mkfifo(outside / "cat.png")  # what a device node is to open, without root
    image = tmp_path / "allowed" / "album" / "cat.png"
    image.parent.mkdir(parents=True)
    image.write_bytes(_png())
    policy = MediaFetchPolicy.create([tmp_path / "allowed"])
    _swapped_when_opened(monkeypatch, image, lambda: _swap_directory_for_symlink_out(image, outside / "cat.png"))
    opened = []
    swapping_open = os.open

    def recording_open(*args, **kwargs):
        fd = swapping_open(*args, **kwargs)
        opened.append(os.fstat(fd))
        return fd

    monkeypatch.setattr(os, "open", recording_open)
    outcome = _loaded_within(5.0, str(image), policy, fifo=outside / "cat.png")
    assert isinstance(outcome, RequestError), outcome
    assert str(outcome) == f"image 0: {str(image)!r} is not a readable file under the allowed media directories"
    outside_files = [os.stat(outside), os.stat(outside / "cat.png")]
    assert not [found for found in opened if any(os.path.samestat(found, other) for other in outside_files)]


def test_a_local_file_swapped_after_its_check_for_one_over_the_limit_is_refused(tmp_path, monkeypatch):
    """Its size was checked by its path, then the file of that path read whole, however large."""
    image = tmp_path / "cat.png"
    image.write_bytes(_png())
    policy = MediaFetchPolicy.create([tmp_path], max_bytes=len(_png()))
    _swapped_when_opened(monkeypatch, image, lambda: image.write_bytes(_png() * 2))
    limit = f"file is {2 * len(_png()):,} bytes, more than the limit of {len(_png()):,}"
    with pytest.raises(RequestError, match=limit):
        load_media_reference(str(image), "image", 0, policy)


def test_a_local_file_that_grows_past_the_limit_while_read_is_refused(tmp_path, monkeypatch):
    """A file that grows after its size is read (or that reports none, as /proc's do) is read no further than the
    limit and refused."""
    image = tmp_path / "cat.png"
    image.write_bytes(_png())
    policy = MediaFetchPolicy.create([tmp_path], max_bytes=len(_png()))
    real_fstat = os.fstat

    def fstat_then_grow(fd):
        found = real_fstat(fd)
        os.truncate(image, 64 << 20)  # sparse: no disk written
        return found

    monkeypatch.setattr(os, "fstat", fstat_then_grow)
    tracemalloc.start()
    try:
        with pytest.raises(RequestError, match=f"file holds more than the limit of {len(_png()):,} bytes"):
            load_media_reference(str(image), "image", 0, policy)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # the file read whole is 64 MiB


def test_a_small_local_file_is_read_without_a_buffer_of_the_limits_size(tmp_path):
    """Read no further than the limit, a file is still read into a buffer as large as it is, not the limit's 64 MiB
    (for each of 40 fetch threads)."""
    image = tmp_path / "cat.png"
    image.write_bytes(_png())
    policy = MediaFetchPolicy.create([tmp_path], max_bytes=64 << 20)
    tracemalloc.start()
    try:
        assert load_media_reference(str(image), "image", 0, policy) == _png()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_refused_path_is_shown_cut_not_whole(tmp_path):
    """A data URL without its `data:` is a path; its refusal repeats 200 characters of it, not megabytes."""
    policy = MediaFetchPolicy.create([tmp_path])
    mistyped = "data;text/plain;base64," + base64.b64encode(b"not an image" * 100).decode()
    with pytest.raises(RequestError) as raised:
        load_media_reference(mistyped, "image", 0, policy)
    assert str(raised.value) == (f"image 0: {mistyped[:200]!r}… is not a readable file under the allowed media "
                                 "directories")


@pytest.mark.parametrize("allowed", [False, True])
@pytest.mark.parametrize("header", ["", "image/png;base64,", "data;image/png;base64,", "data:image/png,"])
def test_base64_of_an_image_sent_without_its_data_url_header_is_refused_saying_so(tmp_path, allowed, header):
    """An image's base64 alone (OpenAI's SDKs leave the data: URL to the caller), or after a header without its
    `data:`, was read as a path: "local files are not allowed; allow a directory with --allowed-local-media-path",
    or not a readable file, which led away from the fix. It is refused as base64 without a data: URL's header."""
    policy = MediaFetchPolicy.create([tmp_path] if allowed else [])
    sent = header + base64.b64encode(_png()).decode()
    with pytest.raises(RequestError) as raised:
        load_media_reference(sent, "image", 0, policy)
    if header.startswith("data:"):  # a data: URL: its own refusal (no ;base64) says so
        assert "does not end in ';base64'" in str(raised.value)
        return
    assert str(raised.value) == ("image 0: this is base64 of an image, not a path or a URL: send it as a data: URL, "
                                 "data:image/png;base64,<data> (with the image's own MIME type)")


@pytest.mark.parametrize("allowed", [False, True])
@pytest.mark.parametrize("header", ["", "image/png;base64,"])
def test_base64_of_an_image_larger_than_the_limit_is_refused_as_base64_too_large(tmp_path, allowed, header):
    """Base64 longer than the limit's took no look at what it was: it was refused as a path, "local files are not
    allowed; allow ... --allowed-local-media-path". Its first characters say it is base64 of an image, and the
    refusal says that image is larger than the limit."""
    image = io.BytesIO()
    Image.effect_noise((512, 512), 100).save(image, format="PNG")  # noise: a PNG of a quarter megabyte
    policy = MediaFetchPolicy.create([tmp_path] if allowed else [], max_bytes=1000)
    assert len(image.getvalue()) > 1000
    with pytest.raises(RequestError) as raised:
        load_media_reference(header + base64.b64encode(image.getvalue()).decode(), "image", 0, policy)
    assert str(raised.value) == ("image 0: this is base64 of an image larger than the limit of 1,000 bytes, not a "
                                 "path or a URL: send a smaller one as a data: URL, data:image/png;base64,<data> (with "
                                 "the image's own MIME type)")


def _jpeg_with_metadata(metadata_bytes: int) -> bytes:
    """A small JPEG with an ICC profile of `metadata_bytes` before its frame, as a camera's or an editor's is."""
    image = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 200, 10)).save(image, format="JPEG", icc_profile=b"\x00" * metadata_bytes)
    return image.getvalue()


@pytest.mark.parametrize("header", ["", "image/jpeg;base64,"])
def test_base64_of_a_jpeg_with_large_metadata_is_refused_as_base64_not_as_a_path(tmp_path, header):
    """Base64 of more than 65,536 characters was judged by its first 64 KiB, which held no more than a JPEG's
    100 KB ICC profile: within the limit it was refused as a path, "local files are not allowed"."""
    policy = MediaFetchPolicy.create([])
    sent = header + base64.b64encode(_jpeg_with_metadata(100_000)).decode()
    assert 65_536 < len(sent) < policy.max_bytes
    with pytest.raises(RequestError) as raised:
        load_media_reference(sent, "image", 0, policy)
    assert str(raised.value) == ("image 0: this is base64 of an image, not a path or a URL: send it as a data: URL, "
                                 "data:image/png;base64,<data> (with the image's own MIME type)")


def test_base64_of_a_jpeg_with_large_metadata_larger_than_the_limit_is_refused_as_base64_too_large(tmp_path):
    """Past the limit's length only a bounded prefix is read: its first bytes, a JPEG's signature, say what it is,
    though its frame lies 100 KB on."""
    policy = MediaFetchPolicy.create([tmp_path], max_bytes=50_000)
    with pytest.raises(RequestError) as raised:
        load_media_reference(base64.b64encode(_jpeg_with_metadata(100_000)).decode(), "image", 0, policy)
    assert str(raised.value) == ("image 0: this is base64 of an image larger than the limit of 50,000 bytes, not a "
                                 "path or a URL: send a smaller one as a data: URL, data:image/png;base64,<data> (with "
                                 "the image's own MIME type)")


def test_base64_of_a_tga_larger_than_the_limit_is_refused_as_base64_too_large(tmp_path):
    """TGA has no signature: past the limit's length it was judged by the signature alone and refused as a path,
    "local files are not allowed", where base64 of a PNG as large is refused as base64 of an image too large."""
    image = io.BytesIO()
    Image.effect_noise((64, 64), 100).convert("RGB").save(image, format="TGA")
    policy = MediaFetchPolicy.create([], max_bytes=1000)
    assert len(image.getvalue()) > 1000
    with pytest.raises(RequestError) as raised:
        load_media_reference(base64.b64encode(image.getvalue()).decode(), "image", 0, policy)
    assert str(raised.value) == ("image 0: this is base64 of an image larger than the limit of 1,000 bytes, not a "
                                 "path or a URL: send a smaller one as a data: URL, data:image/png;base64,<data> (with "
                                 "the image's own MIME type)")


@pytest.mark.parametrize("max_bytes", [100, 10_000])
def test_base64_of_an_image_signature_is_refused_as_base64_whatever_the_limit(tmp_path, max_bytes):
    """Base64 of a JPEG's signature and then zeros (no frame Pillow could open) was base64 past the limit's length
    (told by the signature) but a path within it (told by opening it): the verdict hung on the limit."""
    sent = base64.b64encode(b"\xff\xd8\xff" + bytes(997)).decode()
    with pytest.raises(RequestError) as raised:
        load_media_reference(sent, "image", 0, MediaFetchPolicy.create([tmp_path], max_bytes=max_bytes))
    assert str(raised.value).startswith("image 0: this is base64 of an image")
    assert ("larger than the limit" in str(raised.value)) == (max_bytes == 100)


def test_remote_fetching_is_off_unless_enabled():
    with pytest.raises(RequestError, match="--allow-remote-media"):
        load_media_reference("https://example.com/cat.png", "image", 0, MediaFetchPolicy())


def test_unknown_schemes_are_refused():
    with pytest.raises(RequestError, match="unsupported URL scheme 'ftp'"):
        load_media_reference("ftp://host/cat.png", "image", 0, MediaFetchPolicy())


def test_media_parts_are_collected_in_message_order():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "image_url": {"url": "u1"}}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "video", "video_url": {"url": "v1"}}, {"type": "image", "image": "p"}]},
    ]
    assert collect_media(messages) == [("image", "u1"), ("video", "v1"), ("image", "p")]
    with pytest.raises(RequestError, match="has no image"):
        media_from_part({"type": "image"})


@pytest.mark.parametrize(("kind", "named"), [("image", "an image content part"), ("video", "a video content part")])
def test_a_media_part_without_its_path_names_it_with_its_article(kind, named):
    """With no path to name the part by, a part giving its item twice read "a image content part"."""
    with pytest.raises(RequestError) as twice:
        media_from_part({"type": kind, kind: "A", "url": "B"})
    assert str(twice.value) == f"{named} gives its {kind} twice, as {kind} and url; give it once"
    with pytest.raises(RequestError) as missing:
        media_from_part({"type": kind})
    assert str(missing.value) == f"{named} has no {kind}, {kind}_url.url or url field"


def test_an_input_image_file_id_is_refused_naming_it_even_beside_its_image_url():
    """vLLM's chat takes the Responses API's input_image parts, whose file_id names an uploaded file; Glimmer has no
    Files API, and beside an image_url the file id was dropped without a word."""
    messages = [{"role": "user", "content": [{"type": "input_image", "image_url": "/tmp/cat.png", "file_id": "f-1"}]}]
    with pytest.raises(RequestError) as refused:
        collect_media(messages)
    assert str(refused.value).startswith("messages[0].content[0].file_id: Glimmer has no Files API, so a file id "
                                         "names no image; send the image itself as image_url")
    assert refused.value.param == "messages[0].content[0].file_id"
    with pytest.raises(RequestError, match=r"^file_id: Glimmer has no Files API") as unnamed:
        media_from_part({"type": "image", "file_id": "f-1"})
    assert unnamed.value.param == "messages"
    assert media_from_part({"type": "image", "image_url": "/tmp/cat.png", "file_id": None}) == ("image", "/tmp/cat.png")


def test_an_image_url_without_its_url_names_the_missing_field():
    """Audit: `{"image_url": {}}` used to fail later as "unsupported image input of type NoneType"."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "image_url": {}}]}]
    with pytest.raises(RequestError, match=r"messages\[0\]\.content\[1\]\.image_url\.url is missing") as err:
        collect_media(messages)
    assert err.value.param == "messages[0].content[1].image_url.url"


@pytest.mark.parametrize("detail", ["auto", "low", "high", "original"])
def test_every_image_detail_of_the_openai_sdk_is_accepted(detail):
    """The SDK types `image_url.detail` as auto, low, high or original (the image at its own size, which Glimmer
    sends whatever the detail says); `original` was a 400 saying it must be one of the other three."""
    part = {"type": "image", "image_url": {"url": "/tmp/cat.png", "detail": detail}}
    assert media_from_part(part, "messages[0].content[0]") == ("image", "/tmp/cat.png")


@pytest.mark.parametrize("extra", [{"fps": 2}, {"detail": "low"}, {"max_frames": 8, "fps": 1.5}])
def test_a_video_urls_field_beside_its_url_is_refused_naming_it(extra):
    """`{"video_url": {"url": ..., "fps": 2}}` (the sampling rate other APIs take there) was read as the url alone: the
    video sampled at the model's own rate, and no word that the fps asked for changed nothing."""
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "/tmp/clip.mp4", **extra}}]}]
    named = min(extra)
    with pytest.raises(RequestError, match=rf"^messages\[0\]\.content\[0\]\.video_url\.{named}: a video_url object "
                                           r"takes only its url") as err:
        collect_media(messages)
    assert err.value.param == f"messages[0].content[0].video_url.{named}"


def test_a_video_urls_fields_given_as_null_are_taken_as_left_out():
    part = {"type": "video", "video_url": {"url": "/tmp/clip.mp4", "fps": None}}
    assert media_from_part(part, "messages[0].content[0]") == ("video", "/tmp/clip.mp4")


@pytest.mark.parametrize("url", [5, [1], {"a": 1}], ids=["int", "list", "dict"])
@pytest.mark.parametrize("kind", ["image", "video"])
def test_an_image_or_video_url_that_is_not_a_string_names_the_field(kind, url):
    """QA: `{"image_url": {"url": 5}}` said "unsupported image input of type int" with param messages[0].content[0]."""
    messages = [{"role": "user", "content": [{"type": kind, f"{kind}_url": {"url": url}}]}]
    with pytest.raises(RequestError, match=rf"messages\[0\]\.content\[0\]\.{kind}_url\.url must be a string "
                                           r"\(a data: URL") as err:
        collect_media(messages)
    assert err.value.param == f"messages[0].content[0].{kind}_url.url"


@pytest.mark.parametrize("url", [5, ["data:image/png;base64,iVBORw0KGgo="], True], ids=["int", "list", "bool"])
@pytest.mark.parametrize(("kind", "key"), [("image", "image_url"), ("video", "video_url"), ("image", "url")])
def test_an_image_or_video_url_field_that_is_no_object_or_string_names_the_field(kind, key, url):
    """`{"image_url": [url]}` said "unsupported image input of type list; send encoded bytes, a path, a PIL image, or
    an array", Python inputs a JSON client cannot send, naming only the part."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": kind, key: url}]}]
    with pytest.raises(RequestError) as err:
        collect_media(messages)
    assert str(err.value) == (f"messages[0].content[1].{key} must be an object {{\"url\": ...}} or a string (a data: "
                              f"URL, a local path or an http(s) URL), not {type(url).__name__}")
    assert err.value.param == f"messages[0].content[1].{key}"


def test_local_and_remote_refusals_name_the_server_flag_and_the_python_argument():
    with pytest.raises(RequestError, match=r"LLM\(\.\.\., allowed_local_media_path=") as err:
        load_media_reference("/tmp/cat.png", "image", 0, MediaFetchPolicy())
    assert "--allowed-local-media-path" in str(err.value)
    with pytest.raises(RequestError, match=r"LLM\(\.\.\., allow_remote_media=True\)"):
        load_media_reference("https://example.com/cat.png", "image", 0, MediaFetchPolicy())


AS_SENT = [
    {"role": "developer", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}},
                                 {"type": "video_url", "video_url": {"url": "v"}}]},
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "w"}}]},
]


def test_media_part_paths_point_into_the_request_as_sent():
    assert media_part_paths(AS_SENT) == {"image": ["messages[1].content[1]", "messages[2].content[0]"],
                                         "video": ["messages[1].content[2]"]}


def test_media_part_paths_follow_tool_results_into_their_calls_order():
    """Results render in their calls' order (normalize_messages), so image n of the prompt is the n-th in that order."""
    calls = {"role": "assistant", "tool_calls": [{"id": i, "function": {"name": "snap"}} for i in ("a", "b")]}
    image = [{"type": "image_url", "image_url": {"url": "u"}}]
    messages = [calls, {"role": "tool", "tool_call_id": "b", "content": image},
                {"role": "tool", "tool_call_id": "a", "content": image}]
    assert media_part_paths(messages)["image"] == ["messages[2].content[0]", "messages[1].content[0]"]


def test_item_errors_name_their_content_part():
    """Audit: image errors said `image 1: …` with param "messages"; the part path is what the client can find."""
    with pytest.raises(MediaError) as err, naming_media_parts(AS_SENT):
        load_media_reference("data:image/png;base64,@@@", "image", 1, MediaFetchPolicy())
    assert str(err.value).startswith("messages[2].content[0] (image 1): data URL is not valid base64")
    assert err.value.param == "messages[2].content[0]"
    thin = Image.new("RGB", (4, 800))
    with pytest.raises(MediaLimitError) as err, naming_media_parts(AS_SENT):
        MediaProcessor(limits=MediaLimits(max_image_pixels=1000)).process("<|patch|>", [thin])
    assert str(err.value).startswith("messages[1].content[1] (image 0): ")
    assert err.value.param == "messages[1].content[1]"


def test_errors_about_all_items_together_are_left_as_they_are():
    error = MediaLimitError("request", None, "too many tokens")
    with pytest.raises(MediaLimitError) as err, naming_media_parts(AS_SENT):
        raise error
    assert err.value is error and err.value.param == "messages"


def _gzip_bomb(decoded_bytes: int) -> bytes:
    """gzip of `decoded_bytes` zero bytes (about a thousandth of that), compressed a MiB at a time."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    return b"".join(compressor.compress(block) for _ in range(decoded_bytes >> 20)) + compressor.flush()


# path → (Content-Encoding, the body sent): the PNG compressed, a gzip bomb of 256 MiB of zeros in 256 KiB, a gzip cut
# short, codings that are not read
_COMPRESSED = {"/gzip": ("gzip", lambda: gzip.compress(_png())), "/x-gzip": ("X-Gzip", lambda: gzip.compress(_png())),
               "/deflate": ("deflate", lambda: zlib.compress(_png())), "/identity": ("identity", _png),
               "/bomb": ("gzip", lambda: _gzip_bomb(256 << 20)), "/cut": ("gzip", lambda: gzip.compress(_png())[:-20]),
               "/br": ("br", _png), "/twice": ("gzip, gzip", lambda: gzip.compress(gzip.compress(_png()))),
               "/members": ("gzip", lambda: gzip.compress(_png()[:100]) + gzip.compress(_png()[100:])),
               "/raw-deflate": ("deflate", lambda: _raw_deflate(_png())),
               "/empty-members": ("gzip", lambda: gzip.compress(_png()) + gzip.compress(b"") * 300)}


def _raw_deflate(data: bytes) -> bytes:
    """`data` in deflate's format without zlib's header and checksum, as some servers send `deflate`."""
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.fixture
def http_server():
    """A loopback HTTP server: /cat.png (an image), /big (too large), /loop (redirects forever), /slow, /to-ftp
    (redirects to a presigned ftp: URL), /to-cat (redirects to /cat.png with its header named `location:`), /echo/...
    (answers with its own path, as it was sent), /to-cafe (redirects to `/echo/café noir.png` in raw UTF-8 bytes, as
    some servers write a Location), /gzip and the others of `_COMPRESSED` (a body sent compressed)."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            if self.path in ("/loop", "/to-ftp"):
                self.send_response(302)
                self.send_header("Location", "/loop" if self.path == "/loop" else
                                 "ftp://files.example/cat.png?X-Amz-Signature=redirected-secret")
                self.end_headers()
                return
            if self.path == "/to-cat":
                self.send_response(301)
                self.send_header("location", "/cat.png")  # as Envoy writes header names, in lower case
                self.end_headers()
                return
            if self.path == "/to-cafe":
                self.send_response(302)
                self.send_header("Location", "/echo/café noir.png".encode().decode("latin-1"))  # sent as these bytes
                self.end_headers()
                return
            if self.path == "/stall":  # its head and a tenth of its body, then nothing until the client cuts it
                self.send_response(200)
                self.send_header("Content-Length", "100")
                self.end_headers()
                self.wfile.write(b"x" * 10)
                self.wfile.flush()
                time.sleep(3)
                return
            if self.path == "/slow":
                self.send_response(200)
                self.end_headers()
                for _ in range(40):
                    self.wfile.write(b"x" * 10)
                    self.wfile.flush()
                    time.sleep(0.05)
                return
            status, headers, body = 404, {}, b"y" * 5000
            if self.path in ("/cat.png", "/big"):
                status, body = 200, _png() if self.path == "/cat.png" else body
            elif self.path.startswith("/echo/"):
                status, body = 200, self.path.encode()
            elif self.path in _COMPRESSED:
                status, (coding, compress) = 200, _COMPRESSED[self.path]
                headers, body = {"Content-Encoding": coding}, compress()
            self.send_response(status)
            for name, value in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_remote_fetching_when_enabled_is_bounded(http_server, caplog):
    """The bounds hold, and every failure reads the same to the client (issue 8); the log has the reason."""
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], max_bytes=1000, timeout_s=1.0, max_redirects=2)
    assert load_media_reference(f"{http_server}/cat.png", "image", 0, policy) == _png()
    for path, reason in (("/big", "larger than 1,000 bytes"), ("/loop", "more than 2 redirects"),
                         ("/missing", "HTTP 404"), ("/slow", "took longer than 1.0 s")):
        with caplog.at_level(logging.INFO), pytest.raises(RequestError) as raised:
            load_media_reference(f"{http_server}{path}", "image", 0, policy)
        assert str(raised.value) == (
            f"image 0: {http_server}{path} could not be fetched (an unreachable or refused address, an answer other "
            "than HTTP 200 with an image, more than 2 redirects, more than 1,000 bytes or more than 1.0 s)")
        assert reason in caplog.text


def test_a_download_cut_at_the_deadline_after_the_answer_began_is_logged_as_one(http_server, caplog):
    """A body that stops coming is cut at the deadline by the watchdog; the log says the download took too long, as
    for a body that comes slowly, where it said "no answer within" (and test_remote_fetching_when_enabled_is_bounded's
    slow body read either way, as the watchdog or the reader saw the deadline first)."""
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=0.5)
    with caplog.at_level(logging.INFO), pytest.raises(RequestError, match="could not be fetched"):
        load_media_reference(f"{http_server}/stall", "image", 0, policy)
    assert "the download took longer than 0.5 s" in caplog.text
    assert "no answer within" not in caplog.text


def test_a_redirect_is_followed_whatever_the_case_of_its_location_header(http_server):
    """A header's name is case-insensitive (RFC 9110 §5.1): a redirect whose header is `location:` (Envoy's
    spelling) was refused as "HTTP 301 without a Location header"."""
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=5.0)
    assert load_media_reference(f"{http_server}/to-cat", "image", 0, policy) == _png()


def test_a_url_with_spaces_or_characters_outside_ascii_is_sent_percent_encoded(http_server, monkeypatch):
    """As browsers, requests and aiohttp (vLLM's clients) send it: httpcore refused such a URL, so an image at
    `http://host/café noir.png` could not be fetched. A host outside ASCII goes by its IDNA name."""
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1", "xn--caf-dma.test", "xn--fa-hia.test",
                                                      "xn--i-7iq.test"], timeout_s=5.0)
    assert fetch_remote(f" {http_server}/echo/café noir.png?q=é&r=%C3%A9#part \n", policy) == \
        b"/echo/caf%C3%A9%20noir.png?q=%C3%A9&r=%C3%A9"
    assert fetch_remote(f"{http_server}/to-cafe", policy) == b"/echo/caf%C3%A9%20noir.png"
    looked_up = []
    real_getaddrinfo = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *args, **kwargs: looked_up.append(host) or
                        real_getaddrinfo("127.0.0.1", *args, **kwargs))
    assert fetch_remote(http_server.replace("127.0.0.1", "café.test") + "/echo/x.png", policy) == b"/echo/x.png"
    # IDNA 2008 with UTS 46, as browsers and httpx: Python's IDNA 2003 codec made faß.test fass.test, another host
    assert fetch_remote(http_server.replace("127.0.0.1", "faß.test") + "/echo/x.png", policy) == b"/echo/x.png"
    assert fetch_remote(http_server.replace("127.0.0.1", "Café.test") + "/echo/x.png", policy) == b"/echo/x.png"
    # a symbol IDNA 2008 refuses goes by IDNA 2003, as browsers and yarl (aiohttp) fall back to it
    assert fetch_remote(http_server.replace("127.0.0.1", "i\u2764.test") + "/echo/x.png", policy) == b"/echo/x.png"
    assert looked_up == ["xn--caf-dma.test", "xn--fa-hia.test", "xn--caf-dma.test", "xn--i-7iq.test"]
    with pytest.raises(RemoteMediaError, match="not a URL HTTP can carry"):  # a lone surrogate spells no bytes
        fetch_remote(f"{http_server}/echo/\ud800.png", policy)


def test_a_compressed_body_is_decoded_and_its_decoded_size_bounded_as_it_is_decoded(http_server):
    """A server may compress a body asked for without Accept-Encoding (RFC 9110 §12.5.3), as S3 serves an object stored
    with `Content-Encoding: gzip`: requests and aiohttp (vLLM's clients) decode it, where the fetcher took the
    compressed bytes for the image. A gzip bomb (256 MiB of zeros in 256 KiB) is refused by the size limit without
    being decoded: no more than one byte past the limit is decoded from each chunk."""
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], max_bytes=4096, timeout_s=30.0)
    for path in ("/gzip", "/x-gzip", "/deflate", "/identity", "/members", "/raw-deflate"):  # (the last two as
        assert load_media_reference(f"{http_server}{path}", "image", 0, policy) == _png()  # urllib3 reads them)
    tracemalloc.start()
    try:
        with pytest.raises(RemoteMediaError, match="larger than 4,096 bytes"):
            fetch_remote(f"{http_server}/bomb", policy)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # a chunk of the bomb decoded whole is 64 MiB or more
    for path, refusal in (("/cut", "cut short"), ("/empty-members", "larger than 4,096 bytes"),  # (as received)
                          ("/br", "Content-Encoding 'br' is not read"),
                          ("/twice", "Content-Encoding 'gzip, gzip' is not read")):
        with pytest.raises(RemoteMediaError, match=refusal):
            fetch_remote(f"{http_server}{path}", policy)


def test_a_failed_fetch_is_logged_and_refused_without_the_urls_userinfo(http_server, caplog):
    """`user:password@` in a media URL is a credential: neither the log nor the error repeats it."""
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=1.0)
    url = http_server.replace("http://", "http://alice:s3cret@") + "/missing"
    with caplog.at_level(logging.INFO), pytest.raises(RequestError) as raised:
        load_media_reference(url, "image", 0, policy)
    assert "HTTP 404" in caplog.text and f"fetching {http_server}/missing failed" in caplog.text
    assert str(raised.value).startswith(f"image 0: {http_server}/missing could not be fetched")
    assert "s3cret" not in caplog.text + str(raised.value) and "alice" not in caplog.text + str(raised.value)


def test_a_failed_fetch_is_logged_and_refused_without_the_urls_query_or_fragment(http_server, caplog):
    """A presigned URL's signature is in its query (X-Amz-Signature, sig, token): no log line or error keeps it,
    neither the requested URL's nor a redirect's."""
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=1.0)
    for url, shown, logged in (
            (f"{http_server}/missing?X-Amz-Signature=s1gnature&token=t0ken#part=fr4gment", f"{http_server}/missing?…",
             "HTTP 404"),
            (f"{http_server}/to-ftp#fr4gment", f"{http_server}/to-ftp", "'ftp://files.example/cat.png?…'")):
        caplog.clear()
        with caplog.at_level(logging.INFO), pytest.raises(RequestError) as raised:
            load_media_reference(url, "image", 0, policy)
        assert f"fetching {shown} failed" in caplog.text and logged in caplog.text
        assert str(raised.value).startswith(f"image 0: {shown} could not be fetched")
        for secret in ("s1gnature", "t0ken", "fr4gment", "redirected-secret"):
            assert secret not in caplog.text + str(raised.value)
