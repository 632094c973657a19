"""Bad input to the Python API (`LLM.generate`, `LLM.chat`, `SamplingParams`): a RequestError naming the field,
never an internal exception, a hang or a silent wrong answer; and the engine is left with nothing pending."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from glimmer import LLM, BeamSearchParams, SamplingParams, StructuredOutputsParams
from glimmer.engine.sampling_params import (
    MAX_ALLOWED_TOKEN_IDS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_N,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPERATURE,
)
from glimmer.engine.vllm_arguments import VLLM_ONLY_ARGUMENTS, VLLM_ONLY_STRUCTURED_OUTPUTS_ARGUMENTS
from glimmer.errors import RequestError, UnsupportedArgumentError

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(str(tiny_checkpoint), progress=False, kv_cache_memory=16 << 20, max_model_len=256)


def _refused(call, param: str) -> RequestError:
    with pytest.raises(RequestError) as caught:
        call()
    assert caught.value.param == param, caught.value
    return caught.value


@pytest.mark.parametrize(("field", "value"), [
    ("stop", 5), ("stop_token_ids", 5), ("seed", 2**64), ("seed", -(2**63) - 1), ("n", MAX_N + 1),
    ("n", 10**30), ("ignore_eos", "yes"), ("skip_special_tokens", "no"), ("include_stop_str_in_output", 1),
    ("min_tokens", True), ("logit_bias", {"5": 1.0}), ("logit_bias", {5: 101}), ("logit_bias", {-1: 1}),
    ("logit_bias", {5: float("nan")}), ("logit_bias", [(5, 1.0)])])
def test_sampling_params_refuse_wrong_types_and_ranges(field, value):
    _refused(lambda: SamplingParams(**{field: value}), field)


@pytest.mark.parametrize("value", ["no", None, 0, 1])
def test_structured_outputs_strict_of_another_type_is_refused(value):
    """`strict="no"` was read as true and `strict=None` as false: the schema's unimplemented keywords silently
    refused or silently ignored."""
    _refused(lambda: StructuredOutputsParams(json={}, strict=value), "structured_outputs.strict")


@pytest.mark.parametrize(("given", "value"), [({}, 1), ({}, 0), ({}, "yes"), ({"regex": "a+"}, 0)])
def test_structured_outputs_json_object_of_another_type_is_refused(given, value):
    """`json_object=1` was taken as true and `json_object=0` read as left out ("give exactly one ... (got none)"),
    where `strict` and the server's `structured_outputs.json_object` refuse a number."""
    error = _refused(lambda: StructuredOutputsParams(**given, json_object=value), "structured_outputs.json_object")
    assert "must be a boolean" in str(error)


@pytest.mark.parametrize("value", [0, False])
@pytest.mark.parametrize("field", ["json", "regex", "choice", "grammar"])
def test_a_structured_outputs_constraint_given_as_zero_or_false_is_refused_naming_it(field, value):
    """0 equals False, and read as the constraint left out: "give exactly one of ... (got none)"; False too, though
    only `json_object`'s False means unset."""
    _refused(lambda: StructuredOutputsParams(**{field: value}), f"structured_outputs.{field}")


def test_structured_outputs_json_object_false_is_left_unset():
    assert StructuredOutputsParams(regex="a+", json_object=False).kind == "regex"


@pytest.mark.parametrize(("field", "value", "param"), [
    ("regex", 5, "structured_outputs.regex"), ("choice", ["a"], "structured_outputs"),
    ("regex", "", "structured_outputs.regex"), ("strict", "no", "structured_outputs.strict")])
def test_structured_outputs_fields_set_after_construction_are_checked_on_submission(llm, field, value, param):
    """A StructuredOutputsParams is mutable as SamplingParams is, and its fields set afterwards were never checked:
    `regex = 5` reached the grammar engine as a bare TypeError, and a `choice` set beside the regex was silently
    ignored (the first constraint won)."""
    constraint = StructuredOutputsParams(regex="[a-z]+")
    params = SamplingParams(max_tokens=4, structured_outputs=constraint)
    setattr(constraint, field, value)
    _refused(lambda: llm.generate("a", params), param)
    _refused(params.validate, param)


@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
def test_vllms_minus_one_logprobs_is_refused_saying_it_is_not_supported(name):
    """vLLM reads -1 as every token of the vocabulary; the error gave the range alone, as for a typo."""
    error = _refused(lambda: SamplingParams(**{name: -1}), name)
    assert "-1 (vLLM's every token of the vocabulary) is not supported" in str(error)


@pytest.mark.parametrize(("name", "value", "advice"), [
    ("best_of", 4, "cumulative_logprob"),
    ("guided_decoding", {"json": {}}, "structured_outputs=StructuredOutputsParams"),
    ("logits_processors", [print], "logit_bias"),
    ("detokenize", False, "always detokenizes"), ("spaces_between_special_tokens", "no", "no spaces"),
    ("extra_args", {"plugin": 1}, "plugins"), ("use_beam_search", True, "beam search"),
    ("length_penalty", 0.5, "beam search"), ("early_stopping", True, "beam search"),
    ("thinking_token_budget", 64, "LLM.chat(messages, sampling_params, thinking_token_budget=N)"),
    ("logprob_token_ids", [5], "prompt_logprobs=0"), ("prompt_logprob_token_ids", [5], "prompt_logprobs=k"),
    ("prompt_logprob_start", 3, "slice"), ("flat_logprobs", True, "TokenLogprobs"),
    ("repetition_detection", object(), "repetition_penalty"), ("stream_interval", 0, "final output"),
    ("skip_clone", True, "deeply"), ("skip_reading_prefix_cache", True, "cache_salt"),
    ("routed_experts_prompt_start", 4, "expert routing"), ("trace_decode_token_ids", [5], "prompt_logprobs=0")])
def test_a_vllm_argument_glimmer_does_not_take_is_refused_with_what_to_do_instead(name, value, advice):
    """It was Python's bare `TypeError: __init__() got an unexpected keyword argument`; it is still a TypeError, and
    a RequestError naming the argument like the errors about the values of the arguments SamplingParams takes. vLLM's
    newer arguments were "did you mean" a field of a similar name (logprob_token_ids: 'stop_token_ids',
    repetition_detection: 'repetition_penalty') or named no way at all (thinking_token_budget: LLM.chat's)."""
    with pytest.raises(UnsupportedArgumentError) as caught:
        SamplingParams(temperature=0, **{name: value})
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, RequestError)
    assert caught.value.param == name and advice in VLLM_ONLY_ARGUMENTS[name].instead
    assert str(caught.value) == f"{name}: an argument of vLLM's SamplingParams that Glimmer's does not take; " \
                                f"{VLLM_ONLY_ARGUMENTS[name].instead}"


@pytest.mark.parametrize("arguments", [
    {"best_of": None}, {"best_of": 1}, {"n": 3, "best_of": 3}, {"use_beam_search": False},
    {"length_penalty": 1.0}, {"early_stopping": False}, {"guided_decoding": None}, {"logits_processors": None},
    {"logits_processors": []},
    {"detokenize": True}, {"spaces_between_special_tokens": True}, {"spaces_between_special_tokens": False},
    {"output_kind": 2}, {"output_kind": None}, {"extra_args": None},
    {"extra_args": {}}, {"thinking_token_budget": None}, {"thinking_token_budget": -1}, {"logprob_token_ids": None},
    {"prompt_logprob_token_ids": None}, {"prompt_logprob_start": 0}, {"flat_logprobs": False},
    {"repetition_detection": None}, {"stream_interval": None}, {"stream_interval": 4}, {"skip_clone": False},
    {"skip_reading_prefix_cache": None}, {"skip_reading_prefix_cache": False},
    {"prompt_logprobs": 1, "skip_reading_prefix_cache": True}, {"routed_experts_prompt_start": 0},
    {"trace_decode_token_ids": None}])
def test_a_vllm_argument_at_a_value_that_changes_nothing_is_taken_and_dropped(arguments):
    """A vLLM script passing vLLM's defaults (best_of=None, detokenize=True, ...) was refused. They are taken and
    dropped: the params equal those without them, and replace, copy and pickle see Glimmer's fields alone."""
    names = {f.name for f in dataclasses.fields(SamplingParams)}
    params = SamplingParams(temperature=0.5, **arguments)
    assert params == SamplingParams(temperature=0.5, **{k: v for k, v in arguments.items() if k in names})
    assert vars(params).keys() == {f.name for f in dataclasses.fields(SamplingParams)}
    assert pickle.loads(pickle.dumps(params)) == dataclasses.replace(params) == copy.deepcopy(params) == params


@pytest.mark.parametrize(("name", "value", "advice"), [
    ("logits_processors", [print], "logit_bias"), ("use_beam_search", True, "beam search"),
    ("best_of", 4, "cumulative_logprob"), ("detokenize", False, "always")])
def test_a_vllm_argument_set_after_construction_is_refused_as_at_construction(name, value, advice):
    """`params.logits_processors = [print]` (vLLM scripts set fields after construction) made a new attribute that
    nothing read: the request ran unconstrained. It is refused as `SamplingParams(logits_processors=[print])` is."""
    params = SamplingParams(temperature=0)
    with pytest.raises(UnsupportedArgumentError) as caught:
        setattr(params, name, value)
    assert caught.value.param == name and advice in str(caught.value)
    assert vars(params).keys() == {f.name for f in dataclasses.fields(SamplingParams)}


def test_a_best_of_below_n_is_refused_naming_it_and_the_fix():
    """QA: SamplingParams(n=2, best_of=1) was taken as changing nothing, where vLLM refused a best_of below n (it
    cannot return n of fewer) and Glimmer's server refuses it (400, param best_of); set after construction too."""
    with pytest.raises(UnsupportedArgumentError) as caught:
        SamplingParams(n=2, best_of=1)
    assert caught.value.param == "best_of" and "refuses a best_of below n); leave it out or set it equal to n" in \
        str(caught.value)
    params = SamplingParams(n=3)
    with pytest.raises(UnsupportedArgumentError, match="best_of below n"):
        params.best_of = 1


def test_a_misspelled_field_set_after_construction_names_the_field():
    params = SamplingParams(temperature=0)
    with pytest.raises(UnsupportedArgumentError, match="did you mean 'max_tokens'"):
        params.max_token = 64
    with pytest.raises(UnsupportedArgumentError, match="did you mean 'regex'"):
        StructuredOutputsParams(regex="a+").regx = "b+"


def test_a_vllm_argument_set_at_a_value_that_changes_nothing_is_dropped_and_fields_stay_settable():
    params = SamplingParams(temperature=0, n=3)
    params.output_kind, params.best_of, params.detokenize = 2, 3, True  # best_of=n changes nothing, as at construction
    params.max_tokens, params.stop = 7, "###"
    params.validate()  # as on submission, which takes a stop string as a list of it
    assert params == SamplingParams(temperature=0, n=3, max_tokens=7, stop="###")
    assert vars(params).keys() == {f.name for f in dataclasses.fields(SamplingParams)}


def test_spaces_between_special_tokens_changes_nothing_with_a_byte_level_tokenizer(llm):
    """vLLM's default, True, spaces special tokens apart only where the tokenizer's decoder does (its fast
    detokenizer, a tokenizers DecodeStream, for a tokenizer.json), which byte-level BPE never does: the text of
    consecutive special tokens is Glimmer's, which has no spaces between them (P-REQ-1), either way."""
    tokenizer = llm.get_tokenizer()
    backend = Tokenizer.from_file(str(tokenizer.tokenizer.tokenizer_file))
    ids = tokenizer.encode("<|eot|><|start|>assistant<|message|>hi<|eot|><|eom|><|patch|><|patch|>")
    stream = DecodeStream(skip_special_tokens=False)
    assert "".join(filter(None, (stream.step(backend, i) for i in ids))) == tokenizer.decode(ids) == \
        "<|begin_of_text|><|eot|><|start|>assistant<|message|>hi<|eot|><|eom|><|patch|><|patch|>"


@pytest.mark.parametrize(("name", "value", "advice"), [
    ("disable_any_whitespace", True, "json.dumps"), ("whitespace_pattern", r"[ ]?", "json.dumps"),
    ("disable_additional_properties", True, "additionalProperties"), ("structural_tag", "{}", "tools"),
    ("backend", "xgrammar", "llguidance"), ("disable_fallback", "yes", "never falls back")])
def test_a_vllm_structured_outputs_argument_glimmer_does_not_take_is_refused_with_what_to_do_instead(name, value,
                                                                                                     advice):
    """It was Python's bare `TypeError: __init__() got an unexpected keyword argument`."""
    with pytest.raises(UnsupportedArgumentError) as caught:
        StructuredOutputsParams(json={}, **{name: value})
    assert caught.value.param == name and advice in VLLM_ONLY_STRUCTURED_OUTPUTS_ARGUMENTS[name].instead
    assert str(caught.value) == f"{name}: an argument of vLLM's StructuredOutputsParams that Glimmer's does not " \
                                f"take; {VLLM_ONLY_STRUCTURED_OUTPUTS_ARGUMENTS[name].instead}"


def test_vllm_structured_outputs_arguments_at_values_that_change_nothing_are_taken_and_dropped():
    params = StructuredOutputsParams(json={}, disable_any_whitespace=False, whitespace_pattern=None,
                                     disable_additional_properties=False, structural_tag=None, backend=None,
                                     disable_fallback=True)
    assert params == StructuredOutputsParams(json={})
    assert vars(params).keys() == {f.name for f in dataclasses.fields(StructuredOutputsParams)}
    assert pickle.loads(pickle.dumps(params)) == dataclasses.replace(params) == params
    assert StructuredOutputsParams("a+") == StructuredOutputsParams(json="a+")  # positional, as vLLM's
    with pytest.raises(UnsupportedArgumentError, match="did you mean 'regex'"):
        StructuredOutputsParams(regx="a+")


def test_a_token_scored_at_the_end_of_the_prompt_has_the_logprob_generation_gives_it(llm):
    """What the refusal of logprob_token_ids and trace_decode_token_ids advises gives the logprob they would."""
    ids = llm.get_tokenizer().encode("Hello the")
    generated = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=1, logprobs=0))
    first = generated[0].outputs[0].logprobs[0]
    scored = llm.generate({"prompt_token_ids": ids + [first.token_id]}, SamplingParams(max_tokens=0, prompt_logprobs=0))
    assert scored[0].prompt_logprobs[-1].token_id == first.token_id
    assert scored[0].prompt_logprobs[-1].logprob == pytest.approx(first.logprob, abs=1e-4)


def test_arguments_given_by_position_are_refused_saying_they_go_by_keyword():
    """SamplingParams(2) set temperature=2, silently, where vLLM's sets n=2."""
    with pytest.raises(TypeError, match=r"^SamplingParams takes keyword arguments only \(SamplingParams\(temperature="
                                        r"\.\.\., top_p=\.\.\.\)\), not 1 by position: vLLM's SamplingParams orders"):
        SamplingParams(2)
    assert SamplingParams(n=2).n == 2


def test_clone_is_a_deep_copy():
    """vLLM's SamplingParams.clone() was missing (an AttributeError)."""
    params = SamplingParams(stop=["x"], logit_bias={3: 1.0}, structured_outputs=StructuredOutputsParams(choice=["a"]))
    clone = params.clone()
    assert clone == params and clone is not params
    clone.stop.append("y")
    clone.logit_bias[4] = 2.0
    clone.structured_outputs.choice.append("b")
    assert (params.stop, params.logit_bias, params.structured_outputs.choice) == (["x"], {3: 1.0}, ["a"])


def test_from_optional_reads_none_as_the_default_and_logit_bias_as_vllm_does():
    """vLLM's SamplingParams.from_optional was missing: None is the default for n, temperature, top_p and the
    penalties; logit_bias keys may be id strings and biases are clamped to [-100, 100]."""
    unset = dict.fromkeys(("n", "temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty"))
    params = SamplingParams.from_optional(**unset, max_tokens=None, stop=None, detokenize=True,
                                          logit_bias={"5": 150, 7: -1e9, 8: float("-inf"), 9: 0.5})
    assert params == SamplingParams(max_tokens=None, logit_bias={5: 100.0, 7: -100.0, 8: -100.0, 9: 0.5})
    assert SamplingParams.from_optional(temperature=0, n=2, top_k=5) == SamplingParams(temperature=0, n=2, top_k=5)
    _refused(lambda: SamplingParams.from_optional(logit_bias={"x": 1.0}), "logit_bias")
    _refused(lambda: SamplingParams.from_optional(logit_bias={5: float("nan")}), "logit_bias")
    _refused(lambda: SamplingParams.from_optional(top_k=None), "top_k")  # None is no default there in vLLM either


def test_no_argument_refused_as_vllm_only_is_one_glimmer_takes():
    assert not set(VLLM_ONLY_ARGUMENTS) & {f.name for f in dataclasses.fields(SamplingParams)}


def test_an_unknown_argument_is_refused_naming_the_closest_one():
    with pytest.raises(UnsupportedArgumentError) as caught:
        SamplingParams(temprature=0.5)
    assert caught.value.param == "temprature" and "did you mean 'temperature'?" in str(caught.value)
    with pytest.raises(TypeError, match="SamplingParams has no argument 'colour'; its arguments are temperature"):
        SamplingParams(colour="red")


def test_numpy_scalars_are_taken_as_the_numbers_they_hold(llm):
    """A count or a temperature computed with NumPy (`max_tokens=np.int64(4)`) was refused as "must be an integer"
    while prompt token ids take NumPy integers; it is that number, and samples as the Python number does."""
    params = SamplingParams(temperature=np.float32(0.5), top_p=np.float32(0.9), top_k=np.int64(5),
                            max_tokens=np.int64(4), n=np.int32(2), seed=np.uint64(2**63), logprobs=np.int64(1),
                            stop_token_ids=[np.int64(9)], logit_bias={np.int64(3): np.float32(-1.0)})
    assert (type(params.max_tokens), type(params.seed), type(params.temperature)) == (int, int, float)
    assert params.stop_token_ids == [9] and type(params.stop_token_ids[0]) is int
    assert list(params.logit_bias) == [3] and type(params.logit_bias[3]) is float
    plain = SamplingParams(temperature=0.5, top_p=float(np.float32(0.9)), top_k=5, max_tokens=4, n=2, seed=2**63,
                           logprobs=1, stop_token_ids=[9], logit_bias={3: -1.0})
    assert [o.token_ids for o in llm.generate("a", params)[0].outputs] == \
        [o.token_ids for o in llm.generate("a", plain)[0].outputs]
    _refused(lambda: SamplingParams(max_tokens=np.float32(4.0)), "max_tokens")
    _refused(lambda: SamplingParams(ignore_eos=np.bool_(True)), "ignore_eos")


def test_seeds_at_the_ends_of_the_range_work(llm):
    for seed in (-(2**63), 2**64 - 1):
        assert len(llm.generate("a", SamplingParams(seed=seed, max_tokens=2))[0].outputs[0].token_ids) == 2
    _refused(lambda: SamplingParams(seed=2**64 - 2, n=3), "seed")  # completion 2 would draw with 2**64
    assert len(llm.generate("a", SamplingParams(seed=2**64 - 3, n=3, max_tokens=1))[0].outputs) == 3


def test_logprobs_true_is_one_alternative_as_in_vllm(llm):
    """vLLM reads logprobs=True (and prompt_logprobs=True) as 1; it was refused as no integer."""
    params = SamplingParams(max_tokens=2, logprobs=True, prompt_logprobs=True)
    assert params.logprobs == 1 and params.prompt_logprobs == 1 and params == SamplingParams(
        max_tokens=2, logprobs=1, prompt_logprobs=1)
    out = llm.generate("a b", params)[0]
    assert [len(position.top) for position in out.outputs[0].logprobs] == [1, 1]
    assert [len(position.top) for position in out.prompt_logprobs[1:]] == [1] * (len(out.prompt_token_ids) - 1)
    _refused(lambda: SamplingParams(logprobs=False), "logprobs")


def test_seed_minus_one_is_no_seed_as_in_vllm(llm):
    """vLLM reads seed=-1 as None (a script's "random"); it was the seed -1, every call the same tokens."""
    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=np.int64(-1)).seed is None
    params = SamplingParams(seed=-1, max_tokens=8, ignore_eos=True)
    first, second = (llm.generate("a", params)[0].outputs[0].token_ids for _ in range(2))
    assert first != second
    params.seed = -1
    assert llm.generate("a", params)[0].outputs[0].token_ids not in (first, second) and params.seed is None


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -1), ("max_tokens", -5), ("n", 0), ("top_p", 5), ("logprobs", 100), ("stop", 5)])
def test_fields_changed_after_construction_are_checked_on_submission(llm, field, value):
    params = SamplingParams(max_tokens=4)
    setattr(params, field, value)
    _refused(lambda: llm.generate("a", params), field)
    assert not llm.engine.has_unfinished_requests


def test_temperatures_below_1e_5_are_greedy(llm):
    """Dividing the logits by a subnormal temperature overflowed them: every draw was token 0."""
    greedy = llm.generate("a", SamplingParams(temperature=0, max_tokens=6))[0].outputs[0].token_ids
    for temperature in (1e-39, 1e-20, 9e-6):
        params = SamplingParams(temperature=temperature, max_tokens=6, seed=1)
        assert llm.generate("a", params)[0].outputs[0].token_ids == greedy
    assert SamplingParams(temperature=1e-5).greedy is False


def test_the_largest_float32_temperature_samples_and_a_larger_one_is_refused(llm):
    """Above float32's largest value the temperature became inf in the sampler: every draw was token 0."""
    params = SamplingParams(temperature=MAX_TEMPERATURE, max_tokens=8, seed=1, ignore_eos=True)
    assert set(llm.generate("a", params)[0].outputs[0].token_ids) != {0}
    for temperature in (3.5e38, 1e39, 1e300):
        _refused(lambda t=temperature: SamplingParams(temperature=t), "temperature")


def test_an_integer_temperature_past_int64_samples_as_its_float(llm):
    """`temperature=2**63` (an int float32 holds) passed the check, then failed the step in the sampler, whose tensor
    of int temperatures was int64: "Overflow when unpacking long long", for every request of the batch."""
    params = SamplingParams(temperature=2**63, max_tokens=4, seed=1, ignore_eos=True)
    assert params.temperature == float(2**63)
    assert [len(out.outputs[0].token_ids) for out in llm.generate(["a", "b"], params)] == [4, 4]


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                   "repetition_penalty", "logit_bias"])
def test_an_integer_too_large_for_a_float_is_refused_naming_its_field(field):
    """10**400 raised a bare OverflowError ("int too large to convert to float") from the range check."""
    _refused(lambda: SamplingParams(**{field: {5: 10**400} if field == "logit_bias" else 10**400}), field)


def test_an_integer_too_large_for_a_float_is_refused_by_beam_search_naming_its_field():
    for field in ("length_penalty", "temperature"):
        _refused(lambda field=field: BeamSearchParams(beam_width=2, max_tokens=2, **{field: 10**400}), field)


def test_min_tokens_with_structured_outputs_is_refused_at_construction():
    _refused(lambda: SamplingParams(min_tokens=2, structured_outputs=StructuredOutputsParams(regex="a+")),
             "min_tokens")


def test_min_tokens_past_max_tokens_is_refused_naming_both_numbers_and_the_fix():
    """As vLLM's "min_tokens must be less than or equal to max_tokens=3, got 5": the message said only "must not
    exceed max_tokens"."""
    with pytest.raises(RequestError) as caught:
        SamplingParams(min_tokens=5, max_tokens=3)
    assert caught.value.param == "min_tokens"
    assert str(caught.value) == ("min_tokens: 5 is more than max_tokens=3; lower min_tokens to at most 3, or raise "
                                 "max_tokens")


def test_generate_refuses_what_is_not_a_sampling_params(llm):
    _refused(lambda: llm.generate(["a"], {"max_tokens": 4}), "sampling_params")
    _refused(lambda: llm.generate(["a", "b"], [SamplingParams(), {"max_tokens": 4}]), "sampling_params")


@pytest.mark.parametrize(("prompt", "param"), [
    ({"prompt_token_ids": "abc"}, ".prompt_token_ids"),
    ({"prompt_token_ids": [[1, 2]]}, ".prompt_token_ids"),
    ({"prompt": 5}, ""),
    ({"prompt": "hello", "multi_modal_data": {"audio": b""}}, ".multi_modal_data"),
    ({"prompt": "hello", "lora_request": "x"}, "")])
def test_prompt_dicts_are_checked_naming_the_prompt_as_given(llm, prompt, param):
    """One prompt is `prompt`, as the engine's own errors about it name it; a prompt of a list is `prompts[i]`."""
    one = _refused(lambda: llm.generate(prompt, SamplingParams(max_tokens=2)), "prompt" + param)
    assert "prompts[" not in str(one)
    _refused(lambda: llm.generate(["fine", prompt], SamplingParams(max_tokens=2)), "prompts[1]" + param)


def test_text_that_is_not_valid_unicode_is_refused(llm):
    assert "surrogate" in str(_refused(lambda: llm.generate("a\ud800b", SamplingParams(max_tokens=2)), "prompt"))
    _refused(lambda: llm.chat([{"role": "user", "content": "a\ud800b"}], SamplingParams(max_tokens=2)), "prompt")
    _refused(lambda: llm.encode_prompt(5), "prompt")
    _refused(lambda: llm.encode_prompt(None), "prompt")


@pytest.mark.parametrize("messages", [{"role": "user", "content": "hi"}, None, [], [[]], "hi"])
def test_chat_refuses_what_is_not_a_list_of_conversations(llm, messages):
    _refused(lambda: llm.chat(messages, SamplingParams(max_tokens=2)), "messages")


def test_chat_refuses_a_role_the_template_would_drop(llm):
    """The server refused it; LLM.chat used to render the conversation without the message."""
    _refused(lambda: llm.chat([{"role": "wizard", "content": "What's the weather?"}], SamplingParams(max_tokens=2)),
             "messages[0].role")
    # a refusal beside content (a refusal alone now renders as the assistant's text)
    _refused(lambda: llm.chat([{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "Sure.", "refusal": "No."},
                               {"role": "user", "content": "hi"}], SamplingParams(max_tokens=2)),
             "messages[1].refusal")


def test_logit_bias_steers_generate_and_ids_outside_the_vocabulary_are_refused(llm):
    greedy = llm.generate("a", SamplingParams(temperature=0, max_tokens=1, logprobs=2))[0].outputs[0]
    first, second = list(greedy.logprobs[0].top)
    banned = llm.generate("a", SamplingParams(temperature=0, max_tokens=1, logprobs=2,
                                              logit_bias={first: -100}))[0].outputs[0]
    assert banned.token_ids == [second] and banned.logprobs[0].logprob == greedy.logprobs[0].top[second]
    forced = SamplingParams(temperature=1.0, max_tokens=3, seed=3, logit_bias={second: 100})
    assert llm.generate("a", forced)[0].outputs[0].token_ids == [second] * 3
    vocab = llm.engine.model_config.text.vocab_size
    _refused(lambda: llm.generate("a", SamplingParams(max_tokens=1, logit_bias={vocab: 1})), "logit_bias")
    assert not llm.engine.has_unfinished_requests


def test_chat_checks_its_own_arguments(llm):
    _refused(lambda: llm.chat(MESSAGES, SamplingParams(max_tokens=2), chat_template_kwargs="x"),
             "chat_template_kwargs")
    _refused(lambda: llm.chat(MESSAGES, SamplingParams(max_tokens=2), parallel_tool_calls="no"),
             "parallel_tool_calls")
    _refused(lambda: llm.chat(MESSAGES, {"max_tokens": 2}), "sampling_params")
    assert not llm.engine.has_unfinished_requests


def test_chat_parses_every_one_of_n_completions(llm):
    """`n=3` used to come back as the first completion's parse only."""
    (reply,) = llm.chat(MESSAGES, SamplingParams(n=3, seed=4, max_tokens=12))
    assert len(reply.choices) == 3 and len(reply.output.outputs) == 3
    for choice, completion in zip(reply.choices, reply.output.outputs, strict=True):
        assert choice.output.outputs == [completion] and choice.output.outputs[0].text == completion.text
    assert (reply.reasoning, reply.content) == (reply.choices[0].reasoning, reply.choices[0].content)
    assert len({c.output.outputs[0].text for c in reply.choices}) > 1  # seed + i: different draws
    assert len(llm.chat(MESSAGES, SamplingParams(max_tokens=4))[0].choices) == 1


def test_a_request_refused_after_others_were_queued_leaves_nothing_behind(llm):
    """The second prompt's params are refused on submission; the first, already queued, used to stay in the
    engine and run in the next call."""
    bad = SamplingParams(max_tokens=4)
    bad.temperature = -1
    _refused(lambda: llm.generate(["a", "b"], [SamplingParams(max_tokens=4), bad]), "temperature")
    assert not llm.engine.has_unfinished_requests
    assert len(llm.generate(["a"], SamplingParams(max_tokens=2))) == 1


def test_an_interrupt_landing_as_a_request_is_queued_leaves_nothing_behind(llm, monkeypatch):
    """Ctrl-C arriving once the engine holds a prompt's request, before generate had noted it: that request stayed
    queued, and every later generate failed with a KeyError on its id."""
    queue = llm.engine.add_request
    queued = []

    def queue_then_interrupt(request_id, *args, **kwargs):
        queue(request_id, *args, **kwargs)
        queued.append(request_id)
        if len(queued) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(llm.engine, "add_request", queue_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["a", "b", "c"], SamplingParams(max_tokens=4))
    monkeypatch.undo()
    assert not llm.engine.has_unfinished_requests
    assert all(used == 0 for used, _ in llm.engine.kv.usage().values())
    assert len(llm.generate(["a"], SamplingParams(max_tokens=2))[0].outputs[0].token_ids) == 2


def test_a_thinking_budget_past_the_grammar_engines_count_is_refused_naming_it(llm):
    """10**30 was refused as `tools`, in the grammar engine's words ("error parsing unsigned integer"); the largest
    budget a grammar states, 2**64 - 1, is taken."""
    for budget in (2**64, 10**30):
        _refused(lambda budget=budget: llm.chat(MESSAGES, SamplingParams(max_tokens=2), thinking_token_budget=budget),
                 "thinking_token_budget")
    assert llm.chat(MESSAGES, SamplingParams(max_tokens=2), thinking_token_budget=2**64 - 1)[0].output.outputs
    assert not llm.engine.has_unfinished_requests


def test_a_chat_template_kwargs_key_that_is_no_string_is_refused_naming_the_field(llm):
    """{1: 2} failed rendering as "chat template error: TypeError: keywords must be strings", naming no field."""
    _refused(lambda: llm.chat(MESSAGES, SamplingParams(max_tokens=2), chat_template_kwargs={1: 2}),
             "chat_template_kwargs")


def test_chat_takes_one_sampling_params_per_conversation(llm):
    """As vLLM's LLM.chat: a list of SamplingParams, one per conversation."""
    conversations = [MESSAGES, [{"role": "user", "content": "hello there"}]]
    outs = llm.chat(conversations, [SamplingParams(max_tokens=2, ignore_eos=True),
                                    SamplingParams(max_tokens=5, ignore_eos=True, n=2)])
    assert [len(out.output.outputs[0].token_ids) for out in outs] == [2, 5] and len(outs[1].choices) == 2
    _refused(lambda: llm.chat(conversations, [SamplingParams(max_tokens=2)]), "sampling_params")
    _refused(lambda: llm.chat(conversations, [SamplingParams(max_tokens=2), {"max_tokens": 2}]), "sampling_params")
    assert not llm.engine.has_unfinished_requests


class _CountedReads(dict):
    """A dict that counts the reads of its entries."""

    reads = 0

    def items(self):
        type(self).reads += 1
        return super().items()


class _CountedList(list):
    """A list that counts the reads of its items."""

    reads = 0

    def __iter__(self):
        type(self).reads += 1
        return super().__iter__()


def test_a_logit_bias_or_allowed_token_ids_too_large_is_refused_before_any_entry_is_read():
    """Each entry was converted (a NumPy scalar to the number it holds) before the size was checked: a server request
    of a million ids or biases, a 4 MB body, held the event loop, and every other stream, for a second or two before
    its 400."""
    too_many_biases = _CountedReads({token: 1.0 for token in range(MAX_LOGIT_BIAS_ENTRIES + 1)})
    for make in (lambda: SamplingParams(logit_bias=too_many_biases),
                 lambda: SamplingParams.from_optional(logit_bias=too_many_biases)):
        assert f"at most {MAX_LOGIT_BIAS_ENTRIES} entries" in str(_refused(make, "logit_bias"))
    assert _CountedReads.reads == 0
    refusal = _refused(lambda: SamplingParams(allowed_token_ids=_CountedList([5] * (MAX_ALLOWED_TOKEN_IDS + 1))),
                       "allowed_token_ids")
    assert f"at most {MAX_ALLOWED_TOKEN_IDS} token ids" in str(refusal)
    assert _CountedList.reads == 0
    taken = SamplingParams(logit_bias=_CountedReads({5: 1.0}), allowed_token_ids=_CountedList([5]))
    assert (taken.logit_bias, taken.allowed_token_ids) == ({5: 1.0}, [5])


def test_stop_token_ids_beyond_their_cap_are_refused_before_any_is_read():
    """stop_token_ids had no cap: a server request of 1.9 million ids (a 4 MB body) had each converted, on the event
    loop every other stream waits for, and was then run with them all; beyond MAX_STOP_TOKEN_IDS it is refused by its
    size, as allowed_token_ids and logit_bias are."""
    class Counted(_CountedList):  # its own count, whatever other tests read of theirs
        reads = 0

    refusal = _refused(lambda: SamplingParams(stop_token_ids=Counted([5] * (MAX_STOP_TOKEN_IDS + 1))),
                       "stop_token_ids")
    assert f"at most {MAX_STOP_TOKEN_IDS} token ids" in str(refusal)
    assert Counted.reads == 0
    params = SamplingParams()
    params.stop_token_ids = (5,) * (MAX_STOP_TOKEN_IDS + 1)  # set after construction, checked on submission
    _refused(params.validate, "stop_token_ids")
    assert SamplingParams(stop_token_ids=list(range(MAX_STOP_TOKEN_IDS))).stop_token_ids[-1] == MAX_STOP_TOKEN_IDS - 1
