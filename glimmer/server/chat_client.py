"""`glimmer chat`: a terminal chat against a Glimmer (or any OpenAI-compatible) server, streaming.

Reasoning shows dimmed, the answer plain, tool calls as `→ name(arguments)` as their arguments stream. The
conversation keeps each reply's reasoning and tool calls in its history, as the protocol renders them back.
With `--tools`, you play the tools: after a reply that calls them, each call asks for its result (a line sent as
the `tool` message answering it), and the model goes on from the results.
Standard library only (urllib), so it runs wherever Glimmer is installed.
"""

from __future__ import annotations

import http.client
import json
import secrets
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, NoReturn, TextIO

from glimmer.errors import GlimmerError
from glimmer.server.settings import UNSENDABLE_KEY, sendable_in_a_header

DIM = "\x1b[2m"
TOOL = "\x1b[36m"
RESET = "\x1b[0m"
# What a reply (or a server's error) holds of the C0 controls but tab and newline, DEL and the C1 controls would be
# run by the terminal, not shown: ESC or CSI starts a sequence that clears the screen, retitles the window or hides
# text, a carriage return writes over the line. They are shown as symbols (U+2400's control pictures, U+FFFD).
TERMINAL_CONTROLS = ({code: chr(0x2400 + code) for code in range(0x20) if chr(code) not in "\t\n"}
                     | {0x7F: "\u2421"} | dict.fromkeys(range(0x80, 0xA0), "\ufffd"))


def terminal_text(text: str) -> str:
    """`text` as a terminal may print it: its control characters but tab and newline shown as symbols."""
    return text.translate(TERMINAL_CONTROLS)


class ChatClientError(GlimmerError):
    """The server refused the request or reported an error mid-stream."""


class ServerRefusedError(ChatClientError):
    """The server answered an HTTP error status; `message`, `code` and `param` are its OpenAI-style error body's (the
    body's text, or the status's reason, where it has none)."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(f"the server answered HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    @property
    def context_exceeded(self) -> bool:
        """Whether the request did not fit the model's context: Glimmer names max_model_len in each such refusal,
        vLLM says "maximum context length", OpenAI sends the code context_length_exceeded."""
        return self.status == 400 and (self.code == "context_length_exceeded" or "max_model_len" in self.message
                                       or "context length" in self.message.lower())


class StreamRenderer:
    """Writes chat completion chunks (choice 0) to a terminal and assembles the assistant message."""

    def __init__(self, out: TextIO, *, color: bool = True):
        self._out = out
        self._color = color
        self._section: str | None = None
        self.reasoning = ""
        self.content = ""
        self.tool_calls: list[dict[str, Any]] = []
        self._call_key: object = None  # the index (or id) of the call whose deltas arrive
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None  # the last chunk's (stream_options.include_usage)

    def feed(self, chunk: Any) -> None:
        """Render one chunk. Raises ChatClientError for an error event (OpenAI's `{"error": {"message": ...}}`, or
        the `{"error": "..."}` of servers such as TGI) and for an event that is no chat completion chunk."""
        if isinstance(chunk, dict) and "error" in chunk:
            raise ChatClientError(_error_event_message(chunk["error"]))
        try:
            self._feed(chunk)
        except (AttributeError, TypeError):  # a list, or a string where the chunk has an object
            raise ChatClientError("the server sent an event that is not a chat completion chunk: "
                                  f"{json.dumps(chunk)[:200]}") from None

    def _feed(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self._enter("reasoning")
                self._write(reasoning, DIM)
                self.reasoning += reasoning
            if delta.get("content"):
                self._enter("content")
                self._write(delta["content"])
                self.content += delta["content"]
            for call in delta.get("tool_calls") or []:
                self._tool_call_piece(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def finish(self) -> dict[str, Any]:
        """Close the output and return the assistant message for the history."""
        self._enter(None)
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message

    def _tool_call_piece(self, call: dict[str, Any]) -> None:
        """A delta of a call: a new `index` starts a call, the same index goes on with it (some servers repeat the
        id in every delta; without an index, a new id starts a call)."""
        function = call.get("function") or {}
        key = call.get("index", call.get("id"))
        if key is not None and key != self._call_key and (call.get("id") or "index" in call):
            self._call_key = key
            self._enter("tool")
            self.tool_calls.append({"id": call.get("id") or f"call_{len(self.tool_calls)}", "type": "function",
                                    "function": {"name": function.get("name", ""), "arguments": ""}})
            self._write(f"→ {function.get('name', '')}(", TOOL)
        if self.tool_calls and function.get("arguments"):
            self.tool_calls[-1]["function"]["arguments"] += function["arguments"]
            self._write(function["arguments"], TOOL)

    def _enter(self, section: str | None) -> None:
        if section == self._section and section != "tool":
            return
        if self._section == "tool":
            self._write(")", TOOL)
        if self._section is not None:
            self._out.write("\n")
        self._section = section

    def _write(self, text: str, style: str = "") -> None:
        text = terminal_text(text)
        self._out.write(f"{style}{text}{RESET}" if self._color and style else text)
        self._out.flush()


def _error_event_message(error: Any) -> str:
    """The message of a stream's error event: its `message` where it is an object, the text where it is one."""
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str) and error:
        return error
    return "the server reported an error"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str | None, int | None]:
    """(scheme, host, port) of `url`, the port its scheme's default where it names none."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())


class _KeyKeepingRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, which send a request's headers on to wherever a redirect points, but the Authorization
    header only to the origin (scheme, host and port) it was given for, or to its https form (an upgrade), as
    requests and httpx (the openai SDK's) follow them: the server's key is no one else's to read."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        redirected = super().redirect_request(req, fp, code, msg, headers, newurl)
        if redirected is not None:
            old, new = _origin(req.full_url), _origin(redirected.full_url)
            upgrade = old[0] == "http" and new == ("https", old[1], 443) and old[2] == 80
            if new != old and not upgrade:
                redirected.remove_header("Authorization")
        return redirected


_OPENER = urllib.request.build_opener(_KeyKeepingRedirects)


def authorization_headers(api_key: str | None) -> dict[str, str | bytes]:
    """The Authorization header for `api_key`, stripped as the server strips its own (a key read from a file or an
    env file may end in a newline, which no header can carry); none for no key, an empty one or a blank one (as
    `GLIMMER_API_KEY=` sends none). In Latin-1 where the key fits it (as `requests` and browsers send a key, and vLLM
    reads one), else in UTF-8 (as curl sends it; Glimmer's server takes either). Raises ChatClientError, not echoing
    the key, for one the server's rule (`sendable_in_a_header`) refuses: a control character inside."""
    key = (api_key or "").strip()
    if not key:
        return {}
    if not sendable_in_a_header(key):
        raise ChatClientError(f"the API key (--api-key or GLIMMER_API_KEY) {UNSENDABLE_KEY}")
    try:
        return {"Authorization": f"Bearer {key}".encode("latin-1")}
    except UnicodeEncodeError:
        return {"Authorization": f"Bearer {key}".encode()}


def stream_chat_completion(url: str, payload: dict[str, Any], api_key: str | None = None,
                           timeout_s: float = 600.0) -> Iterator[dict[str, Any]]:
    """POST a streaming chat request to `url` (the server's address, with or without `/v1`) and yield its
    chunks. Raises ServerRefusedError for an HTTP error status, and ChatClientError for a server that cannot be
    reached, for an answer that is not an event stream (one JSON body, a web page), and for a stream that breaks: a
    connection lost, an event that is not JSON, or an end before `data: [DONE]`."""
    body = json.dumps({**payload, "stream": True}).encode()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **authorization_headers(api_key)}
    request = urllib.request.Request(endpoint_url(url, "/v1/chat/completions"), body, headers, method="POST")
    try:
        response = _OPENER.open(request, timeout=timeout_s)
    except urllib.error.HTTPError as error:
        raise _refusal(error) from None
    except urllib.error.URLError as error:
        if isinstance(error.reason, (BrokenPipeError, ConnectionResetError)):
            # reached, then dropped: a server refusing a body over its limit (413) closes the connection before
            # the body is sent, and the refusal is lost with it
            raise ChatClientError(f"{url} closed the connection before answering the request of {len(body):,} "
                                  "bytes; if the message is long, send a shorter one (a server refuses requests "
                                  "larger than its limit: `glimmer serve --max-request-bytes`, 4 MiB by default)"
                                  ) from None
        raise ChatClientError(f"cannot reach {url}: {error.reason}") from None
    except http.client.HTTPException as error:
        raise _not_http(url, error) from None
    with response:
        try:
            # (a stream without a Content-Type, which a server of a few lines may send, is read as one)
            if "Content-Type" in response.headers and response.headers.get_content_type() != "text/event-stream":
                _refuse_whole_reply(url, response)
            done = yield from parse_sse_lines(line.decode("utf-8", errors="replace") for line in response)
        except (OSError, http.client.HTTPException) as error:
            raise ChatClientError(f"the connection to {url} broke mid-reply ({error})") from None
        except ValueError as error:
            raise ChatClientError(f"the server sent an event that is not JSON ({error})") from None
    if not done:
        raise ChatClientError(f"the reply from {url} ended before it finished (no [DONE])")


def _not_http(url: str, error: http.client.HTTPException) -> ChatClientError:
    """The error for an answer http.client could not read as HTTP (BadStatusLine: whatever listens at `url` is no
    HTTP server), which urllib passes on as it is, neither an OSError nor a URLError. The answer's text is shown as
    a terminal may print it: it is whatever the other end sent."""
    return ChatClientError(f"{url} did not answer in HTTP ({type(error).__name__}: {terminal_text(str(error).strip())}"
                           "); give the address of an OpenAI-compatible server, e.g. http://127.0.0.1:8000")


def _refuse_whole_reply(url: str, response: http.client.HTTPResponse) -> NoReturn:
    """Raises ChatClientError for a 200 answer that is not an event stream, saying so, not that a stream broke. One
    JSON body is a server (or a proxy) that ignores `stream: true`, and its `{"error": ...}` is that error; another
    body (a proxy's sign-in page) is named by its Content-Type, unread. Reading the JSON body may raise OSError or
    http.client.HTTPException."""
    if response.headers.get_content_type() == "application/json":
        try:
            answer = json.loads(response.read())
        except ValueError:
            answer = None
        if isinstance(answer, dict) and "error" in answer:
            raise ChatClientError(_error_event_message(answer["error"]))
        raise ChatClientError(f"{url} answered one JSON body (Content-Type: application/json), not an event stream: "
                              "it ignores `stream: true`, and glimmer chat streams each reply; give the address of a "
                              "server that streams chat completions, such as `glimmer serve`")
    raise ChatClientError(f"{url} answered a body of Content-Type {response.headers['Content-Type']}, not an event "
                          "stream (Content-Type: text/event-stream), as glimmer chat needs; give the address of a "
                          "server that streams chat completions, such as `glimmer serve`")


def check_server_url(url: str) -> None:
    """Raises ChatClientError unless `url` is an http(s) URL with a host (and a valid port, if it names one)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, _ = parts.hostname, parts.port  # .port raises ValueError for a port out of range
    except ValueError as error:
        raise ChatClientError(f"{url!r} is not a valid URL ({error}); give the server's address, e.g. "
                              "http://127.0.0.1:8000") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ChatClientError(f"{url!r} is not an http(s) URL with a host; give the server's address, e.g. "
                              "http://127.0.0.1:8000")


def endpoint_url(url: str, endpoint: str) -> str:
    """The URL of `endpoint` (`/v1/models`) of the server at `url`, whose trailing slashes and final `/v1` are dropped:
    OpenAI clients take the base URL with `/v1` (http://127.0.0.1:8000/v1), Glimmer's examples give it without; both
    name the same server. Its query string (a proxy's `?api-version=...`) is kept on every request; a fragment, which
    no request sends, is left out."""
    parts = urllib.parse.urlsplit(url)
    root = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return urllib.parse.urlunsplit(parts._replace(path=root + endpoint, fragment=""))


def check_server(url: str, api_key: str | None = None, model: str | None = None, timeout_s: float = 10.0) -> int | None:
    """Ask `url` (with or without `/v1`) for its models. Returns the context length in tokens of `model` (None: the
    server's default) where the model list gives one (Glimmer's and vLLM's do), else None.

    Raises ChatClientError (one line) when `url` is not an http(s) URL, cannot be reached, refuses, or lists its
    models and `model` is not among them (the message names them)."""
    check_server_url(url)
    headers = authorization_headers(api_key)
    models_url = endpoint_url(url, "/v1/models")
    request = urllib.request.Request(models_url, headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        # the server's text, printed before the chat begins: its controls shown as symbols, as the chat shows them
        message = terminal_text(_refusal(error).message)
        if error.code == 404:  # most often an endpoint's URL given for the server's (…/v1/chat/completions)
            raise ChatClientError(f"{url} has no OpenAI-compatible API: {models_url} answered HTTP 404 ({message}); "
                                  "give the server's address, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine), "
                                  "not an endpoint's") from None
        if error.code == 401:  # the server's message tells an HTTP client how to send a key; say how to give one
            what = "refused the API key given" if headers else "needs an API key"
            raise ChatClientError(f"{url} {what} (HTTP 401: {message}); pass the server's key with --api-key KEY "
                                  "or set GLIMMER_API_KEY") from None
        raise ChatClientError(f"{url} answered HTTP {error.code}: {message}") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        if isinstance(reason, ssl.SSLCertVerificationError):  # the server answered: it need not be started
            raise ChatClientError(f"{url} sent a certificate this machine does not trust ({reason.verify_message}); "
                                  f"{_certificate_fix(reason)}") from None
        # what OpenSSL calls a plain-HTTP answer to its handshake
        if isinstance(reason, ssl.SSLError) and reason.reason in ("WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG"):
            plain = "http://" + url.split("://", 1)[1]
            raise ChatClientError(f"cannot reach {url}: the server there answers plain HTTP, not HTTPS (`glimmer "
                                  f"serve` without --ssl-keyfile); give {plain}") from None
        raise ChatClientError(f"cannot reach {url}: {reason}; start the server there (`glimmer serve`), or give the "
                              "address it listens on, e.g. http://127.0.0.1:8000") from None
    except http.client.HTTPException as error:
        raise _not_http(url, error) from None
    try:
        cards = [card for card in json.loads(body)["data"] if isinstance(card["id"], str)]
    except (ValueError, KeyError, TypeError):
        return None  # no OpenAI model list to check against: the first message will tell
    served = [card["id"] for card in cards]
    if model is not None and model not in served:
        offered = ", ".join(repr(name) for name in served) or "none"
        raise ChatClientError(f"{url} does not serve the model {model!r}; it serves {offered}: pass one of them with "
                              "--served-model, or leave it out for the server's default")
    # without a model the server picks one (Glimmer: its first name); its context length is known if all agree
    lengths = {length if isinstance(length := card.get("max_model_len"), int) else None
               for card in cards if model is None or card["id"] == model}
    return lengths.pop() if len(lengths) == 1 else None


# OpenSSL's verify codes for a certificate issued to other names: a URL's host name, or its IP address
X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH = 62, 64


def _certificate_fix(error: ssl.SSLCertVerificationError) -> str:
    """What makes a server's certificate that failed verification (`error`) trusted."""
    if error.verify_code in (X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH):
        return "give the server's address by a name (or IP address) its certificate is issued to"
    return ("if it is the server you meant (`glimmer serve --ssl-certfile` with a self-signed certificate, or one of a "
            "private authority), trust it with SSL_CERT_FILE=PATH, the PEM file of that certificate or of its "
            "authority")


def parse_sse_lines(lines: Iterable[str]) -> Generator[dict[str, Any], None, bool]:
    """The JSON payloads of `data:` lines, up to `data: [DONE]` (the space after the colon is optional, as in any
    event stream's field: `data:[DONE]`). Returns whether the stream reached [DONE]."""
    for line in lines:
        line = line.strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return True
        yield json.loads(data)
    return False


def _refusal(error: urllib.error.HTTPError) -> ServerRefusedError:
    """The HTTP error `error` with its OpenAI-style error body's message and code; a body that is not one gives its
    text on one line (cut to 300 characters), an empty one the status's reason."""
    body = error.read()
    try:
        detail = json.loads(body)["error"]
        return ServerRefusedError(error.code, str(detail["message"]), detail.get("code"), detail.get("param"))
    except (ValueError, KeyError, TypeError, AttributeError):
        text = " ".join(body.decode("utf-8", errors="replace").split())
        return ServerRefusedError(error.code, text[:300] or str(error.reason))


def _context_refusal_hint(error: ServerRefusedError, system: str | None, earlier: list[dict[str, Any]],
                          request_options: dict[str, Any] | None) -> str:
    """The line after a refusal for the context's length (`error.context_exceeded`) that says what the chat's user
    can do ("" where nothing more than the error's own fix): `earlier`, the history before the refused message."""
    if system and error.param == "messages[0]":  # the part the refusal would have shortened: the user's flag
        return "messages[0] is the --system prompt, sent with every message: give a shorter --system.\n"
    if any(message["role"] != "system" for message in earlier):
        # a refusal that names max_tokens is also met by asking for fewer tokens
        fewer = " (or a smaller --max-tokens leaves room)" if "max_tokens" in error.message else ""
        return f"The conversation no longer fits the model's context: /reset starts a new one{fewer}.\n"
    if "max_tokens" in error.message and "max_tokens" in (request_options or {}):  # its fix names the API field
        return "A smaller --max-tokens leaves the message room.\n"
    return ""


def run_chat(url: str, *, model: str | None, api_key: str | None, out: TextIO, read_line: Callable[[str], str],
             system: str | None = None, tools: list[dict[str, Any]] | None = None,
             request_options: dict[str, Any] | None = None, color: bool = True,
             max_model_len: int | None = None, in_process: bool = False, err: TextIO | None = None) -> int:
    """The chat loop: read a line, stream the reply, repeat. `/reset` clears the history; `/exit` or EOF ends; Ctrl-C
    during a reply stops it and drops the turn, Ctrl-C at a prompt raises KeyboardInterrupt (the prompt's line ended).
    Returns the number of turns that failed (an error written, the turn dropped); `err`, where their errors go (None:
    `out`, beside the replies).
    Another `/command` is not sent: the chat lists the commands; `//text` sends `/text`.
    `max_model_len`: the model's context length in tokens, if known, to tell a reply cut by it from one cut by
    max_tokens. `in_process`: the server at `url` runs in this process for the chat alone (`glimmer chat` without
    --url), so messages speak of the engine's answers, not of a server the user never started.

    A reply that calls tools is followed by one prompt per call for its result (`name(arguments) result>`); the
    results go back as `tool` messages and the reply continues, until a reply calls nothing. At a result prompt
    `/reset` starts a new conversation and `/exit` leaves, as at `you>`."""
    history: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    # A cache_salt only partitions the server's prefix cache: requests share cached prompt blocks only with requests
    # naming the same salt. One random salt per chat session keeps this conversation's turns reusing each other's
    # blocks (each prompt starts with the previous one) and lets the chat work with a server started with
    # --require-cache-salt.
    cache_salt = secrets.token_hex(16)
    errors = out if err is None else err
    failed = 0
    out.write("Type a message; /reset clears the conversation, /exit (or Ctrl-D) leaves.\n")

    def reply(turn_start: int) -> dict[str, Any] | None:
        """Stream one reply to the history as it stands (this turn from `turn_start`); None (the error written) if
        the request failed."""
        nonlocal failed
        # the usage tells which limit cut a reply short (length_notice)
        payload: dict[str, Any] = {"messages": history, "cache_salt": cache_salt,
                                   "stream_options": {"include_usage": True}, **(request_options or {})}
        if model:
            payload["model"] = model
        if tools:
            payload["tools"] = tools
        renderer = StreamRenderer(out, color=color)
        chunks = stream_chat_completion(url, payload, api_key)
        try:
            for chunk in chunks:
                renderer.feed(chunk)
        except KeyboardInterrupt:  # Ctrl-C stops the reply, not the chat (Ctrl-D or /exit leaves)
            chunks.close()  # hangs up: the server stops generating it
            renderer.finish()
            out.write("[stopped by Ctrl-C: the turn is dropped]\n")
            return None
        except ChatClientError as error:
            renderer.finish()
            refused_in_process = in_process and isinstance(error, ServerRefusedError)
            errors.write(f"error: {terminal_text(error.message if refused_in_process else str(error))}\n")
            if isinstance(error, ServerRefusedError) and error.context_exceeded:
                errors.write(_context_refusal_hint(error, system, history[:turn_start], request_options))
            errors.flush()
            failed += 1
            return None
        message = renderer.finish()
        if renderer.finish_reason == "length":
            out.write(length_notice(renderer.usage, (request_options or {}).get("max_tokens"), max_model_len,
                                    in_process=in_process) + "\n")
        elif not renderer.content and not renderer.tool_calls:  # reasoning alone, or nothing: say so, not silence
            out.write("[no answer: the model ended its turn without one]\n")
        return message

    def read(prompt: str) -> str | None:
        """A typed line, or None after /reset (the history cleared in place); _Exit for /exit, /quit or end of
        input (a newline written). An unknown /command is answered with the commands and asked again; `//`
        starts a line that is sent with one leading `/`."""
        while True:
            try:
                line = _read(read_line, prompt)
            except KeyboardInterrupt:  # Ctrl-C at a prompt ends the chat: its line ends first, as after Ctrl-D
                out.write("\n")
                raise
            if line is None:
                out.write("\n")
                raise _Exit
            command = line.strip()
            if command in ("/exit", "/quit"):
                raise _Exit
            if command == "/reset":
                del history[1 if system else 0 :]
                return None
            if command.startswith("//"):
                return line.replace("/", "", 1)
            if not command.startswith("/"):
                return line
            out.write(f"unknown command {command.split()[0]}: the commands are /reset, /exit and /quit; start with "
                      "// to send a message that begins with /\n")

    try:
        while True:
            line = read("you> ")
            if line is None or not line.strip():
                continue
            turn_start = len(history)
            history.append({"role": "user", "content": line})
            while True:
                message = reply(turn_start)
                if message is None:
                    del history[turn_start:]  # the turn failed: as if it had not been sent
                    break
                history.append(message)
                calls = message.get("tool_calls") or []
                results = []
                for call in calls:
                    result = read(f"{call_label(call)} result> ")
                    if result is None:  # /reset: a new conversation
                        break
                    results.append({"role": "tool", "tool_call_id": call["id"], "content": result})
                if not calls or len(results) < len(calls):
                    break
                history.extend(results)
    except _Exit:
        return failed


def length_notice(usage: dict[str, Any] | None, max_tokens: int | None, max_model_len: int | None, *,
                  in_process: bool = False) -> str:
    """The line after a reply cut short (finish_reason "length"): which limit cut it, where the usage (and the
    max_tokens asked for, the context length if known) tells; else words that hold for either. `in_process`: the
    default max_tokens is Glimmer's own, the model's generation_config max_new_tokens."""
    prompt = (usage or {}).get("prompt_tokens")
    completion = (usage or {}).get("completion_tokens")
    if completion is None:
        return "[stopped at a length limit: max_tokens or the end of the context window]"
    if max_model_len is not None and prompt is not None and prompt + completion >= max_model_len:
        return f"[stopped: the context window ({max_model_len} tokens) is full; /reset starts a new conversation]"
    if max_tokens is not None and completion >= max_tokens:
        return "[stopped at max_tokens]"
    if max_tokens is None and max_model_len is not None and prompt is not None:  # the server's own default
        if in_process:
            return "[stopped at the model's default max_tokens (generation_config max_new_tokens)]"
        return "[stopped at the server's default max_tokens]"
    return "[stopped at a length limit: max_tokens or the end of the context window]"


class _Exit(Exception):
    """/exit, /quit or end of input at any prompt of the chat."""


def call_label(call: dict[str, Any], width: int = 60) -> str:
    """`name(arguments)` of a call, the arguments cut to `width` characters: what a result prompt shows, so that two
    calls of one tool can be told apart."""
    arguments = call["function"].get("arguments") or ""
    if len(arguments) > width:
        arguments = arguments[: width - 1] + "…"
    return terminal_text(f"{call['function'].get('name', '')}({arguments})")


def _read(read_line: Callable[[str], str], prompt: str) -> str | None:
    """A line typed at `prompt`, None at end of input. Bytes that are not UTF-8 reach Python as lone surrogates,
    which no JSON body can carry: they become U+FFFD."""
    try:
        return read_line(prompt).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except EOFError:
        return None
