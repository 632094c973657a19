"""`python -m glimmer.train_nano --recipe micro`: the whole pipeline at a size a CPU runs in seconds."""

from __future__ import annotations

import csv

import pytest

from glimmer import LLM, SamplingParams
from glimmer.checkpoint.config_layouts import load_config
from glimmer.engine.model_loader import load_drafter
from glimmer.train_nano.__main__ import main
from glimmer.train_nano.pipeline import DRAFTER_DIR, TARGET_DIR
from glimmer.train_nano.recipe import MICRO


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("micro")
    assert main([str(out), "--recipe", "micro", "--device", "cpu", "--workers", "1"]) == 0
    return out


def _curve(path):
    with path.open() as handle:
        return [float(row["loss"]) for row in csv.DictReader(handle)]


def test_the_target_learns(trained):
    losses = _curve(trained / "target_loss.csv")
    assert len(losses) == MICRO.target_steps and losses[-1] < losses[0]


def test_the_target_is_a_complete_checkpoint_of_the_real_architecture(trained):
    target = trained / TARGET_DIR
    assert {"config.json", "generation_config.json", "chat_template.jinja", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "model.safetensors"} <= {p.name for p in target.iterdir()}
    text = load_config(target).text
    assert set(text.layer_types) == {"full_attention", "sliding_attention"}
    assert not all(text.rope_layers) and any(text.rope_layers)  # NoPE and RoPE layers
    assert text.num_key_value_heads < text.num_attention_heads  # GQA
    llm = LLM(str(target), progress=False)
    output = llm.chat([{"role": "user", "content": "Hi!"}], SamplingParams(max_tokens=5))[0]
    assert len(output.output.token_ids) == 5


def test_the_drafter_is_trained_for_the_target(trained):
    assert len(_curve(trained / "drafter_loss.csv")) == MICRO.drafter_steps
    drafter = load_drafter(trained / DRAFTER_DIR, load_config(trained / TARGET_DIR),
                           lambda: pytest.fail("the drafter names its mask token"), progress=False)
    assert drafter.config.block_size == MICRO.drafter.block_size
    assert drafter.config.target_layer_ids == MICRO.drafter.target_layer_ids


def test_a_drafter_alone_for_a_trained_target(trained, tmp_path):
    assert main([str(tmp_path), "--recipe", "micro", "--device", "cpu", "--workers", "1", "--target",
                 str(trained / TARGET_DIR), "--drafter-steps", "2"]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {DRAFTER_DIR, "drafter_loss.csv"}
    assert len(_curve(tmp_path / "drafter_loss.csv")) == 2


@pytest.mark.parametrize(("flags", "words"), [
    (["--target", "{tmp}/glimmer-nan"], "is not a trained target checkpoint (it has no config.json or tokenizer.json)"),
    (["--device", "cdua"], "--device cdua is not a device"),
    (["--device", "meta"], "--device meta is not supported"),
    (["--conversations", "0"], "--conversations 0: give a count of at least 1"),
    (["--drafter-conversations", "0"], "--drafter-conversations 0: give a count of at least 1"),
    (["--workers", "-2"], "--workers -2: give a count of at least 1"),
    (["--batch-tokens", "0"], "--batch-tokens 0: give a count of at least 1"),
    (["--target-steps", "-1"], "--target-steps -1: give 0 or more"),
    (["--drafter-steps", "-5"], "--drafter-steps -5: give 0 or more"),
    (["--seed", "-1"], "--seed -1: give a seed from 0 to 2**64 - 1"),
    (["--seed", str(2**64)], f"--seed {2**64}: give a seed from 0 to 2**64 - 1"),
    (["--target", "{tmp}", "--conversations", "5"], "--target trains only a drafter; leave out --conversations"),
    (["--target", "{tmp}", "--conversations", "5", "--target-steps", "3"],
     "leave out --conversations and --target-steps (the target's training)"),
    (["--drafter-conversations", "25"], "--drafter-conversations 25 is more than the corpus's 24 conversations"),
    (["--conversations", "10", "--drafter-conversations", "11"],
     "--drafter-conversations 11 is more than the corpus's 10 conversations"),
])
def test_a_wrong_option_is_one_line_before_anything_is_written(capsys, tmp_path, flags, words):
    """A mistyped --target was created as an empty directory and the run ended in a traceback, `Exception: No such
    file or directory (os error 2)`; a mistyped --device in torch's RuntimeError traceback. A count or seed out of
    range was taken: --conversations 0 and --seed -1 ended in numpy tracebacks after the tokenizer was written,
    --drafter-conversations 0 waited for a batch forever, --workers 0 and --batch-tokens 0 ran as if sensible, and
    a --drafter-conversations above the corpus's trained the drafter on fewer without a word. With --target, the
    target's --conversations and --target-steps were ignored without a word."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main([str(out), "--recipe", "micro", "--workers", "1", *[flag.format(tmp=tmp_path) for flag in flags]])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.strip().splitlines() == [err.strip()]
    assert err.startswith("python -m glimmer.train_nano: error: ") and words in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", ["--conversations", "--drafter-conversations"])
def test_a_corpus_left_without_conversations_is_one_line(capsys, tmp_path, option):
    """The micro corpus's conversation 0 runs longer than the recipe keeps, so its first conversation alone leaves
    none: --conversations 1 ended in numpy's `need at least one array to concatenate`, and --drafter-conversations 1
    waited for the drafter's first batch forever (after training the target)."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "out"), "--recipe", "micro", "--device", "cpu", "--workers", "1", option, "1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.strip().splitlines() == [err.strip()]
    assert err == (f"python -m glimmer.train_nano: error: {option} 1: none of the first 1 conversations fits in "
                   f"{MICRO.max_conversation_tokens} tokens (longer ones are left out); give a larger {option}\n")
    assert not (tmp_path / "out" / "target_loss.csv").exists()  # refused before the target trains


@pytest.mark.parametrize("file", [".", TARGET_DIR, DRAFTER_DIR])
def test_a_file_where_the_run_writes_a_directory_is_one_line(capsys, tmp_path, file):
    """A file as OUT_DIR, or as its glimmer-nano or glimmer-nano-dflash, was mkdir's FileExistsError traceback."""
    out = tmp_path / "out"
    if file == ".":
        out.write_text("x")
    else:
        out.mkdir()
        (out / file).write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        main([str(out), "--recipe", "micro", "--device", "cpu", "--workers", "1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err == (f"python -m glimmer.train_nano: error: OUT_DIR {out}: {out / file if file != '.' else out} is a "
                   "file, where the run writes a directory; give another OUT_DIR or move the file\n")
