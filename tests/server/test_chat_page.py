"""The chat page at `/` in a real browser: Debian's headless Chromium driven by Selenium (chromium-driver).

The served model follows scripted turns (`ScriptedRunner`), so the page sees a known reply: reasoning, an
answer, a tool call. The server requires an API key, which the page asks for, and a cache_salt, which the page
sends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from server_support import agent_server

from glimmer.server.choice_stream import ChoiceStream

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    pytest.skip("Debian's chromium and chromium-driver are not installed (.ci/run installs them)",
                allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

KEY = "page-test-key"
TOOLS_JSON = ('[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", '
              '"properties": {"city": {"type": "string"}}}}}]')


@pytest.fixture(scope="module")
def server(make_tiny):
    with agent_server(make_tiny(vision=True), api_key=KEY, require_cache_salt=True) as live:
        yield live


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _wait(browser, condition, timeout_s: float = 30):
    return WebDriverWait(browser, timeout_s).until(lambda _: condition())


def _last_assistant_turn(browser):
    _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, ".turn.assistant.done"))
    return browser.find_elements(By.CSS_SELECTOR, ".turn.assistant.done")[-1]


def _send(browser, text: str):
    before = len(browser.find_elements(By.CSS_SELECTOR, ".turn.assistant.done"))
    browser.find_element(By.ID, "prompt").send_keys(text)
    browser.find_element(By.ID, "send").click()
    _wait(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, ".turn.assistant.done")) > before)
    return _last_assistant_turn(browser)


def _open_with_key(browser, server):
    """The page, its key given (the browser session may hold it already)."""
    browser.get(server.url + "/")
    _wait(browser, lambda: browser.find_element(By.ID, "key-form").is_displayed()
          or browser.find_element(By.ID, "model").text)
    if browser.find_element(By.ID, "key-form").is_displayed():
        browser.find_element(By.ID, "key").send_keys(KEY)
        browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
    _wait(browser, lambda: browser.find_element(By.ID, "model").text == "tiny")


def _script_long_reply(live) -> str:
    """`[long]` scripted to a 400-word reply (returned), at a model's pace from now on: the reply streams for
    minutes, so a test acts on it mid-stream."""
    long_answer = " ".join(f"word{i}" for i in range(400))
    live.engine.engine.runner.add("[long]", f" to=user<|message|>{long_answer}<|eot|>")
    live.engine.engine.runner.step_delay_s = 0.05
    return long_answer


@contextlib.contextmanager
def _slow_long_reply(live) -> Iterator[str]:
    """`_script_long_reply` on a server other tests share, whose pace is restored after the block."""
    try:
        yield _script_long_reply(live)
    finally:
        live.engine.engine.runner.step_delay_s = 0.0


def _start_long_reply(browser):
    """Sends `[long] Talk.` and waits until the streaming reply shows text."""
    browser.find_element(By.ID, "prompt").send_keys("[long] Talk.")
    browser.find_element(By.ID, "send").click()
    _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, ".turn.assistant.streaming .content")
          and browser.find_element(By.CSS_SELECTOR, ".turn.assistant.streaming .content").text)


def test_the_page_is_served_as_static_files_without_a_key(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "chat.js" in page.text
    assert "http" not in httpx.get(server.url + "/static/chat.js").text.split("//")[0]  # nothing fetched from afar
    assert httpx.get(server.url + "/static/style.css").status_code == 200


def test_the_page_and_its_files_carry_security_headers(server):
    for path in ("/", "/static/chat.js", "/static/style.css"):
        headers = httpx.get(server.url + path).headers
        assert headers["x-content-type-options"] == "nosniff", path
        policy = headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy, path


def test_under_a_root_path_the_page_resolves_its_urls_under_it(server):
    # a proxy that strips the prefix hands `/glimmer` and `/glimmer/` to the app alike, as `/`: only a base URL makes
    # the page's relative URLs (static/chat.js, v1/models) land under the prefix from both
    async def get_page(root_path: str) -> str:
        transport = httpx.ASGITransport(app=server.app, root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return (await client.get("/")).text

    assert '<base href="/glimmer/">' in asyncio.run(get_page("/glimmer"))
    assert "<base" not in asyncio.run(get_page(""))  # served at the root: relative to wherever a proxy put it


def test_html_slipped_into_the_page_runs_no_script(server, browser):
    browser.get(server.url + "/")
    _wait(browser, lambda: browser.find_element(By.ID, "key-form").is_displayed())  # chat.js ran under the policy
    browser.execute_script("""
        document.getElementById('log').insertAdjacentHTML('beforeend',
          '<img id="probe" src="missing.png" onerror="window.ran = true">');""")
    _wait(browser, lambda: browser.execute_script(
        "const img = document.getElementById('probe'); return img.complete && img.naturalWidth === 0"))
    assert browser.execute_script("return window.ran") is None


def test_a_conversation_in_the_browser(server, browser, tmp_path):
    browser.get(server.url + "/")
    _wait(browser, lambda: browser.find_element(By.ID, "key-form").is_displayed())  # the server needs a key
    browser.find_element(By.ID, "key").send_keys(KEY)
    browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
    _wait(browser, lambda: browser.find_element(By.ID, "model").text == "tiny")

    # streamed text: every change of the answer is recorded as it happens
    browser.execute_script("""
        window.seen = [];
        new MutationObserver(() => {
          const turns = document.querySelectorAll('.turn.assistant .content');
          if (turns.length) window.seen.push(turns[turns.length - 1].textContent);
        }).observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true});""")
    # a step as long as a real model's: a page that reads slower than the steps come gets their deltas merged (the
    # server coalesces for a slow client), and on a loaded machine the whole answer arrived as one
    server.engine.engine.runner.step_delay_s = 0.05
    try:
        turn = _send(browser, "[greet] Hello!")
    finally:
        server.engine.engine.runner.step_delay_s = 0.0
    assert turn.find_element(By.CSS_SELECTOR, ".content").text == "Hello there!"
    seen = [text for text in browser.execute_script("return window.seen") if text]
    assert len(set(seen)) > 1 and all("Hello there!".startswith(text) for text in seen)  # it grew piece by piece

    reasoning = turn.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert reasoning.get_attribute("open") is None  # folded
    assert not turn.find_element(By.CSS_SELECTOR, ".reasoning-text").is_displayed()
    reasoning.find_element(By.TAG_NAME, "summary").click()
    _wait(browser, lambda: turn.find_element(By.CSS_SELECTOR, ".reasoning-text").is_displayed())
    assert turn.find_element(By.CSS_SELECTOR, ".reasoning-text").text == "The user greets me."

    browser.find_element(By.CSS_SELECTOR, "#settings summary").click()
    browser.find_element(By.ID, "tools").send_keys(TOOLS_JSON)
    browser.find_element(By.ID, "effort").send_keys("low")
    call = _send(browser, "[weather] Weather in Paris?").find_element(By.CSS_SELECTOR, ".tool-call")
    assert call.text == '→ get_weather({"city": "Paris"})'
    assert "Reasoning strength: low." in server.engine.engine.runner.prompts[-1]
    # the next text is the call's result (a conversation goes on only once each call is answered)
    assert browser.find_element(By.ID, "prompt").get_attribute("placeholder").startswith(
        'Result of get_weather({"city": "Paris"})')
    turn = _send(browser, "Sunny [sunny-result]")
    assert browser.find_elements(By.CSS_SELECTOR, ".turn.tool")[-1].text == (
        'get_weather({"city": "Paris"}) → Sunny [sunny-result]')
    assert turn.find_element(By.CSS_SELECTOR, ".content").text == "It is sunny in Paris."
    assert "Sunny [sunny-result]</tool_output>" in server.engine.engine.runner.prompts[-1].replace("\n", "")
    assert browser.find_element(By.ID, "prompt").get_attribute("placeholder").startswith("Message")

    browser.find_element(By.ID, "reset").click()  # a new conversation: the scripts key on the whole prompt
    image = tmp_path / "red.png"
    Image.new("RGB", (32, 32), (200, 30, 30)).save(image)
    browser.find_element(By.ID, "image").send_keys(str(image))
    _wait(browser, lambda: "1 image" in browser.find_element(By.ID, "attachments").text)
    turn = _send(browser, "[greet] What is this?")
    assert browser.find_elements(By.CSS_SELECTOR, ".turn.user img")
    assert "<|image_start|>" in server.engine.engine.runner.prompts[-1]
    assert turn.find_element(By.CSS_SELECTOR, ".content").text == "Hello there!"
    assert not browser.find_element(By.ID, "error").is_displayed()


def test_stop_ends_the_reply_and_the_request_on_the_server(server, browser):
    _open_with_key(browser, server)
    assert not browser.find_element(By.ID, "stop").is_displayed()
    with _slow_long_reply(server) as long_answer:
        _start_long_reply(browser)
        browser.find_element(By.ID, "stop").click()
        turn = _last_assistant_turn(browser)
        assert turn.get_attribute("data-finish-reason") == "stopped"
        shown = turn.find_element(By.CSS_SELECTOR, ".content").text
        assert long_answer.startswith(shown) and len(shown) < len(long_answer)
        samples = server.wait_for_idle(timeout_s=10)  # the server dropped the request, long before its end
        assert samples["glimmer_num_requests_running"] == 0
        assert not any(v for k, v in samples.items() if k.startswith("glimmer_kv_blocks_used"))
    assert not browser.find_element(By.ID, "stop").is_displayed()
    assert not browser.find_element(By.ID, "error").is_displayed()
    # the conversation goes on, the stopped reply in it
    assert _send(browser, "[greet] Hi").find_element(By.CSS_SELECTOR, ".content").text == "Hello there!"
    assert f"<|message|>{shown}<|eot|>" in server.engine.engine.runner.prompts[-1]
    assert not browser.find_element(By.ID, "error").is_displayed()


def test_a_long_reply_is_shown_in_time_linear_in_its_length(server, browser):
    # 50,000 deltas of reasoning and answer (a long reasoning reply): `textContent +=` copied the text so far on each,
    # 27 s in all here; appended, they take a fraction of a second
    browser.get(server.url + "/")
    elapsed_ms = browser.execute_script("""
        const turn = new AssistantTurn();
        const start = performance.now();
        for (let i = 0; i < 50000; i++) { turn.addReasoning('abcdefghij '); turn.addContent('0123456789 '); }
        return [performance.now() - start, turn.content.textContent.length, turn.reasoningText.textContent.length];""")
    assert elapsed_ms[1:] == [550000, 550000]
    assert elapsed_ms[0] < 5000


def test_a_connection_broken_mid_reply_is_said_so_and_the_conversation_goes_on(make_tiny, browser):
    with agent_server(make_tiny(vision=True)) as live:
        _script_long_reply(live)  # still streaming when the server goes
        browser.get(live.url + "/")
        _wait(browser, lambda: browser.find_element(By.ID, "model").text == "tiny")
        _start_long_reply(browser)
    turn = _last_assistant_turn(browser)  # the server is gone
    assert turn.get_attribute("data-finish-reason") == "broken" and "(cut off)" in turn.text
    assert browser.find_element(By.ID, "error").text.startswith("The connection to the server broke off the reply")
    assert not browser.find_element(By.ID, "stop").is_displayed() and browser.find_element(By.ID, "send").is_enabled()
    history = browser.execute_script("return state.history")
    assert [m["role"] for m in history] == ["user", "assistant"] and history[1]["content"]
    # with no server, a message is not taken into the conversation
    browser.find_element(By.ID, "prompt").send_keys("Still there?")
    browser.find_element(By.ID, "send").click()
    _wait(browser, lambda: browser.find_element(By.ID, "error").text.startswith("Cannot reach the server"))
    assert len(browser.execute_script("return state.history")) == 2


def test_an_error_event_after_a_call_began_leaves_no_call_to_answer(make_tiny, browser, monkeypatch):
    """The server failed mid-reply (an error event) after the call's first arguments had streamed: the page asked for
    the result of a call whose arguments were no JSON and sent it back, and the server refused the conversation
    (400 naming the arguments) at every try until New chat. As a reply cut off by a broken connection, it now keeps no
    call to answer, and the conversation goes on."""
    feed = ChoiceStream.feed

    def failing_after_a_call_start(self, delta):
        if getattr(self, "call_started", False):
            raise RuntimeError("the engine failed")
        released = feed(self, delta)
        self.call_started = any(kind == "tool_call" for step in released for kind, _ in step.events)
        return released

    with agent_server(make_tiny(vision=True)) as live:
        browser.get(live.url + "/")
        _wait(browser, lambda: browser.find_element(By.ID, "model").text == "tiny")
        browser.find_element(By.CSS_SELECTOR, "#settings summary").click()
        browser.find_element(By.ID, "tools").send_keys(TOOLS_JSON)
        live.engine.engine.runner.step_delay_s = 0.05  # a delta per token: the call's `}` comes after its start
        with monkeypatch.context() as patch:
            patch.setattr(ChoiceStream, "feed", failing_after_a_call_start)
            turn = _send(browser, "[weather] Weather in Paris?")
        assert turn.find_element(By.CSS_SELECTOR, ".tool-call").text == '→ get_weather({"city": "Paris")'  # cut short
        assert browser.find_element(By.ID, "error").text
        assert browser.execute_script("return state.pendingCalls") == []
        assert "tool_calls" not in browser.execute_script("return state.history")[-1]
        live.engine.engine.runner.step_delay_s = 0.0
        again = _send(browser, "Try again.")  # the history still holds [weather]: the model calls once more
        assert again.find_element(By.CSS_SELECTOR, ".tool-call").text == '→ get_weather({"city": "Paris"})'
        assert not browser.find_element(By.ID, "error").is_displayed()


def _cut_off_reply(browser, live):
    """The page's reply to `[long] Talk.`, scripted to 400 words (returned too), which a limit cuts off."""
    long_answer = " ".join(f"w{i}" for i in range(400))
    live.engine.engine.runner.add("[long]", f" to=user<|message|>{long_answer}<|eot|>")
    browser.get(live.url + "/")
    _wait(browser, lambda: browser.find_element(By.ID, "model").text == "tiny")
    turn = _send(browser, "[long] Talk.")
    assert turn.get_attribute("data-finish-reason") == "length"
    return turn, long_answer


def test_a_reply_cut_off_by_the_context_length_says_so(make_tiny, browser):
    with agent_server(make_tiny(vision=True), engine_options={"max_model_len": 256}) as live:
        turn, long_answer = _cut_off_reply(browser, live)
        assert "(cut off: the conversation fills the model's context)" in turn.text
        assert long_answer.startswith(turn.find_element(By.CSS_SELECTOR, ".content").text)
        assert not browser.find_element(By.ID, "error").is_displayed()


def test_a_reply_cut_off_by_the_default_max_tokens_says_so_not_that_the_context_is_full(make_tiny, browser, tmp_path):
    """The page sets no max_tokens, so the server's default ends a long reply: the checkpoint's generation_config
    max_new_tokens, well inside the context here. The page said the conversation filled the model's context."""
    model = tmp_path / "model"
    shutil.copytree(make_tiny(vision=True), model)
    generation = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps(generation | {"max_new_tokens": 20}))
    with agent_server(model) as live:
        turn, _ = _cut_off_reply(browser, live)
        assert "(cut off at the server's default max_tokens)" in turn.text
        assert "context" not in turn.find_element(By.CSS_SELECTOR, ".stopped-note").text


def test_a_server_that_fails_to_list_its_models_is_named_with_its_status(server, browser):
    browser.get(server.url + "/")
    _wait(browser, lambda: browser.find_element(By.ID, "key-form").is_displayed()
          or browser.find_element(By.ID, "model").text)
    # what a proxy in front of a stopped server answers
    browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        window.fetch = async () => new Response('<html><body>Bad Gateway</body></html>',
                                                {status: 502, statusText: 'Bad Gateway'});
        connect().then(() => done(), (error) => done(String(error)));""")
    assert browser.find_element(By.ID, "error").text == "The server answered HTTP 502 for its models: Bad Gateway"


def test_enter_while_a_reply_streams_sends_nothing(server, browser):
    _open_with_key(browser, server)
    browser.find_element(By.ID, "reset").click()
    with _slow_long_reply(server):
        _start_long_reply(browser)
        browser.find_element(By.ID, "prompt").send_keys("[greet] Hi\n")
        assert len(browser.find_elements(By.CSS_SELECTOR, ".turn.user")) == 1
        assert browser.find_element(By.ID, "prompt").get_attribute("value") == "[greet] Hi"  # kept for later
        browser.find_element(By.ID, "stop").click()
    _last_assistant_turn(browser)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".turn.assistant")) == 1


def test_new_chat_while_a_reply_streams_stops_it_and_starts_empty(server, browser):
    _open_with_key(browser, server)
    browser.find_element(By.ID, "reset").click()
    with _slow_long_reply(server):
        _start_long_reply(browser)
        browser.find_element(By.ID, "reset").click()
        _wait(browser, lambda: browser.find_element(By.ID, "send").is_enabled())
        samples = server.wait_for_idle(timeout_s=10)
        assert samples["glimmer_num_requests_running"] == 0
    assert browser.execute_script("return state.history") == []
    assert _send(browser, "[greet] Hi").find_element(By.CSS_SELECTOR, ".content").text == "Hello there!"
    assert "word" not in server.engine.engine.runner.prompts[-1]


def test_enter_that_ends_an_input_method_composition_sends_nothing(server, browser):
    """Enter that picks a Chinese or Japanese input method's candidate ends the composition (isComposing; Safari
    says keyCode 229 instead): it sent the half-typed message. The text stays in the composer."""
    _open_with_key(browser, server)
    browser.find_element(By.ID, "reset").click()
    for composing in ("isComposing: true", "keyCode: 229"):
        sent = browser.execute_script(f"""
            const prompt = document.getElementById('prompt');
            prompt.value = '[greet] 你好';
            prompt.dispatchEvent(new KeyboardEvent('keydown',
              {{key: 'Enter', {composing}, bubbles: true, cancelable: true}}));
            return [prompt.value, document.querySelectorAll('.turn.user').length];""")
        assert sent == ["[greet] 你好", 0], composing
    # Enter outside a composition still sends
    browser.find_element(By.ID, "prompt").send_keys("\n")
    assert _last_assistant_turn(browser).find_element(By.CSS_SELECTOR, ".content").text == "Hello there!"


def test_a_refused_message_goes_back_to_the_composer(server, browser, tmp_path):
    """A message the page could not send (tools that are no JSON) or the server refused (an attachment that is no
    image: a 400) stayed on the page as sent, though it is not in the conversation, and its text was gone: it had to
    be typed again, and then showed twice. It leaves the page and is back in the composer, to send again."""
    _open_with_key(browser, server)
    browser.find_element(By.ID, "reset").click()
    if not browser.find_element(By.ID, "tools").is_displayed():
        browser.find_element(By.CSS_SELECTOR, "#settings summary").click()
    browser.find_element(By.ID, "tools").clear()
    browser.find_element(By.ID, "tools").send_keys("[not json")
    browser.find_element(By.ID, "prompt").send_keys("[greet] Hi\n")
    _wait(browser, lambda: browser.find_element(By.ID, "error").text.startswith("Tools are not valid JSON"))
    assert not browser.find_elements(By.CSS_SELECTOR, ".turn.user")
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "[greet] Hi"
    browser.find_element(By.ID, "tools").clear()

    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    browser.find_element(By.ID, "image").send_keys(str(notes))
    _wait(browser, lambda: "1 image" in browser.find_element(By.ID, "attachments").text)
    browser.find_element(By.ID, "send").click()
    _wait(browser, lambda: "not an image format" in browser.find_element(By.ID, "error").text)
    assert not browser.find_elements(By.CSS_SELECTOR, ".turn.user")
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "[greet] Hi"
    assert browser.execute_script("return state.history") == []

    browser.find_element(By.ID, "send").click()  # sent again, without the file
    assert _last_assistant_turn(browser).find_element(By.CSS_SELECTOR, ".content").text == "Hello there!"
    assert [turn.text for turn in browser.find_elements(By.CSS_SELECTOR, ".turn.user")] == ["[greet] Hi"]


def test_a_key_accepted_after_a_refused_one_clears_the_refusal(server, browser):
    """A wrong key, then the right one: the page said "That API key was refused." beside the model it had connected
    to, as though the right key were refused too."""
    browser.get(server.url + "/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(server.url + "/")
    _wait(browser, lambda: browser.find_element(By.ID, "key-form").is_displayed())
    browser.find_element(By.ID, "key").send_keys("wrong-key\n")
    _wait(browser, lambda: browser.find_element(By.ID, "error").text == "That API key was refused.")
    browser.find_element(By.ID, "key").clear()
    browser.find_element(By.ID, "key").send_keys(KEY + "\n")
    _wait(browser, lambda: browser.find_element(By.ID, "model").text == "tiny")
    assert not browser.find_element(By.ID, "key-form").is_displayed()
    assert not browser.find_element(By.ID, "error").is_displayed()


def test_images_go_in_the_order_attached_with_the_message_sent_while_they_are_read(server, browser, tmp_path):
    """Images are read after they are picked: a message sent before the reads ended went without them (they went
    with the next message), and several images went in the order their reads ended, not the order picked."""
    _open_with_key(browser, server)
    browser.find_element(By.ID, "reset").click()
    paths = [tmp_path / "red.png", tmp_path / "blue.png"]
    for path, colour in zip(paths, [(200, 30, 30), (30, 30, 200)], strict=True):
        Image.new("RGB", (64, 64), colour).save(path)
    urls = ["data:image/png;base64," + base64.b64encode(path.read_bytes()).decode() for path in paths]
    # each read ends when the test says so
    browser.execute_script("""
        window.endRead = [];
        const Reader = FileReader;
        window.FileReader = class {
          readAsDataURL(file) {
            const reader = new Reader();
            reader.onload = () => window.endRead.push(() => { this.result = reader.result; this.onload(); });
            reader.readAsDataURL(file);
          }
        };""")
    browser.find_element(By.ID, "image").send_keys("\n".join(str(path) for path in paths))
    _wait(browser, lambda: browser.execute_script("return window.endRead.length") == 2)
    browser.find_element(By.ID, "prompt").send_keys("[greet] What are these?\n")
    browser.execute_script("window.endRead[1](); window.endRead[0]();")  # the second picked is read first
    _last_assistant_turn(browser)
    content = browser.execute_script("return state.history")[0]["content"]
    assert [part["image_url"]["url"] for part in content[:2]] == urls
    assert len(browser.find_elements(By.CSS_SELECTOR, ".turn.user img")) == 2
    assert server.engine.engine.runner.prompts[-1].count("<|image_start|>") == 2
    assert not browser.find_element(By.ID, "attachments").text


def test_an_image_that_cannot_be_read_keeps_the_message_to_send_again(server, browser, tmp_path):
    """A file that could not be read (moved or deleted after it was picked) failed the send after the composer was
    emptied: the typed message was lost. Nothing is sent, the error says so and the text is back in the composer."""
    _open_with_key(browser, server)
    browser.find_element(By.ID, "reset").click()
    path = tmp_path / "gone.png"
    Image.new("RGB", (8, 8)).save(path)
    browser.execute_script("""
        window.FileReader = class {
          readAsDataURL(file) {
            this.error = new DOMException("the file was moved", "NotReadableError");
            setTimeout(() => this.onerror(), 0);
          }
        };""")
    browser.find_element(By.ID, "image").send_keys(str(path))
    prompts = len(server.engine.engine.runner.prompts)
    browser.find_element(By.ID, "prompt").send_keys("[greet] What is this?\n")
    _wait(browser, lambda: browser.find_element(By.ID, "error").text.startswith("An attached image could not be read"))
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "[greet] What is this?"
    assert not browser.find_elements(By.CSS_SELECTOR, ".turn.user")
    assert len(server.engine.engine.runner.prompts) == prompts and not browser.execute_script("return state.history")


def test_a_refused_call_result_goes_back_to_the_composer(server, browser):
    """The reply to a call's result refused (here tools that are no JSON; a result past the context is a 400): the
    result stayed on the page as given while the composer asked for it again, so it then showed twice. It leaves the
    page and is back in the composer."""
    _open_with_key(browser, server)
    browser.find_element(By.ID, "reset").click()
    if not browser.find_element(By.ID, "tools").is_displayed():
        browser.find_element(By.CSS_SELECTOR, "#settings summary").click()
    tools = browser.find_element(By.ID, "tools")
    tools.clear()
    tools.send_keys(TOOLS_JSON)
    assert _send(browser, "[weather] Weather in Paris?").find_elements(By.CSS_SELECTOR, ".tool-call")
    tools.send_keys("]")
    browser.find_element(By.ID, "prompt").send_keys("Sunny [sunny-result]\n")
    _wait(browser, lambda: browser.find_element(By.ID, "error").text.startswith("Tools are not valid JSON"))
    assert not browser.find_elements(By.CSS_SELECTOR, ".turn.tool")
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "Sunny [sunny-result]"
    assert browser.find_element(By.ID, "prompt").get_attribute("placeholder").startswith("Result of get_weather")

    tools.send_keys(Keys.BACKSPACE)
    assert _send(browser, "").find_element(By.CSS_SELECTOR, ".content").text == "It is sunny in Paris."
    assert len(browser.find_elements(By.CSS_SELECTOR, ".turn.tool")) == 1
    tools.clear()
