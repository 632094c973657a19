"""The pieces between special tokens, tokenized once across prompts (glimmer/engine/token_pieces.py)."""

import json
import pickle
import tracemalloc
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer

from glimmer.checkpoint.tiny_tokenizer import BOS_TOKEN, EOM_TOKEN, EOT_TOKEN, SPECIAL_TOKENS, write_tiny_tokenizer
from glimmer.engine.token_pieces import PieceIds, entry_bytes, pieces_encode_alone
from glimmer.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(out)
    return out


class RecordingBackend:
    """A tokenizers backend that records the texts it tokenizes."""

    def __init__(self, backend: HFTokenizer):
        self.backend = backend
        self.texts: list[str] = []

    def encode(self, text, **kwargs):
        self.texts.append(text)
        return self.backend.encode(text, **kwargs)

    def encode_batch(self, texts, **kwargs):
        self.texts += texts
        return self.backend.encode_batch(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.backend, name)


@pytest.fixture
def recorded(tiny_dir) -> tuple[Tokenizer, RecordingBackend]:
    tokenizer = Tokenizer.from_dir(tiny_dir)
    backend = RecordingBackend(tokenizer._backend)
    tokenizer._backend = backend
    return tokenizer, backend


def _agent_prompt(turns: int) -> str:
    """A rendered agent conversation's text: the tools' block, then a call and its result a turn."""
    text = f"{BOS_TOKEN}<|start|>system<|message|>" + "Tools: read_file(path), grep(pattern). " * 40 + EOT_TOKEN
    for turn in range(turns):
        text += (f"<|start|>assistant to=read_file<|message|>path = src/module_{turn}.py{EOM_TOKEN}"
                 f"<|start|>tool read_file<|message|>  def handler_{turn}(request):\n    return 42\n{EOT_TOKEN}")
    return text + "<|start|>assistant"


def test_a_conversation_sent_again_with_a_new_turn_tokenizes_only_that_turn(recorded):
    tokenizer, backend = recorded
    tokenizer.encode(_agent_prompt(3))
    backend.texts.clear()
    whole = _agent_prompt(4)
    ids = tokenizer.encode(whole)
    assert ids == backend.backend.encode(whole, add_special_tokens=False).ids
    assert sorted(backend.texts) == sorted({"path = src/module_3.py",
                                            "  def handler_3(request):\n    return 42\n"})


SPECIAL = list(SPECIAL_TOKENS[:8])
PIECES = st.lists(st.one_of(st.sampled_from(SPECIAL), st.sampled_from([" ", "\n", "  ", "\t", "a b", "’s"]),
                            st.text(max_size=12)), max_size=24).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(PIECES, min_size=1, max_size=4))
def test_ids_from_kept_pieces_are_the_whole_texts_ids(recorded, texts):
    tokenizer, backend = recorded
    for text in [*texts, *texts]:  # the second time from kept pieces
        assert tokenizer.encode(text) == backend.backend.encode(text, add_special_tokens=False).ids


def test_kept_pieces_stay_within_their_bytes(tiny_dir):
    backend = RecordingBackend(Tokenizer.from_dir(tiny_dir)._backend)
    ids = {p: backend.backend.encode(p, add_special_tokens=False).ids for p in ("abcdef", "ghij", "klmno")}
    cost = {p: entry_bytes(p, array("i", ids[p])) for p in ids}
    pieces = PieceIds(backend, max_bytes=sum(cost.values()) - 1)
    assert pieces.ids(["abcdef", "ghij"]) == [ids["abcdef"], ids["ghij"]]
    pieces.ids(["klmno"])  # over the budget: the least recently used piece goes
    backend.texts.clear()
    pieces.ids(["ghij", "klmno", "abcdef"])
    assert backend.texts == ["abcdef"]


def test_a_tokenizer_that_kept_pieces_pickles_without_them_and_its_copy_tokenizes_the_same(tiny_dir):
    """The kept pieces' lock made a Tokenizer that had tokenized a prompt (any LLM.chat) unpicklable: "cannot
    pickle '_thread.lock' object", where a fresh one is sent to worker processes. The copy starts with no kept
    pieces (a cache of up to megabytes, rebuilt where it is used) and gives the same ids."""
    tokenizer = Tokenizer.from_dir(tiny_dir)
    text = _agent_prompt(2)
    ids = tokenizer.encode(text)
    copy = pickle.loads(pickle.dumps(tokenizer))
    assert copy._piece_ids is not None and copy._piece_ids._kept == {}
    assert copy.encode(text) == ids and copy._piece_ids._kept


def test_many_short_pieces_keep_no_more_memory_than_the_budget(tiny_dir):
    """A budget of characters let 64 Ki pieces of four characters keep 15 MiB where 256 KiB was meant."""
    backend = Tokenizer.from_dir(tiny_dir)._backend
    budget = 256 << 10
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pieces = PieceIds(backend, budget)
        for start in range(0, 80_000, 4_000):
            pieces.ids([f"{n:04x}" for n in range(start, start + 4_000)])
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < budget * 1.25
    assert pieces.ids(["0000", "ffff"]) == [backend.encode(p, add_special_tokens=False).ids for p in ("0000", "ffff")]


def test_a_tokenizer_whose_pieces_depend_on_their_place_tokenizes_each_text_whole(tiny_dir):
    backend = HFTokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert pieces_encode_alone(backend)
    first_only = json.loads(backend.to_str())
    first_only["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]}
    assert not pieces_encode_alone(HFTokenizer.from_str(json.dumps(first_only)))
    backend.add_tokens(["module"])  # a non-special added token: matched beside the special ones
    assert not pieces_encode_alone(backend)
