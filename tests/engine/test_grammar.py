"""Turn grammars compiled with the tiny tokenizer: which transcripts a constrained turn admits (P-REQ-4..6).

Transcripts are tokenized with the tiny tokenizer, whose special tokens sit at ids unlike the release's (P-TOK-1);
a transcript is admitted when every token is allowed in turn. The last case drives the bitmask fill the engine
uses, so the masks the sampler applies are the ones these tests reason about.
"""

from __future__ import annotations

import json

import pytest
import torch

from glimmer.engine.grammar import (
    GrammarCompiler,
    GrammarController,
    GrammarFailure,
    GrammarMasks,
    answer_grammar,
    chat_answer_grammar,
    check_json_schema,
    check_tool_parameters,
)
from glimmer.engine.sampler import unpack_token_bitmask
from glimmer.engine.sampling_params import StructuredOutputsParams
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import RequestError
from glimmer.protocol import normalize_tools
from glimmer.protocol.output_parser import parse_output
from glimmer.protocol.turn_grammar import TurnConstraint

LOOKUP = normalize_tools([{"name": "lookup", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]},
                   "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
    "required": ["city", "days"],
    "$defs": {"tag": {"type": "string", "maxLength": 3}}}}])[0]
CLOCK = normalize_tools([{"name": "clock", "parameters": {"type": "object", "properties": {}}}])[0]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
JSON_ANSWER = answer_grammar(StructuredOutputsParams(json=SCHEMA))


def call(name: str, *parameters: tuple[str, str]) -> str:
    body = "".join(f'<atem:parameter name="{key}">{value}</atem:parameter>\n' for key, value in parameters)
    return (f' to={name}<|message|><atem:function_calls>\n<atem:invoke name="{name}">\n{body}</atem:invoke>\n'
            "</atem:function_calls>")


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint) -> Tokenizer:
    return Tokenizer.from_dir(tiny_checkpoint)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    stops = [tokenizer.require_token_id(token) for token in ("<|eot|>", "<|end_of_text|>")]
    return GrammarCompiler(tokenizer, 512, stops)


def allowed_ids(matcher) -> list[int]:
    bitmask = GrammarMasks(512, 1).fill([_controller(matcher)])
    return unpack_token_bitmask(bitmask, 512)[0].nonzero().flatten().tolist()


def admits(compiler, tokenizer, constraint: TurnConstraint, text: str) -> bool:
    matcher = compiler.turn(constraint)().matcher
    ids = tokenizer.encode(text)
    eot = tokenizer.require_token_id("<|eot|>")
    if ids[-1] == eot:  # llguidance takes the stop token as the end, not as a token to consume: ask the mask
        return matcher.try_consume_tokens(ids[:-1]) == len(ids) - 1 and eot in allowed_ids(matcher)
    return matcher.try_consume_tokens(ids) == len(ids)


def test_a_json_answer_may_follow_free_reasoning_and_only_the_end_of_turn_may_follow_it(compiler, tokenizer):
    constraint = TurnConstraint(answer=JSON_ANSWER)
    for text in ('<|message|>{"ok": true}<|eot|>',  # bare first header (P-REQ-6)
                 ' to=user<|message|>{"ok": false}<|eot|>',
                 ' to=self<|message|>Think {"ok": 3} < 4.<|eom|>'
                 '<|start|>assistant to=user<|message|>{"ok": true}<|eot|>'):
        assert admits(compiler, tokenizer, constraint, text), text
    for text in (' to=user<|message|>{"ok": 1}<|eot|>',  # not the schema
                 ' to=user<|message|>{"ok": true} and more',  # after the JSON only <|eot|>
                 ' to=user<|message|>{"ok": true}<|eom|>',
                 ' to=self<|message|>a<|eot|>',  # reasoning ends with <|eom|>, not the turn
                 ' to=self<|message|>a <|eom|> spelled<|eom|>',  # no framing marker spelled in text
                 ' to=lookup<|message|>'):  # no tools to call
        assert not admits(compiler, tokenizer, constraint, text), text


def test_with_tools_declared_a_call_is_free_of_the_answer_schema(compiler, tokenizer):
    constraint = TurnConstraint(answer=JSON_ANSWER, call_tools=[LOOKUP, CLOCK])
    assert admits(compiler, tokenizer, constraint, call("clock") + "<|eot|>")
    assert admits(compiler, tokenizer, constraint, '<|message|>{"ok": true}<|eot|>')


def test_a_forced_call_has_exactly_the_tools_parameters_typed_by_their_schemas(compiler, tokenizer):
    constraint = TurnConstraint(call_tools=[LOOKUP], must_call=True)
    good = [
        call("lookup", ("city", "Oslo"), ("days", "3")) + "<|eot|>",
        # P-VAL-1: a string parameter is raw text, even when it looks like JSON
        call("lookup", ("city", '{"a": 1}'), ("days", "-2"), ("unit", "f"), ("tags", '["ab", "c"]')) + "<|eot|>",
        ' to=self<|message|>Which city?<|eom|><|start|>assistant' + call("lookup", ("city", "Bergen"), ("days", "0"))
        + "<|eot|>",
    ]
    for text in good:
        assert admits(compiler, tokenizer, constraint, text), text
    bad = [
        ' to=user<|message|>Sunny.<|eot|>',  # no answer
        call("lookup", ("city", "Oslo")) + "<|eot|>",  # a required parameter missing
        call("lookup", ("city", "Oslo"), ("days", "three")) + "<|eot|>",  # not an integer
        call("lookup", ("city", "Oslo"), ("days", "3"), ("unit", "k")) + "<|eot|>",  # not in the enum
        call("lookup", ("city", "Oslo"), ("days", "3"), ("tags", '["long"]')) + "<|eot|>",  # $ref'd maxLength
        call("lookup", ("city", "Oslo"), ("days", "3"), ("mood", "x")) + "<|eot|>",  # undeclared
        call("lookup", ("days", "3"), ("city", "Oslo")) + "<|eot|>",  # out of order
        call("lookup", ("city", "a</atem:parameter>"), ("days", "3")),  # the closer cannot hide in a value
        call("clock") + "<|eot|>",  # not among the callable tools
    ]
    for text in bad:
        assert not admits(compiler, tokenizer, constraint, text), text


def test_reasoning_may_take_several_messages_before_a_call_and_one_before_an_answer_alone(compiler, tokenizer):
    """A forced call allowed one reasoning message: a model reasoning in two (§3.1, P-REQ-5: `self` messages, then
    the call) was steered off. With no tools, one message, then the answer's header is forced (P-REQ-6)."""
    thought = " to=self<|message|>Hm.<|eom|><|start|>assistant"
    lookup = call("lookup", ("city", "Oslo"), ("days", "3"))
    forced = TurnConstraint(call_tools=[LOOKUP], must_call=True)
    assert admits(compiler, tokenizer, forced, thought * 2 + lookup + "<|eot|>")
    assert admits(compiler, tokenizer, forced, lookup + "<|eom|><|start|>assistant" + thought * 2 + lookup + "<|eot|>")
    answer = TurnConstraint(answer=JSON_ANSWER)
    assert admits(compiler, tokenizer, answer, thought + '<|message|>{"ok": true}<|eot|>')
    assert not admits(compiler, tokenizer, answer, thought * 2 + '<|message|>{"ok": true}<|eot|>')
    budget = TurnConstraint(call_tools=[LOOKUP], must_call=True, thinking_token_budget=8)
    assert not admits(compiler, tokenizer, budget, thought * 2 + lookup + "<|eot|>")


def test_a_string_value_may_hold_closing_tags_but_not_its_closer_or_a_framing_marker(compiler, tokenizer):
    """Raw values held no `</` at all: a forced or strict call could not write HTML (`</b>`) or XML in a string
    parameter, and the model was steered off its argument. Only the first `</atem:parameter>` ends a value, as the
    parser reads it (P-ATEM-2); `<|` stays out, as in all text."""
    note = normalize_tools([{"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "maxLength": 4}, "tag": {"enum": ["<p>", "</p>"]}},
        "required": ["text"]}}])[0]
    constraint = TurnConstraint(call_tools=[LOOKUP, note], must_call=True)
    for city in ("<b>Oslo</b>", "a </div>\n<br/> b", "x <", "</atem:parameter", "</"):
        assert admits(compiler, tokenizer, constraint, call("lookup", ("city", city), ("days", "3")) + "<|eot|>"), city
    assert admits(compiler, tokenizer, constraint, call("note", ("text", "</b>")) + "<|eot|>")  # maxLength 4
    assert admits(compiler, tokenizer, constraint, call("note", ("text", "a"), ("tag", "</p>")) + "<|eot|>")
    for bad in (call("lookup", ("city", "a <|x"), ("days", "3")),
                call("lookup", ("city", "a</atem:parameter> b"), ("days", "3")),
                call("note", ("text", "<b/>x"))):
        assert not admits(compiler, tokenizer, constraint, bad + "<|eot|>"), bad


def test_a_string_value_with_a_long_length_bound_compiles_and_keeps_its_bound(compiler, tokenizer):
    """A length bound past what the grammar engine intersects within its lexer fuel (`maxLength` 3,000 and more, a
    file's content) made the whole request a 400 "fuel exhausted"; such a value takes text without `<` instead."""
    from glimmer.protocol.turn_grammar import RAW_VALUE_TAG_BOUND

    for schema in ({"type": "string", "maxLength": 20_000}, {"type": "string", "minLength": 3_000},
                   {"type": "string", "minLength": 5, "maxLength": 100_000}):
        note = normalize_tools([{"name": "note", "parameters": {
            "type": "object", "properties": {"text": schema}, "required": ["text"]}}])[0]
        constraint = TurnConstraint(call_tools=[note], must_call=True)
        length = max(schema.get("minLength", 0), 7)
        assert length > RAW_VALUE_TAG_BOUND or schema.get("maxLength", 0) > RAW_VALUE_TAG_BOUND
        assert admits(compiler, tokenizer, constraint, call("note", ("text", "x" * length)) + "<|eot|>"), schema
        assert not admits(compiler, tokenizer, constraint, call("note", ("text", "a <b> c" + "x" * length)) + "<|eot|>")
    short = normalize_tools([{"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "minLength": 3_000}}, "required": ["text"]}}])[0]
    assert not admits(compiler, tokenizer, TurnConstraint(call_tools=[short], must_call=True),
                      call("note", ("text", "x" * 2_999)) + "<|eot|>")


# keywords llguidance does not implement; pydantic writes `uniqueItems` for a `set[...]` field
UNIMPLEMENTED = {"tags": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
                 "codes": {"type": "array", "contains": {"type": "integer"}},
                 "labels": {"type": "object", "propertyNames": {"pattern": "^a"}},
                 "level": {"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}}}


def _admits(compiler, tokenizer, params: StructuredOutputsParams, text: str) -> bool:
    """Whether a fresh matcher for `params` takes all of `text` and may end there."""
    matcher = compiler.structured_outputs(params)().matcher
    ids = tokenizer.encode_text(text)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


def _strict_refusal(schema: dict) -> RequestError:
    """The RequestError of `schema` as a strict response_format's property; it names response_format."""
    with pytest.raises(RequestError) as raised:
        check_json_schema({"type": "object", "properties": {"p": schema}}, "response_format", strict=True)
    assert raised.value.param == "response_format"
    return raised.value


def _tagger(strict: bool | None = None) -> dict:
    function = {"name": "tagger", "parameters": {"type": "object", "properties": UNIMPLEMENTED,
                                                 "required": ["tags"]}}
    return normalize_tools([{**function, **({} if strict is None else {"strict": strict})}])[0]


def test_keywords_the_engine_does_not_implement_are_ignored_in_a_non_strict_tools_call(compiler, tokenizer):
    """They failed every grammar-backed turn (a forced call, a thinking budget, an answer schema beside the tools)
    with a 400 quoting the turn grammar; a non-strict tool's schema is a hint, as its response_format twin is."""
    for constraint in (TurnConstraint(call_tools=[_tagger()], must_call=True),
                       TurnConstraint(answer=JSON_ANSWER, call_tools=[_tagger(False)], thinking_token_budget=0)):
        assert admits(compiler, tokenizer, constraint, call("tagger", ("tags", "[1, 1]"), ("level", "7")) + "<|eot|>")
        assert not admits(compiler, tokenizer, constraint, call("tagger", ("tags", '["a"]')) + "<|eot|>")


@pytest.mark.parametrize(("key", "keyword"), [("tags", "uniqueItems"), ("codes", "contains"),
                                              ("labels", "propertyNames"), ("level", "if")])
def test_a_strict_tool_using_keywords_the_engine_does_not_implement_is_refused_naming_them(key, keyword):
    parameters = {"type": "object", "properties": {key: UNIMPLEMENTED[key]}}
    check_json_schema(parameters, "tools[0].function.parameters")  # not strict: ignored
    with pytest.raises(RequestError) as raised:
        check_json_schema(parameters, "tools[0].function.parameters", strict=True)
    assert raised.value.param == "tools[0].function.parameters"
    message = str(raised.value)
    assert message.startswith("tools[0].function.parameters: the grammar engine refused it: Unimplemented keys")
    assert f'"{keyword}"' in message and '"strict": true' in message


def test_a_turn_grammar_the_engine_refuses_is_refused_without_quoting_its_source(compiler):
    """llguidance lists the grammar's source after its error: for a turn that is Glimmer's own grammar (headers,
    ATEM tags, channel rules), nothing a client wrote or should read."""
    parameters = {"type": "object", "properties": {"b": {"type": "integer", "minimum": 5, "maximum": 1}},
                  "required": ["b"]}  # unchecked (check_json_schema would refuse it first)
    tool = normalize_tools([{"name": "f", "parameters": parameters}])[0]
    with pytest.raises(RequestError) as raised:
        compiler.turn(TurnConstraint(call_tools=[tool], must_call=True))
    assert raised.value.param == "tools"
    message = str(raised.value)
    assert message == "tools: the grammar engine refused it: failed to compile JSON schema: Unsatisfiable schema: " \
                      "minimum (5) is greater than maximum (1)", message


def test_parallel_calls_follow_the_request(compiler, tokenizer):
    two = call("clock") + "<|eom|><|start|>assistant" + call("clock") + "<|eot|>"
    assert admits(compiler, tokenizer, TurnConstraint(call_tools=[CLOCK], must_call=True), two)
    single = TurnConstraint(call_tools=[CLOCK], must_call=True, parallel_calls=False)
    assert not admits(compiler, tokenizer, single, two)
    assert admits(compiler, tokenizer, single, call("clock") + "<|eot|>")


def test_the_thinking_budget_bounds_reasoning_and_zero_forbids_it(compiler, tokenizer):
    constraint = TurnConstraint(answer=JSON_ANSWER, thinking_token_budget=4)
    matcher = compiler.turn(constraint)().matcher
    eom = tokenizer.require_token_id("<|eom|>")
    ids = tokenizer.encode(" to=self<|message|>a b c d")
    assert matcher.try_consume_tokens(ids) == len(ids)
    assert allowed_ids(matcher) == [eom]
    assert not admits(compiler, tokenizer, TurnConstraint(answer=JSON_ANSWER, thinking_token_budget=0),
                      " to=self<|message|>")


def test_masks_of_a_batch_constrain_only_their_rows(compiler, tokenizer):
    masks = GrammarMasks(512, 2)
    matcher = compiler.structured_outputs(StructuredOutputsParams(choice=["yes", "no"]))().matcher
    allowed = unpack_token_bitmask(masks.fill([None, _controller(matcher), None]), 512)
    assert allowed[0].all() and allowed[2].all()
    first = {tokenizer.decode([i]) for i in allowed[1].nonzero().flatten().tolist()}
    assert first and all("yes".startswith(text) or "no".startswith(text) for text in first)
    assert masks.fill([None, None]) is None


def test_a_choice_holding_control_characters_admits_exactly_its_text(compiler, tokenizer):
    """A choice holding DEL (U+007F) was refused with the grammar engine's `lexer error` quoting the grammar."""
    choices = ["x\x7fy", "tab\there", "nul\x00", 'q"uote\\']
    for choice in choices:
        assert _admits(compiler, tokenizer, StructuredOutputsParams(choice=choices), choice), choice
    matcher = compiler.structured_outputs(StructuredOutputsParams(choice=choices))().matcher
    ids = tokenizer.encode_text("x\\u007fy")
    assert matcher.try_consume_tokens(ids) < len(ids)  # the escape is the grammar's, not the text's


def test_a_forced_call_of_a_parameter_named_with_del_is_served(compiler, tokenizer):
    """Its tag's literal held DEL (U+007F) raw: the turn was a 400 quoting the grammar engine's `lexer error`."""
    tool = normalize_tools([{"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"x\x7fy": {"type": "integer"}}, "required": ["x\x7fy"]}}])[0]
    constraint = TurnConstraint(call_tools=[tool], must_call=True)
    assert admits(compiler, tokenizer, constraint, call("f", ("x\x7fy", "1")) + "<|eot|>")
    assert not admits(compiler, tokenizer, constraint, call("f", ("x\\u007fy", "1")) + "<|eot|>")


def test_masks_fit_a_padded_vocabulary_and_forbid_its_padding(tokenizer):
    """A model whose logit rows outnumber the tokenizer's ids in another count of 32-bit words (glimmer-nano:
    2,112 rows, 2,067 tokens) gets masks of its own width, with every padded row forbidden."""
    rows = -(-tokenizer.vocab_size // 32) * 32 + 64
    stops = [tokenizer.require_token_id("<|eot|>")]
    padded = GrammarCompiler(tokenizer, rows, stops)
    assert padded.tokenizer.vocab_size == rows
    controller = padded.structured_outputs(StructuredOutputsParams(regex="[a-z]+"))()
    allowed = unpack_token_bitmask(GrammarMasks(rows, 2).fill([controller, None]), rows)
    assert allowed.shape == (2, rows) and allowed[1].all()
    ids = allowed[0].nonzero().flatten().tolist()
    assert ids and max(ids) < tokenizer.vocab_size
    assert all(tokenizer.decode([i]).isalpha() for i in ids)
    assert controller.accepted_prefix([rows - 1]) == 0 and not controller.matcher.is_error()
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        GrammarCompiler(tokenizer, tokenizer.vocab_size - 1, stops)


def test_a_repeated_grammar_is_compiled_once_and_each_completion_gets_its_own_matcher(compiler, tokenizer,
                                                                                        monkeypatch):
    params = StructuredOutputsParams(choice=["north", "south"])
    first = compiler.structured_outputs(params)
    built = []

    class Counting:
        def __init__(self, *args, **kwargs):
            built.append(args)

        @staticmethod
        def validate_grammar_with_warnings(*args):
            built.append(args)
            return False, []

    monkeypatch.setattr("glimmer.engine.grammar.llguidance.LLMatcher", Counting)
    again = compiler.structured_outputs(params)  # from the cache: nothing validated or built
    assert built == []
    one, two = first(), again()
    assert one.matcher is not two.matcher
    for token in tokenizer.encode("north"):
        assert one.matcher.consume_token(token)
    assert one.matcher.is_accepting() and not two.matcher.is_accepting()  # the copies move independently


@pytest.mark.parametrize(("params", "field"), [
    (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "wat"}}}), "response_format"),
    (StructuredOutputsParams(json="{not json"), "response_format"),
    (StructuredOutputsParams(regex="(unclosed"), "response_format"),
    (StructuredOutputsParams(grammar="start: missing_rule"), "response_format"),
])
def test_an_invalid_schema_regex_or_grammar_is_refused_naming_the_field(compiler, params, field):
    with pytest.raises(RequestError) as raised:
        compiler.turn(TurnConstraint(answer=answer_grammar(params, field)), field)
    assert raised.value.param == field


@pytest.mark.parametrize(("text", "path"), [
    ('{"type": "object", "properties": {"a": {"type": "string"}}, "properties": {"b": {"type": "integer"}}, '
     '"required": ["a"]}', "guided_json.properties"),
    ('{"type": "object", "properties": {"a": {"type": "string", "type": "integer"}}}', "guided_json.properties.a.type"),
], ids=["outer", "inner"])
def test_a_schema_as_json_text_giving_a_key_twice_is_refused_naming_the_key(text, path):
    """The text form of a schema (guided_json, structured_outputs.json) was read by json.loads, which keeps the last
    value: the first `properties`, with the property `required` asked for, was dropped without a word, where the same
    schema sent as an object is refused for its repeated key."""
    with pytest.raises(RequestError) as raised:
        answer_grammar(StructuredOutputsParams(json=text), "guided_json")
    assert raised.value.param == path
    assert str(raised.value).startswith(f"{path}: given more than once in the same JSON object")


def test_a_schema_as_json_text_holding_a_lone_surrogate_is_refused_naming_it():
    """Its `\\ud800` escape decodes to a lone surrogate, which the grammar engine refused as "Value is not JSON
    serializable", quoting the compiled grammar."""
    with pytest.raises(RequestError) as raised:
        answer_grammar(StructuredOutputsParams(json='{"type": "string", "pattern": "\\ud800"}'), "guided_json")
    assert raised.value.param == "guided_json"
    assert "lone UTF-16 surrogate" in str(raised.value) and "serializable" not in str(raised.value)


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "object", "properties": {"city": {"type": "nonsense"}}}, "Invalid type: nonsense"),
    ({"type": "object", "properties": {"city": {"$ref": "#/$defs/missing"}}}, "/$defs/missing"),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": "abc"}}}, "minimum"),
])
def test_a_schema_the_grammar_engine_refuses_is_refused_naming_the_field_without_a_tokenizer(schema, words):
    """A tool's parameters get the check a non-strict response_format schema gets, with the same wording."""
    with pytest.raises(RequestError) as raised:
        check_json_schema(schema, "tools[0].function.parameters")
    assert raised.value.param == "tools[0].function.parameters"
    assert str(raised.value).startswith("tools[0].function.parameters: the grammar engine refused it: ")
    assert words in str(raised.value)


@pytest.mark.parametrize("keyword", [{"maximum": float("inf")}, {"minimum": float("-inf")}, {"default": float("nan")}])
@pytest.mark.parametrize("strict", [False, True])
def test_nan_or_an_infinity_in_a_schema_is_refused_naming_it(keyword, strict):
    """A tool's or response_format's schema holding a body's `NaN`, `Infinity` or `1e400` was refused as "the grammar
    engine refused it: expected value at line 1 column 100", naming neither the value nor what to do."""
    schema = {"type": "object", "properties": {"x": {"type": "number", **keyword}}}
    with pytest.raises(RequestError) as raised:
        check_json_schema(schema, "tools[0].function.parameters", strict=strict)
    assert raised.value.param == "tools[0].function.parameters"
    assert "NaN or an infinity" in str(raised.value) and "expected value" not in str(raised.value)


@pytest.mark.parametrize("bounds", [{"minimum": -2 ** 63, "maximum": 2 ** 63 - 1}, {"minimum": -1e19},
                                    {"type": "number", "maximum": 1e300},
                                    {"type": "number", "exclusiveMinimum": -1e20}])
@pytest.mark.parametrize("strict", [False, True])
def test_a_bound_past_the_engines_numbers_is_refused_naming_the_keywords(bounds, strict):
    """llguidance's words were `integer range: min=Some(-9223372036854775808), max=None` for a minimum of -1e19."""
    schema = {"type": "object", "properties": {"id": {"type": "integer", **bounds}}}
    with pytest.raises(RequestError) as raised:
        check_json_schema(schema, "response_format.json_schema.schema", strict=strict)
    message = str(raised.value)
    assert raised.value.param == "response_format.json_schema.schema"
    assert "minimum or maximum" in message and "9.2e18" in message and "Some(" not in message
    assert '"strict": true' not in message  # no hint that a non-strict schema would pass
    check_json_schema({"type": "integer", "minimum": -9e18, "maximum": 9e18}, "p", strict=strict)


@pytest.mark.parametrize("schema", [
    {}, {"type": "object", "properties": {}},
    {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}, "day": {"format": "weekday"}}},
    LOOKUP["function"]["parameters"],
])
def test_a_valid_schema_passes_the_check_unimplemented_keywords_included(schema):
    check_json_schema(schema, "tools[0].function.parameters")  # lenient, as a non-strict schema: no error


@pytest.mark.parametrize("schema", [
    {"type": "object", "patternProperties": {"^[a-c]$": {"type": "integer"}}, "minProperties": 2},
    {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
     "additionalProperties": {"type": "string"}, "minProperties": 2},
    {"type": "array", "items": {"$ref": "#/$defs/counts"},
     "$defs": {"counts": {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1}}},
])
def test_a_strict_min_properties_beyond_the_required_keys_is_refused_naming_it(schema):
    """Keys of patternProperties or additionalProperties may repeat (next test): a strict schema cannot have it."""
    for param in ("response_format.json_schema.schema", "tools[0].function.parameters"):
        with pytest.raises(RequestError) as raised:
            check_json_schema(schema, param, strict=True)
        assert raised.value.param == param and "minProperties" in str(raised.value)
    check_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                       "additionalProperties": {"type": "integer"}, "minProperties": 1}, "p", strict=True)



@pytest.mark.parametrize("schema", [
    {"type": "array", "prefixItems": [{"type": "null"}], "additionalItems": False},
    {"type": "array", "prefixItems": [{"type": "null"}], "items": {"type": "boolean"}, "additionalItems": False},
    {"type": "array", "prefixItems": [{"type": "null"}], "items": [{"type": "boolean"}]},
    {"type": "object", "properties": {"pair": {"$ref": "#/$defs/pair"}},
     "$defs": {"pair": {"type": "array", "prefixItems": [{"type": "null"}], "additionalItems": {"type": "integer"}}}},
])
def test_a_strict_prefix_items_beside_a_tuple_keyword_of_older_drafts_is_refused_naming_it(compiler, tokenizer, schema):
    """The grammar engine reads additionalItems or an array items as the drafts before 2020-12 do and drops
    prefixItems: `[202]` was written for a first item that must be null. A non-strict schema keeps them as hints."""
    for param in ("response_format.json_schema.schema", "tools[0].function.parameters"):
        with pytest.raises(RequestError) as raised:
            check_json_schema(schema, param, strict=True)
        assert raised.value.param == param and "prefixItems beside" in str(raised.value)
    check_json_schema(schema, "p", strict=False)
    served = [({"type": "array", "prefixItems": [{"type": "null"}], "items": {"type": "boolean"}}, "[null, true]"),
              ({"type": "array", "items": [{"type": "null"}], "additionalItems": False}, "[null]")]  # draft 7's tuple
    for good, text in served:
        assert _admits(compiler, tokenizer, StructuredOutputsParams(json=good), text)
        assert not _admits(compiler, tokenizer, StructuredOutputsParams(json=good), "[202]")

def test_the_grammar_engine_lets_a_key_of_pattern_properties_repeat(compiler, tokenizer):
    """Why a strict minProperties beyond `required` is refused: `{"a": 1, "a": 2}` counts two keys, parses to one."""
    schema = {"type": "object", "patternProperties": {"^[a-c]$": {"type": "integer"}}, "minProperties": 2}
    matcher = compiler.structured_outputs(StructuredOutputsParams(json=schema, strict=False))().matcher
    twice = tokenizer.encode_text('{"a": 1, "a": 2}')
    assert matcher.try_consume_tokens(twice) == len(twice) and matcher.is_accepting()


@pytest.mark.parametrize(("schema", "excluded", "keyword"), [
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}, "0", "exclusiveMinimum"),
    ({"type": ["number", "null"], "exclusiveMinimum": 1, "exclusiveMaximum": 1.001}, "1", "exclusiveMinimum"),
    ({"type": "number", "minimum": -0.5, "exclusiveMaximum": 0}, "-0", "exclusiveMaximum"),
    ({"type": "number", "minimum": -2.5, "exclusiveMaximum": -2}, "-2", "exclusiveMaximum"),
])
def test_a_strict_exclusive_bound_the_engine_would_let_through_is_refused_naming_it(compiler, tokenizer, schema,
                                                                                     excluded, keyword):
    """The grammar engine writes such a range as the bound's integer part and a fraction it lets be left out."""
    # why strict cannot have it
    assert _admits(compiler, tokenizer, StructuredOutputsParams(json=schema, strict=False), excluded)
    raised = _strict_refusal(schema)
    assert f"{keyword} " in str(raised) and f"the number be {excluded};" in str(raised)


@pytest.mark.parametrize(("schema", "excluded"), [({"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "0"),
                                                  ({"type": "number", "exclusiveMinimum": -1, "maximum": -0.5}, "-1"),
                                                  ({"type": "number", "minimum": 2.5, "exclusiveMaximum": 3}, "3"),
                                                  ({"type": "integer", "exclusiveMinimum": 0, "maximum": 5}, "0")])
def test_an_exclusive_bound_the_engine_holds_is_served_strict(compiler, tokenizer, schema, excluded):
    assert not _admits(compiler, tokenizer, StructuredOutputsParams(json=schema), excluded)


@pytest.mark.parametrize(("schema", "written", "keyword"), [
    ({"type": "integer", "minimum": 9007199254740990, "maximum": 9007199254740995}, "9007199254740996", "maximum"),
    ({"type": "integer", "minimum": -9007199254740995, "maximum": -9007199254740990}, "-9007199254740996",
     "minimum"),
    ({"const": 9007199254740993}, "9007199254740992", "const"),
    ({"enum": ["a", [12345678901234567890123]]}, "[12345678901234568000000]", "enum"),
])
def test_a_strict_integer_past_2_to_the_53_the_engine_would_round_is_refused_naming_it(compiler, tokenizer, schema,
                                                                                        written, keyword):
    """The grammar engine reads a schema's numbers as 64-bit floats: it would write or let through the nearest one."""
    # why strict cannot have it
    assert _admits(compiler, tokenizer, StructuredOutputsParams(json=schema, strict=False), written)
    raised = _strict_refusal(schema)
    assert str(raised).startswith(f"response_format: {keyword} holds ") and "2^53" in str(raised)


@pytest.mark.parametrize("schema", [{"const": 2 ** 60}, {"enum": [-(2 ** 53), 2 ** 53 + 2]},
                                    {"type": "integer", "minimum": 2 ** 53, "maximum": 2 ** 62}])
def test_an_integer_past_2_to_the_53_a_float_holds_exactly_is_served_strict(compiler, tokenizer, schema):
    value = schema.get("const", schema.get("enum", [schema.get("minimum")])[-1])
    assert _admits(compiler, tokenizer, StructuredOutputsParams(json=schema), json.dumps(value))


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(("schema", "path"), [
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 10**400, "maximum": 10**401}},
      "required": ["a"]}, ".properties.a.minimum"),
    ({"type": "integer", "maximum": -(10**400)}, ".maximum"),
    ({"anyOf": [{"type": "string"}, {"enum": [1, [2, 10**400]]}]}, ".anyOf[1].enum[1][1]"),
    ({"type": "integer", "default": 10**400}, ".default"),  # no keyword the engine enforces, but JSON it reads
])
def test_an_integer_past_the_float_range_is_refused_naming_its_path(schema, path, strict):
    """The grammar engine reads every number of a schema as a float or a 64-bit integer and refused 10**400 as
    "number out of range at line 1 column 501"; a strict schema's check of integers past 2^53 made it a float, an
    OverflowError."""
    with pytest.raises(RequestError) as raised:
        check_json_schema(schema, "response_format", strict)
    assert raised.value.param == f"response_format{path}"
    assert "past the range of a 64-bit float" in str(raised.value)


@pytest.mark.parametrize(("schema", "broken", "option"), [
    ({"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True}, "[1, 1]", "lenient"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "7", "coerce_one_of"),
])
def test_a_strict_schema_whose_own_engine_options_relax_it_is_refused_naming_them(compiler, tokenizer, schema,
                                                                                  broken, option):
    """A schema's `x-guidance` options win over Glimmer's: these would let the output break the schema."""
    relaxed = {**schema, "x-guidance": {option: True}}
    params = StructuredOutputsParams(json=relaxed, strict=False)
    assert _admits(compiler, tokenizer, params, broken)  # why strict cannot have it
    for check in (lambda: answer_grammar(StructuredOutputsParams(json=relaxed), "guided_json"),
                  lambda: check_json_schema(relaxed, "guided_json", strict=True)):
        with pytest.raises(RequestError) as raised:
            check()
        assert raised.value.param == "guided_json" and f"x-guidance.{option} true" in str(raised.value)
    answer_grammar(StructuredOutputsParams(json={**schema, "x-guidance": {option: False}}, strict=False), "p")


@pytest.mark.parametrize(("schema", "leap", "not_leap"), [
    ({"type": "string", "format": "date"}, "2024-02-29", "2023-02-29"),
    ({"type": "string", "format": "date"}, "2000-02-29", "1900-02-29"),
    ({"type": "string", "format": "date-time"}, "2024-02-29T08:30:00Z", "2023-02-29T08:30:00Z"),
    ({"type": ["string", "null"], "format": "date", "pattern": "^20", "allOf": [{"maxLength": 10}]}, "2024-02-29",
     "2023-02-29"),
])
def test_a_date_format_takes_february_29th_in_leap_years_only(compiler, tokenizer, schema, leap, not_leap):
    """RFC 3339 §5.7; the grammar engine's format regexes took `2023-02-29`, which no date parser reads."""
    for strict in (True, False):
        params = StructuredOutputsParams(json={"type": "object", "properties": {"d": schema}, "required": ["d"]},
                                         strict=strict)
        for text, admitted in ((leap, True), (not_leap, False), ("2023-03-01" + leap[10:], True)):
            assert _admits(compiler, tokenizer, params, json.dumps({"d": text})) is admitted, text


def test_a_date_in_a_tool_calls_json_value_takes_february_29th_in_leap_years_only(compiler, tokenizer):
    day = {"type": "object", "properties": {"on": {"type": "string", "format": "date"}}, "required": ["on"]}
    for strict in (True, False):
        tool = normalize_tools([{"name": "book", "strict": strict, "parameters": {
            "type": "object", "properties": {"day": day}, "required": ["day"]}}])[0]
        constraint = TurnConstraint(call_tools=[tool], must_call=True)
        assert admits(compiler, tokenizer, constraint, call("book", ("day", '{"on": "2024-02-29"}')) + "<|eot|>")
        assert not admits(compiler, tokenizer, constraint, call("book", ("day", '{"on": "2023-02-29"}')) + "<|eot|>")



@pytest.mark.parametrize("schema", [
    {"type": "string", "format": "hostname"},
    {"anyOf": [{"type": ["string", "null"], "format": "hostname"}, {"type": "integer"}]},
])
def test_a_hostname_format_takes_at_most_253_characters(compiler, tokenizer, schema):
    """RFC 1034 §3.1, as a raw ATEM value's hostname regex holds: the grammar engine's own regex bounds each label to
    63 characters but not the name, and a random walk of its masks wrote a 700-character host name."""
    longest = ".".join(["a" * 63] * 3 + ["b" * 61])  # 253 characters
    for strict in (True, False):
        params = StructuredOutputsParams(json=schema, strict=strict)
        assert _admits(compiler, tokenizer, params, json.dumps(longest))
        assert _admits(compiler, tokenizer, params, '"example.com"')
        assert not _admits(compiler, tokenizer, params, json.dumps(longest + "b"))
        assert not _admits(compiler, tokenizer, params, json.dumps(longest + ".c"))


@pytest.mark.parametrize(("schema", "admitted"), [
    ({"type": "number", "multipleOf": 5, "maximum": 1000}, {"0": True, "5": True, "200": True, "3": False,
                                                            "2.5": False, "1005": False}),
    ({"type": ["number", "null"], "multipleOf": 1.0, "exclusiveMaximum": 7.5}, {"0": True, "7": True, "null": True,
                                                                                 "8": False, "2.5": False}),
])
def test_a_chat_answer_of_a_number_multiple_of_an_integer_ends_without_failing(compiler, tokenizer, schema, admitted):
    """The grammar engine panicked ("assertion failed: !s.has_pending_lexeme_bytes()") filling the mask after such a
    number where `<|eot|>` may follow it: 11 of 12 chat answers of `multipleOf: 5` failed their request. It is held as
    an integer, the same values."""
    eot = tokenizer.require_token_id("<|eot|>")
    constraint = TurnConstraint(answer=chat_answer_grammar(StructuredOutputsParams(json=schema)),
                                thinking_token_budget=0)
    for answer, expected in admitted.items():
        controller = compiler.turn(constraint)()
        ids = tokenizer.encode("<|message|>" + answer)
        taken = controller.matcher.try_consume_tokens(ids) == len(ids)
        allowed = unpack_token_bitmask(GrammarMasks(512, 1).fill([controller]), 512)[0].nonzero().flatten().tolist()
        assert controller.failure is None, (answer, controller.failure)
        assert (taken and eot in allowed) is expected, answer

def _one_string_tool(schema: dict, strict: bool) -> TurnConstraint:
    parameters = {"type": "object", "properties": {"v": schema}, "required": ["v"]}
    check_json_schema(parameters, "tools", strict)
    return TurnConstraint(call_tools=normalize_tools([{"name": "f", "strict": strict, "parameters": parameters}]),
                          must_call=True)


@pytest.mark.parametrize(("schema", "good", "bad"), [
    ({"type": "string", "pattern": "^[A-Z]{3}$"}, ["EUR"], ["eur", "EURO", "EU"]),
    ({"type": "string", "pattern": "[0-9]"}, ["a1b", "7"], ["ab", ""]),  # JSON Schema's pattern is unanchored
    ({"type": "string", "pattern": "^a|b$"}, ["ax", "xb", "b"], ["xa", "bx"]),  # anchors per top-level branch
    ({"type": "string", "pattern": "^(?:no|yes)$"}, ["yes"], ["yess", "maybe"]),
    ({"type": "string", "pattern": "^\\d+ \\w+$"}, ["12 ab_1"], ["\u0661\u0662 ab", "12 \u00e9"]),  # ECMA: ASCII
    ({"type": "string", "pattern": "^a/[$]"}, ["a/$"], ["a/x"]),
    ({"type": "string", "format": "date"}, ["2024-02-29", "2000-02-29", "2023-12-31"],
     ["2023-02-29", "1900-02-29", "2023-04-31", "2023-1-1", " 2023-01-01"]),
    ({"type": "string", "format": "date-time"}, ["2024-02-29T12:00:00Z", "2023-01-01t23:59:60.5+05:30"],
     ["2024-02-29 12:00:00Z", "2024-02-29T24:00:00Z", "2024-02-29T12:00:00"]),
    ({"type": "string", "format": "time"}, ["12:00:00Z", "00:00:00.123-01:00"], ["12:00", "25:00:00Z"]),
    ({"type": "string", "format": "duration"}, ["P1Y2M", "PT1H", "P3W", "P1DT2H3M4S"], ["P", "PT", "P1H", "1Y"]),
    ({"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000"],
     ["123e4567e89b12d3a456426614174000", "g23e4567-e89b-12d3-a456-426614174000"]),
    ({"type": "string", "format": "ipv4"}, ["192.168.0.1", "0.0.0.0"], ["256.1.1.1", "1.2.3", "01.2.3.4"]),
    ({"type": "string", "format": "ipv6"}, ["::1", "2001:db8::1", "::", "1:2:3:4:5:6:7:8", "::ffff:1.2.3.4"],
     [":::", "1:2:3:4:5:6:7:8:9", "12345::", "1::2::3"]),
    ({"type": "string", "format": "hostname"}, ["example.com", "a", "x-y.z"], ["-a.com", "a..b", "a_b", "a" * 64]),
    ({"type": "string", "format": "email"}, ["a.b+c@example.com", "x@[1.2.3.4]"],
     ["a@", "@b.com", "a b@c.com", "a..b@c.com"]),
    ({"type": "string", "format": "uri"}, ["https://example.com/a?b=1#c", "urn:isbn:0451450523", "http://[::1]:80/"],
     ["not a uri", "example.com", "http://a b"]),
    ({"type": ["string", "null"], "pattern": "^a"}, ["ab", "null"], ["b"]),  # pattern holds strings only
    ({"enum": ["ab", "cd", "a.c"], "pattern": "^a"}, ["ab", "a.c"], ["cd", "abc"]),
    ({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "z$"}]}, ["az", "abcz"], ["ab", "bz"]),
    ({"anyOf": [{"type": "string", "format": "email"}, {"type": "string", "format": "uuid"}]},
     ["a@b.c", "123e4567-e89b-12d3-a456-426614174000"], ["abc"]),
    ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}, ["abc"], ["abcd", "AB"]),
    ({"type": "string", "pattern": "^x", "maxLength": 5000}, ["x" * 10], ["y"]),
    ({"type": "string", "pattern": "b", "minLength": 2}, ["<b>", "</b>"], ["b", "a<|b"]),
])
def test_a_string_values_pattern_and_format_hold_a_forced_or_strict_call(compiler, tokenizer, schema, good, bad):
    """A raw value (a parameter admitting strings) took any text: a strict tool's `pattern` and `format` were not
    enforced, and an agent's call carried `2023-02-29` for a date or `eur` for `^[A-Z]{3}$`."""
    for strict in (True, False):  # a forced call holds every keyword the grammar engine implements, as JSON values do
        constraint = _one_string_tool(schema, strict)
        for value in good:
            assert admits(compiler, tokenizer, constraint, call("f", ("v", value)) + "<|eot|>"), (strict, value)
        for value in bad:
            assert not admits(compiler, tokenizer, constraint, call("f", ("v", value)) + "<|eot|>"), (strict, value)


@pytest.mark.parametrize("strict", [False, True])
def test_a_forced_call_follows_a_ref_into_the_tools_schema_as_the_tool_reads_it(compiler, tokenizer, strict):
    """A parameter's JSON value is constrained by its schema as a document of its own, whose `#` was the parameter's
    schema: a `$ref` to `#/properties/...` (zod-to-json-schema writes one for a schema used twice) was a 400 under a
    forced call ("Pointer '/properties/count' does not exist"), and `#` named the parameter, not the tool's schema."""
    parameters = {"type": "object", "additionalProperties": False, "required": ["count", "counts", "child"],
                  "properties": {"count": {"type": "integer"}, "counts": {"type": "array",
                                                                           "items": {"$ref": "#/properties/count"}},
                                 "child": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}}
    check_json_schema(parameters, "tools", strict)
    constraint = TurnConstraint(call_tools=normalize_tools([{"name": "f", "strict": strict,
                                                             "parameters": parameters}]), must_call=True)
    child = '{"count": 1, "counts": [], "child": null}'
    assert admits(compiler, tokenizer, constraint, call("f", ("count", "3"), ("counts", "[1, 2]"), ("child", child))
                  + "<|eot|>")
    assert not admits(compiler, tokenizer, constraint, call("f", ("count", "3"), ("counts", '["x"]')))
    assert not admits(compiler, tokenizer, constraint, call("f", ("count", "3"), ("counts", "[]"),
                                                            ("child", '{"counts": [], "child": null}')))



@pytest.mark.parametrize("parameters", [
    {"allOf": [{"type": "object", "properties": {"n": {"type": "integer", "minimum": 5}}, "required": ["n"]},
               {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}, "s": {"maxLength": 2}}},
               {"properties": {"s": {"type": "string", "pattern": "^x"}}}]},
    {"$ref": "#/$defs/base", "properties": {"n": {"maximum": 9}, "s": {"type": "string", "maxLength": 2}},
     "$defs": {"base": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5},
                                                         "s": {"pattern": "^x"}}, "required": ["n"]}}},
])
@pytest.mark.parametrize("strict", [False, True])
def test_a_call_holds_a_parameter_to_each_of_the_root_schemas_that_declare_it(compiler, tokenizer, parameters,
                                                                              strict):
    """A parameter declared in two `allOf` members of a tool's parameters, or beside and behind a root `$ref`, held
    only to the last declaration read (and behind a `$ref`, to the sibling's, which replaced the target's
    properties): `n` could be 1 and `s` any text. The call is typed by both declarations alike."""
    check_json_schema(parameters, "tools", strict)
    tools = normalize_tools([{"name": "f", "strict": strict, "parameters": parameters}])
    constraint = TurnConstraint(call_tools=tools, must_call=True)
    assert admits(compiler, tokenizer, constraint, call("f", ("n", "7"), ("s", "xy")) + "<|eot|>")
    for bad in (("n", "1"), ("n", "20")):
        assert not admits(compiler, tokenizer, constraint, call("f", bad))
    for bad in ("yy", "xyz"):
        assert not admits(compiler, tokenizer, constraint, call("f", ("n", "7"), ("s", bad)))
    parsed = parse_output(call("f", ("n", "7"), ("s", "xy")), tools)
    assert json.loads(parsed.tool_calls[0].arguments) == {"n": 7, "s": "xy"}

def test_a_pattern_anchored_inside_a_group_is_refused_strict_and_a_hint_otherwise(compiler, tokenizer):
    schema = {"type": "string", "pattern": "(^a)b"}
    with pytest.raises(RequestError, match="pattern '\\(\\^a\\)b': a '\\^' or '\\$' inside a group") as raised:
        admits(compiler, tokenizer, _one_string_tool(schema, True), call("f", ("v", "ab")) + "<|eot|>")
    assert raised.value.param == "tools"
    assert admits(compiler, tokenizer, _one_string_tool(schema, False), call("f", ("v", "zz")) + "<|eot|>")


@pytest.mark.parametrize("pattern", ["^(?=.*[A-Z])(?=.*\\d).{8,}$", "\\bcat\\b", "(a)\\1", "(?<!x)y"])
def test_a_pattern_beyond_the_grammar_engine_is_refused_strict_and_a_hint_otherwise(compiler, tokenizer, pattern):
    """Lookarounds, word boundaries and backreferences are ECMA-262 (so JSON Schema) but beyond the grammar engine's
    regexes. A non-strict tool's schema leaves such a pattern a hint, as it leaves keywords the engine does not
    implement: it was a 400 under every tool_choice, auto included, where no grammar runs at all."""
    schema = {"type": "string", "pattern": pattern}
    with pytest.raises(RequestError, match="^tools: the grammar engine refused it: .*regex"):
        _one_string_tool(schema, True)
    assert admits(compiler, tokenizer, _one_string_tool(schema, False), call("f", ("v", "zz")) + "<|eot|>")
    nested = {"type": "object", "properties": {"v": {"type": "array", "items": schema}}, "required": ["v"]}
    check_json_schema(nested, "tools", strict=False)  # inside JSON values too
    tools = normalize_tools([{"name": "f", "parameters": nested}])
    assert admits(compiler, tokenizer, TurnConstraint(call_tools=tools, must_call=True),
                  call("f", ("v", '["zz"]')) + "<|eot|>")


@pytest.mark.parametrize("strict", [False, True])
def test_a_schema_nested_past_pythons_recursion_is_refused_naming_the_field(strict):
    """The schema walks (strict keywords, leap years) raised RecursionError from LLM.chat's tools and answers."""
    schema: dict = {"type": "integer"}
    for _ in range(700):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(RequestError) as raised:
        check_json_schema(schema, "tools[0].function.parameters", strict=strict)
    assert raised.value.param == "tools[0].function.parameters" and "nested too deeply" in str(raised.value)
    with pytest.raises(RequestError, match="^response_format: the JSON schema is nested too deeply"):
        answer_grammar(StructuredOutputsParams(json=schema, strict=strict), "response_format")


def test_structured_outputs_params_take_exactly_one_constraint():
    with pytest.raises(RequestError, match="exactly one"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(RequestError, match="exactly one"):
        StructuredOutputsParams()
    assert StructuredOutputsParams(choice=["a"]).kind == "choice"


def _controller(matcher) -> GrammarController:  # a controller around a bare matcher
    return GrammarController(matcher, 512)


def test_unpacking_reads_llguidance_bit_order():
    bitmask = torch.tensor([[1 | (1 << 31)]], dtype=torch.int64)
    packed = torch.where(bitmask >= 2**31, bitmask - 2**32, bitmask).to(torch.int32)
    assert unpack_token_bitmask(packed, 32)[0].nonzero().flatten().tolist() == [0, 31]


def test_verification_masks_walk_the_proposals_and_survive_ids_beyond_the_tokenizer(compiler, tokenizer):
    """Speculative decoding: one row per proposal and one after; a proposal past the tokenizer's ids (a padded
    logit row a drafter can propose) ends the walk without breaking the matcher, which is left where it was."""
    controller = compiler.structured_outputs(StructuredOutputsParams(regex="[a-z ]{40}"))()
    letters = tokenizer.encode("ab")
    assert tokenizer.vocab_size < 512
    padded = 511
    masks = GrammarMasks(512, 4)
    allowed = unpack_token_bitmask(masks.fill_verification([None, controller], [[7], letters + [padded, 3]]), 512)
    assert allowed.shape[0] == 2 + len(letters) + 3
    assert allowed[:2].all()  # the free sequence's rows
    rows = allowed[2:]
    assert all(rows[j, t] for j, t in enumerate(letters)) and not rows[len(letters), padded]
    assert not controller.matcher.is_error()
    assert controller.accepted_prefix(letters) == len(letters)
    assert not controller.observe(letters[0])


def test_verification_masks_leave_a_thinking_budget_grammar_usable(compiler, tokenizer):
    """A thinking budget is a `max_tokens=` lexeme, which llguidance cannot roll back: verifying proposals used
    to roll the matcher back, leaving it in its error state, and the speculative server ended such turns early
    with a stray header as their answer. The proposals are now walked on a copy."""
    controller = compiler.turn(TurnConstraint(thinking_token_budget=20))()
    proposals = tokenizer.encode(" to=self<|message|>abc def", add_special_tokens=False)
    masks = GrammarMasks(512, 1)
    for _ in range(2):  # twice: the first walk left the matcher where it was
        allowed = unpack_token_bitmask(masks.fill_verification([controller], [proposals]), 512)
        assert all(allowed[j, t] for j, t in enumerate(proposals))
        assert not controller.matcher.is_error()
    for token in proposals:  # the tokens verification accepted, consumed one by one as the engine does
        assert not controller.observe(token)
    assert not controller.matcher.is_error()


def test_a_token_the_grammar_refuses_fails_the_completion_instead_of_ending_it(compiler, tokenizer):
    """The sampler draws only allowed tokens, so a refusal is a limit of the grammar engine: the request must
    fail with its reason, not finish as if its output were complete."""
    controller = compiler.structured_outputs(StructuredOutputsParams(choice=["yes", "no"]))()
    with pytest.raises(GrammarFailure, match="grammar engine stopped"):
        controller.observe(tokenizer.encode_text("maybe")[0])


@pytest.mark.parametrize(("params", "reason"), [
    (StructuredOutputsParams(grammar="root ::= root"), "no text satisfies this constraint"),
    (StructuredOutputsParams(json={"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}),
     "'#/\\$defs/A' leads back to itself with no way out"),  # found in the schema, before compiling
])
def test_a_constraint_no_text_satisfies_is_refused_naming_the_field(compiler, params, reason):
    """llguidance accepts these grammars and finds out only at the first mask, which would allow nothing but the
    stop ids: an empty answer finished as if complete. The compiler computes that mask and refuses them."""
    with pytest.raises(RequestError, match=reason) as raised:
        compiler.structured_outputs(params, "structured_outputs.grammar")
    assert raised.value.param == "structured_outputs.grammar"


def test_a_lexer_limit_fails_every_request_of_that_grammar_as_it_failed_the_first(compiler, tokenizer):
    """A regex whose lexer hits llguidance's limit past the compiler's probe (which advances the lowest allowed
    token, `c`; the `x`s fail at the second) fails its completion there, as the request's fault (GrammarFailure is
    a RequestError naming the field). llguidance's copies of a kept matcher share its lexer, so later copies used to
    fail at their first mask, whose only allowed ids were the stop ids: those requests ended at once, empty, as if
    complete. A failure drops the kept matcher, so each request meets the grammar afresh and fails as the first
    did, at the same token, with the engine's reason."""
    factory = compiler.structured_outputs(StructuredOutputsParams(regex="(c|x{999999999})"), "structured_outputs.regex")
    masks = GrammarMasks(512, 1)
    c, x = tokenizer.encode_text("c")[0], tokenizer.encode_text("x")[0]
    for _ in range(3):
        controller = factory()
        bitmask = masks.fill([controller])
        assert controller.failure is None  # the first mask is the grammar's own: `c` or `x`s
        allowed = unpack_token_bitmask(bitmask, 512)[0].nonzero().flatten().tolist()
        assert c in allowed and x in allowed
        assert not controller.observe(x)
        masks.fill([controller])
        with pytest.raises(GrammarFailure, match="too many expressions") as raised:
            controller.observe(x)
        assert isinstance(raised.value, RequestError) and raised.value.param == "structured_outputs.regex"
        assert str(raised.value).startswith("structured_outputs.regex: the grammar engine stopped on this constraint")
        assert "Tokens:" not in str(raised.value)  # not the completion's text, which llguidance's state spells


def test_a_constraint_past_the_grammar_engines_limits_at_its_first_token_is_refused_naming_the_field(compiler):
    """`c{999999999}` compiled, then failed every request at its first token, with a 500 (mid-stream after a 200)."""
    with pytest.raises(RequestError, match="too many expressions") as raised:
        compiler.structured_outputs(StructuredOutputsParams(regex="c{999999999}"), "structured_outputs.regex")
    assert raised.value.param == "structured_outputs.regex" and not isinstance(raised.value, GrammarFailure)


@pytest.mark.parametrize("params", [
    StructuredOutputsParams(regex=r"a<\|b"), StructuredOutputsParams(grammar='root ::= "a<" "|b"'),
    StructuredOutputsParams(json={"type": "string", "pattern": r"^<\|x$"}),
])
def test_a_chat_answer_that_must_spell_a_framing_marker_is_refused_before_it_runs(compiler, params):
    """The grammar's text holds no `<|` (`chat_answer_grammar` takes it), but every answer would spell one, which
    used to fail the request mid-generation with a 500; completions, whose raw text may hold it, take it."""
    with pytest.raises(RequestError, match="a chat answer cannot contain") as raised:
        compiler.turn(TurnConstraint(answer=chat_answer_grammar(params, "structured_outputs"), thinking_token_budget=0),
                      "structured_outputs")
    assert raised.value.param == "structured_outputs"
    compiler.structured_outputs(params)


def test_a_chat_answer_schema_whose_annotations_name_a_framing_marker_is_taken(compiler):
    """A `description` or `title` is never written, yet a schema whose docs mentioned `<|eot|>` was refused as a chat
    answer that would spell it (a tool's parameters with the same description were taken)."""
    schema = {"type": "object", "title": "<|x|>", "description": "never write <|eot|>", "$defs": {"flag": {
        "type": "boolean", "description": "<|", "examples": ["<|"], "default": "<|"}},
              "properties": {"description": {"$ref": "#/$defs/flag", "$comment": "<|start|>"}},
              "required": ["description"], "additionalProperties": False}
    answer = chat_answer_grammar(StructuredOutputsParams(json=schema), "response_format")
    compiler.turn(TurnConstraint(answer=answer, thinking_token_budget=0), "response_format")


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"<|eot|>": {"type": "boolean"}}, "required": ["<|eot|>"]},
    {"enum": ["a", "<|eot|>"]}, {"const": {"description": "<|eot|>"}},
    {"type": "object", "properties": {"title": {"const": "<|"}}, "required": ["title"]},
])
def test_a_chat_answer_schema_that_writes_a_framing_marker_is_still_refused(schema):
    with pytest.raises(RequestError, match="a chat answer cannot contain '<|'"):
        chat_answer_grammar(StructuredOutputsParams(json=schema), "response_format")


def _allowed_after(controller: GrammarController, tokens: list[int]) -> list[int]:
    """The ids the engine's mask allows once `tokens` were generated (each observed after its own mask)."""
    masks = GrammarMasks(512, 1)
    for token in tokens:
        masks.fill([controller])
        controller.observe(token)
    return unpack_token_bitmask(masks.fill([controller]), 512)[0].nonzero().flatten().tolist()


def _answer_turn(compiler, grammar: str) -> GrammarController:
    answer = chat_answer_grammar(StructuredOutputsParams(grammar=grammar), "guided_grammar")
    return compiler.turn(TurnConstraint(answer=answer, thinking_token_budget=0), "guided_grammar")()


@pytest.mark.parametrize("token", ["<|eot|>", "<|start|>", "<|reserved_special_token_0|>"])
def test_a_chat_answer_that_must_hold_a_special_token_by_id_is_refused_before_it_runs(compiler, tokenizer, token):
    """Lark names a token by id (`<[N]>`), which the text check for `<|` cannot see: `"ok" <[eot]> "more"` ended
    the answer at `ok` as a normal stop, and `<[start]>` put framing inside the answer. Every answer of these holds
    one, so the constraint is refused up front; completions, whose raw text may hold special tokens, take it."""
    grammar = f'start: "ok" <[{tokenizer.require_token_id(token)}]> "more"'
    with pytest.raises(RequestError, match="a chat answer cannot contain special tokens") as raised:
        _answer_turn(compiler, grammar)
    assert raised.value.param == "guided_grammar" and token in str(raised.value)


@pytest.mark.parametrize("token", ["<|eot|>", "<|start|>", "<|eom|>", "<|message|>", "<|reserved_special_token_0|>"])
def test_a_chat_answer_never_takes_a_special_token_its_grammar_offers(compiler, tokenizer, token):
    """Where the answer's grammar offers a special token beside text, the mask keeps only the text; the answer's
    header (`<|message|>`) and the `<|eot|>` that completes the turn stay allowed."""
    special = tokenizer.require_token_id(token)
    controller = _answer_turn(compiler, f'start: "ok" (<[{special}]> | "x") "more"')
    header = tokenizer.encode_text(" to=user") + [tokenizer.require_token_id("<|message|>")]
    allowed = _allowed_after(controller, header + tokenizer.encode_text("ok"))
    assert allowed == tokenizer.encode_text("x")[:1] and controller.refusal is None
    assert tokenizer.require_token_id("<|eot|>") in _allowed_after(controller, tokenizer.encode_text("xmore"))


@pytest.mark.parametrize("token", ["<|eot|>", "<|start|>"])
def test_a_chat_answer_that_needs_a_special_token_while_generating_fails_as_the_requests_fault(compiler, tokenizer,
                                                                                               token):
    """A branch the answer may take (`a` or `ok`) that needs a special token fails its request there, naming the
    field, rather than end the answer (`<|eot|>`: a normal stop) or put framing inside it (`<|start|>`)."""
    special = tokenizer.require_token_id(token)
    controller = _answer_turn(compiler, f'start: "a" | "ok" <[{special}]> "more"')
    header = tokenizer.encode_text(" to=user") + [tokenizer.require_token_id("<|message|>")]
    assert _allowed_after(controller, header + tokenizer.encode_text("ok")) == [special]
    with pytest.raises(GrammarFailure, match="a chat answer cannot contain special tokens") as raised:
        controller.observe(special)
    assert raised.value.param == "guided_grammar" and token in str(raised.value)


def test_a_completion_takes_a_special_token_but_no_stop_token_before_its_grammar_is_complete(compiler, tokenizer):
    """Raw text may hold special tokens, but a stop token ends generation: one the grammar needs before it is
    complete ended the completion as a normal stop with the constraint unmet. It is refused up front when every
    output holds it, steered around where text is offered beside it, and fails its request where it is needed;
    where it completes the grammar, or where it stops nothing (`ignore_eos`), it is taken."""
    eot, reserved = (tokenizer.require_token_id(t) for t in ("<|eot|>", "<|reserved_special_token_0|>"))
    stops = frozenset(tokenizer.require_token_id(t) for t in ("<|eot|>", "<|end_of_text|>"))

    def completion(grammar: str, stop_token_ids=stops) -> GrammarController:
        return compiler.structured_outputs(StructuredOutputsParams(grammar=grammar), "guided_grammar")(stop_token_ids)

    with pytest.raises(RequestError, match="a stop token that ends generation there") as raised:
        completion(f'start: "ok" <[{eot}]> "more"')
    assert raised.value.param == "guided_grammar"
    ok = tokenizer.encode_text("ok")
    assert _allowed_after(completion(f'start: "ok" (<[{eot}]> | "x") "more"'), ok) == tokenizer.encode_text("x")[:1]
    needed = completion(f'start: "ok" <[{eot}]> ("a" | "b")')
    assert _allowed_after(needed, ok) == [eot]
    with pytest.raises(GrammarFailure, match="needs <\\|eot\\|> before it is complete"):
        needed.observe(eot)
    assert eot in _allowed_after(completion(f'start: "ok" <[{eot}]>'), ok)
    assert _allowed_after(completion(f'start: "ok" <[{eot}]> "more"', frozenset()), ok) == [eot]
    assert _allowed_after(completion(f'start: "ok" <[{reserved}]> "x"'), ok) == [reserved]


def test_a_stop_token_the_request_added_that_a_constraint_must_hold_is_refused_naming_stop_token_ids(compiler,
                                                                                                     tokenizer):
    """`stop_token_ids: [<|message|>]` with a forced call (no reasoning) was refused naming `tools`, whose framing
    cannot leave `<|message|>` out, and advised `ignore_eos`, which keeps a request's own stop ids; the field to
    change is `stop_token_ids`. A stop token of the checkpoint's still names the constraint."""
    stops = frozenset(tokenizer.require_token_id(t) for t in ("<|eot|>", "<|end_of_text|>"))
    forced_call = compiler.turn(TurnConstraint(call_tools=[CLOCK], must_call=True, thinking_token_budget=0))
    with pytest.raises(RequestError, match="leave it out of stop_token_ids") as raised:
        forced_call(stops | {tokenizer.require_token_id("<|message|>")})
    assert raised.value.param == "stop_token_ids" and "<|message|>" in str(raised.value)
    forced_call(stops)
    eot = tokenizer.require_token_id("<|eot|>")
    with pytest.raises(RequestError, match="with ignore_eos") as raised:
        compiler.structured_outputs(StructuredOutputsParams(grammar=f'start: "ok" <[{eot}]> "more"'),
                                    "guided_grammar")(stops)
    assert raised.value.param == "guided_grammar"


def test_a_turns_free_answer_is_guarded_without_walking_a_copy_of_its_matcher_each_step(compiler, tokenizer,
                                                                                         monkeypatch):
    """The guard against stop tokens that do not complete the grammar walked a copy of the matcher through every
    allowed one: a free answer allows `<|eot|>` at every step, and the walk (llguidance settles the grammar's end)
    cost as much as the step's mask, 7x the grammar's cost per step for tool and thinking-budget turns. A turn's
    own grammar names `<|eot|>` only where it ends, so it completes wherever it is allowed."""
    walks = []
    monkeypatch.setattr("glimmer.engine.grammar._completes", lambda matcher, token_id: walks.append(token_id) or True)
    eot = tokenizer.require_token_id("<|eot|>")
    controller = compiler.turn(TurnConstraint(call_tools=[CLOCK], thinking_token_budget=0))()
    header = tokenizer.encode_text(" to=user") + [tokenizer.require_token_id("<|message|>")]
    assert eot in _allowed_after(controller, header + tokenizer.encode_text("it is late"))
    assert walks == [] and controller.refusal is None
    assert controller.observe(eot)


def test_a_strict_schema_with_an_anyof_branch_no_value_meets_is_taken_for_its_other_branches():
    """Bounds that contradict each other are refused naming them (`minLength` 4 above `maxLength` 2), but not in a
    branch of an `anyOf` or `oneOf`, which the other branches leave satisfiable."""
    empty = {"type": "array", "minItems": 1, "maxItems": 0}
    check_json_schema({"type": "object", "properties": {"p": {"anyOf": [empty, {"type": "integer"}]}},
                       "required": ["p"]}, "response_format", strict=True)
    with pytest.raises(RequestError) as raised:
        check_json_schema({"type": "object", "properties": {"p": {"allOf": [empty]}}, "required": ["p"]},
                          "response_format", strict=True)
    assert raised.value.param == "response_format.properties.p.allOf[0]"
    assert str(raised.value).startswith("response_format.properties.p.allOf[0]: minItems 1 is above maxItems 0")


@pytest.fixture
def validations(monkeypatch) -> list[str]:
    """The grammars the grammar engine validates from here on, with the tool-schema caches emptied."""
    import llguidance

    from glimmer.engine import grammar

    calls: list[str] = []
    validate = llguidance.LLMatcher.validate_grammar_with_warnings
    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar_with_warnings",
                        staticmethod(lambda text: calls.append(text) or validate(text)))
    grammar._unsatisfiable_optional_parameter.cache_clear()
    grammar._accepted_schema.cache_clear()
    return calls


def test_a_tools_schema_and_optional_parameters_are_checked_once_for_the_same_schema(validations):
    # the schema and each optional parameter as if required are checked (up to a millisecond each for nested
    # parameters); an agent sends the same tools with every request, so the verdicts are kept: the second request
    # runs no grammar validation for them
    from glimmer.engine import grammar

    parameters = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5)}, "required": ["p0"]}
    grammar.check_tool_parameters(parameters, "tools[0].function.parameters")
    first = len(validations)
    assert first == 1 + 4  # the schema, then each of the four optional parameters required
    grammar.check_tool_parameters(json.loads(json.dumps(parameters)), "tools[3].function.parameters")
    assert len(validations) == first
    never = {**parameters, "properties": {**parameters["properties"], "x": {"type": "string", "pattern": "ab",
                                                                           "maxLength": 1}}}
    for index in (0, 2):  # the cached answer names the parameter at the tool's own place
        with pytest.raises(RequestError) as raised:
            grammar.check_tool_parameters(never, f"tools[{index}].function.parameters")
        assert raised.value.param == f"tools[{index}].function.parameters.properties.x"


def test_a_kept_schema_verdict_is_never_another_schemas(validations):
    """The verdict kept for a tool's schema is keyed by its JSON text: a refused schema is refused again, naming
    each request's own field; a schema of the same text that JSON does not hold whole (a tuple) is checked itself."""
    from glimmer.engine import grammar

    refused = {"type": "object", "properties": {"a": {"type": "strin"}}}
    for index in (0, 4):
        with pytest.raises(RequestError) as raised:
            grammar.check_tool_parameters(refused, f"tools[{index}].function.parameters")
        assert raised.value.param.startswith(f"tools[{index}].function.parameters")
    accepted = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}}
    grammar.check_tool_parameters(accepted, "tools[0].function.parameters")
    before = len(validations)
    grammar.check_tool_parameters({"type": "object", "properties": {"a": {"enum": ("x", "y")}}},
                                  "tools[0].function.parameters")
    assert len(validations) > before
    grammar.check_tool_parameters({**accepted, "properties": {"a": {"enum": ["x", "z"]}}},
                                  "tools[1].function.parameters")
    assert len(validations) > before + 1


def test_a_repeated_turn_grammar_is_built_once_for_an_equal_constraint_only(compiler, tokenizer, monkeypatch):
    """An agent sends the same tools with every request: the turn's grammar text is built once for them (its tools'
    schemas walked once), and taken again only for an equal constraint: not after a tool's schema was changed in
    place, nor for one whose JSON text is the same but whose values are not (a tuple for a list)."""
    from glimmer.engine import grammar

    built = []
    build = grammar.turn_grammar
    monkeypatch.setattr(grammar, "turn_grammar", lambda constraint: built.append(constraint) or build(constraint))
    tool = normalize_tools([{"name": "pick", "parameters": {"type": "object", "properties": {
        "color": {"type": "string", "enum": ["teal", "plum"]}}, "required": ["color"]}}])[0]
    constraint = TurnConstraint(call_tools=[tool], must_call=True)
    first = compiler.turn(constraint)()
    compiler.turn(TurnConstraint(call_tools=[json.loads(json.dumps(tool))], must_call=True))
    assert len(built) == 1
    tool["function"]["parameters"]["properties"]["color"]["enum"] = ["gold"]
    changed = compiler.turn(constraint)()
    assert len(built) == 2
    compiler.turn(TurnConstraint(call_tools=(tool,), must_call=True))
    assert len(built) == 3
    call = ' to=pick<|message|><atem:function_calls>\n<atem:invoke name="pick">\n<atem:parameter name="color">'
    teal = tokenizer.encode(call + "teal")  # each controller follows its own grammar: teal only before the change
    assert first.accepted_prefix(teal) == len(teal)
    assert changed.accepted_prefix(teal) < len(teal)


@pytest.mark.parametrize("stopped_early", [False, True])
def test_verification_takes_the_masks_the_drafters_walk_computed(compiler, tokenizer, stopped_early):
    """The drafter walks a copy of the matcher through its drafts, computing the mask before each (`GrammarWalk`);
    verification computed those masks again, and the one after the last draft: it takes the walk's and computes only
    the last (the walk's own where it has it). The rows are those computed afresh; drafts the walk did not propose,
    or proposed from another position, are computed afresh."""
    from glimmer.engine.grammar import GrammarWalk

    factory = compiler.structured_outputs(StructuredOutputsParams(json=SCHEMA), "response_format")
    drafts = tokenizer.encode_text('{"ok": ')
    opened = tokenizer.encode_text("{")

    def walked(controller: GrammarController, tokens: list[int]) -> GrammarWalk:
        walk = GrammarWalk(controller)
        for token in tokens:
            assert walk.mask() is not None
            walk.advance(token)
        if stopped_early:  # the drafter looked at the next position and proposed nothing there
            assert walk.mask() is not None
        return walk

    fresh = GrammarMasks(512, 1).fill_verification([factory()], [drafts])
    controller = factory()
    walk = walked(controller, drafts)
    walk.masks[0][0] = 12345  # a mark: a row taken from the walk, not computed again
    taken = GrammarMasks(512, 1).fill_verification([controller], [drafts])
    assert taken[0, 0] == 12345 and torch.equal(taken[1:], fresh[1:]) and torch.equal(taken[0, 1:], fresh[0, 1:])
    assert controller.last_walk is None  # taken once
    controller = factory()
    walked(controller, drafts)
    assert torch.equal(GrammarMasks(512, 1).fill_verification([controller], [drafts[:-1] + opened]),
                       GrammarMasks(512, 1).fill_verification([factory()], [drafts[:-1] + opened]))
    controller = factory()
    walk = walked(controller, drafts)
    walk.masks[0][0] = 12345
    controller.observe(drafts[0])  # the walk began before this token: its masks are another position's
    assert torch.equal(GrammarMasks(512, 1).fill_verification([controller], [drafts[1:]]),
                       GrammarMasks(512, 1).fill_verification([_observed(factory(), drafts[:1])], [drafts[1:]]))


def _observed(controller: GrammarController, tokens: list[int]) -> GrammarController:
    for token in tokens:
        controller.observe(token)
    return controller


def test_a_stop_token_the_request_added_that_a_chat_answer_needs_names_stop_token_ids(compiler, tokenizer):
    """`stop_token_ids` holding a text token that a chat answer's constraint needs (`y` of a choice `yes`) failed the
    request while generating saying that a chat answer cannot contain special tokens, naming the constraint, whose
    answers hold no special token: the field to change is `stop_token_ids`, as on completions. Every answer holding
    it is refused up front; an answer that comes to need it fails there, naming `stop_token_ids`."""
    y = tokenizer.require_token_id("y")
    stops = frozenset(tokenizer.require_token_id(t) for t in ("<|eot|>", "<|end_of_text|>")) | {y}
    header = tokenizer.encode_text(" to=user") + [tokenizer.require_token_id("<|message|>")]

    def answer_turn(choice: list[str]):
        answer = chat_answer_grammar(StructuredOutputsParams(choice=choice), "guided_choice")
        return compiler.turn(TurnConstraint(answer=answer, thinking_token_budget=0), "guided_choice")

    with pytest.raises(RequestError, match="leave it out of stop_token_ids") as raised:
        answer_turn(["yes"])(stops)
    assert raised.value.param == "stop_token_ids" and "y ends generation" in str(raised.value)
    controller = answer_turn(["ok", "xyz"])(stops)
    assert _allowed_after(controller, header + tokenizer.encode_text("x")) == [y]
    with pytest.raises(GrammarFailure, match="leave it out of stop_token_ids") as raised:
        controller.observe(y)
    assert raised.value.param == "stop_token_ids" and "special tokens" not in str(raised.value)


@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "object"}])
def test_a_chat_answers_free_text_is_steered_around_a_framing_marker(compiler, tokenizer, schema):
    """A JSON string (or an object's key) the schema leaves free may hold `<|`, which a chat answer cannot spell
    (P-CHAN-6): the request failed with a 400 blaming a valid `response_format` whenever the model wrote it, as a
    random model (or one quoting code) does. The mask keeps such tokens out where the grammar offers others, and
    the failure stays for an answer that needs one (`test_a_chat_answer_that_spells_a_framing_marker_...`)."""
    answer = chat_answer_grammar(StructuredOutputsParams(json=schema), "response_format")
    controller = compiler.turn(TurnConstraint(answer=answer, thinking_token_budget=0), "response_format")()
    header = tokenizer.encode_text(" to=user") + [tokenizer.require_token_id("<|message|>")]
    opening = tokenizer.encode_text('"' if schema["type"] == "string" else '{"')
    texts = {t: tokenizer.token_bytes(t) for t in range(tokenizer.vocab_size) if t not in tokenizer.all_special_ids}
    spelling = {t for t, text in texts.items() if b"<|" in text}  # none in the tiny vocabulary: `<` then `|`
    bars = {t for t, text in texts.items() if text.startswith(b"|")}
    allowed = set(_allowed_after(controller, header + opening))
    assert not allowed & spelling and tokenizer.encode_text("<")[0] in allowed
    after_open = set(_allowed_after(controller, tokenizer.encode_text("<")))
    assert bars and not after_open & bars and tokenizer.encode_text("a")[0] in after_open
    assert controller.refusal is None and controller.failure is None


@pytest.mark.parametrize("schema", [{"type": "integer", "format": "int32"}, {"type": "number", "format": "float"},
                                    {"type": ["integer", "null"], "format": "uint8"}])
def test_a_strict_format_on_a_number_is_refused_naming_it(compiler, tokenizer, schema):
    """The grammar engine holds `format` on strings only (an unknown one there it refuses): OpenAPI's `int32` on an
    integer was taken by a strict schema and ignored, and the answer was 71231649312021020256420255402740202. A
    non-strict schema keeps it as a hint; a format beside `enum` or on a string schema is the engine's to judge."""
    assert _admits(compiler, tokenizer, StructuredOutputsParams(json=schema, strict=False), "99999999999")
    raised = _strict_refusal(schema)
    assert f"format {schema['format']!r}" in str(raised) and "minimum and maximum" in str(raised)
    check_json_schema({**schema, "enum": [1, 2]}, "p", strict=True)
    check_json_schema({"type": ["string", "integer"], "format": "date"}, "p", strict=True)


def test_a_forced_calls_json_value_is_steered_around_a_framing_marker(compiler, tokenizer):
    """A typed value's JSON string (`tags`' items) may hold `<|` as its schema reads; the call would end there
    (P-CHAN-6), and the request failed with a 400 blaming the tool's schema whenever the model wrote it. The mask
    keeps `|` from following `<` there too."""
    controller = compiler.turn(TurnConstraint(call_tools=[LOOKUP], must_call=True, thinking_token_budget=0))()
    written = call("lookup", ("city", "Oslo"), ("days", "2")).split("</atem:invoke>")[0]
    prefix = written + '<atem:parameter name="tags">["'
    bars = {t for t in range(tokenizer.vocab_size) if t not in tokenizer.all_special_ids
            and tokenizer.token_bytes(t).startswith(b"|")}
    after_open = set(_allowed_after(controller, tokenizer.encode(prefix) + tokenizer.encode_text("<")))
    assert bars and not after_open & bars and tokenizer.encode_text("a")[0] in after_open


@pytest.mark.parametrize(("option", "value", "broken", "not_json"), [
    ("item_separator", ";", '{"a": 1;"b": 2}', True),
    ("key_separator", "=", '{"a"=1}', True),
    ("item_separator", ",", '{"a": 1,"b": 2}', False),
    ("key_separator", " : ", '{"a" : 1}', False),
    ("whitespace_flexible", True, '{ "a" :   1 }', False),
    ("whitespace_pattern", "[ x]*", '{x"a": 1}', False),
])
@pytest.mark.parametrize("strict", [True, False])
def test_a_schema_whose_own_engine_options_lay_the_json_out_otherwise_is_refused_naming_them(
        compiler, tokenizer, option, value, broken, not_json, strict):
    """A schema's `x-guidance` layout options won over Glimmer's `JSON_LAYOUT`: `item_separator: ";"` let the output
    be text that is not JSON, free whitespace let it run on; the layout they would change is refused, strict or not."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    laid_out = {**schema, "x-guidance": {option: value}}
    for check in (lambda: answer_grammar(StructuredOutputsParams(json=laid_out, strict=strict), "guided_json"),
                  lambda: check_json_schema(laid_out, "guided_json", strict=strict)):
        with pytest.raises(RequestError) as raised:
            check()
        assert raised.value.param == "guided_json" and f"x-guidance.{option} {json.dumps(value)}" in str(raised.value)
        # a separator JSON allows (whitespace around its , or :) is refused for the layout alone, not as "not JSON"
        assert ("is not JSON" in str(raised.value)) is not_json
    # Glimmer's own layout, given again, changes nothing
    same = {**schema, "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}}
    params = StructuredOutputsParams(json=same, strict=strict)
    assert _admits(compiler, tokenizer, params, '{"a": 1, "b": 2}')
    assert not _admits(compiler, tokenizer, params, broken)


@pytest.mark.parametrize("strict", [True, False])
def test_a_tool_parameter_whose_own_engine_options_lay_its_value_out_otherwise_is_refused(strict):
    """A parameter's schema is the root of its value's grammar, where the engine reads its `x-guidance`: a strict
    tool's forced call wrote `{"a": [1;2]}`'s `a` as the text `[7;7;7]`, read back as a string."""
    parameters = {"type": "object", "required": ["a"], "$defs": {"pair": {"type": "integer"}},
                  "properties": {"a": {"type": "array", "items": {"$ref": "#/$defs/pair"}, "minItems": 2,
                                       "x-guidance": {"item_separator": ";"}}}}
    with pytest.raises(RequestError) as raised:
        check_tool_parameters(parameters, "tools[0].function.parameters", strict)
    assert raised.value.param == "tools[0].function.parameters.properties.a"
    assert str(raised.value).startswith('tools[0].function.parameters.properties.a: x-guidance.item_separator ";"')
    del parameters["properties"]["a"]["x-guidance"]
    check_tool_parameters(parameters, "tools[0].function.parameters", strict)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(("definition", "reference"), [
    ({"$anchor": "count"}, "#count"),
    ({"$id": "count.json"}, "count.json"),
])
def test_a_tool_reference_by_anchor_or_id_is_refused_since_a_call_cannot_follow_it(compiler, tokenizer, strict,
                                                                                   definition, reference):
    """The engine follows an `$anchor` or `$id` in the whole schema, but a call's value grammar reroots each
    parameter's schema: the reference led nowhere and a strict tool's integer was written as free text."""
    parameters = {"$id": "https://example.com/tool.json", "type": "object", "required": ["a"],
                  "$defs": {"count": {**definition, "type": "integer", "minimum": 100, "maximum": 105}},
                  "properties": {"a": {"$ref": reference}}}
    for _ in range(2):  # the second time from the cached verdict
        with pytest.raises(RequestError) as raised:
            check_tool_parameters(parameters, "tools[0].function.parameters", strict)
        assert raised.value.param == "tools[0].function.parameters.properties.a"
        assert str(raised.value).startswith(f"tools[0].function.parameters.properties.a: $ref {reference!r}")
    parameters["properties"]["a"]["$ref"] = "#/$defs/count"  # the pointer the message asks for
    check_tool_parameters(parameters, "tools[0].function.parameters", strict)
    tools = normalize_tools([{"type": "function", "function": {"name": "f", "parameters": parameters,
                                                                "strict": strict}}])
    constraint = TurnConstraint(call_tools=tools, must_call=True)
    assert admits(compiler, tokenizer, constraint, call("f", ("a", "101")))
    assert not admits(compiler, tokenizer, constraint, call("f", ("a", "7")))


def test_a_layout_option_below_an_answer_schemas_root_is_refused_naming_its_path_not_dropped():
    """Below an answer schema's root the engine would ignore `x-guidance`: it is refused there too, naming where it is,
    and a value the Python API passes that is no JSON is shown by its repr (json.dumps raised a bare TypeError)."""
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"},
                                                     "x-guidance": {"item_separator": ";"}}}}
    with pytest.raises(RequestError) as raised:
        answer_grammar(StructuredOutputsParams(json=schema), "guided_json")
    assert raised.value.param == "guided_json.properties.a"
    assert str(raised.value).startswith('guided_json.properties.a: x-guidance.item_separator ";"')
    schema["properties"]["a"]["x-guidance"] = {"key_separator": {";"}}
    with pytest.raises(RequestError) as raised:
        answer_grammar(StructuredOutputsParams(json=schema), "structured_outputs")
    assert raised.value.param == "structured_outputs.properties.a" and "x-guidance.key_separator {';'}" in str(
        raised.value)
