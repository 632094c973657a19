"""Synthetic conversations for the nano model: OpenAI-style messages, tools and template kwargs.

Each conversation declares 0–5 tools (drawn from `domains.py`, named by `names.py`) and holds 1–3 user
turns. A turn is one of:

- **call**: the user asks for something a declared tool does, stating the arguments in their own words;
  the assistant reasons to `self` at the conversation's reasoning strength (at every strength walking the
  declared tools in order up to the one that fits: `tool_walk`), calls the tool with arguments
  copied or derived from those words and typed by the tool's JSON schema (`"three"` → 3, `off` → false,
  `Ana and Ben` → `["Ana", "Ben"]`), gets the result, reasons again and answers with every value of it.
  Some calls are parallel (two cities → two calls).
- **plain**: a greeting, thanks, "what can you do?" (the answer lists the declared tools), or "repeat after
  me"; no tool fits, the assistant just answers.
- **refusal**: the user asks for something no declared tool does, or names a tool that is not declared; the
  assistant says it cannot, naming what is missing.

The module is pure text (no torch): `render.py` renders these with the checkpoint's chat template.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from glimmer.train_nano.domains import DOMAINS, Domain, ResultField, Slot
from glimmer.train_nano.names import draw_tool_name
from glimmer.train_nano.values import POOLS, made_up_word, number_surface

STRENGTHS = ("low", "medium", "high", "xhigh")
# Requests of one domain that another's tool would plausibly serve: never a refusal when the other is declared.
RELATED = {frozenset(pair) for pair in (("weather", "forecast"), ("email", "group_message"),
                                        ("flights", "directions"), ("lights", "thermostat"))}

# Most declarations add a detail of their own to the domain's description, so the reasoning's restatement of
# each tool's description is copied from the declaration (not recalled from the request).
DESCRIPTION_DETAILS = (
    "Provided by {word}.", "Uses the {word} service.", "Part of the {word} toolkit.", "Maintained by the {word} team.",
    "Backed by {word}.", "From the {word} plugin.", "Version {number}.", "Rate limit: {number} calls a minute.",
    "Runs on {word} servers.", "Added in release {number}.",
)

SYSTEM_PROMPTS = (
    "You are a helpful assistant.", "You are a concise assistant. Keep answers short.",
    "You help users with everyday tasks using the tools you are given.", "Be friendly and precise.",
    "You are the assistant of a travel agency.", "You are a home assistant that controls devices and answers "
    "questions.", "Answer in plain English.",
)


@dataclass
class TurnExpectation:
    """What the evaluated (last) user turn should produce: calls [(name, arguments)], then an answer holding
    `answer_values`; or no call (`kind` plain or refusal)."""

    kind: str
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tool_results: list[str] = field(default_factory=list)
    answer_values: list[str] = field(default_factory=list)


@dataclass
class Conversation:
    """A whole conversation. `trained[i]` says whether assistant message i is a training target (an earlier
    turn whose reasoning a client dropped is context only)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    reasoning_strength: str | None
    template_kwargs: dict[str, Any]
    trained: dict[int, bool]
    last_turn: TurnExpectation
    last_user_index: int


@dataclass
class DeclaredTool:
    domain: Domain
    name: str
    keys: dict[str, str]  # slot id -> parameter name
    slots: list[Slot]  # the slots present in the schema, in schema order

    def as_openai_tool(self, description: str) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        for slot in self.slots:
            properties[self.keys[slot.id]] = _slot_schema(slot)
        schema: dict[str, Any] = {"type": "object", "properties": properties,
                                  "required": [self.keys[s.id] for s in self.slots if s.required]}
        return {"type": "function", "function": {"name": self.name, "description": description,
                                                  "parameters": schema}}


def _slot_schema(slot: Slot) -> dict[str, Any]:
    if slot.kind == "enum":
        return {"type": "string", "enum": list(slot.choices), "description": slot.description}
    if slot.kind == "array":
        return {"type": "array", "items": {"type": "string"}, "description": slot.description}
    return {"type": slot.kind, "description": slot.description}


@dataclass
class Argument:
    slot: Slot
    value: Any  # typed, as the call carries it
    surface: str  # as the user wrote it


def atem_text(value: Any) -> str:
    """A value as the chat template writes it into an ATEM parameter (protocol.md §2.1)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _number(rng: random.Random, span: tuple[float, float], integral: bool) -> int | float:
    low, high = span
    if integral or rng.random() < 0.5:
        return rng.randint(int(low), int(high))
    value = round(rng.uniform(low, high), rng.choice((1, 2)))
    return value if value != int(value) else int(value)


def _sample_argument(slot: Slot, rng: random.Random) -> Argument:
    if slot.kind == "integer":
        value = _number(rng, slot.span, integral=True)
        return Argument(slot, value, number_surface(value, rng))
    if slot.kind == "number":
        value = _number(rng, slot.span, integral=False)
        return Argument(slot, value, str(value))
    if slot.kind == "boolean":
        value = rng.random() < 0.5
        return Argument(slot, value, slot.choices[0] if value else slot.choices[1])
    if slot.kind == "enum":
        value = rng.choice(slot.choices)
        surface = value.capitalize() if value.islower() and rng.random() < 0.2 else value
        return Argument(slot, value, surface)
    if slot.kind == "array":
        people: list[str] = []
        while len(people) < rng.randint(2, 3):
            person = POOLS[slot.pool](rng)
            if person not in people:
                people.append(person)
        surface = ", ".join(people[:-1]) + " and " + people[-1]
        return Argument(slot, people, surface)
    value = POOLS[slot.pool](rng)
    return Argument(slot, value, value)


def _sample_arguments(tool: DeclaredTool, rng: random.Random, *, with_optional: bool) -> list[Argument]:
    arguments: list[Argument] = []
    for slot in tool.slots:
        if not slot.required and not (with_optional and rng.random() < 0.4):
            continue
        while True:
            argument = _sample_argument(slot, rng)
            if all(argument.surface != other.surface for other in arguments):
                break
        arguments.append(argument)
    return arguments


def _fill(template: str, arguments: list[Argument], results: list[Any] = ()) -> str:
    values = {a.slot.id: a.surface for a in arguments}
    values.update({f"r{i}": atem_text(r) for i, r in enumerate(results)})
    return template.format(**values)


def _request_text(tool: DeclaredTool, arguments: list[Argument], rng: random.Random) -> str:
    text = _fill(rng.choice(tool.domain.requests), arguments)
    for argument in arguments:
        if not argument.slot.required:
            text += _fill(rng.choice(argument.slot.clauses), [argument])
    if rng.random() < 0.08:
        text = f"Use {tool.name}: {text}"
    elif rng.random() < 0.1:
        text = text[0].lower() + text[1:]
    return text


def _result_value(result_field: ResultField, arguments: list[Argument], rng: random.Random) -> Any:
    if result_field.copy:
        argument = next(a for a in arguments if a.slot.id == result_field.copy)
        return argument.value if argument.slot.kind in ("integer", "number") else argument.surface
    if result_field.choices:
        return rng.choice(result_field.choices)
    if result_field.kind in ("integer", "number"):
        return _number(rng, result_field.span, integral=result_field.kind == "integer")
    return POOLS[result_field.pool](rng)


def _tool_result(tool: DeclaredTool, arguments: list[Argument], rng: random.Random) -> tuple[str, list[Any]]:
    """The tool's reply (a JSON object text) and its field values in order."""
    values = [_result_value(f, arguments, rng) for f in tool.domain.result]
    body = {rng.choice(f.keys): v for f, v in zip(tool.domain.result, values, strict=True)}
    return json.dumps(body, ensure_ascii=False), values


def _arguments_phrase(arguments: list[Argument], tool: DeclaredTool, *, detailed: bool) -> str:
    parts = []
    for argument in arguments:
        key = tool.keys[argument.slot.id]
        text = atem_text(argument.value)
        if detailed:
            kind = argument.slot.kind if argument.slot.kind != "enum" else "one of " + "/".join(argument.slot.choices)
            derived = f', from "{argument.surface}"' if argument.surface != text else ""
            parts.append(f"{key} is {text} ({kind}{derived})")
        else:
            parts.append(f"{key} = {text}")
    return "; ".join(parts) if detailed else ", ".join(parts)


def tool_walk(tools: list[DeclaredTool], descriptions: dict[str, str], chosen: DeclaredTool | None) -> str:
    """The declared tools in declaration order, each as `name (description): no`, up to the chosen one (`yes`).

    A tool is chosen by its description, but the template declares a tool's name before its description, so
    writing the name after deciding on the description would be a look back within the declarations, which a
    model this small gets wrong once several tools are declared. Walking the declarations forward reads each
    name, then the description that follows it, then judges it; the call then copies the name of the entry
    just judged `yes`, a few tokens back. Turns that call nothing walk every tool to `no`."""
    entries = []
    for tool in tools:
        entries.append(f"{tool.name} ({descriptions[tool.name].rstrip('.')}): {'yes' if tool is chosen else 'no'}")
        if tool is chosen:
            break
    return "Tools: " + "; ".join(entries) + "."


def _call_reasoning(strength: str, walk: str, tool: DeclaredTool, intents: list[str],
                    argument_sets: list[list[Argument]], rng: random.Random) -> str:
    """The reasoning before a call: the request, the walk over the declared tools (`tool_walk`), the call, and
    from strength high on its arguments."""
    intent = " and ".join(intents)
    twice = " twice" if len(argument_sets) > 1 else ""
    if strength == "low":
        return f"{walk} Call {tool.name}{twice} for {intent}."
    if strength == "medium":
        return f"The user {rng.choice(('wants', 'asks for'))} {intent}. {walk} So I call {tool.name}{twice}."
    text = f"The user wants {intent}. {walk} So I call {tool.name}{twice}."
    detailed = strength == "xhigh"
    text += " Arguments: " + " Then ".join(_arguments_phrase(a, tool, detailed=detailed) + "."
                                          for a in argument_sets)
    if detailed:
        text += " When the result comes back I will answer with its values."
    return text


def _result_reasoning(strength: str, tool: DeclaredTool, results: list[list[Any]], rng: random.Random) -> str:
    if strength == "low":
        return "Answer with the result."
    if strength == "medium":
        return rng.choice((f"{tool.name} answered. Tell the user.", "The result is in; answer the user."))
    summary = "; ".join(", ".join(atem_text(v) for v in values) for values in results)
    text = f"{tool.name} returned {summary}. Answer the user with these values."
    if strength == "xhigh":
        text += " Keep it to one sentence and do not call another tool."
    return text


def _no_call_reasoning(strength: str, walk: str, situation: tuple[str, str, str], conclusion: str) -> str:
    """The reasoning of a turn that calls nothing: the situation (low, medium, high wording), the walk over the
    declared tools (every one `no`; empty without tools), and from strength medium on the conclusion."""
    low, medium, high = situation
    parts = {"low": [low, walk], "medium": [medium, walk, conclusion], "high": [high, walk, conclusion],
             "xhigh": [high, walk, conclusion, "No tool call is needed."]}[strength]
    return " ".join(part for part in parts if part)


class _Builder:
    """Builds one conversation, turn by turn."""

    def __init__(self, rng: random.Random, *, held_out: bool):
        self.rng = rng
        self.held_out = held_out
        self.messages: list[dict[str, Any]] = []
        self.trained: dict[int, bool] = {}
        self.call_counter = 0
        self.tools: list[DeclaredTool] = []
        self.descriptions: dict[str, str] = {}

    def declare_tools(self) -> None:
        rng = self.rng
        count = rng.choices((0, 1, 2, 3, 4, 5), weights=(10, 16, 20, 21, 18, 15))[0]
        taken: set[str] = set()
        for domain in rng.sample(DOMAINS, count):
            name = draw_tool_name(domain, rng, held_out=self.held_out, taken=taken)
            taken.add(name)
            slots = [s for s in domain.slots if s.required or rng.random() < 0.7]
            keys: dict[str, str] = {}
            for slot in slots:
                keys[slot.id] = rng.choice([k for k in slot.keys if k not in keys.values()])
            tool = DeclaredTool(domain, name, keys, slots)
            self.tools.append(tool)
            description = rng.choice(domain.descriptions)
            if rng.random() < 0.6:
                detail = rng.choice(DESCRIPTION_DETAILS).format(word=made_up_word(rng, (1, 2)).capitalize(),
                                                                number=rng.randint(2, 99))
                description = f"{description} {detail}"
            self.descriptions[name] = description

    def walk(self, chosen: DeclaredTool | None) -> str:
        return tool_walk(self.tools, self.descriptions, chosen) if self.tools else ""

    def openai_tools(self) -> list[dict[str, Any]] | None:
        return [t.as_openai_tool(self.descriptions[t.name]) for t in self.tools] or None

    def add_assistant(self, message: dict[str, Any], trained: bool) -> None:
        self.trained[len(self.messages)] = trained
        self.messages.append(message)

    def call_turn(self, strength: str, keep_reasoning: bool, *, pair: bool) -> TurnExpectation:
        rng = self.rng
        candidates = [t for t in self.tools if t.domain.pair_requests] if pair else self.tools
        tool = rng.choice(candidates)
        if pair:
            first = _sample_arguments(tool, rng, with_optional=False)
            while True:
                second = _sample_arguments(tool, rng, with_optional=False)
                if second[0].surface != first[0].surface:
                    break
            template = rng.choice(tool.domain.pair_requests)
            request = template.format(a=first[0].surface, b=second[0].surface)
            argument_sets = [first, second]
        else:
            arguments = _sample_arguments(tool, rng, with_optional=True)
            request = _request_text(tool, arguments, rng)
            argument_sets = [arguments]
        self.messages.append({"role": "user", "content": request})
        intents = [_fill(tool.domain.intent, a) for a in argument_sets]
        calls, call_pairs = [], []
        for arguments in argument_sets:
            call_id = f"call_{self.call_counter}_{made_up_word(rng, (1, 1))}{rng.randint(100, 999)}"
            self.call_counter += 1
            call_arguments = {tool.keys[a.slot.id]: a.value for a in arguments}
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": tool.name, "arguments": call_arguments}})
            call_pairs.append((tool.name, call_arguments))
        reasoning = _call_reasoning(strength, self.walk(tool), tool, intents, argument_sets, rng)
        self.add_assistant(_assistant(None, reasoning if keep_reasoning else None, calls), keep_reasoning)
        results, result_texts = [], []
        for call, arguments in zip(calls, argument_sets, strict=True):
            text, values = _tool_result(tool, arguments, rng)
            message: dict[str, Any] = {"role": "tool", "tool_call_id": call["id"], "content": text}
            if rng.random() < 0.3:
                message["name"] = tool.name
            self.messages.append(message)
            results.append(values)
            result_texts.append(text)
        answer = " ".join(_fill(rng.choice(tool.domain.answers), arguments, values)
                          for arguments, values in zip(argument_sets, results, strict=True))
        reasoning = _result_reasoning(strength, tool, results, rng)
        self.add_assistant(_assistant(answer, reasoning if keep_reasoning else None), keep_reasoning)
        answer_values = [atem_text(v) for values in results for v in values]
        return TurnExpectation("call", call_pairs, result_texts, answer_values)

    def plain_turn(self, strength: str, keep_reasoning: bool) -> TurnExpectation:
        rng = self.rng
        kind = rng.choice(("greeting", "thanks", "capabilities", "echo"))
        if kind == "greeting":
            request = rng.choice(("Hi!", "Hello there", "Good morning!", "hey", "Hello, who are you?", "Hi, how are "
                                  "you?"))
            if "who" in request:
                answer = "I'm Glimmer, a small demo assistant. How can I help?"
            else:
                answer = rng.choice(("Hello! How can I help you today?", "Hi! What can I do for you?"))
            situation = ("A greeting.", "The user greets me.", "The user greets me.")
            conclusion = "No tool is needed; reply briefly and offer help."
        elif kind == "thanks":
            request = rng.choice(("Thanks!", "thank you", "Great, thanks.", "Perfect, thank you!"))
            answer = rng.choice(("You're welcome!", "Glad I could help."))
            situation = ("Thanks.", "The user thanks me.", "The user thanks me.")
            conclusion = "Reply politely in a few words."
        elif kind == "capabilities":
            request = rng.choice(("What can you do?", "Which tools do you have?", "What tools are available?",
                                  "List your tools."))
            if self.tools:
                answer = "I can use these tools: " + "; ".join(
                    f"{t.name} ({self.descriptions[t.name].rstrip('.')})" for t in self.tools) + "."
            else:
                answer = "I have no tools in this conversation, so I can only chat."
            situation = ("List the tools.", "The user asks what I can do.", "The user asks what I can do.")
            conclusion = "I list the declared tools with what they do."
        else:
            said = POOLS["text"](rng)
            request = rng.choice((f"Repeat after me: {said}", f'Say "{said}"', f"Please echo this: {said}"))
            answer = said
            situation = ("Repeat it.", "The user wants the text repeated.", f'The user wants me to repeat "{said}".')
            conclusion = "I answer with exactly that."
        self.messages.append({"role": "user", "content": request})
        reasoning = _no_call_reasoning(strength, self.walk(None), situation, conclusion)
        self.add_assistant(_assistant(answer, reasoning if keep_reasoning else None), keep_reasoning)
        return TurnExpectation("plain")

    def refusal_turn(self, strength: str, keep_reasoning: bool) -> TurnExpectation:
        rng = self.rng
        declared = {t.domain.key for t in self.tools}
        missing = [d for d in DOMAINS if d.key not in declared
                   and not any(frozenset((d.key, k)) in RELATED for k in declared)]
        domain = rng.choice(missing)
        ghost = DeclaredTool(domain, "", {s.id: s.keys[0] for s in domain.slots}, list(domain.slots))
        arguments = _sample_arguments(ghost, rng, with_optional=False)
        intent = _fill(domain.intent, arguments)
        no_tools = "I have no tools in this conversation" if not self.tools else "none of my tools does that"
        if rng.random() < 0.35:
            taken = {t.name for t in self.tools}
            fake = draw_tool_name(domain, rng, held_out=self.held_out, taken=taken)
            request = rng.choice((f"Use the {fake} tool to get {intent}.", f"Call {fake} for {intent}.",
                                  f"Run {fake}: I need {intent}."))
            answer = f"There is no tool named {fake} here, so I can't {domain.ability} for you."
            situation = (f"The user asks for {fake}.", f"The user asks for {fake}.",
                         f"The user asks me to call {fake} for {intent}.")
            conclusion = f"{fake} is not one of the declared tools, so I cannot."
        else:
            request = _fill(rng.choice(domain.requests), arguments)
            answer = f"Sorry, I can't {domain.ability} here: {no_tools}."
            situation = (f"The user wants {intent}.",) * 3
            conclusion = f"No declared tool can {domain.ability}, so I say so."
        self.messages.append({"role": "user", "content": request})
        reasoning = _no_call_reasoning(strength, self.walk(None), situation, conclusion)
        self.add_assistant(_assistant(answer, reasoning if keep_reasoning else None), keep_reasoning)
        return TurnExpectation("refusal")


def _assistant(content: str | None, reasoning: str | None, tool_calls: list[dict] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _turn_kind(builder: _Builder, rng: random.Random, forced: str | None) -> str:
    if forced is not None:
        return forced
    if not builder.tools:
        return rng.choices(("plain", "refusal"), weights=(55, 45))[0]
    can_pair = any(t.domain.pair_requests for t in builder.tools)
    return rng.choices(("call", "pair", "plain", "refusal"), weights=(62, 7 if can_pair else 0, 13, 18))[0]


def make_conversation(rng: random.Random, *, held_out: bool = False, last_kind: str | None = None) -> Conversation:
    """One conversation. held_out: declare only held-out tool names (evaluation). last_kind forces the kind of
    the last turn ("call", "pair", "plain" or "refusal"); a call needs tools, so tools are then declared."""
    builder = _Builder(rng, held_out=held_out)
    while True:
        builder.declare_tools()
        needs_pair = last_kind == "pair"
        if last_kind in (None, "plain", "refusal") or (builder.tools and (
                not needs_pair or any(t.domain.pair_requests for t in builder.tools))):
            break
        builder.tools.clear()
    strength = rng.choices((None, *STRENGTHS), weights=(25, 15, 18, 30, 12))[0]
    effective = strength or "high"
    template_kwargs = {"current_date": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"}
    if rng.random() < 0.25:
        system = rng.choice(SYSTEM_PROMPTS)
        if rng.random() < 0.15:
            effective = rng.choice(STRENGTHS)
            system += f" Reasoning {rng.choice(('strength', 'effort'))}: {effective}."
        builder.messages.append({"role": "system", "content": system})
    turns = rng.choices((1, 2, 3), weights=(60, 30, 10))[0]
    expectation = TurnExpectation("plain")
    last_user_index = 0
    for turn in range(turns):
        last = turn == turns - 1
        kind = _turn_kind(builder, rng, last_kind if last else None)
        keep_reasoning = last or rng.random() < 0.75
        last_user_index = len(builder.messages)
        if kind in ("call", "pair"):
            expectation = builder.call_turn(effective, keep_reasoning, pair=kind == "pair")
        elif kind == "plain":
            expectation = builder.plain_turn(effective, keep_reasoning)
        else:
            expectation = builder.refusal_turn(effective, keep_reasoning)
    return Conversation(builder.messages, builder.openai_tools(), strength, template_kwargs, builder.trained,
                        expectation, last_user_index)

