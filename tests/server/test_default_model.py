"""The embedded default model: glimmer-nano and its drafter ship inside the package and load as they are."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from safetensors.torch import load_file

import glimmer
import glimmer.default_model as default_model
from glimmer import LLM, SamplingParams, StructuredOutputsParams
from glimmer.checkpoint.config_layouts import load_config
from glimmer.checkpoint.resolve import resolve_checkpoint
from glimmer.default_model import DEFAULT_DRAFTER_NAME, DEFAULT_MODEL_NAME, default_drafter_dir, default_model_dir
from glimmer.engine.model_loader import load_drafter, load_model
from glimmer.errors import CheckpointError, RequestError

SIZE_BUDGET_BYTES = 20_000_000  # target and drafter together, as shipped


def test_the_default_model_and_its_drafter_ship_inside_the_package():
    package = default_model_dir().parents[1]
    assert package.samefile(glimmer.__path__[0])
    assert default_model_dir().name == DEFAULT_MODEL_NAME and default_drafter_dir().name == DEFAULT_DRAFTER_NAME
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
            "generation_config.json", "model.safetensors"} <= {p.name for p in default_model_dir().iterdir()}
    assert resolve_checkpoint(str(default_model_dir())) == default_model_dir()
    size = sum(p.stat().st_size for d in (default_model_dir(), default_drafter_dir()) for p in d.iterdir())
    assert size <= SIZE_BUDGET_BYTES


def test_half_precision_weights_load_exactly_to_float32():
    stored = load_file(str(default_model_dir() / "model.safetensors"))
    model = load_model(default_model_dir(), progress=False).model
    parameters = dict(model.named_parameters())
    assert {t.dtype for t in stored.values()} == {torch.float16}
    for name, tensor in stored.items():
        assert parameters[name].dtype == torch.float32
        assert torch.equal(parameters[name], tensor.float()), name


def test_the_drafter_fits_the_default_model():
    config = load_config(default_model_dir())
    drafter = load_drafter(default_drafter_dir(), config, lambda: pytest.fail("the drafter names its mask token"),
                           progress=False)
    assert drafter.config.hidden_size == config.text.hidden_size
    assert drafter.config.block_size == 16
    assert max(drafter.config.target_layer_ids) < config.text.num_hidden_layers


def test_an_installation_without_the_model_says_so(monkeypatch):
    monkeypatch.setattr(default_model, "EMBEDDED_FOLDER", "missing-folder")
    with pytest.raises(CheckpointError, match="reinstall glimmer, or pass a MODEL"):
        default_model_dir()


def test_the_embedded_names_resolve_to_the_embedded_models():
    assert resolve_checkpoint(DEFAULT_MODEL_NAME) == default_model_dir()
    assert resolve_checkpoint(DEFAULT_DRAFTER_NAME) == default_drafter_dir()


def test_grammars_constrain_the_default_model_whose_vocabulary_is_padded():
    """glimmer-nano has 2,112 logit rows for 2,067 tokens: the grammar masks must cover the padded rows (every
    constrained request failed with "Invalid buffer size" when they did not)."""
    llm = LLM(DEFAULT_MODEL_NAME, progress=False, max_model_len=1024)
    assert llm.engine.model_config.text.vocab_size > len(llm.get_tokenizer())
    padded_row = len(llm.get_tokenizer())  # a logit row that is no token: never biased towards
    with pytest.raises(RequestError, match="outside the vocabulary") as refused:
        llm.generate(["x"], SamplingParams(max_tokens=1, logit_bias={padded_row: 100}))
    assert refused.value.param == "logit_bias"
    # nor named in a prompt or as a stop id (it could never be sampled), nor sampled at any temperature
    for prompt, params, param in (({"prompt_token_ids": [1, padded_row]}, SamplingParams(max_tokens=1), "prompts[0]"),
                                  ("x", SamplingParams(max_tokens=1, stop_token_ids=[padded_row]), "stop_token_ids")):
        with pytest.raises(RequestError, match=rf"\[{padded_row}\] are outside the vocabulary") as refused:
            llm.generate([prompt], params)
        assert refused.value.param == param
    hot = llm.generate(["x"], SamplingParams(max_tokens=300, temperature=1e6, seed=7, ignore_eos=True))[0].outputs[0]
    assert max(hot.token_ids) < padded_row
    choice = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    assert llm.generate(["Is the sky blue?"], choice)[0].outputs[0].text in ("yes", "no")
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    output = llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(max_tokens=200), tools=[weather],
                      tool_choice="required", parallel_tool_calls=False)[0]
    assert output.finish_reason == "tool_calls"
    ((call),) = output.tool_calls
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), weather["function"]["parameters"])


def test_the_embedded_drafter_is_named_in_a_speculative_config():
    llm = LLM(DEFAULT_MODEL_NAME, progress=False, max_model_len=512, device="cpu", max_num_seqs=4,
              speculative_config={"method": "dflash", "model": DEFAULT_DRAFTER_NAME})
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert llm.engine.drafter.config.block_size == 16
    assert len(llm.generate(["Hello"], params)[0].outputs[0].token_ids) == 12


def test_speculative_decoding_keeps_a_thinking_budget_turn_exact(same_cpu_kernels):
    """The budget's grammar cannot be rolled back in llguidance; verification used to try, and the speculative
    engine answered `to=self` with no call where the plain one called the tool."""
    options = {"progress": False, "max_model_len": 1024, "device": "cpu", "max_num_seqs": 4}
    plain = LLM(DEFAULT_MODEL_NAME, **options)
    spec = LLM(DEFAULT_MODEL_NAME, **options, speculative_config={"method": "dflash", "model": DEFAULT_DRAFTER_NAME,
                                                                   "draft_policy": "always"})
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather.",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}, "required": ["city"]}}}
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    params = SamplingParams(temperature=0, max_tokens=120)
    for budget in (5, 40, 1000):
        want, got = (llm.chat(messages, params, tools=[weather], thinking_token_budget=budget)[0]
                     for llm in (plain, spec))
        assert got.output.outputs[0].token_ids == want.output.outputs[0].token_ids, budget
    assert want.tool_calls and spec.engine.speculator.stats.num_accepted_tokens > 0


def test_llm_chat_keeps_one_call_without_parallel_calls_and_stops_only_the_answer():
    """As the server does: `parallel_tool_calls=False` returns one call under `auto` too, and stop strings end
    the answer only (P-REQ-2): reasoning and calls may hold them."""
    llm = LLM(DEFAULT_MODEL_NAME, progress=False, max_model_len=1024, kv_cache_memory="64MiB")  # beside others
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    greedy = SamplingParams(temperature=0, max_tokens=300)
    two = [{"role": "user", "content": "What's the weather in Paris and in Rome?"}]
    both = llm.chat(two, greedy, tools=[weather])[0]
    assert len(both.tool_calls) == 2
    (first,) = llm.chat(two, greedy, tools=[weather], parallel_tool_calls=False)[0].tool_calls
    assert (first.name, first.arguments) == (both.tool_calls[0].name, both.tool_calls[0].arguments)
    one = [{"role": "user", "content": "What's the weather in Paris?"}]
    stopped = llm.chat(one, SamplingParams(temperature=0, max_tokens=300, stop=["Paris"]), tools=[weather])[0]
    assert "Paris" in stopped.reasoning and json.loads(stopped.tool_calls[0].arguments) == {"city": "Paris"}
    answer = llm.chat([{"role": "user", "content": "Hi! Who are you?"}], greedy)[0]
    word = answer.content.split()[1]
    for include in (False, True):
        params = SamplingParams(temperature=0, max_tokens=300, stop=[word], include_stop_str_in_output=include)
        cut = llm.chat([{"role": "user", "content": "Hi! Who are you?"}], params)[0]
        end = answer.content.index(word) + (len(word) if include else 0)
        # min_tokens holds stop strings off until its last token, as on the server: the early word does not count
        held = llm.chat([{"role": "user", "content": "Hi! Who are you?"}], SamplingParams(
            temperature=0, max_tokens=300, stop=[word], min_tokens=len(answer.output.outputs[0].token_ids) - 1))[0]
        assert (held.content, held.stop_string) == (answer.content, None)
        assert (cut.content, cut.stop_string, cut.finish_reason) == (answer.content[:end] or None, word, "stop")
    # as vLLM (and the server): the word counts only if it ends in a token after the first min_tokens
    ids, tokenizer = answer.output.outputs[0].token_ids, llm.get_tokenizer()
    end = tokenizer.decode(ids).rindex(answer.content) + answer.content.index(word) + len(word)
    last = next(t for t in range(1, len(ids) + 1) if len(tokenizer.decode(ids[:t])) >= end)  # the token ending it
    for min_tokens, expected in ((last - 1, (answer.content[:answer.content.index(word)], word)),
                                 (last, (answer.content, None))):
        reply = llm.chat([{"role": "user", "content": "Hi! Who are you?"}], SamplingParams(
            temperature=0, max_tokens=300, stop=[word], min_tokens=min_tokens))[0]
        assert (reply.content, reply.stop_string) == expected, min_tokens
