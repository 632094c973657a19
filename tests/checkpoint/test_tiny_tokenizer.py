import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from transformers import AutoTokenizer

from glimmer.checkpoint.tiny_tokenizer import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    TinyTokenizerInfo,
    write_tiny_tokenizer,
)

WRITTEN_FILES = ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")
MUSE_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eom|>",
    "<|eot|>",
    "<|finetune_right_pad|>",
    "<|start|>",
    "<|message|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|vid_start|>",
    "<|vid_end|>",
    "<|vid_frame_separator|>",
    "<|image|>",
    "<|video|>",
    "<|patch|>",
)
# protocol.md §1 / architecture.md §9: the 30B tokenizer's ids, which the tiny tokenizer must not reuse
RELEASE_IDS = {
    "<|begin_of_text|>": 200000,
    "<|end_of_text|>": 200001,
    "<|eom|>": 200007,
    "<|eot|>": 200008,
    "<|finetune_right_pad|>": 200018,
    "<|start|>": 200022,
    "<|message|>": 200023,
    "<|image_start|>": 200080,
    "<|image_end|>": 200081,
    "<|vid_start|>": 200082,
    "<|vid_end|>": 200083,
    "<|vid_frame_separator|>": 200087,
    "<|image|>": 200090,
    "<|video|>": 200091,
    "<|patch|>": 200092,
    "<|reserved_special_token_1818|>": 201818,
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, TinyTokenizerInfo]:
    out = tmp_path_factory.mktemp("tiny_tokenizer")
    return out, write_tiny_tokenizer(out)


def test_writes_the_three_tokenizer_files(written):
    out, _ = written
    assert sorted(p.name for p in out.iterdir()) == list(WRITTEN_FILES)


def test_two_writes_are_byte_identical(written, tmp_path):
    out, _ = written
    write_tiny_tokenizer(tmp_path)
    for name in WRITTEN_FILES:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_write_in_another_process_is_byte_identical(written, tmp_path):
    # a fresh process has fresh hash seeds (Python's and the Rust trainer's HashMaps)
    out, _ = written
    script = (
        "import sys; from glimmer.checkpoint.tiny_tokenizer import write_tiny_tokenizer; "
        "write_tiny_tokenizer(sys.argv[1])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, cwd=root, env=env)
    for name in WRITTEN_FILES:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_has_every_muse_special_token(written):
    _, info = written
    assert set(MUSE_TOKENS) <= set(info.special_token_ids)
    assert any(t.startswith("<|reserved_special_token_") for t in info.special_token_ids)


def test_special_ids_are_not_the_release_ids(written):
    """P-TOK-1: a hard-coded release id, absolute or relative to bos, resolves to the wrong token here."""
    _, info = written
    ids = info.special_token_ids
    for token, release_id in RELEASE_IDS.items():
        assert ids[token] != release_id
        if token != "<|begin_of_text|>":
            assert ids[token] - ids["<|begin_of_text|>"] != release_id - 200000, token
    assert max(ids.values()) < info.vocab_size < 200000


def test_info_agrees_with_tokenizer_json(written):
    out, info = written
    backend = HFTokenizer.from_file(str(out / "tokenizer.json"))
    assert info.vocab_size == backend.get_vocab_size(with_added_tokens=True)
    for token, token_id in info.special_token_ids.items():
        assert backend.token_to_id(token) == token_id
    assert (info.bos_token_id, info.eos_token_id, info.pad_token_id) == (
        backend.token_to_id(BOS_TOKEN),
        backend.token_to_id(EOS_TOKEN),
        backend.token_to_id(PAD_TOKEN),
    )
    assert info.image_token_id == backend.token_to_id("<|patch|>")
    assert info.video_token_id == backend.token_to_id("<|video|>")


def test_vocabulary_fits_the_tiny_model_embedding(written):
    # architecture.md §12.3 sizes the tiny model's embedding at 512 rows
    _, info = written
    assert 300 <= info.vocab_size <= 512


def test_special_tokens_are_flagged_special_and_not_normalized(written):
    out, _ = written
    added = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    assert {a["content"] for a in added} == set(SPECIAL_TOKENS)
    assert all(a["special"] and not a["normalized"] for a in added)


def test_tokenizer_config_names_bos_eos_pad(written):
    out, info = written
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == (
        BOS_TOKEN,
        EOS_TOKEN,
        PAD_TOKEN,
    )
    assert config["model_max_length"] == 131072
    decoder = config["added_tokens_decoder"]
    assert {int(i): entry["content"] for i, entry in decoder.items()} == {
        i: t for t, i in info.special_token_ids.items()
    }


def test_post_processor_prepends_bos(written):
    out, info = written
    backend = HFTokenizer.from_file(str(out / "tokenizer.json"))
    assert backend.encode("hello").ids[0] == info.bos_token_id
    assert backend.encode("hello", add_special_tokens=False).ids[0] != info.bos_token_id


def test_merges_make_common_words_single_tokens(written):
    out, _ = written
    backend = HFTokenizer.from_file(str(out / "tokenizer.json"))
    for word in (" the", " weather", "assistant", "description", "<atem"):
        assert len(backend.encode(word, add_special_tokens=False).ids) == 1, word
    assert len(backend.encode(" zygote", add_special_tokens=False).ids) > 1


def test_transformers_loads_it_with_the_named_special_tokens(written):
    out, info = written
    hf = AutoTokenizer.from_pretrained(out)
    assert (hf.bos_token, hf.eos_token, hf.pad_token) == (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (
        info.bos_token_id,
        info.eos_token_id,
        info.pad_token_id,
    )
    assert len(hf) == info.vocab_size
    assert hf("The weather")["input_ids"][0] == info.bos_token_id
