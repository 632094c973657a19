"""A seeded fuzz of structured outputs at the grammar's masks: random JSON schemas (nested objects and arrays,
required and optional keys, `additionalProperties`, enums, consts, `anyOf`, `$defs`/`$ref`, length, item and numeric
bounds, `multipleOf`, patterns, formats, nullable types, empty and boolean schemas), as a completion's constraint, a
chat turn's answer and a strict tool's forced call, walked token by token through the tiny tokenizer's masks (each
step a random token the mask allows, the stop token at random where it may end). Every text a walk completes must
parse, and validate against its schema with jsonschema; a schema the engine cannot hold must be refused naming the
field.

The walk reaches what a model rarely writes (1,000-character strings, numbers of 60 digits, every format's corner),
which is where the grammar engine's own regexes went wrong (`format: hostname` of 700 characters), where a call's
grammar dropped its root's keywords (an `anyOf` of required keys, a property declared in two `allOf` members), and
where the engine panicked on a chat answer's number before its `<|eot|>`.
"""

from __future__ import annotations

import decimal
import json
import random
import re
from typing import Any

import jsonschema
import pytest
from jsonschema import validators

from glimmer.engine.grammar import GrammarCompiler, GrammarMasks, chat_answer_grammar, check_tool_parameters
from glimmer.engine.sampler import unpack_token_bitmask
from glimmer.engine.sampling_params import StructuredOutputsParams
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import RequestError
from glimmer.protocol import normalize_tools
from glimmer.protocol.output_parser import parse_output
from glimmer.protocol.turn_grammar import TurnConstraint

VOCAB = 512
PATTERNS = [r"^[a-c]{1,3}$", r"^x\d{2}$", r"[0-9]", r"^(ab|cd)+$", r"^\w+$", r"a|b", r"^[^a]$", r"^[A-Z][a-z]*$"]
FORMATS = ["date", "email", "uuid", "ipv4", "ipv6", "hostname", "hostname"]
VALUES = ["a", "", "x\ny", "\"q\"", "é", 1, 2.5, -3, True, False, None, [1, 2], {"k": "v"}]


class Schemas:
    """Random schemas of one seed. `bounded`: every number has a minimum and a maximum. A tool call's values are read
    back into Python values, a number into a double, and one past a double's range (`1e400`, which a walk through an
    unbounded number writes) comes back a string (P-VAL-4), against its schema: not fuzzed here."""

    def __init__(self, seed: int, bounded: bool = False):
        self.rng = random.Random(seed)
        self.defs: dict[str, Any] = {}
        self.bounded = bounded

    def leaf(self) -> dict[str, Any]:
        rng = self.rng
        kind = rng.choice(["string", "string", "string", "integer", "number", "boolean", "null"])
        schema: dict[str, Any] = {"type": kind}
        if kind == "string":
            roll = rng.random()
            if roll < 0.25:
                schema.update(minLength=rng.randint(0, 2), maxLength=rng.randint(2, 8))
            elif roll < 0.45:
                schema["pattern"] = rng.choice(PATTERNS)
            elif roll < 0.9:
                schema["format"] = rng.choice(FORMATS)
        elif kind in ("integer", "number"):
            low = rng.randint(-50, 50)
            if self.bounded or rng.random() < 0.5:
                schema.update(minimum=low, maximum=low + rng.randint(0, 60))
            if "minimum" in schema and rng.random() < 0.4:
                schema["multipleOf"] = rng.choice([2, 5] if kind == "integer" else [0.5, 0.25, 0.1, 3])
            if kind == "number" and rng.random() < 0.3 and "maximum" in schema:
                schema["exclusiveMaximum"] = schema.pop("maximum") + 0.5
        if rng.random() < 0.15:
            schema["type"] = [kind, "null"] if kind != "null" else ["null", "boolean"]
        return schema

    def value(self, depth: int = 0) -> Any:
        rng = self.rng
        roll = rng.random()
        if depth >= 2 or roll < 0.35:
            return self.leaf()
        if roll < 0.55:
            return self.object(depth)
        if roll < 0.7:
            schema = {"type": "array", "items": self.value(depth + 1), "maxItems": rng.randint(0, 3)}
            if rng.random() < 0.3:
                schema.update(prefixItems=[self.value(depth + 1)], minItems=1)
            return schema
        if roll < 0.77:
            return {"enum": [rng.choice(VALUES) for _ in range(rng.randint(1, 3))]}
        if roll < 0.82:
            return {"const": rng.choice(VALUES)}
        if roll < 0.9:
            return {"anyOf": [self.value(depth + 1) for _ in range(rng.randint(1, 3))]}
        if roll < 0.96:
            name = f"d{len(self.defs)}"
            self.defs[name] = self.value(depth + 1)
            return {"$ref": f"#/$defs/{name}"}
        return rng.choice([{}, True])

    def object(self, depth: int) -> dict[str, Any]:
        rng = self.rng
        properties = {f"{rng.choice(['a', 'name', 'x y', 'é'])}{i}": self.value(depth + 1)
                      for i in range(rng.randint(0, 4))}
        schema: dict[str, Any] = {"type": "object", "properties": properties,
                                  "required": [key for key in properties if rng.random() < 0.6]}
        if rng.random() < 0.7:
            schema["additionalProperties"] = False
        return schema

    def with_defs(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {**schema, "$defs": self.defs} if self.defs else schema


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_checker = jsonschema.FormatChecker()


@_checker.checks("hostname")
def _hostname(value: Any) -> bool:  # RFC 1034 §3.1 (jsonschema's own check needs the fqdn package)
    return not isinstance(value, str) or (len(value) <= 253 and re.fullmatch(rf"{_LABEL}(?:\.{_LABEL})*", value))


def _multiple_of(validator, divisor, instance, schema):
    """multipleOf on the decimal text, not on doubles (0.3 is no multiple of 0.1 in binary); the generator gives it
    only to bounded numbers."""
    if validator.is_type(instance, "number") and (decimal.Decimal(str(instance)) / decimal.Decimal(str(divisor))) % 1:
        yield jsonschema.ValidationError(f"{instance} is not a multiple of {divisor}")


_Validator = validators.extend(jsonschema.Draft202012Validator, {"multipleOf": _multiple_of})


def _validate(text: str, schema: dict[str, Any]) -> None:
    as_decimals = json.loads(json.dumps(schema), parse_float=decimal.Decimal)
    try:
        value = json.loads(text, parse_float=decimal.Decimal)
    except decimal.InvalidOperation:  # an exponent past Decimal's (an unbounded number may be 1e9999999999999999999)
        value = json.loads(text)
    _Validator(as_decimals, format_checker=_checker).validate(value)


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint) -> Tokenizer:
    return Tokenizer.from_dir(tiny_checkpoint)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, VOCAB, [tokenizer.require_token_id(token)
                                              for token in ("<|eot|>", "<|end_of_text|>")])


def _walk(controller, rng: random.Random, stops: set[int], steps: int = 400) -> list[int] | None:
    """Token ids of a random walk through `controller`'s masks to a point where the grammar may end (None: it ran past
    `steps`); the controller's failures fail the test."""
    masks = GrammarMasks(VOCAB, 1)
    ids: list[int] = []
    for _ in range(steps):
        if controller.matcher.is_stopped():
            return ids
        allowed = unpack_token_bitmask(masks.fill([controller]), VOCAB)[0].nonzero().flatten().tolist()
        assert controller.failure is None and controller.refusal is None, (controller.failure, controller.refusal)
        ending = [token for token in allowed if token in stops]
        token = rng.choice(ending if ending and rng.random() < 0.5 else allowed)
        if token in stops:
            return ids
        assert controller.matcher.consume_token(token)
        ids.append(token)
    return None


def _stops(tokenizer) -> set[int]:
    return {tokenizer.require_token_id(token) for token in ("<|eot|>", "<|end_of_text|>")}


def _completed_walks(factory, seed: int, tokenizer) -> list[str]:
    """The texts of the walks (three, seeded) through `factory`'s controllers that completed."""
    rng = random.Random(seed)
    walks = (_walk(factory(), rng, _stops(tokenizer)) for _ in range(3))
    return [tokenizer.decode(ids) for ids in walks if ids is not None]


def _valid_walks(tokenizer, param: str, constrain, read) -> int:
    """How many walks through `constrain(schema)`'s controllers completed, for the random schemas of 150 seeds; each
    completed walk's text, as `read` takes the value out of it, validates. A schema refused names `param`."""
    completed = 0
    for seed in range(150):
        schemas = Schemas(seed)
        schema = schemas.with_defs({"anyOf": [schemas.value()]})
        try:
            factory = constrain(schema)
        except RequestError as error:  # an unsatisfiable schema (a required key no value can take, ...)
            assert error.param == param or error.param.startswith(f"{param}.")  # or the field beneath it
            assert str(error).startswith(f"{error.param}: ")
            continue
        for text in _completed_walks(factory, seed, tokenizer):
            _validate(read(text), schema)
            completed += 1
    return completed


@pytest.mark.parametrize("strict", [True, False])
def test_random_schemas_walked_through_the_masks_give_valid_json(compiler, tokenizer, strict):
    completed = _valid_walks(tokenizer, "structured_outputs", lambda schema: compiler.structured_outputs(
        StructuredOutputsParams(json=schema, strict=strict)), lambda text: text)
    assert completed > 350  # most walks end: the schemas bound what they let a walk write


def test_random_schemas_as_chat_answers_walked_through_the_turns_masks_give_valid_answers(compiler, tokenizer):
    """The answer's grammar inside a turn's, ended by `<|eot|>` (a special token, where the grammar engine once
    panicked after a number): every completed walk's answer, as the output parser reads it, validates."""
    def constrain(schema):
        answer = chat_answer_grammar(StructuredOutputsParams(json=schema), "response_format")
        return compiler.turn(TurnConstraint(answer=answer, thinking_token_budget=0))

    completed = _valid_walks(tokenizer, "response_format", constrain, lambda text: parse_output(text).content)
    assert completed > 350


def test_random_strict_tools_forced_calls_walked_through_the_masks_validate(compiler, tokenizer):
    completed = 0
    for seed in range(100):
        schemas = Schemas(seed, bounded=True)
        parameters = schemas.object(0)
        shape = seed % 4
        if shape == 1:  # the same keys declared again by a second member: a call holds to both
            parameters = {"allOf": [parameters, {**schemas.object(0), "properties": {
                key: schemas.leaf() for key in parameters["properties"]}}]}
        elif shape == 2:
            parameters = {"anyOf": [parameters, schemas.object(0)]}
        parameters = schemas.with_defs(parameters)
        if shape == 2:  # a call writes each property as a parameter of its own: no union of objects
            with pytest.raises(RequestError, match="anyOf at the root"):
                normalize_tools([{"name": "f", "strict": True, "parameters": parameters}])
            continue
        try:
            tools = normalize_tools([{"name": "f", "strict": True, "parameters": parameters}],
                                    check_schema=check_tool_parameters)
            factory = compiler.turn(TurnConstraint(call_tools=tools, must_call=True, thinking_token_budget=0))
        except RequestError as error:
            assert error.param in ("tools", "tools[0].parameters") or error.param.startswith("tools[0].parameters.")
            assert str(error).startswith(f"{error.param}: ")
            continue
        for text in _completed_walks(factory, seed, tokenizer):
            calls = parse_output(text, tools).tool_calls
            assert calls
            for call in calls:
                _validate(call.arguments, parameters)
            completed += 1
    assert completed > 80

