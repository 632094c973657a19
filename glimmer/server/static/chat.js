// Glimmer's chat page: streams /v1/chat/completions and shows reasoning (folded), the answer and tool calls.
// Plain JavaScript, no build step, nothing fetched from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
// A cache_salt only partitions the server's prefix cache: requests share cached prompt blocks only with requests
// naming the same salt. One random salt per page load keeps this conversation's turns reusing each other's blocks
// (each turn's prompt starts with the previous one) and lets the page work with a server started with
// --require-cache-salt. (crypto.getRandomValues, unlike randomUUID, also works on a plain-http page.)
const cacheSalt = Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0"))
  .join("");
// images: the next message's attachments, a promise of its data URL each.
// pendingCalls: the tool calls of the last reply still waiting for their results, which the composer takes one by one
// (the conversation goes on only once each call is answered, as OpenAI requires); answeredCalls: those answered since.
const state = { model: null, maxModelLen: null, key: sessionStorage.getItem("glimmer-api-key") || "", history: [],
  images: [], pendingCalls: [], answeredCalls: [], stopping: null };
const PROMPT_PLACEHOLDER = "Message (Enter sends, Shift+Enter for a new line)";

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.key) h.Authorization = `Bearer ${state.key}`;
  return h;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

async function connect() {
  const response = await fetch("v1/models", { headers: headers() });
  if (response.status === 401) {
    $("key-form").hidden = false;
    showError(state.key ? "That API key was refused." : "");
    return;
  }
  $("key-form").hidden = true;
  showError("");  // a key refused before this one
  if (!response.ok) {  // a proxy's 502, say: its body may be a page of HTML
    const error = await response.json().catch(() => ({}));
    showError(`The server answered HTTP ${response.status} for its models: ${
      (error.error && error.error.message) || response.statusText || "no message"}`);
    return;
  }
  const models = await response.json();
  state.model = models.data[0].id;
  state.maxModelLen = models.data[0].max_model_len;
  $("model").textContent = state.model;
}

// Whether a reply cut off with `usage` filled the context (so a new chat is the way on), rather than reaching the
// server's default max_tokens (the model's generation_config max_new_tokens); without the figures, the context.
function contextFull(usage) {
  return !usage || !state.maxModelLen || usage.prompt_tokens + usage.completion_tokens >= state.maxModelLen;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

function addUserTurn(text, images) {
  const turn = element("div", "turn user");
  for (const url of images) {
    const img = element("img");
    img.src = url;
    turn.append(img);
  }
  turn.append(document.createTextNode(text));
  $("log").append(turn);
  return turn;
}

function callLabel(call) {
  return `${call.function.name}(${call.function.arguments})`;
}

// The composer asks for the result of the first call still waiting for one, or for a message.
function showPendingCall() {
  const call = state.pendingCalls[0];
  $("prompt").placeholder = call ? `Result of ${callLabel(call)} (Enter sends)` : PROMPT_PLACEHOLDER;
}

// One assistant turn on the page, filled as the stream arrives.
class AssistantTurn {
  constructor() {
    this.node = element("div", "turn assistant");
    this.reasoning = null;
    this.content = element("div", "content");
    this.node.append(this.content);
    this.calls = [];
    this.message = { role: "assistant", content: "", reasoning_content: "", tool_calls: [] };
    this.usage = null;  // the stream's last chunk's (stream_options.include_usage)
    $("log").append(this.node);
  }

  addReasoning(text) {
    if (!this.reasoning) {
      this.reasoning = element("details", "reasoning");
      this.reasoning.append(element("summary", null, "Reasoning"));
      this.reasoningText = element("div", "reasoning-text");
      this.reasoning.append(this.reasoningText);
      this.node.insertBefore(this.reasoning, this.content);
    }
    this.reasoningText.append(text);  // a text node per delta: `textContent +=` copies all so far, each time
    this.message.reasoning_content += text;
  }

  addContent(text) {
    this.content.append(text);
    this.message.content += text;
  }

  addToolCall(piece) {
    if (piece.id) {
      const call = { id: piece.id, type: "function", function: { name: piece.function.name, arguments: "" } };
      this.message.tool_calls.push(call);
      const node = element("div", "tool-call");
      this.node.append(node);
      this.calls[piece.index] = { call, node };
    }
    const entry = this.calls[piece.index];
    if (!entry) return;
    entry.call.function.arguments += piece.function.arguments || "";
    entry.node.textContent = `→ ${callLabel(entry.call)}`;
  }

  historyMessage() {
    const m = { role: "assistant", content: this.message.content || null };
    if (this.message.reasoning_content) m.reasoning_content = this.message.reasoning_content;
    if (this.message.tool_calls.length) m.tool_calls = this.message.tool_calls;
    return m;
  }
}

function requestBody() {
  // the usage tells which limit ended a reply cut off (finish_reason "length")
  const body = { model: state.model, messages: [], stream: true, stream_options: { include_usage: true },
    cache_salt: cacheSalt };
  const system = $("system").value.trim();
  if (system) body.messages.push({ role: "system", content: system });
  body.messages.push(...state.history);
  if ($("effort").value) body.reasoning_effort = $("effort").value;
  const tools = $("tools").value.trim();
  if (tools) body.tools = JSON.parse(tools);
  return body;
}

async function* serverSentEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

async function send(text) {
  showError("");
  if (state.pendingCalls.length) {
    await answerCall(text);
    return;
  }
  const reads = state.images;
  state.images = [];
  $("attachments").textContent = "";
  let images;
  try {
    images = await Promise.all(reads);  // each read to its end, in the order attached
  } catch (error) {
    // a file that could not be read (moved or deleted since it was picked): nothing is sent, the text kept to send
    // with the images attached again (all of them: the reads that ended are dropped with it)
    showError(`An attached image could not be read (${error}); attach the images again`);
    if (!$("prompt").value) $("prompt").value = text;
    return;
  }
  const content = images.length
    ? [...images.map((url) => ({ type: "image_url", image_url: { url } })), { type: "text", text }]
    : text;
  const turn = addUserTurn(text, images);
  const history = state.history;
  history.push({ role: "user", content });
  // refused: the message is not in the conversation; its text is back in the composer to send again (its images,
  // which a refusal may name, are not: attach them again)
  if (!(await reply()) && history === state.history) {
    history.pop();
    turn.remove();
    if (!$("prompt").value) $("prompt").value = text;
  }
}

// The text is the result of the first call waiting for one; once each call has its result, the model replies.
async function answerCall(text) {
  const call = state.pendingCalls.shift();
  state.answeredCalls.push(call);
  $("log").append(element("div", "turn tool", `${callLabel(call)} → ${text}`));
  state.history.push({ role: "tool", tool_call_id: call.id, content: text });
  if (!state.pendingCalls.length) {
    const history = state.history;
    // as with a refused message, the results are to be sent again: they leave the page, the first back in the composer
    if (!(await reply()) && history === state.history) {
      const results = history.splice(history.length - state.answeredCalls.length);
      for (const node of [...$("log").querySelectorAll(".turn.tool")].slice(-results.length)) node.remove();
      if (!$("prompt").value) $("prompt").value = results[0].content;
      state.pendingCalls = state.answeredCalls;
    }
    state.answeredCalls = [];
  }
  showPendingCall();
}

// Streams the model's reply to the conversation so far; false when the server refused the request.
async function reply() {
  let body;
  try {
    body = requestBody();
  } catch (error) {
    showError(`Tools are not valid JSON: ${error.message}`);
    return false;
  }
  // Stop aborts the request: the server sees the connection close and frees the request's place and KV cache
  state.stopping = new AbortController();
  $("stop").hidden = false;
  try {
    return await streamReply(body, state.stopping.signal);
  } finally {
    $("stop").hidden = true;
    state.stopping = null;
  }
}

async function streamReply(body, signal) {
  const history = state.history;  // "New chat" replaces it: a reply it stopped stays out of the new conversation
  let response;
  try {
    response = await fetch("v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
      signal });
  } catch (error) {  // as a refused request: the message is to be sent again
    showError(error.name === "AbortError" ? "Stopped before the reply began." : `Cannot reach the server: ${error}`);
    return false;
  }
  if (!response.ok) {
    const error = await response.json().catch(() => ({}));
    showError((error.error && error.error.message) || `HTTP ${response.status}`);
    if (response.status === 401) $("key-form").hidden = false;
    return false;
  }
  const turn = new AssistantTurn();
  turn.node.classList.add("streaming");
  try {
    for await (const chunk of serverSentEvents(response)) {
      if (chunk.error) {  // the server ended the reply: a call it was streaming has no complete arguments
        showError(chunk.error.message);
        turn.message.tool_calls = [];
        break;
      }
      if (chunk.usage) turn.usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (delta.reasoning_content) turn.addReasoning(delta.reasoning_content);
        if (delta.content) turn.addContent(delta.content);
        for (const piece of delta.tool_calls || []) turn.addToolCall(piece);
        if (choice.finish_reason) turn.node.dataset.finishReason = choice.finish_reason;
      }
    }
  } catch (error) {
    // stopped, or the connection broke: what came stays in the conversation; a tool call cut short has no complete
    // arguments to answer
    const stopped = error.name === "AbortError";
    if (!stopped) showError(`The connection to the server broke off the reply: ${error}`);
    turn.node.dataset.finishReason = stopped ? "stopped" : "broken";
    turn.node.append(element("div", "stopped-note", stopped ? "(stopped)" : "(cut off)"));
    turn.message.tool_calls = [];
  }
  if (turn.node.dataset.finishReason === "length") {  // the page sets no max_tokens: the server's default ended it
    turn.node.append(element("div", "stopped-note", contextFull(turn.usage)
      ? "(cut off: the conversation fills the model's context)" : "(cut off at the server's default max_tokens)"));
  }
  turn.node.classList.remove("streaming");
  turn.node.classList.add("done");
  history.push(turn.historyMessage());
  if (history === state.history) state.pendingCalls = [...turn.message.tool_calls];
  showPendingCall();
  return true;
}

$("composer").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  // Enter submits the form even while Send is disabled: one reply at a time, the text kept for the next
  if (!text || !state.model || $("send").disabled) return;
  $("prompt").value = "";
  $("send").disabled = true;
  try {
    await send(text);
  } catch (error) {
    showError(String(error));
  } finally {
    $("send").disabled = false;
  }
});

$("stop").addEventListener("click", () => {
  if (state.stopping) state.stopping.abort();
});

$("prompt").addEventListener("keydown", (event) => {
  // Enter that ends an input method's composition (picking a Chinese or Japanese candidate) is the method's, not a
  // send; Safari marks that keydown by keyCode 229 alone
  if (event.isComposing || event.keyCode === 229) return;
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

$("image").addEventListener("change", () => {
  // an image is a promise of its data URL: a message sent while it is read waits for it, and images keep their order
  for (const file of $("image").files) {
    state.images.push(new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    }));
  }
  $("attachments").textContent = `${state.images.length} image(s) attached`;
  $("image").value = "";
});

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.key = $("key").value;
  sessionStorage.setItem("glimmer-api-key", state.key);
  connect();
});

$("reset").addEventListener("click", () => {
  if (state.stopping) state.stopping.abort();
  state.history = [];
  state.pendingCalls = [];
  state.answeredCalls = [];
  showPendingCall();
  $("log").textContent = "";
});

connect().catch((error) => showError(`Cannot reach the server: ${error}`));
