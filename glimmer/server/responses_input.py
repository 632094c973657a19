"""Responses API input items → chat messages, the shape the chat template renders.

- a string input is one user message; `instructions` become a system message first (developer messages in
  the input then join it, as on chat);
- message items keep their role; `input_text` / `output_text` parts become text, `input_image` parts
  image_url parts; other parts (`input_file`, `input_audio`, …) are refused naming the part;
- a `reasoning` item (its `content` text, else its summary text), the assistant message and the
  `function_call` items that follow it make one assistant message: reasoning_content, content, tool_calls;
- a `function_call_output` item is a tool message answering its `call_id`.
Anything else is refused with 400 naming `input[i]`: nothing is silently dropped.
"""

from __future__ import annotations

from typing import Any

from glimmer.errors import RequestError

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")


def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value)


def chat_messages(items: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    """Raises RequestError naming the item or part the model cannot take."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    assistant: dict[str, Any] | None = None

    def flush() -> None:
        nonlocal assistant
        if assistant is not None:
            messages.append(assistant)
            assistant = None

    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "reasoning":
            if assistant is not None and (assistant.get("content") or assistant.get("tool_calls")):
                flush()
            assistant = assistant or {"role": "assistant", "content": None}
            text = _reasoning_text(item, where)
            previous = assistant.get("reasoning_content")
            assistant["reasoning_content"] = f"{previous}\n{text}" if previous else text
        elif kind == "function_call":
            assistant = assistant or {"role": "assistant", "content": None}
            assistant.setdefault("tool_calls", []).append(_tool_call(item, where))
        elif kind == "message" and item.get("role") == "assistant":
            if assistant is not None and (assistant.get("content") or assistant.get("tool_calls")):
                flush()
            assistant = assistant or {"role": "assistant", "content": None}
            assistant["content"] = _text_of(item.get("content"), where)
        elif kind == "message":
            flush()
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise RequestError(f"{where}.role: {role!r} is not one of {', '.join(_MESSAGE_ROLES)}",
                                   param=f"{where}.role")
            messages.append({"role": role, "content": _content(item.get("content"), where)})
        elif kind == "function_call_output":
            flush()
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise RequestError(f"{where}.call_id: must name the function call answered", param=f"{where}.call_id")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _text_of(item.get("output"), where)})
        else:
            raise RequestError(f"{where}.type: input items of type {kind!r} are not supported (message, reasoning, "
                               "function_call and function_call_output are)", param=f"{where}.type")
    flush()
    return messages


def _tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments", "")
    if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, str):
        raise RequestError(f"{where}: a function_call item needs string `name`, `call_id` and `arguments`",
                           param=where)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    parts = item.get("content") or item.get("summary") or []
    if not parts and item.get("encrypted_content"):
        raise RequestError(f"{where}: a reasoning item with only `encrypted_content` cannot be read here; send "
                           "its text in `content`", param=where)
    return "".join(_part_text(part, f"{where}.content[{j}]") for j, part in enumerate(parts))


def _part_text(part: Any, where: str) -> str:
    if isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("type") in (
            *_TEXT_PARTS, "reasoning_text", "summary_text"):
        return part["text"]
    if isinstance(part, dict) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
        return part["refusal"]
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    raise RequestError(f"{where}: parts of type {kind!r} are not supported here (text parts are)", param=where)


def _text_of(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(_part_text(part, f"{where}.content[{j}]") for j, part in enumerate(content))
    raise RequestError(f"{where}.content: must be a string or a list of text parts", param=f"{where}.content")


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A user / system / developer message's content in chat parts (images kept)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(f"{where}.content: must be a string or a list of content parts", param=f"{where}.content")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        param = f"{where}.content[{j}]"
        if isinstance(part, dict) and part.get("type") == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise RequestError(f"{param}: an input_image needs `image_url` as a string (a data: or https: URL); "
                                   "file ids and other forms are not supported", param=param)
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": "text", "text": _part_text(part, param)})
    return parts
