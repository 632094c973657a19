"""Structured outputs through the Python API: `SamplingParams(structured_outputs=...)` on raw text with
`LLM.generate`, and on the answer (reasoning free) with `LLM.chat`, plus `tool_choice` and `response_format`."""

from __future__ import annotations

import json

import jsonschema
import pytest

from glimmer import LLM, SamplingParams, StructuredOutputsParams
from glimmer.engine.grammar import GrammarFailure
from glimmer.engine.llm_engine import StepError
from glimmer.errors import RequestError, ToolChoiceUnsatisfiedError

KWARGS = {"current_date": "2026-01-01"}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "sky": {"enum": ["clear", "grey"]}},
          "required": ["n", "sky"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "clock", "description": "The time.", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}, "exact": {"type": "boolean"}},
    "required": ["zone"]}}}
MESSAGES = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(str(tiny_checkpoint), progress=False, kv_cache_memory=16 << 20, max_model_len=2048)


def test_generate_constrains_the_raw_text(llm):
    params = [SamplingParams(max_tokens=40, seed=seed, structured_outputs=StructuredOutputsParams(json=SCHEMA))
              for seed in range(4)]
    for output in llm.generate(["The weather as JSON:"] * 4, params):
        assert output.outputs[0].finish_reason == "stop"
        jsonschema.validate(json.loads(output.outputs[0].text), SCHEMA)
    regex = SamplingParams(max_tokens=10, structured_outputs=StructuredOutputsParams(regex=r"[0-9]{2}:[0-9]{2}"))
    text = llm.generate("Time:", regex)[0].outputs[0].text
    assert len(text) == 5 and text[2] == ":"


def test_a_grammar_completed_by_the_last_token_max_tokens_allows_ends_with_stop(llm):
    """P-API-2: `length` when the token limit ended generation. A grammar completed by the max_tokens-th token ends
    the output there anyway (the same text as with room to spare), yet it was reported `length`, so a caller (the
    openai SDK's `parse`) discarded a complete answer as cut short."""
    for constraint in (StructuredOutputsParams(json=SCHEMA), StructuredOutputsParams(choice=["clear sky tonight"])):
        roomy = llm.generate("Now:", SamplingParams(max_tokens=40, seed=2, structured_outputs=constraint))[0].outputs[0]
        assert roomy.finish_reason == "stop"
        exact, short = (llm.generate("Now:", SamplingParams(max_tokens=len(roomy.token_ids) + extra, seed=2,
                                                            structured_outputs=constraint))[0].outputs[0]
                        for extra in (0, -1))
        assert (exact.finish_reason, exact.text, exact.token_ids) == ("stop", roomy.text, roomy.token_ids)
        assert short.finish_reason == "length" and short.token_ids == roomy.token_ids[:-1]


def test_chat_constrains_the_answer_and_leaves_reasoning_free(llm):
    outputs = llm.chat([MESSAGES] * 3, SamplingParams(max_tokens=50, seed=3),
                       response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}},
                       thinking_token_budget=10, chat_template_kwargs=KWARGS)
    for output in outputs:
        assert output.finish_reason == "stop" and not output.tool_calls
        jsonschema.validate(json.loads(output.content), SCHEMA)
    choice = SamplingParams(max_tokens=30, structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    assert llm.chat(MESSAGES, choice, thinking_token_budget=0, chat_template_kwargs=KWARGS)[0].content in ("yes", "no")


def test_chat_forces_a_valid_call_with_tool_choice(llm):
    for tool_choice in ("required", {"type": "function", "function": {"name": "clock"}}):
        output = llm.chat(MESSAGES, SamplingParams(max_tokens=100, seed=1), tools=[TOOL], tool_choice=tool_choice,
                          parallel_tool_calls=False, thinking_token_budget=4, chat_template_kwargs=KWARGS)[0]
        assert output.finish_reason == "tool_calls" and output.content is None
        ((call),) = output.tool_calls
        assert call.name == "clock"
        jsonschema.validate(json.loads(call.arguments), TOOL["function"]["parameters"])


def test_chat_raises_when_max_tokens_cuts_a_forced_call_short_before_it_is_written(llm):
    # P-REQ-4, as the server answers it: no ChatOutput with finish_reason "length" and no call
    conversations = [MESSAGES, [{"role": "user", "content": "Time?"}]]
    with pytest.raises(ToolChoiceUnsatisfiedError) as raised:
        llm.chat(conversations, SamplingParams(max_tokens=3, seed=1), tools=[TOOL], tool_choice="required",
                 thinking_token_budget=0, chat_template_kwargs=KWARGS)
    assert str(raised.value) == (
        "tool_choice asked for a call of 'clock', but choice 0 of conversation 0 was cut short by max_tokens "
        '(finish_reason "length") before a complete call; raise max_tokens so that the reasoning and the call fit')
    assert not llm.engine.has_unfinished_requests


def test_chat_says_to_shorten_the_conversation_when_the_context_ends_before_a_forced_call(llm):
    # P-REQ-4: without max_tokens the reply runs to the end of the context; the error said to raise max_tokens,
    # which cannot help there (prompt + max_tokens past max_model_len is refused)
    words, room = 0, None
    while room is None or not 1 <= room <= 3:  # pad the prompt until fewer tokens are left than a call needs
        if room is not None:
            words += (room - 2) // len(llm.engine.tokenizer.encode(" now")) or (1 if room > 3 else -1)
        messages = [{"role": "user", "content": "Time?" + " now" * words}]
        prompt = llm.chat(messages, SamplingParams(max_tokens=1), tools=[TOOL], chat_template_kwargs=KWARGS)[0]
        room = llm.engine.max_model_len - len(prompt.prompt_token_ids)
    with pytest.raises(ToolChoiceUnsatisfiedError) as raised:
        llm.chat(messages, SamplingParams(max_tokens=None, seed=1), tools=[TOOL], tool_choice="required",
                 thinking_token_budget=0, chat_template_kwargs=KWARGS)
    assert str(raised.value) == (
        f"tool_choice asked for a call of 'clock', but choice 0 reached the end of the context (max_model_len="
        f"{llm.engine.max_model_len}) before a complete call; shorten the conversation so that the reasoning and the "
        "call fit")


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"<|eot|>": {"type": "boolean"}}, "required": ["<|eot|>"],
     "additionalProperties": False},
    {"type": "array", "items": {"const": "a<|start|>"}, "minItems": 1}])
def test_a_forced_call_whose_tool_schema_spells_a_framing_marker_fails_naming_the_tools(llm, schema):
    """P-CHAN-6: a typed value's JSON written as text ended the call where its schema spelled `<|eot|>`; the call was
    lost and the server answered 500 tool_choice_unsatisfied ("retry"), which no retry mends. It fails as the
    request's fault, naming `tools` (a 400 on the server). `LLM.chat` raises it as the RequestError it is (it was
    a StepError wrapping it), the engine's StepError as its cause."""
    tool = {"type": "function", "function": {"name": "mark", "parameters": {
        "type": "object", "properties": {"value": schema}, "required": ["value"]}}}
    with pytest.raises(GrammarFailure) as raised:
        llm.chat(MESSAGES, SamplingParams(max_tokens=60, seed=1), tools=[tool], tool_choice="required",
                 thinking_token_budget=0, chat_template_kwargs=KWARGS)
    assert raised.value.param == "tools" and isinstance(raised.value.__cause__, StepError)
    assert "a tool call's value spelled a framing marker" in str(raised.value)
    assert not llm.engine.has_unfinished_requests


def test_conflicting_or_impossible_requests_are_refused(llm):
    structured = SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True))
    with pytest.raises(RequestError) as raised:
        llm.chat(MESSAGES, structured, response_format={"type": "json_object"})
    assert raised.value.param == "response_format"
    with pytest.raises(RequestError) as raised:
        llm.generate("x", SamplingParams(min_tokens=2, structured_outputs=StructuredOutputsParams(regex="a+")))
    assert raised.value.param == "min_tokens"
    with pytest.raises(RequestError) as raised:
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(json={"type": 7})))
    assert raised.value.param == "structured_outputs"
    assert not llm.engine.has_unfinished_requests


def test_chat_forces_a_call_of_a_tool_whose_schema_uses_keywords_the_engine_does_not_implement(llm):
    """`uniqueItems` (pydantic's `set[...]`) failed every grammar-backed turn; a non-strict tool ignores it, and a
    strict one is refused naming its parameters."""
    tagger = {"type": "function", "function": {"name": "tagger", "parameters": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "uniqueItems": True}}, "required": ["tags"]}}}
    output = llm.chat(MESSAGES, SamplingParams(max_tokens=60, seed=1), tools=[tagger], tool_choice="required",
                      parallel_tool_calls=False, thinking_token_budget=0, chat_template_kwargs=KWARGS)[0]
    ((call),) = output.tool_calls
    assert call.name == "tagger" and set(json.loads(call.arguments)["tags"]) <= {"red", "blue"}
    strict = {"type": "function", "function": {**tagger["function"], "strict": True}}
    with pytest.raises(RequestError) as raised:
        llm.chat(MESSAGES, SamplingParams(max_tokens=5), tools=[strict], tool_choice="required")
    assert raised.value.param == "tools[0].function.parameters" and "uniqueItems" in str(raised.value)


def test_requests_failing_in_one_step_each_keep_their_own_cause(llm):
    """A constraint's failure is its request's fault (GrammarFailure, a 400 on the server), any other is internal
    (a 500): when both come in one step, each request is told its own, not the step's first."""
    engine = llm.engine
    compiled = engine.grammars.structured_outputs(StructuredOutputsParams(regex="[a-z]{8}"))

    def failing_with(error: Exception):
        def controller(stop_token_ids=None):
            made = compiled(stop_token_ids)

            def observe(token_id: int) -> bool:
                raise error

            made.observe = observe
            return made
        return controller

    constraint = GrammarFailure("structured_outputs.regex: spelled a marker", param="structured_outputs.regex")
    params = SamplingParams(max_tokens=4)
    engine.add_request("faulty", [1, 5, 9], params, controller_factory=failing_with(constraint))
    engine.add_request("broken", [1, 5, 9], params, controller_factory=failing_with(RuntimeError("broke")))
    with pytest.raises(StepError) as failure:
        while engine.has_unfinished_requests:
            engine.step()
    assert failure.value.request_ids == ["broken", "faulty"]
    assert failure.value.cause_of("faulty") is constraint
    assert isinstance(failure.value.cause_of("broken"), RuntimeError)
    for request_id in failure.value.request_ids:
        engine.abort(request_id)
    assert not engine.has_unfinished_requests


CONTRADICTIONS = [
    ({"type": "string", "minLength": 4, "maxLength": 2}, "minLength 4 is above maxLength 2"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems 3 is above maxItems 1"),
    ({"type": "integer", "minimum": 4, "maximum": 2}, "minimum 4 is above maximum 2"),
    ({"type": "number", "exclusiveMinimum": 2, "maximum": 2}, "exclusiveMinimum 2 is not below maximum 2"),
    ({"type": "object", "minProperties": 3, "maxProperties": 1}, "minProperties 3 is above maxProperties 1")]


@pytest.mark.parametrize(("schema", "named"), CONTRADICTIONS)
def test_a_strict_schema_whose_lower_bound_is_above_its_upper_is_refused_naming_both(llm, schema, named):
    """A strict tool's `minLength` 4 with `maxLength` 2 was refused quoting Glimmer's own regex `(.|\\n){4,2}`."""
    parameters = {"type": "object", "properties": {"x": schema}, "required": []}
    strict = {"type": "function", "function": {"name": "f", "parameters": parameters, "strict": True}}
    with pytest.raises(RequestError) as raised:
        llm.chat(MESSAGES, SamplingParams(max_tokens=5), tools=[strict], tool_choice="required")
    assert raised.value.param == "tools[0].function.parameters.properties.x"
    assert str(raised.value).startswith(f"tools[0].function.parameters.properties.x: {named}")
    answer = {"type": "json_schema", "json_schema": {"name": "a", "schema": {**parameters, "required": ["x"]},
                                                     "strict": True}}  # an optional property no value needs
    with pytest.raises(RequestError) as raised:
        llm.chat(MESSAGES, SamplingParams(max_tokens=5), response_format=answer)
    assert named in str(raised.value) and raised.value.param.endswith(".properties.x"), raised.value.param


@pytest.mark.parametrize("strict", [True, False])
def test_a_tool_whose_optional_parameter_no_value_satisfies_is_refused_naming_it(llm, strict):
    """A forced call that began writing such a parameter failed while generating with the grammar engine's bare
    "NoExtensionBias"; a required one was refused already, and still is."""
    never = {"type": "string", "pattern": "ab", "maxLength": 1}
    for required in ([], ["x"]):
        tool = {"type": "function", "function": {"name": "f", "strict": strict, "parameters": {
            "type": "object", "properties": {"a": {"type": "string"}, "x": never}, "required": required}}}
        with pytest.raises(RequestError) as raised:
            llm.chat(MESSAGES, SamplingParams(max_tokens=5), tools=[tool], tool_choice="required")
        if required:
            assert raised.value.param == "tools[0].function.parameters" and "'x'" in str(raised.value)
        else:
            assert raised.value.param == "tools[0].function.parameters.properties.x"
            assert "no value satisfies the schema of this optional parameter" in str(raised.value)
    satisfiable = {"type": "function", "function": {"name": "f", "strict": strict, "parameters": {
        "type": "object", "properties": {"x": {**never, "maxLength": 2}}, "required": []}}}
    llm.chat(MESSAGES, SamplingParams(max_tokens=5), tools=[satisfiable], tool_choice="auto")


def test_an_end_of_turn_token_not_flagged_special_ends_constrained_turns_and_is_skipped(tiny_checkpoint, tmp_path):
    """tokenizer.json may flag `<|eot|>` `special: false` (a converted or hand-edited tokenizer). Every grammar-backed
    chat turn then failed with 'tools: the grammar engine refused it: unknown special token: "<|eot|>"' (for a
    request that declared no tools), and `skip_special_tokens` left `<|eot|>` in the text. A protocol marker is a
    special token whatever the flag says."""
    import shutil

    checkpoint = tmp_path / "eot-not-special"
    shutil.copytree(tiny_checkpoint, checkpoint)
    state = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    next(added for added in state["added_tokens"] if added["content"] == "<|eot|>")["special"] = False
    (checkpoint / "tokenizer.json").write_text(json.dumps(state), encoding="utf-8")
    config = json.loads((checkpoint / "tokenizer_config.json").read_text(encoding="utf-8"))
    # tokenizer_config.json's flag is the token's where both files have one, as transformers reads them
    next(added for added in config["added_tokens_decoder"].values() if added["content"] == "<|eot|>")["special"] = \
        False
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    llm = LLM(str(checkpoint), progress=False, kv_cache_memory=16 << 20, max_model_len=2048)
    choice = SamplingParams(max_tokens=30, seed=1, structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    answer = llm.chat(MESSAGES, choice, thinking_token_budget=0, chat_template_kwargs=KWARGS)[0]
    assert (answer.content, answer.finish_reason) in (("yes", "stop"), ("no", "stop"))
    eot = llm.get_tokenizer().convert_tokens_to_ids("<|eot|>")
    forced = SamplingParams(max_tokens=3, temperature=0, logit_bias={eot: 100}, ignore_eos=True,
                            skip_special_tokens=True)
    output = llm.generate("Hi", forced)[0].outputs[0]
    assert (output.token_ids, output.text) == ([eot] * 3, "")
