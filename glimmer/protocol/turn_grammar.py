"""The grammar of a constrained turn: channel structure, ATEM calls typed by their tools, a constrained answer.

Written in llguidance's dialect of Lark (special tokens as `<|start|>`, `%json {schema}` for a JSON value,
`@name` for a nested grammar, `rule[max_tokens=N]` for a bounded lexeme) and returned as llguidance's top-level
grammar object. Pure data: the engine compiles it against the tokenizer (engine/grammar.py).

A constrained turn reads (protocol.md §3; the prompt ends with `<|start|>assistant`, so the first header is bare):

    turn     := {reasoning <|eom|> <|start|>assistant} (answer | calls)
    reasoning := " to=self" <|message|> TEXT
    answer   := [" to=user"] <|message|> BODY <|eot|>                    (P-REQ-6: the gate is the answer's header)
    calls    := call {<|eom|> <|start|>assistant {reasoning <|eom|> <|start|>assistant} call} <|eot|>
    call     := " to=NAME" <|message|> <atem:function_calls> invoke+ </atem:function_calls>  (P-REQ-5)

Reasoning may take several messages where a call may follow (§3.1, P-REQ-5: `self` messages, then the call). With no
tools to call it is one message, after which the answer's header is forced (P-REQ-6); under a thinking budget, one
message before the answer or the first call.

BODY is the requested answer grammar (a JSON schema, a regex, …) or free text; after it only `<|eot|>` may follow.
An invoke holds exactly the tool's declared parameters (required ones always, optional ones in declaration
order), each value shaped so that value typing (P-VAL-1, P-VAL-2) reads it back as a value of its schema: a
parameter that admits strings takes raw text (an enum's members verbatim, `minLength`/`maxLength`, `pattern` and
`format` honoured), any other takes
JSON of its schema (keywords the grammar engine does not implement ignored, unless the tool is `strict`). Free
text never holds `<|` (a framing marker spelled in text would be read as framing, P-CHAN-6); a raw value holds no
`<|` either and ends at its first `</atem:parameter>`, but may hold other closing tags (`</b>`, P-ATEM-2).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from glimmer.errors import RequestError
from glimmer.protocol.atem import BLOCK_CLOSE, BLOCK_OPEN, INVOKE_CLOSE, INVOKE_OPEN, PARAMETER_CLOSE, PARAMETER_OPEN
from glimmer.protocol.schema_bounds import without_references_to_empty
from glimmer.protocol.string_patterns import FORMATS, UnsupportedPattern, search_regex
from glimmer.protocol.tokens import EOM, EOT, MESSAGE, START
from glimmer.protocol.value_typing import allowed_types, object_shape, resolve_local_reference

ANSWER_GRAMMAR = "answer"
"""Name under which the answer's grammar is nested in a turn grammar (referenced as `@answer`)."""

ANSWER_HEADER = "answer_header"
"""Name of the capture a turn grammar's matcher records once the answer's header is complete (its `<|message|>`
read): from then on the answer's own grammar runs, whose tokens the engine guards (engine/grammar.py)."""

REASONING_RECIPIENT = "self"
ANSWER_RECIPIENT = "user"

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How constrained JSON is laid out: as `json.dumps` and the template's `tojson` write it, with no free whitespace
(a model that may add whitespace at will can loop on it)."""

# Text without `<|` (no framing marker can be spelled): every run of `<` is followed by a character that is
# neither `<` nor `|`, and the text does not end in `<`.
_FREE_TEXT = r"([^<]|<+[^<|])*"
# A raw parameter value and its closer as one lexeme (a terminal: llguidance intersects and negates terminals only),
# so the value cannot swallow the closer: any text up to the first `</atem:parameter>`, HTML's `</b>` included, and
# no `<|`. `{length}` is the value's length in characters as a regex bound.
_RAW_VALUE_AND_CLOSER = r"/(.|\n){length}<\/atem:parameter>/ & ~/(.|\n)*(<\|(.|\n)*|<\/atem:parameter>(.|\n)+)/"
# The largest length bound the grammar engine can intersect within its default lexer fuel (a bound of 3,000 is
# refused as "fuel exhausted"); a longer bound takes `_BOUNDED_RAW_VALUE_WITHOUT_TAGS`: no `<` in the value at all.
RAW_VALUE_TAG_BOUND = 2048
_BOUNDED_RAW_VALUE_WITHOUT_TAGS = r"/[^<]{length}<\/atem:parameter>/"


def laid_out_schema(schema: Mapping[str, Any], *, strict: bool) -> dict[str, Any]:
    """`schema` with the grammar engine's options (`x-guidance`): JSON laid out as `JSON_LAYOUT` and, unless `strict`,
    keywords the engine does not implement (`uniqueItems`, `if`, ...) ignored rather than refused (llguidance's
    `lenient`), as OpenAI's non-strict schemas are hints. Options the schema sets itself win (the grammar refuses
    those that would change the layout: `grammar._refuse_a_layout_of_its_own`). A `$ref` to a schema
    no value meets is written `false` (`without_references_to_empty`), which the engine takes where another value
    may be written (an `anyOf` branch, an optional property)."""
    custom = schema.get("x-guidance")
    options = {**JSON_LAYOUT, "lenient": not strict, **(custom if isinstance(custom, Mapping) else {})}
    return {**_held_by_the_engine(without_references_to_empty(schema)), "x-guidance": options}


_LEAP_AWARE_DATE = ("^(?:[0-9]{4}-(?:0[13-9]|1[0-2])|[0-9]{4}-02-(?:0[1-9]|1[0-9]|2[0-8])|"
                    "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)")
"""The date an RFC 3339 `date` or `date-time` begins with, February 29th in leap years only (RFC 3339 §5.7): the
grammar engine's own `format` regexes take it in every year (`2023-02-29`)."""
_FORMAT_LIMITS: dict[str, dict[str, Any]] = {
    "date": {"pattern": _LEAP_AWARE_DATE},
    "date-time": {"pattern": _LEAP_AWARE_DATE},
    "hostname": {"maxLength": 253},
}
"""What a `format` asks that the grammar engine's own `format` regexes do not hold, as a schema required beside it:
February 29th in leap years only, and a host name of at most 253 characters (RFC 1034 §3.1; the engine bounds each
label to 63 but not the name, and wrote 700). A raw ATEM value's regexes (`string_patterns.FORMATS`) hold both."""
_VALUE_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
"""Keywords whose values are JSON values, not schemas: left as they are."""


def _held_by_the_engine(schema: Any) -> Any:
    """`schema` as the grammar engine holds it, at every level: `_FORMAT_LIMITS` required (through `allOf`) beside
    every `format` they name, and a `number` whose `multipleOf` is an integer written as an `integer`
    (`_as_integer`). The maps of subschemas (`properties`, `$defs`, ...) are walked as schemas too: a name maps to a
    schema, never to the string `date`."""
    if isinstance(schema, list):
        return [_held_by_the_engine(member) for member in schema]
    if not isinstance(schema, Mapping):
        return schema
    kept = {key: value if key in _VALUE_KEYWORDS else _held_by_the_engine(value) for key, value in schema.items()}
    limit = _FORMAT_LIMITS.get(schema["format"]) if isinstance(schema.get("format"), str) else None
    if limit is not None and isinstance(kept.get("allOf", []), list):
        kept["allOf"] = [*kept.get("allOf", []), limit]
    types = kept.get("type")
    numbers = types == "number" or isinstance(types, list) and "number" in types
    if numbers and _is_integer_valued(kept.get("multipleOf")):
        kept["type"] = _as_integer(types)
    return kept


def _as_integer(types: str | list[Any]) -> str | list[Any]:
    """The `type` of a number schema whose `multipleOf` is an integer, with `number` as `integer`: the values are the
    same (a multiple of an integer is one), and the grammar engine, which writes a `number` multiple as an integer
    part and a fraction it lets be left out, panicked ("assertion failed: !s.has_pending_lexeme_bytes()") where such
    a number ended a chat answer before its `<|eot|>`: 11 of 12 answers of `multipleOf: 5` failed."""
    if types == "number":
        return "integer"
    return list(dict.fromkeys("integer" if name == "number" else name for name in types))


def _is_integer_valued(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float)
            and math.isfinite(value) and value.is_integer()) and value > 0


MAX_THINKING_TOKEN_BUDGET = 2**64 - 1
"""The largest thinking budget a turn's grammar can state: llguidance reads a Lark `max_tokens=` count as an unsigned
64-bit integer."""


@dataclass(frozen=True)
class TurnConstraint:
    """What a turn must look like.

    answer: the llguidance grammar object (`{"json_schema": ...}`, `{"lark_grammar": ...}`) of the answer body,
        or None for free text.
    call_tools: the tools the turn may call (normalized, `{"type": "function", "function": {...}}`); empty: none.
    must_call: the turn ends with calls and has no answer (`tool_choice` required or named, P-REQ-4).
    parallel_calls: more than one call may be made (`parallel_tool_calls`).
    thinking_token_budget: None: reasoning is free (as many messages as the module docstring says); N: one reasoning
        message of at most N tokens, before the answer or the first call (0: none).
    """

    answer: Mapping[str, Any] | None = None
    call_tools: Sequence[Mapping[str, Any]] = ()
    must_call: bool = False
    parallel_calls: bool = True
    thinking_token_budget: int | None = None


def turn_grammar(constraint: TurnConstraint) -> dict[str, Any]:
    """The llguidance top-level grammar of a turn under `constraint`."""
    rules = _GrammarRules()
    budget = constraint.thinking_token_budget
    reasoning = None
    if budget != 0:
        think = "think"
        rules.add(f"{think}[max_tokens={budget}]" if budget is not None else think, f"/{_FREE_TEXT}/")
        reasoning = rules.add("reasoning", f"{lark_string(' to=' + REASONING_RECIPIENT)} {MESSAGE} {think} {EOM} "
                                           f"{START} {lark_string('assistant')}")
    finals = []
    if not constraint.must_call:
        body = f"@{ANSWER_GRAMMAR}" if constraint.answer is not None else f"/{_FREE_TEXT}/"
        header = rules.add(f"{ANSWER_HEADER}[capture]", f"{lark_string(' to=' + ANSWER_RECIPIENT)}? {MESSAGE}")
        finals.append(rules.add("answer", f"{header} {body} {EOT}"))
    if constraint.call_tools:
        finals.append(_calls(rules, constraint, reasoning if budget is None else None))
    if not finals:
        raise ValueError("a turn that must call needs tools to call")
    rules.add("final", " | ".join(finals))
    thoughts = f"{reasoning}*" if budget is None and constraint.call_tools else f"{reasoning}?"
    rules.add("start", f"{thoughts} final" if reasoning else "final", first=True)
    grammars: list[dict[str, Any]] = [{"lark_grammar": rules.text()}]
    if constraint.answer is not None and not constraint.must_call:
        grammars.append({**constraint.answer, "name": ANSWER_GRAMMAR})
    return {"grammars": grammars}


def _calls(rules: _GrammarRules, constraint: TurnConstraint, reasoning_between: str | None) -> str:
    call_rules = [_call(rules, index, tool, constraint.parallel_calls)
                  for index, tool in enumerate(constraint.call_tools)]
    call = rules.add("call", " | ".join(call_rules))
    if not constraint.parallel_calls:
        return rules.add("calls", f"{call} {EOT}")
    next_header = f"{EOM} {START} {lark_string('assistant')}"
    between = f"{reasoning_between}*" if reasoning_between else ""
    return rules.add("calls", f"{call} ({next_header} {between} {call})* {EOT}")


def _call(rules: _GrammarRules, index: int, tool: Mapping[str, Any], parallel: bool) -> str:
    function = tool["function"]
    name = function["name"]
    strict = function.get("strict") is True  # OpenAI's strict mode: the whole schema holds, or it is refused
    parameters = function.get("parameters")
    root = parameters if isinstance(parameters, Mapping) else {}
    properties, required = object_shape(root)
    for key in sorted(required - set(properties)):  # required but not described: a value of any type
        properties[key] = {}
    items = []
    for position, (key, schema) in enumerate(properties.items()):
        if '"' in key:  # an ATEM name ends at the first `"` (P-ATEM-1): such a key cannot be written
            if key in required:
                raise RequestError(f"tools: parameter {key!r} of {name!r} is required, but a name holding '\"' cannot "
                                   "be written in an ATEM tag (P-ATEM-1); rename it", param="tools")
            continue
        value = _value(rules, schema, root, strict)
        rule = rules.add(f"parameter_{index}_{position}",
                         f"{lark_string(PARAMETER_OPEN + key + chr(34) + '>')} {value} {lark_string(chr(10))}")
        items.append(rule if key in required else f"{rule}?")
    invoke = rules.add(f"invoke_{index}", f"{lark_string(INVOKE_OPEN + name + chr(34) + '>' + chr(10))} "
                                          f"{' '.join(items)} {lark_string(INVOKE_CLOSE + chr(10))}")
    invokes = f"{invoke}+" if parallel else invoke
    return rules.add(f"call_{index}", f"{lark_string(' to=' + name)} {MESSAGE} {lark_string(BLOCK_OPEN + chr(10))} "
                                      f"{invokes} {lark_string(BLOCK_CLOSE)}")


def _value(rules: _GrammarRules, schema: Any, root: Mapping[str, Any], strict: bool) -> str:
    """A parameter value followed by its closer, shaped by the parameter's schema (P-VAL-1..3); `strict`: the
    tool's, whose JSON values follow every keyword of their schema."""
    resolved = _resolved(schema, root)
    types = allowed_types(schema, root)
    if types and "string" not in types:
        return (f"%json {json.dumps(_standalone(resolved, root, strict), ensure_ascii=False)} "
                f"{lark_string(PARAMETER_CLOSE)}")
    shapes = _raw_shapes(schema, root, 0, strict)
    if not shapes:
        raise RequestError("tools: a parameter's schema admits no value that can be written as raw text (its string "
                           "members hold `</atem:parameter>` or `<|`, which end or break an ATEM value)", param="tools")
    # the text null is a member apart from any pattern: `pattern` and `format` hold strings only
    literals = sorted({text for shape in shapes if shape.literals is not None for text in shape.literals
                       if not shape.patterns or text == "null"})
    matched = sorted({(shape.literals - {"null"}, shape.patterns) for shape in shapes
                      if shape.literals is not None and shape.patterns and shape.literals - {"null"}},
                     key=lambda choice: (sorted(choice[0]), sorted(choice[1])))
    bounds = sorted({(shape.low, shape.high, shape.patterns) for shape in shapes if shape.literals is None},
                    key=lambda b: (b[0], -1 if b[1] is None else b[1], sorted(b[2])))
    if (0, None, frozenset()) in bounds:  # any text: the other shapes add nothing it does not hold
        return _raw_value_terminal(rules, 0, None, frozenset())
    pieces = ([f"({' | '.join(lark_string(text) for text in literals)}) {lark_string(PARAMETER_CLOSE)}"]
              if literals else [])
    pieces += [_raw_value_terminal(rules, low, high, patterns) for low, high, patterns in bounds]
    pieces += [_raw_choice_terminal(rules, texts, patterns) for texts, patterns in matched]
    return pieces[0] if len(pieces) == 1 else f"({' | '.join(pieces)})"


def patterned_raw_values(tool: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """The name and a Lark grammar of its value (`start:` the value and its closer, as a call writes it) of each
    parameter of `tool` (normalized) written as raw text held to a `pattern` or `format`. Such a value's terminal is the
    pattern intersected with what a raw value may hold (no `<|`, no closer inside); the grammar engine finds that
    intersection empty only while generating, so the compiler checks these grammars before a turn uses them."""
    function = tool["function"]
    strict = function.get("strict") is True
    parameters = function.get("parameters")
    root = parameters if isinstance(parameters, Mapping) else {}
    properties, _ = object_shape(root)
    for key, schema in properties.items():
        types = allowed_types(schema, root)
        if '"' in key or types and "string" not in types or not any(
                shape.patterns for shape in _raw_shapes(schema, root, 0, strict)):
            continue
        rules = _GrammarRules()
        rules.add("start", _value(rules, schema, root, strict), first=True)
        yield key, rules.text()


_CLOSER_REGEX = r"<\/atem:parameter>"


def _raw_value_terminal(rules: _GrammarRules, low: int, high: int | None, patterns: frozenset[str]) -> str:
    """The terminal of a raw value of `low`..`high` characters (None: no bound) that matches each of `patterns`
    whole, and its closer."""
    bound = "" if high is None else str(high)
    pattern = _RAW_VALUE_AND_CLOSER if max(low, high or 0) <= RAW_VALUE_TAG_BOUND else _BOUNDED_RAW_VALUE_WITHOUT_TAGS
    body = pattern.replace("{length}", f"{{{low},{bound}}}") + _matching(patterns)
    return rules.add_once(f"RAW_VALUE_{low}_{bound or 'ANY'}{_digest(patterns)}", body)


def _raw_choice_terminal(rules: _GrammarRules, texts: frozenset[str], patterns: frozenset[str]) -> str:
    """The terminal of one of `texts` (enum members) that matches each of `patterns` whole, and its closer."""
    choice = " | ".join(lark_string(text) for text in sorted(texts))
    return rules.add_once(f"RAW_CHOICE{_digest(patterns, *sorted(texts))}",
                          f"({choice}) {lark_string(PARAMETER_CLOSE)}{_matching(patterns)}")


def _matching(patterns: frozenset[str]) -> str:
    return "".join(f" & /(?:{regex}){_CLOSER_REGEX}/" for regex in sorted(patterns))


def _digest(patterns: frozenset[str], *texts: str) -> str:
    """A suffix naming a terminal apart by its patterns (and texts): empty without them."""
    if not patterns and not texts:
        return ""
    return "_" + hashlib.sha256(json.dumps([sorted(patterns), texts]).encode()).hexdigest()[:16].upper()


@dataclass(frozen=True)
class _RawShape:
    """Raw text a string-admitting parameter may hold: one of `literals` (None: any text of `low`..`high`
    characters without `<`; (0, None): any text a raw value may hold), matching each of `patterns` whole
    (string_patterns' regexes of the schema's `pattern` and `format`; the literal null exempt)."""

    literals: frozenset[str] | None = None
    low: int = 0
    high: int | None = None
    patterns: frozenset[str] = frozenset()


_ANY_TEXT = _RawShape()
_MAX_SHAPE_DEPTH = 16


def _raw_shapes(schema: Any, root: Mapping[str, Any], depth: int, strict: bool) -> list[_RawShape]:
    """The raw texts `schema` admits, as alternatives (P-VAL-1: raw text reads back as the string itself, and the
    exact text null as null where null is allowed). Follows `$ref`, `anyOf`/`oneOf` (the union of the members
    that admit strings or null) and `allOf` (the intersection); an empty list admits nothing writable. `strict`: a
    `pattern` or `format` that cannot be held is refused, not ignored (`_string_patterns`)."""
    resolved = _resolved(schema, root)
    if depth > _MAX_SHAPE_DEPTH or not resolved:
        return [_ANY_TEXT]
    own_types = allowed_types({k: v for k, v in resolved.items() if k not in ("anyOf", "oneOf", "allOf")}, root)
    shapes: list[_RawShape] = []
    if "enum" in resolved or "const" in resolved:
        members = resolved.get("enum") if "enum" in resolved else [resolved["const"]]
        members = members if isinstance(members, list) else []
        spelled = frozenset(_spelled_members(members))
        shapes = [_RawShape(spelled, patterns=_string_patterns(resolved, strict))] if spelled else []
    elif not own_types or "string" in own_types:
        shapes = [_RawShape(None, _count(resolved.get("minLength"), 0), _count(resolved.get("maxLength"), None),
                            _string_patterns(resolved, strict))]
        if "null" in own_types:
            shapes.append(_RawShape(frozenset({"null"})))
    elif "null" in own_types:
        shapes = [_RawShape(frozenset({"null"}))]
    for combinator in ("anyOf", "oneOf"):
        members = resolved.get(combinator)
        if isinstance(members, list) and members:
            union = [shape for member in members if _admits_raw(member, root)
                     for shape in _raw_shapes(member, root, depth + 1, strict)]
            shapes = [joint for a in shapes for b in union if (joint := _both(a, b)) is not None]
    every = resolved.get("allOf")
    if isinstance(every, list):
        for member in every:
            member_shapes = _raw_shapes(member, root, depth + 1, strict)
            shapes = [joint for a in shapes for b in member_shapes if (joint := _both(a, b)) is not None]
    return shapes


def _string_patterns(schema: Mapping[str, Any], strict: bool) -> frozenset[str]:
    """The whole-value regexes of `schema`'s own `pattern` and `format` (string_patterns). The grammar engine has
    already taken the pattern's syntax and the format's name when the tool's schema was checked; a pattern anchored
    inside a group cannot be held in a raw value: refused naming it when `strict`, otherwise left a hint, as a
    non-strict schema's keywords the engine does not implement are."""
    regexes: list[str] = []
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            regexes.append(search_regex(pattern))
        except UnsupportedPattern as exc:
            if strict:
                raise RequestError(f"tools: {exc}", param="tools") from None
    name = schema.get("format")
    if isinstance(name, str):
        regexes += FORMATS.get(name, ())
    return frozenset(regexes)


def _spelled_members(members: list[Any]) -> list[str]:
    """The raw values that read back as enum members (P-VAL-1: a parameter admitting strings reads raw text as
    the string, and the exact text null as null when null is a member): string members without `<|` or the value's
    closer `</atem:parameter>`, and `null`. Other members (a number beside strings) cannot be written so that they
    read back as themselves.
    """
    spelled = [m for m in members if isinstance(m, str) and PARAMETER_CLOSE not in m and "<|" not in m]
    if None in members:
        spelled.append("null")
    return list(dict.fromkeys(spelled))


def _admits_raw(schema: Any, root: Mapping[str, Any]) -> bool:
    types = allowed_types(schema, root)
    return not types or bool(types & {"string", "null"})


def _both(a: _RawShape, b: _RawShape) -> _RawShape | None:
    """Texts both shapes admit, or None."""
    low = max(a.low, b.low)
    high = a.high if b.high is None else b.high if a.high is None else min(a.high, b.high)
    if a.literals is not None or b.literals is not None:
        pool = a.literals if b.literals is None else b.literals if a.literals is None else a.literals & b.literals
        kept = frozenset(text for text in pool if text == "null" or (low <= len(text) and (high is None or
                                                                                        len(text) <= high)))
        return _RawShape(kept, patterns=a.patterns | b.patterns) if kept else None
    return _RawShape(None, low, high, a.patterns | b.patterns) if high is None or low <= high else None


def _resolved(schema: Any, root: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(schema, Mapping):
        return {}
    reference = schema.get("$ref")
    if isinstance(reference, str):
        target = resolve_local_reference(reference, root)
        if isinstance(target, Mapping):
            return {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


_TOOL_SCHEMA = "glimmer_tool_parameters"
"""The `$defs` entry under which a parameter's standalone schema keeps the tool's whole `parameters` schema."""


def _standalone(schema: Mapping[str, Any], root: Mapping[str, Any], strict: bool) -> dict[str, Any]:
    """The parameter's schema as a document of its own. Its local `$ref`s name schemas of the tool's `parameters`
    (`#` is the whole of it, `#/$defs/Item`, `#/properties/count`: zod-to-json-schema writes such a pointer for a
    schema used twice), so they are rewritten to point into a copy of that schema kept under `$defs`, whose own
    `$ref`s are rewritten alike."""
    document = _rerooted(schema)
    if document != schema:
        document = {**document, "$defs": {**(document.get("$defs") or {}), _TOOL_SCHEMA: _rerooted(root)}}
    return laid_out_schema(document, strict=strict)


def _rerooted(schema: Any) -> Any:
    """`schema` with each local `$ref` (`#...`) pointing into the `$defs` entry `_TOOL_SCHEMA` of the document; the
    values of `enum`, `const` and the other value keywords are left as they are."""
    if isinstance(schema, list):
        return [_rerooted(member) for member in schema]
    if not isinstance(schema, Mapping):
        return schema
    kept = {key: value if key in _VALUE_KEYWORDS else _rerooted(value) for key, value in schema.items()}
    reference = schema.get("$ref")
    if isinstance(reference, str) and reference.startswith("#"):
        kept["$ref"] = f"#/$defs/{_TOOL_SCHEMA}{reference[1:]}"
    return kept


def _count(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def lark_string(text: str) -> str:
    """A Lark string literal: JSON escapes, and DEL's (U+007F), which json.dumps leaves raw and the grammar engine's
    lexer refuses in a literal."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


class _GrammarRules:
    """Lark rules in order, the start rule first."""

    def __init__(self) -> None:
        self._rules: list[str] = []

    def add(self, head: str, body: str, *, first: bool = False) -> str:
        rule = f"{head}: {body}"
        if first:
            self._rules.insert(0, rule)
        else:
            self._rules.append(rule)
        return head.split("[", 1)[0]

    def add_once(self, head: str, body: str) -> str:
        """`add`, unless a rule of that head was added before (a terminal that several parameters share)."""
        if not any(rule.startswith(head + ":") for rule in self._rules):
            self.add(head, body)
        return head

    def text(self) -> str:
        return "\n".join(self._rules) + "\n"


def shortest_kept_calls(tool: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The shortest outputs of a turn grammar's call of `tool` (`_call`) in which the call is kept (P-ATEM-5), each as
    pieces, a text or the `<|message|>` special token: its header, then the block and invoke openers and what
    materializes the call (P-ATEM-4), one complete parameter or the invoke's close. The grammar writes the parameters
    in declaration order, required ones always: the first is any of them up to the first required one, or, with
    none required, `</atem:invoke>` closes it empty. Values are left empty (none is shorter). Every output that holds
    a call of the tool (P-REQ-4) spells one of these and more, so their fewest tokens are the fewest it takes."""
    function = tool["function"]
    name = function["name"]
    parameters = function.get("parameters")
    properties, required = object_shape(parameters if isinstance(parameters, Mapping) else {})
    keys = [*properties, *sorted(required - set(properties))]  # `_call`'s order
    first_required = next((n for n, key in enumerate(keys) if key in required), None)
    firsts = [f'{PARAMETER_OPEN}{key}">{PARAMETER_CLOSE}' for key in keys[:None if first_required is None
                                                                             else first_required + 1] if '"' not in key]
    if first_required is None:
        firsts.append(INVOKE_CLOSE)
    opener = f'{BLOCK_OPEN}\n{INVOKE_OPEN}{name}">\n'
    return [(f" to={name}", MESSAGE, opener + first) for first in firsts]
