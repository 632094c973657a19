"""Differential tests of text exactness through the public paths: `LLM.generate`, `LLM.chat`, /v1/completions and
/v1/chat/completions, streamed and not. Scripted turns of token ids (emoji, CJK and ZWJ sequences split into byte
tokens, lone and invalid bytes, special tokens) are generated as they are; the streamed deltas must add up to the
non-streamed text, and both to the `tokenizers` library's own decode of the ids (P-TOK-3, P-API-4). Seeded, so a
failure repeats."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest
from server_support import PINNED_DATE, ScriptedRunner, live_server

from glimmer import LLM, BeamSearchParams, SamplingParams
from glimmer.protocol.tokens import EOT

TRICKY = ["😀", "👩\u200d👩\u200d👧", "東京の天気", "e\u0301", " héllo", "½°C", " b", "🦀x", "<|eo", "ab", "\u2028\x85"]
SHOWN_SPECIALS = ("<|image_end|>", "<|patch|>", "<|reserved_special_token_1|>")


@pytest.fixture(scope="module")
def servers(make_tiny):
    """A server whose turns are scripted, and one of the random tiny model itself."""
    with live_server(make_tiny(), scripted=True) as scripted, live_server(make_tiny()) as model:
        yield scripted, model


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


@pytest.fixture(scope="module")
def model_server(servers):
    return servers[1]


@pytest.fixture(scope="module")
def llm(make_tiny):
    llm = LLM(str(make_tiny()), device="cpu", progress=False, kv_cache_memory=32 << 20, max_model_len=2048)
    llm.engine.runner = ScriptedRunner(llm.engine)
    return llm


@pytest.fixture(scope="module")
def tok(server):
    return server.engine.engine.tokenizer


def _script(server, llm, key: str, ids: list[int]) -> None:
    server.engine.engine.runner.add_ids(key, ids)
    llm.engine.runner.add_ids(key, ids)


def _random_ids(rng: random.Random, tok) -> list[int]:
    """Text whose characters split across byte tokens, lone bytes (truncated and invalid UTF-8), shown specials."""
    ids: list[int] = []
    for _ in range(rng.randint(1, 10)):
        draw = rng.random()
        if draw < 0.6:
            ids += tok.encode_text(rng.choice(TRICKY))
        elif draw < 0.85:
            ids.append(rng.randrange(256))  # the byte tokens come first in the tiny vocabulary
        else:
            ids.append(tok.token_to_id(rng.choice(SHOWN_SPECIALS)))
    return ids


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    # split at "\n" alone, as SSE does: str.splitlines also splits at U+0085 and U+2028, which the JSON may hold
    return [json.loads(line[6:]) for line in response.text.split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


def _legacy_bytes(token: str) -> bytes:
    """A legacy completion's logprob token as bytes: its text, or `bytes:\\xe2\\x80` for bytes that are no text."""
    if token.startswith("bytes:"):
        return bytes.fromhex(token.removeprefix("bytes:").replace("\\x", ""))
    return token.encode()


def _completion(server, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    whole = httpx.post(server.base_url + "/completions", json=body, timeout=30).json()
    chunks = _events(httpx.post(server.base_url + "/completions", json={**body, "stream": True}, timeout=30))
    return whole, [chunk["choices"][0] for chunk in chunks if chunk.get("choices")]


def _chat(server, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    whole = httpx.post(server.base_url + "/chat/completions", json=body, timeout=30).json()
    chunks = _events(httpx.post(server.base_url + "/chat/completions", json={**body, "stream": True}, timeout=30))
    return whole["choices"][0], [chunk["choices"][0] for chunk in chunks if chunk.get("choices")]


@pytest.mark.parametrize("seed", range(3))
def test_completion_text_is_the_tokenizers_decode_streamed_or_not_and_from_llm_generate(server, llm, tok, seed):
    """P-TOK-3: special tokens kept (or all skipped), nothing inserted, whole characters only; P-API-4."""
    rng = random.Random(seed)
    for trial in range(6):
        ids = _random_ids(rng, tok)
        key = f"[gen-{seed}-{trial}]"
        _script(server, llm, key, ids)
        for skip in (False, True):
            expected = tok._backend.decode(ids, skip_special_tokens=skip)
            body = {"model": "tiny", "prompt": f"Say {key}", "max_tokens": len(ids), "temperature": 0,
                    "skip_special_tokens": skip, "logprobs": 0}
            whole, chunks = _completion(server, body)
            streamed = "".join(chunk["text"] for chunk in chunks)
            output = llm.generate(f"Say {key}", SamplingParams(temperature=0, max_tokens=len(ids),
                                                               skip_special_tokens=skip), use_tqdm=False)[0]
            assert whole["choices"][0]["text"] == streamed == output.text == expected, (ids, skip)
            assert output.token_ids == ids
            tokens = whole["choices"][0]["logprobs"]["tokens"]
            assert tokens == [chunk_token for chunk in chunks for chunk_token in chunk["logprobs"]["tokens"]]
            assert [_legacy_bytes(token) for token in tokens] == [tok.token_bytes(i) for i in ids]


@pytest.mark.parametrize("seed", range(3))
def test_a_stop_string_cuts_the_decoded_text_at_its_first_occurrence(server, llm, tok, seed):
    """A stop string drawn from the decoded text (so it spans tokens, split characters and U+FFFDs) ends it there,
    kept with include_stop_str_in_output, the same streamed, not streamed and from LLM.generate."""
    rng = random.Random(100 + seed)
    for trial in range(6):
        ids = _random_ids(rng, tok)
        key = f"[stop-{seed}-{trial}]"
        _script(server, llm, key, ids)
        text = tok.decode(ids)
        start = rng.randrange(len(text))
        stop = text[start:start + rng.randint(1, 4)]
        for include in (False, True):
            at = text.find(stop)
            expected = text[:at + len(stop)] if include else text[:at]
            body = {"model": "tiny", "prompt": f"Say {key}", "max_tokens": len(ids), "temperature": 0, "stop": [stop],
                    "include_stop_str_in_output": include}
            whole, chunks = _completion(server, body)
            output = llm.generate(f"Say {key}", SamplingParams(temperature=0, max_tokens=len(ids), stop=[stop],
                                                               include_stop_str_in_output=include), use_tqdm=False)[0]
            assert whole["choices"][0]["text"] == "".join(c["text"] for c in chunks) == output.text == expected
            assert whole["choices"][0]["stop_reason"] == output.stop_reason == stop


@pytest.mark.parametrize(("stop", "expected"), [
    (["ram", "parameter"], "xpa"), (["parameter", "ram"], "xpa"),  # one token completes both: "ram" ends first
    (["para", "parameter"], "x"), (["meter", "ameter"], "xpar"),  # a prefix; two ending at one place: the longer
    (["r d", "ter day"], "xparamete"),  # across tokens: both complete in the token "day", "r d" ends first
])
def test_overlapping_stop_strings_cut_at_the_first_to_end_everywhere(server, llm, tok, stop, expected):
    """Of overlapping stop strings (or one a prefix of another) the one that ends first cuts the text, of those ending
    at one place the longest: the same streamed and not, on /v1/completions, LLM.generate, chat and LLM.chat, the
    answer being a few tokens that each hold several characters (LLM.chat cut its whole answer at the earliest to
    start; the server at the first its tokens completed)."""
    answer = tok.encode_text("x") + tok.encode_text("parameter") + tok.encode_text(" day")
    assert len(answer) == 4  # the tiny vocabulary has "parameter" and "day" as tokens
    key = f"[overlap-{'-'.join(stop)}]"
    _script(server, llm, key, answer)
    body = {"model": "tiny", "prompt": f"Say {key}", "max_tokens": len(answer), "temperature": 0, "stop": stop}
    whole, chunks = _completion(server, body)
    output = llm.generate(f"Say {key}", SamplingParams(temperature=0, max_tokens=len(answer), stop=stop),
                          use_tqdm=False)[0]
    assert whole["choices"][0]["text"] == "".join(c["text"] for c in chunks) == output.text == expected
    chat_key = f"[overlap-chat-{'-'.join(stop)}]"
    _script(server, llm, chat_key, tok.encode(" to=user<|message|>") + answer + [tok.token_to_id(EOT)])
    messages = [{"role": "user", "content": f"{chat_key} Hi"}]
    reply, chat_chunks = _chat(server, {"model": "tiny", "messages": messages, "temperature": 0, "stop": stop,
                                        "chat_template_kwargs": PINNED_DATE})
    offline = llm.chat(messages, SamplingParams(temperature=0, stop=stop), chat_template_kwargs=PINNED_DATE,
                       use_tqdm=False)[0]
    streamed = "".join(chunk["delta"].get("content") or "" for chunk in chat_chunks)
    assert reply["message"]["content"] == streamed == offline.content == expected


def _turn(rng: random.Random, tok, answer: list[int]) -> list[int]:
    """A chat turn whose answer is `answer`, with or without reasoning before it."""
    head = tok.encode(" to=user<|message|>")
    if rng.random() < 0.5:
        head = (tok.encode(" to=self<|message|>") + _random_ids(rng, tok)
                + tok.encode("<|eom|><|start|>assistant to=user<|message|>"))
    return head + answer + [tok.token_to_id(EOT)]


@pytest.mark.parametrize("seed", range(3))
def test_chat_answer_is_the_decode_of_its_tokens_streamed_or_not_and_from_llm_chat(server, llm, tok, seed):
    """The answer is the decode of its tokens, the hidden specials left out unless skip_special_tokens is false
    (P-REQ-1 keeps them in the engine's text); each listed logprob is an answer token's, `bytes` its own bytes."""
    rng = random.Random(200 + seed)
    hidden = tok.hidden_in_replies
    for trial in range(5):
        answer = _random_ids(rng, tok)
        key = f"[chat-{seed}-{trial}]"
        _script(server, llm, key, _turn(rng, tok, answer))
        messages = [{"role": "user", "content": f"{key} Hi"}]
        for skip in (True, False):
            shown = [token_id for token_id in answer if not (skip and token_id in hidden)]
            body = {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": 300, "logprobs": True,
                    "skip_special_tokens": skip, "chat_template_kwargs": PINNED_DATE}
            whole, chunks = _chat(server, body)
            reply = llm.chat(messages, SamplingParams(temperature=0, max_tokens=300, skip_special_tokens=skip),
                             chat_template_kwargs=PINNED_DATE, use_tqdm=False)[0]
            streamed = "".join(chunk["delta"].get("content") or "" for chunk in chunks)
            content = (whole["message"]["content"], streamed or None, reply.content)
            # a hidden token is left out before the bytes are decoded (as skip_special_tokens leaves tokens out): a
            # character whose bytes it splits comes out whole
            expected = tok.decode(shown)
            assert content == (expected or None,) * 3, (answer, skip)  # P-API-1: null when empty
            entries = whole["logprobs"]["content"]
            assert entries == [entry for chunk in chunks if chunk.get("logprobs")
                               for entry in chunk["logprobs"]["content"]]
            assert [bytes(entry["bytes"]) for entry in entries] == [tok.token_bytes(i) for i in shown], (answer, skip)


def test_a_hidden_special_token_between_the_bytes_of_a_character_leaves_it_whole(server, llm, tok):
    """A special token the reply hides (`<|patch|>`), generated between the bytes of an emoji, left the bytes on either
    side decoded apart: U+FFFDs in the answer, streamed or not, where skip_special_tokens' decode has the emoji."""
    emoji = tok.encode_text("😀")
    answer = tok.encode_text("ok ") + emoji[:2] + [tok.token_to_id("<|patch|>")] + emoji[2:] + tok.encode_text("!")
    _script(server, llm, "[split-emoji]", tok.encode(" to=user<|message|>") + answer + [tok.token_to_id(EOT)])
    messages = [{"role": "user", "content": "[split-emoji] Hi"}]
    for logprobs in (False, True):
        body = {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": 50, "logprobs": logprobs,
                "chat_template_kwargs": PINNED_DATE}
        whole, chunks = _chat(server, body)
        streamed = [chunk["delta"]["content"] for chunk in chunks if chunk["delta"].get("content")]
        assert whole["message"]["content"] == "".join(streamed) == "ok 😀!"
    reply = llm.chat(messages, SamplingParams(temperature=0, max_tokens=50), chat_template_kwargs=PINNED_DATE,
                     use_tqdm=False)[0]
    assert reply.content == "ok 😀!"


def test_an_answer_ending_in_an_incomplete_character_lists_no_logprob_of_the_token_after_it(server, tok):
    """The U+FFFD of bytes an answer left incomplete comes with the text of the token after them (`<|eot|>`, whose
    first byte cannot continue the character), yet it stands for the bytes: `<|eot|>` was listed among the answer's
    logprobs, as if its text were the answer's, whenever the answer ended in a truncated character."""
    answer = tok.encode_text("ok") + tok.encode_text("😀")[:2]
    server.engine.engine.runner.add_ids("[cut-emoji]", tok.encode(" to=user<|message|>") + answer
                                        + [tok.token_to_id(EOT)])
    body = {"model": "tiny", "messages": [{"role": "user", "content": "[cut-emoji] Hi"}], "temperature": 0,
            "max_tokens": 50, "logprobs": True, "top_logprobs": 1, "chat_template_kwargs": PINNED_DATE}
    whole, chunks = _chat(server, body)
    assert whole["message"]["content"] == "ok\ufffd"
    for entries in (whole["logprobs"]["content"],
                    [entry for chunk in chunks if chunk.get("logprobs") for entry in chunk["logprobs"]["content"]]):
        assert [bytes(entry["bytes"]) for entry in entries] == [tok.token_bytes(i) for i in answer]


def test_echo_and_prompt_logprobs_spell_a_prompt_that_splits_a_character(model_server, tok):
    """echo puts the prompt's decode before the text, streamed or not (a character it cuts short is the output's to
    complete: whole if the model's first token does, else U+FFFD); prompt_logprobs' decoded_token is each token's own
    decode."""
    prompt = tok.encode_text("東京 ") + tok.encode_text("😀")[:3]
    for skip in (False, True):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": True,
                "logprobs": 1, "prompt_logprobs": 1, "skip_special_tokens": skip, "seed": 0}
        whole, chunks = _completion(model_server, body)
        choice = whole["choices"][0]
        generated = choice["logprobs"]["tokens"][len(prompt):]
        assert choice["text"] == "".join(chunk["text"] for chunk in chunks)
        assert choice["text"].startswith("東京 ") and len(generated) == 4
        offsets = choice["logprobs"]["text_offset"]
        completes = not choice["text"].startswith("東京 \ufffd")  # this seed's first token does: 😢
        assert offsets == sorted(offsets) and offsets[len(prompt)] == len("東京 \ufffd") - completes
        for position in choice["prompt_logprobs"][1:]:
            for token_id, entry in position.items():
                assert entry["decoded_token"] == tok._backend.decode([int(token_id)], skip_special_tokens=False)


@pytest.mark.parametrize("max_tokens", [0, 1, 3])
def test_echo_of_a_prompt_whose_character_the_output_completes_spells_it_whole(server, tok, max_tokens):
    """The echo was decoded apart from the output: a character whose bytes the prompt begins and the output ends came
    out as U+FFFDs on both sides. The choice's text is the decode of prompt and output together, streamed or not, and
    each token's `text_offset` is where its text starts in it (the token that completes the character, at the
    character); with max_tokens 0 or an output that does not complete it, the bytes are one U+FFFD, as before."""
    emoji = tok.encode_text("😀")
    prompt = tok.encode("Say [echo-split] 東京 ") + emoji[:2]
    server.engine.engine.runner.add_ids("[echo-split]", emoji[2:] + tok.encode_text("!"))
    for skip in (False, True):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "echo": True,
                "logprobs": 0, "skip_special_tokens": skip}
        whole, chunks = _completion(server, body)
        choice = whole["choices"][0]
        output = choice["logprobs"]["tokens"][len(prompt):]
        assert len(output) == max_tokens
        expected = tok._backend.decode(prompt + (emoji[2:] + tok.encode_text("!"))[:max_tokens],
                                       skip_special_tokens=skip)
        assert choice["text"] == "".join(chunk["text"] for chunk in chunks) == expected
        assert "\ufffd" not in expected or max_tokens < 2
        offsets = choice["logprobs"]["text_offset"]
        assert offsets == sorted(offsets)
        assert offsets == [offset for chunk in chunks for offset in chunk["logprobs"]["text_offset"]]
        before = len(tok._backend.decode(prompt[:-2], skip_special_tokens=skip))
        assert offsets[len(prompt) - 2:] == [before] * min(max_tokens + 2, 4) + [before + 1] * (max_tokens == 3)


@pytest.mark.parametrize("seed", range(4))
def test_the_real_model_sampling_byte_tokens_streams_the_decode_of_what_it_sampled(model_server, tok, seed):
    """The model itself (no script) sampling among the byte tokens of an emoji and a CJK character and a shown special
    (`allowed_token_ids`), so that characters come split, truncated and invalid: the streamed and the non-streamed
    text are the `tokenizers` decode of the sampled ids (read back from the logprob tokens), skipped specials too."""
    allowed = sorted(set(tok.encode_text("😀東é")) | {tok.token_to_id("<|image_end|>")})
    id_of = {tok.token_bytes(token_id): token_id for token_id in allowed}
    for skip in (False, True):
        body = {"model": "tiny", "prompt": "Emoji:", "max_tokens": 16, "temperature": 1.0, "seed": seed,
                "allowed_token_ids": allowed, "skip_special_tokens": skip, "logprobs": 0}
        whole, chunks = _completion(model_server, body)
        choice = whole["choices"][0]
        ids = [id_of[_legacy_bytes(token)] for token in choice["logprobs"]["tokens"]]
        assert len(ids) == 16 and len(set(ids)) > 1
        assert choice["text"] == "".join(chunk["text"] for chunk in chunks)
        assert choice["text"] == tok._backend.decode(ids, skip_special_tokens=skip)


def test_a_request_with_logprobs_decodes_each_generated_token_once(server, tok, monkeypatch):
    """The engine says where each token's own text starts (`token_text_starts`); the server decoded every generated
    token a second time for that, a legacy completion for its `text_offset`, a chat answer for its logprobs."""
    from glimmer.engine.detokenizer import IncrementalDetokenizer

    decoded: list[int] = []
    for name in ("add", "add_at"):
        method = getattr(IncrementalDetokenizer, name)

        def counting(self, token_id, _method=method):
            decoded.append(token_id)
            return _method(self, token_id)

        monkeypatch.setattr(IncrementalDetokenizer, name, counting)
    answer = tok.encode_text("ok ") + tok.encode_text("😀")[:2] + tok.encode_text("東京!")
    server.engine.engine.runner.add_ids("[decoded-once]", answer)
    body = {"model": "tiny", "prompt": "[decoded-once]", "max_tokens": len(answer), "temperature": 0, "logprobs": 1}
    for stream in (False, True):
        decoded.clear()
        response = httpx.post(server.base_url + "/completions", json={**body, "stream": stream}, timeout=30)
        assert response.status_code == 200 and sorted(decoded) == sorted(answer)
    turn = tok.encode(" to=user<|message|>") + answer + [tok.token_to_id(EOT)]
    server.engine.engine.runner.add_ids("[decoded-once-chat]", turn)
    decoded.clear()
    reply, _ = _chat(server, {"model": "tiny", "messages": [{"role": "user", "content": "[decoded-once-chat]"}],
                              "temperature": 0, "logprobs": True, "chat_template_kwargs": PINNED_DATE})
    assert reply["message"]["content"] == "ok \ufffd東京!"
    assert sorted(decoded) == sorted(turn * 2)  # the whole response, then the streamed one


def test_a_line_separator_in_the_text_does_not_split_a_streamed_event(server, tok):
    """U+2028, U+2029 and NEL (U+0085) are line breaks to str.splitlines, which httpx's `iter_lines()` (and so many an
    SSE client) splits at: written raw into an event's JSON they cut it in two, and the client failed to parse it.
    They are escaped (valid JSON, the same string); the text streamed is the text."""
    text = "a\u2028b\u2029c\x85d"
    server.engine.engine.runner.add_ids("[separators]", tok.encode_text(text))
    server.engine.engine.runner.add_ids("[separators-chat]", tok.encode(" to=user<|message|>") + tok.encode_text(text)
                                        + [tok.token_to_id(EOT)])
    requests = [("/completions", {"prompt": "[separators]", "max_tokens": len(tok.encode_text(text))}, "text"),
                ("/chat/completions", {"messages": [{"role": "user", "content": "[separators-chat]"}],
                                       "chat_template_kwargs": PINNED_DATE}, "content")]
    for path, fields, key in requests:
        body = {"model": "tiny", "temperature": 0, "stream": True, **fields}
        with httpx.stream("POST", server.base_url + path, json=body, timeout=30) as response:
            lines = [line for line in response.iter_lines() if line]
        assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines), lines
        choices = [json.loads(line[6:])["choices"] for line in lines[:-1]]
        pieces = [(c[0].get("delta") or c[0]).get(key) or "" for c in choices if c]
        assert "".join(pieces) == text


def _split_prompt(server, llm, tok, key: str) -> tuple[list[int], list[int]]:
    """A token-id prompt ending in the first two of an emoji's four byte tokens, and its scripted output: the other
    two then "!"."""
    emoji = tok.encode_text("😀")
    assert len(emoji) == 4, "the tiny vocabulary has a token joining the emoji's bytes; pick a rarer character"
    _script(server, llm, key, emoji[2:] + tok.encode_text("!"))
    return tok.encode(f"Say {key} ") + emoji[:2], emoji[2:] + tok.encode_text("!")


@pytest.mark.parametrize(("max_tokens", "expected"), [(0, ""), (1, "\ufffd"), (2, "😀"), (3, "😀!")])
def test_an_output_completing_a_character_its_prompt_began_spells_it_whole(server, llm, tok, max_tokens, expected):
    """A token-id prompt ending partway through a character, and an output that completes it: without echo the
    output's text was decoded on its own, its first bytes U+FFFDs ("\ufffd\ufffd!"), where vLLM starts its
    detokenizer on the prompt's last tokens and gives "😀!". The text starts with the whole character, streamed or not
    and from LLM.generate; max_tokens 0 gives "" (as vLLM), and an output that has not completed the character ends
    in U+FFFD, as any output ending partway through one does (P-TOK-3). `text_offset` puts the tokens that complete
    the character at its start."""
    prompt, output = _split_prompt(server, llm, tok, "[prompt-split]")
    for skip in (False, True):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0,
                "skip_special_tokens": skip}
        whole, chunks = _completion(server, body)
        choice = whole["choices"][0]
        generated = llm.generate({"prompt_token_ids": prompt}, SamplingParams(
            temperature=0, max_tokens=max_tokens, skip_special_tokens=skip), use_tqdm=False)[0].outputs[0]
        assert choice["text"] == "".join(chunk["text"] for chunk in chunks) == generated.text == expected
        assert generated.token_ids == output[:max_tokens]
        offsets = choice["logprobs"]["text_offset"]
        assert offsets == [offset for chunk in chunks for offset in chunk["logprobs"]["text_offset"]]
        assert offsets == [0, 0, 1][:max_tokens]


def test_a_stop_string_matches_a_character_its_prompt_began(server, llm, tok):
    """The character the prompt begins and the output completes is the output text's, so a stop string can match
    it (vLLM checks stop strings against the text its prompt-started detokenizer gives): it never could while that
    text began with U+FFFDs."""
    prompt, output = _split_prompt(server, llm, tok, "[prompt-split-stop]")
    for include in (False, True):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 5, "temperature": 0, "stop": ["😀"],
                "include_stop_str_in_output": include}
        whole, chunks = _completion(server, body)
        choice = whole["choices"][0]
        generated = llm.generate({"prompt_token_ids": prompt}, SamplingParams(
            temperature=0, max_tokens=5, stop=["😀"], include_stop_str_in_output=include), use_tqdm=False)[0]
        expected = "😀" if include else ""
        assert choice["text"] == "".join(chunk["text"] for chunk in chunks) == generated.outputs[0].text == expected
        assert choice["finish_reason"] == generated.outputs[0].finish_reason == "stop"
        assert choice["stop_reason"] == generated.outputs[0].stop_reason == "😀"


def test_a_beam_search_choice_decodes_its_beam_alone_as_vllms(server, llm, tok):
    """`use_beam_search` decodes each beam's generated tokens alone, as vLLM's server does
    (`tokenizer.decode(beam.tokens[tokenized_length:])`): the bytes completing a character the prompt began read
    U+FFFD, where a sampled choice starts with the whole character (README); `LLM.beam_search`'s text, the prompt's
    and the beam's tokens decoded together, has it whole."""
    emoji, bang = tok.encode_text("😀"), tok.encode_text("!")
    assert len(emoji) == 4 and len(bang) == 1
    prompt = tok.encode("Say [beam-split] ") + emoji[:3]
    beam = emoji[3:] + bang
    # each step of a beam search is a request whose prompt holds the beam so far, scripted to its next token
    steps = [tok.decode(prompt), tok.decode(prompt + beam[:1])]
    assert steps[0] not in steps[1] and steps[1] not in steps[0], steps
    _script(server, llm, steps[0], beam[:1])
    _script(server, llm, steps[1], beam[1:])
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "use_beam_search": True, "n": 1}
    whole, chunks = _completion(server, body)
    alone = tok.decode(beam)
    assert alone.startswith("\ufffd") and alone.endswith("!")
    assert whole["choices"][0]["text"] == "".join(chunk["text"] for chunk in chunks) == alone
    searched = llm.beam_search([{"prompt_token_ids": prompt}], BeamSearchParams(beam_width=1, max_tokens=2))
    assert searched[0].sequences[0].text.endswith("😀!")
