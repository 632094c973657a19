"""vLLM's `bad_words`: a word's last token is banned right after the output's tokens spell the rest of it, bare or
after a space; checked against greedy decoding one token at a time with the ban the rule gives at each step."""

from __future__ import annotations

import pytest

from glimmer import LLM, SamplingParams
from glimmer.engine.llm_engine import StepError
from glimmer.errors import RequestError

PROMPT = "The quick brown fox"
FREE = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(make_tiny, same_cpu_kernels_in_module):
    return LLM(str(make_tiny()), progress=False, enable_prefix_caching=False)


def _prompt_ids(llm: LLM) -> list[int]:
    return llm.get_tokenizer().encode(PROMPT)


def _stepwise(llm: LLM, prompt: list[int], words: list[tuple[int, ...]], count: int) -> list[int]:
    """Greedy decoding one token per call, every token the rule bans after the output so far left out."""
    vocab = len(llm.get_tokenizer())
    out: list[int] = []
    for _ in range(count):
        banned = {w[-1] for w in words
                  if len(w) - 1 <= len(out) and (len(w) == 1 or out[-(len(w) - 1):] == list(w[:-1]))}
        params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True,
                                allowed_token_ids=[t for t in range(vocab) if t not in banned])
        out += llm.generate([{"prompt_token_ids": prompt + out}], params)[0].outputs[0].token_ids
    return out


def _bigram(llm: LLM, free: list[int]) -> int:
    """A position j whose two tokens are what their text tokenizes to (so a bad word can name them), the second
    token not a word alone."""
    tokenizer = llm.get_tokenizer()
    for j in range(len(free) - 1):
        text = tokenizer.decode(free[j:j + 2])
        if (text.strip() == text and text and tokenizer.encode_text(text) == free[j:j + 2]
                and free[j + 1] not in free[:j]):
            return j
    raise AssertionError("no bigram to ban")


def test_a_one_token_word_of_the_greedy_output_is_never_sampled(llm):
    prompt = _prompt_ids(llm)
    free = llm.generate([{"prompt_token_ids": prompt}], FREE)[0].outputs[0].token_ids
    tokenizer = llm.get_tokenizer()
    token = next(t for t in free
                 if tokenizer.decode([t]).strip() and tokenizer.encode_text(tokenizer.decode([t])) == [t])
    word = tokenizer.decode([token])
    got = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(**{**vars(FREE), "bad_words": [word]}))
    tokens = got[0].outputs[0].token_ids
    forms = [tuple(tokenizer.encode_text(word.lstrip())), tuple(tokenizer.encode_text(" " + word.lstrip()))]
    assert token not in tokens and tokens != free
    assert tokens[:free.index(token)] == free[:free.index(token)]
    assert tokens == _stepwise(llm, prompt, [f for f in forms if len(f) == 1], len(free))


def test_the_spaced_form_of_a_word_is_banned_too(llm):
    """A word given without its leading space bans the token it takes inside a text (" forecast")."""
    prompt = _prompt_ids(llm)
    free = llm.generate([{"prompt_token_ids": prompt}], FREE)[0].outputs[0].token_ids
    tokenizer = llm.get_tokenizer()
    spaced = next(t for t in free if tokenizer.decode([t]).startswith(" ") and len(tokenizer.decode([t])) > 2
                  and tokenizer.encode_text(tokenizer.decode([t]).lstrip()) != [t]
                  and len(tokenizer.encode_text(tokenizer.decode([t]).lstrip())) == 1)
    word = tokenizer.decode([spaced]).lstrip()
    tokens = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(**{**vars(FREE), "bad_words": [word]}))
    tokens = tokens[0].outputs[0].token_ids
    at = free.index(spaced)
    assert spaced not in tokens and tokens[:at] == free[:at]
    assert tokens == _stepwise(llm, prompt, [tuple(tokenizer.encode_text(word)), (spaced,)], len(free))


def test_a_word_of_two_tokens_bans_the_second_only_after_the_first(llm):
    prompt = _prompt_ids(llm)
    free = llm.generate([{"prompt_token_ids": prompt}], FREE)[0].outputs[0].token_ids
    tokenizer = llm.get_tokenizer()
    j = _bigram(llm, free)
    word = tokenizer.decode(free[j:j + 2])
    params = SamplingParams(**{**vars(FREE), "bad_words": [word]})
    tokens = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
    assert tokens[:j + 1] == free[:j + 1] and tokens[j + 1] != free[j + 1]
    forms = {tuple(tokenizer.encode_text(word)), tuple(tokenizer.encode_text(" " + word))}
    assert tokens == _stepwise(llm, prompt, [f for f in forms if len(f) == 2], len(free))
    # the prompt does not count: a prompt ending in the first token is followed by the second as without the word
    after = llm.generate([{"prompt_token_ids": prompt + free[:j + 1]}], params)[0].outputs[0].token_ids
    assert after[0] == free[j + 1]


@pytest.mark.parametrize("two_tokens", [False, True], ids=["one-token-words", "two-token-word"])
def test_bad_words_decode_the_same_running_ahead(make_tiny, llm, launches, two_tokens, same_cpu_kernels):
    """A one-token word bans the same token at every step: its steps run ahead of the host. A word of several tokens
    needs the token before, not read yet then: its sequence runs step by step."""
    prompt = _prompt_ids(llm)
    free = llm.generate([{"prompt_token_ids": prompt}], FREE)[0].outputs[0].token_ids
    j = _bigram(llm, free)
    tokenizer = llm.get_tokenizer()
    words = [tokenizer.decode(free[j:j + 2])] if two_tokens else [tokenizer.decode(free[j + 1:j + 2]).strip()]
    params = SamplingParams(**{**vars(FREE), "bad_words": words})
    ahead = LLM(str(make_tiny()), progress=False, async_scheduling=True)
    expected = llm.generate([{"prompt_token_ids": prompt}] * 3, params)
    launches["steps"] = 0
    got = ahead.generate([{"prompt_token_ids": prompt}] * 3, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert expected[0].outputs[0].token_ids != free
    assert (launches["steps"] == 0) == two_tokens


@pytest.mark.parametrize(("value", "message"), [
    ("word", "must be a list"), ([""], "'' is not a word"), (["  "], "'  ' is not a word"), ([3], "3 is not a word"),
    (["x" * 1001], "1 to 1000 characters"), (["w"] * 1025, "at most 1024")])
def test_invalid_bad_words_are_refused_naming_the_field(value, message):
    with pytest.raises(RequestError) as caught:
        SamplingParams(bad_words=value)
    assert caught.value.param == "bad_words" and message in str(caught.value)


def test_bad_words_with_a_grammar_are_refused(llm):
    from glimmer.engine.sampling_params import StructuredOutputsParams

    with pytest.raises(RequestError, match="bad_words: cannot be combined with structured_outputs"):
        SamplingParams(bad_words=["yes"], structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    with pytest.raises(RequestError) as caught:
        llm.engine.add_request("g", _prompt_ids(llm), SamplingParams(bad_words=["yes"]),
                               controller_factory=lambda stop_ids: None)
    assert caught.value.param == "bad_words" and "grammar" in str(caught.value)


def test_a_special_tokens_spelling_bans_its_characters_not_the_special_token(llm):
    """A chat reply's framing (and the stop ids) can never be banned: words are tokenized as plain text."""
    tokenizer = llm.get_tokenizer()
    from glimmer.engine.bad_words import bad_word_ids

    special = set(tokenizer.all_special_ids)
    spellings = [tokenizer.decode([t]) for t in sorted(special)]
    assert not {t for ids in bad_word_ids(tokenizer, spellings) for t in ids} & special


def test_bad_words_that_ban_every_allowed_id_are_refused(llm):
    """Nothing was left to sample: every token was id 0, outside allowed_token_ids."""
    token = llm.get_tokenizer().encode_text("days")
    assert len(token) == 1
    with pytest.raises(RequestError) as caught:
        llm.generate(["hi"], SamplingParams(max_tokens=4, allowed_token_ids=token, bad_words=["days"]))
    assert caught.value.param == "bad_words" and "allowed_token_ids" in str(caught.value)
    spared = llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                 allowed_token_ids=[*token, 7], bad_words=["days"]))
    assert spared[0].outputs[0].token_ids == [7] * 4


def test_one_token_words_and_the_stop_ids_min_tokens_bans_that_leave_no_allowed_id_are_refused(llm):
    """Each alone left an id of allowed_token_ids to sample first (the word's token a stop id, the stop id the word's
    token), but together they banned both: the first token was id 0, outside allowed_token_ids."""
    token = llm.get_tokenizer().encode_text("days")
    stop_id = min(llm.engine.generation_defaults.stop_token_ids)
    with pytest.raises(RequestError) as caught:
        llm.generate(["hi"], SamplingParams(max_tokens=4, min_tokens=2, allowed_token_ids=[*token, stop_id],
                                            bad_words=["days"]))
    assert caught.value.param == "allowed_token_ids"
    assert "bad_words" in str(caught.value) and "min_tokens" in str(caught.value)
    spared = llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=2, min_tokens=2,
                                                 allowed_token_ids=[*token, stop_id, 7], bad_words=["days"]))
    assert spared[0].outputs[0].token_ids == [7, 7]



def _doubled_token(llm: LLM) -> int:
    """A token whose text twice over tokenizes as it twice (a word of two tokens, both it), its spaced form not."""
    tokenizer = llm.get_tokenizer()
    for token in range(len(tokenizer)):
        text = tokenizer.decode([token])
        if text.isalnum() and tokenizer.encode_text(text * 2) == [token, token]:
            return token
    raise AssertionError("no token doubles")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_word_of_several_tokens_that_leaves_no_allowed_id_ends_its_request_with_an_error(llm, temperature):
    """After the word's first token, its last, the only allowed id, was banned: nothing was left to sample, and the
    request went on with id 0, outside allowed_token_ids. It fails naming bad_words, and the requests beside it go
    on; a limit that ends the request before the dead end leaves it unharmed."""
    token = _doubled_token(llm)
    word = llm.get_tokenizer().decode([token, token])
    cornered = SamplingParams(temperature=temperature, seed=0, max_tokens=4, ignore_eos=True,
                              allowed_token_ids=[token], bad_words=[word])
    with pytest.raises(RequestError) as caught:
        llm.generate(["hi"], cornered)
    assert caught.value.param == "bad_words" and "allowed_token_ids" in str(caught.value)
    cornered.max_tokens = 1
    assert llm.generate(["hi"], cornered)[0].outputs[0].token_ids == [token]
    beside = llm.engine
    beside.add_request("free", llm.get_tokenizer().encode("hi"), FREE)
    beside.add_request("cornered", llm.get_tokenizer().encode("hi"), SamplingParams(
        temperature=temperature, seed=0, max_tokens=4, ignore_eos=True, allowed_token_ids=[token], bad_words=[word]))
    free, failed = [], []
    while beside.has_unfinished_requests:
        try:
            deltas = beside.step()
        except StepError as error:
            assert not error.whole_batch
            failed.extend(error.request_ids)
            for request_id in error.request_ids:
                beside.abort(request_id)
            deltas = error.deltas
        free.extend(t for delta in deltas if delta.request_id == "free" for t in delta.token_ids)
        assert not any(delta.request_id == "cornered" and 0 in delta.token_ids for delta in deltas)
    assert failed == ["cornered"] and len(free) == FREE.max_tokens


def test_a_word_is_matched_against_the_output_alone_from_its_first_token():
    """vLLM's rule (v1/sample/ops/bad_words.py, and its GPU runner's kernel): a word's other tokens are looked for
    among the generated tokens only, so at the first position only one-token words ban; a word of three tokens bans
    its last once two outputs spell the rest, wherever they end the output, and never on a partial match."""
    from glimmer.engine.bad_words import banned_after

    words = ((7,), (1, 2), (3, 4, 5))
    assert banned_after(words, ()) == (7,)  # the prompt's last tokens spell nothing
    assert banned_after(words, (1,)) == (7, 2)
    assert banned_after(words, (4,)) == (7,)  # (3, 4) is not all there: the prompt does not supply the 3
    assert banned_after(words, (9, 3, 4)) == (7, 5)
    assert banned_after(words, (3, 4, 1)) == (7, 2)
