"""`glimmer inspect` refuses what loading refuses: tokenizer, generation config, and weights of two checkpoints."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from safetensors.torch import load_file

from glimmer import LLM, SamplingParams
from glimmer.cli import INSPECT_EXIT_STATUS, main
from glimmer.engine.model_loader import load_model
from glimmer.errors import CheckpointError, ConfigError, GlimmerError


def _breakages():
    def no_tokenizer(path):
        (path / "tokenizer.json").unlink()

    def corrupt_tokenizer(path):
        (path / "tokenizer.json").write_text("{not json")

    def bos_of_another_token(path):  # the post-processor still begins text prompts with <|begin_of_text|>
        config = json.loads((path / "tokenizer_config.json").read_text())
        (path / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": "<|end_of_text|>"}))

    def hot_temperature(path):
        (path / "generation_config.json").write_text(json.dumps({"temperature": "hot"}))

    def list_generation_config(path):
        (path / "generation_config.json").write_text("[1, 2]")

    def generation_config_a_directory(path):  # was taken as absent: the checkpoint's stop ids and defaults unread
        (path / "generation_config.json").unlink()
        (path / "generation_config.json").mkdir()

    def tokenizer_config_a_directory(path):  # was taken as absent: its special tokens unread
        (path / "tokenizer_config.json").unlink()
        (path / "tokenizer_config.json").mkdir()

    def unclosed_template_tag(path):
        (path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}")

    def template_without_generation_prompt(path):  # the server refuses it at start (P-TMPL-8)
        (path / "chat_template.jinja").write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")

    def template_that_fails_to_render(path):
        (path / "chat_template.jinja").write_text("{{ raise_exception('no chat here') }}")

    return [(no_tokenizer, "CheckpointError", "tokenizer.json not found"),
            (corrupt_tokenizer, "CheckpointError", "not a valid tokenizers file"),
            (bos_of_another_token, "CheckpointError", "begins a prompt with '<|begin_of_text|>'"),
            (hot_temperature, "ConfigError", "temperature='hot'"),
            (list_generation_config, "ConfigError", "must hold a JSON object"),
            (generation_config_a_directory, "ConfigError", "generation_config.json is not a file"),
            (tokenizer_config_a_directory, "CheckpointError", "tokenizer_config.json is not a file"),
            (unclosed_template_tag, "CheckpointError", "chat_template.jinja does not compile (line 1: Unexpected end"),
            (template_without_generation_prompt, "ConfigError", "P-TMPL-8"),
            (template_that_fails_to_render, "ChatTemplateError", "no chat here")]


@pytest.mark.parametrize(("breakage", "error", "words"), _breakages(), ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_inspect_refuses_a_tokenizer_or_generation_config_that_loading_refuses(
        tiny_checkpoint, tmp_path, capsys, breakage, error, words, as_json):
    checkpoint = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, checkpoint)
    breakage(checkpoint)
    assert main(["inspect", str(checkpoint), *(["--json"] if as_json else [])]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1].startswith(f"glimmer: error: {error}: ")
    assert words in captured.err and "Traceback" not in captured.err
    assert "warnings: none" not in captured.out and captured.out == ""


def test_inspect_of_a_sound_checkpoint_reports_no_warnings(tiny_checkpoint, capsys):
    assert main(["inspect", str(tiny_checkpoint)]) == 0
    out = capsys.readouterr().out
    assert "warnings: none" in out and f"chat template:   {tiny_checkpoint / 'chat_template.jinja'} (sha256 " in out


def test_inspect_checks_the_chat_template_serve_would_be_given(tiny_checkpoint, tmp_path, capsys):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% if %}")
    assert main(["inspect", str(tiny_checkpoint), "--chat-template", str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"the chat template from {broken} (the caller's template) does not compile (line 1:" in err
    good = tmp_path / "good.jinja"
    good.write_text((tiny_checkpoint / "chat_template.jinja").read_text())
    assert main(["inspect", str(tiny_checkpoint), "--chat-template", str(good), "--json"]) == 0
    origin = json.loads(capsys.readouterr().out)["chat_template"]["origin"]
    assert origin == f"{good} (the caller's template)"


def test_inspect_refuses_a_missing_chat_template_naming_the_flag_and_the_fix(tiny_checkpoint, tmp_path, capsys):
    """It said "CheckpointError: chat template file PATH does not exist", naming neither the flag nor what to do, where
    serve refuses the same --chat-template naming both (and a Hub id would have been downloaded first)."""
    missing = tmp_path / "missing.jinja"
    assert main(["inspect", str(tiny_checkpoint), "--chat-template", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"glimmer: error: --chat-template {missing}: no such file; give the path of a Jinja chat template file, or "
        "leave it out for the checkpoint's own template")


def test_a_checkpoint_template_that_does_not_compile_is_named_by_its_file(tiny_checkpoint, tmp_path, capsys):
    """A broken chat_template.jinja is the checkpoint's fault: inspect and LLM.chat name the file and the fix, where
    the bare template error read like a request's."""
    checkpoint = tmp_path / "broken-template"
    shutil.copytree(tiny_checkpoint, checkpoint)
    (checkpoint / "chat_template.jinja").write_text("{% for %}")
    assert main(["inspect", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert "chat_template.jinja does not compile (line 1:" in err and "--chat-template FILE" in err
    llm = LLM(str(checkpoint), progress=False)
    with pytest.raises(CheckpointError, match=r"chat_template\.jinja does not compile"):
        llm.chat([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(("source", "error", "words"), [
    ("{{ raise_exception('no chat here') }}", "ChatTemplateError", "fails on a one-message probe chat: no chat here"),
    ("{{ bos_token }}{{ greeting.text }}<|start|>assistant", "ChatTemplateError", "'greeting' is undefined"),
    ("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", "ConfigError", "fails its check: the chat "
     "template's generation prompt must be exactly '<|start|>assistant'"),
])
def test_a_chat_template_failing_its_probe_is_named_by_its_origin_and_the_fix(tiny_checkpoint, tmp_path, capsys,
                                                                               source, error, words):
    """A --chat-template (or a checkpoint's template) that compiles but fails the probe chat was reported as "chat
    template error: no chat here" (or "'greeting' is undefined"), naming neither the template nor what to do; the error
    names where it came from and the option that replaces it, as one that does not compile does."""
    template = tmp_path / "failing.jinja"
    template.write_text(source)
    assert main(["inspect", str(tiny_checkpoint), "--chat-template", str(template)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"glimmer: error: {error}: ") and words in err
    named = f"the chat template from {template} (the caller's template) "
    assert named in err and "--chat-template FILE" in err
    llm = LLM(str(tiny_checkpoint), progress=False, chat_template=str(template))
    with pytest.raises(GlimmerError, match=re.escape(named)):
        llm.chat([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("marker", ["<|start|>", "<|message|>", "<|eot|>"])
def test_a_template_writing_a_marker_the_tokenizer_lacks_is_refused_by_inspect_and_llm_chat(tiny_checkpoint, tmp_path,
                                                                                            capsys, marker):
    """A tokenizer without the protocol's markers (a tokenizer.json of another model beside Muse's template) tokenized
    every chat prompt's markup as its characters, the reply parsed from text the model never saw as markup, without a
    word: a marker it has but as no added token was refused already."""
    checkpoint = tmp_path / "no-marker"
    shutil.copytree(tiny_checkpoint, checkpoint)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the token keeps its id under another spelling
        (checkpoint / name).write_text((checkpoint / name).read_text().replace(marker, "<|renamed|>"))
    words = f"the chat template writes {marker!r}, which is no token of the tokenizer"
    assert main(["inspect", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glimmer: error: ConfigError: ") and words in err
    llm = LLM(str(checkpoint), progress=False)
    assert llm.generate("hi", SamplingParams(max_tokens=1))[0].outputs[0].token_ids  # completions need no template
    with pytest.raises(ConfigError, match=re.escape(words)):
        llm.chat([{"role": "user", "content": "hi"}])


def test_a_tool_use_template_beside_the_default_is_named_by_inspect_and_refused_by_llm_chat(tiny_checkpoint, tmp_path,
                                                                                             capsys):
    """transformers renders a chat with tools with the `tool_use` template; Glimmer rendered it with the default."""
    checkpoint = tmp_path / "tool-use"
    shutil.copytree(tiny_checkpoint, checkpoint)
    (checkpoint / "additional_chat_templates").mkdir()
    (checkpoint / "additional_chat_templates" / "tool_use.jinja").write_text("{{ bos_token }}<|start|>assistant")
    assert main(["inspect", str(checkpoint), "--json"]) == 0  # as any template serve refuses: a warning here
    assert any("the checkpoint has a 'tool_use' chat template" in warning
               for warning in json.loads(capsys.readouterr().out)["warnings"])
    with pytest.raises(CheckpointError, match="'tool_use' chat template"):
        LLM(str(checkpoint), progress=False).chat([{"role": "user", "content": "hi"}])


def test_a_single_file_beside_an_index_of_other_shards_is_refused(make_tiny, tmp_path, capsys):
    """Two checkpoints' weights in one directory (one written over the other): reading either set could silently
    be the wrong model, so loading and inspect both refuse and say which files to remove."""
    checkpoint = tmp_path / "both"
    shutil.copytree(make_tiny("canonical", seed=7, num_shards=2), checkpoint)
    shutil.copy(make_tiny("canonical", seed=3) / "model.safetensors", checkpoint)
    with pytest.raises(CheckpointError, match="holds both model.safetensors and model.safetensors.index.json"):
        load_model(checkpoint, progress=False)
    assert main(["inspect", str(checkpoint)]) == 2
    assert "remove the stale ones" in capsys.readouterr().err


def test_an_index_that_names_the_single_file_is_one_checkpoint(make_tiny, tmp_path):
    checkpoint = tmp_path / "indexed-single"
    shutil.copytree(make_tiny("canonical", seed=7), checkpoint)
    tensors = load_file(checkpoint / "model.safetensors")
    weight_map = dict.fromkeys(tensors, "model.safetensors")
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert load_model(checkpoint, progress=False).config.text.num_hidden_layers == 8


def _config_change(**fields):
    def change(path):
        config = json.loads((path / "config.json").read_text())
        config.update({k: (config[v] if isinstance(v, str) else v) for k, v in fields.items()})
        (path / "config.json").write_text(json.dumps(config))
    change.__name__ = "_".join(fields)
    return change


def _foreign_tokenizer(path):
    from glimmer.default_model import default_model_dir

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(default_model_dir() / name, path / name)


def _token_past_the_vocabulary(path):
    """Fewer tokens than the vocabulary, but one of them at an id the embedding has no row for."""
    spec = json.loads((path / "tokenizer.json").read_text())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    pairs = [merge.split(" ") if isinstance(merge, str) else merge for merge in merges]
    merged = {part for pair in pairs for part in (*pair, "".join(pair))}
    # as many tokens as before (so the added tokens keep their ids): one no merge uses gives way
    del vocab[max((token for token in vocab if token not in merged), key=vocab.get)]
    vocab["QQQQ"] = 700
    (path / "tokenizer.json").write_text(json.dumps(spec))


@pytest.mark.parametrize(("breakage", "words"), [
    (_config_change(image_token_id=300), "config.json image_token_id=300 but the tokenizer's <|patch|> is 487: the "
                                         "config and the tokenizer do not belong together; set image_token_id to 487 "
                                         "if the vision tower was trained with this tokenizer"),
    (_config_change(video_token_id="image_token_id"), "video_token_id="),
    (_foreign_tokenizer, "the tokenizer has 2067 tokens but text_config.vocab_size=512"),
    (_token_past_the_vocabulary, "the tokenizer's token 'QQQQ' has id 700 but text_config.vocab_size=512"),
], ids=["image_id", "video_id_is_image_id", "foreign_tokenizer", "token_id_past_the_vocabulary"])
def test_a_tokenizer_that_does_not_fit_the_config_is_refused_by_inspect_and_loading(make_tiny, tmp_path, capsys,
                                                                                    breakage, words):
    """Media placeholder ids that are not the tokenizer's `<|patch|>` / `<|video|>` loaded, and every image
    request then failed blaming the request; inspect passed such checkpoints too."""
    from glimmer import LLM
    from glimmer.errors import ConfigError

    checkpoint = tmp_path / "broken"
    shutil.copytree(make_tiny("canonical", vision=True, seed=17), checkpoint)
    breakage(checkpoint)
    assert main(["inspect", str(checkpoint)]) == 2
    captured = capsys.readouterr()
    assert words in captured.err and "Traceback" not in captured.err
    with pytest.raises(ConfigError, match=re.escape(words)):
        LLM(str(checkpoint), progress=False)


def _without_chat_template(checkpoint, copy):
    """A copy of `checkpoint` without a chat template anywhere (a base model's)."""
    shutil.copytree(checkpoint, copy)
    (copy / "chat_template.jinja").unlink()
    config = copy / "tokenizer_config.json"
    if config.exists():
        config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "chat_template"}))
    return copy


def test_a_checkpoint_without_a_chat_template_is_inspected_with_a_warning(tiny_checkpoint, tmp_path, capsys):
    """A base model completes text without a template: inspect reports it (serve would refuse it) but passes."""
    checkpoint = _without_chat_template(tiny_checkpoint, tmp_path / "base")
    assert main(["inspect", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    assert "chat template:   none (see warnings)" in out and "  - no chat template: " in out
    assert main(["inspect", str(checkpoint), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chat_template"]["origin"] is None and report["chat_template"]["warning"].startswith("no chat")


@pytest.mark.parametrize("as_json", [False, True])
def test_inspect_strict_exits_1_for_warnings_and_0_for_a_checkpoint_without(tiny_checkpoint, tmp_path, capsys,
                                                                          as_json):
    """The exit status a script reads (INSPECT_EXIT_STATUS): warnings alone pass unless --strict, where they are 1
    (said on stderr, the report still printed); a refusal stays 2 with or without it."""
    json_flag = ["--json"] if as_json else []
    base = _without_chat_template(tiny_checkpoint, tmp_path / "base")  # a warning, not a refusal (test above)
    assert main(["inspect", str(base), *json_flag]) == 0
    capsys.readouterr()
    assert main(["inspect", str(base), "--strict", *json_flag]) == 1
    captured = capsys.readouterr()
    assert captured.err == "glimmer: inspect: 1 warning (--strict)\n" and "no chat template" in captured.out
    assert main(["inspect", str(tiny_checkpoint), "--strict", *json_flag]) == 0
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "config.json").write_text("{")
    assert main(["inspect", str(broken), "--strict", *json_flag]) == 2


def test_a_warning_logged_while_the_checkpoint_is_read_is_in_the_report_and_fails_strict(tiny_checkpoint, tmp_path,
                                                                                         capsys):
    """A caveat the loaders only logged (here config.json's null eos_token_id) was missing from the report, so
    --strict passed a checkpoint that loads with a warning."""
    checkpoint = tmp_path / "null-eos"
    shutil.copytree(tiny_checkpoint, checkpoint)
    (checkpoint / "generation_config.json").unlink()
    config = json.loads((checkpoint / "config.json").read_text())
    config["text_config"]["eos_token_id"] = None
    (checkpoint / "config.json").write_text(json.dumps(config))
    assert main(["inspect", str(checkpoint), "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert [w for w in warnings if "eos_token_id is null" in w] == [
        f"config.json's eos_token_id is null and {checkpoint / 'generation_config.json'} names none: generation stops "
        "at the tokenizer's eos_token (where it names one) and at <|eot|> (the protocol's turn end)"]
    assert main(["inspect", str(checkpoint), "--strict"]) == 1


def test_inspect_help_states_its_exit_status(capsys):
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    assert " ".join(capsys.readouterr().out.split()).endswith(" ".join(INSPECT_EXIT_STATUS.split()))


def test_a_config_only_checkpoint_is_inspected_without_weights_and_says_so(tmp_path, capsys):
    """`make-tiny --config-only` writes no weights: inspect checks the rest, counts the parameters `--load-format
    dummy` would draw, and says how to run it (it refused, pointing at a flag inspect does not have)."""
    config_only, full = tmp_path / "config-only", tmp_path / "full"
    assert main(["make-tiny", str(config_only), "--config-only"]) == 0
    assert main(["make-tiny", str(full)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(config_only)]) == 0
    out = capsys.readouterr().out
    assert "format:          config-only" in out and "weight layout:   none" in out
    assert f"  - no weights: {config_only} holds a config only" in out
    assert f"glimmer serve {config_only} --load-format dummy" in out
    assert main(["inspect", str(config_only), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["inspect", str(full), "--json"]) == 0
    assert report["parameters"] == json.loads(capsys.readouterr().out)["parameters"]
    (config_only / "tokenizer.json").write_text("{}")
    assert main(["inspect", str(config_only)]) == 2
    assert "not a valid tokenizers file" in capsys.readouterr().err


def _edit_json(path, **fields):
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize(("file", "fields", "words"), [
    ("preprocessor_config.json", {"max_image_tokens": 0}, "max_image_tokens=0"),
    ("preprocessor_config.json", {"image_std": [0, 0, 0]}, "image_std"),
    ("video_preprocessor_config.json", {"patch_size": 7}, "disagree on patch_size"),
], ids=["token-limit", "std", "image-vs-video"])
def test_inspect_refuses_preprocessor_configs_that_loading_refuses(make_tiny, tmp_path, capsys, file, fields, words):
    checkpoint = tmp_path / "vision"
    shutil.copytree(make_tiny(vision=True), checkpoint)
    if not (checkpoint / file).exists():
        (checkpoint / file).write_text("{}")
    _edit_json(checkpoint / file, **fields)
    assert main(["inspect", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("glimmer: error: ConfigError: ") and words in err
    with pytest.raises(ConfigError, match=re.escape(words)):
        LLM(str(checkpoint), device="cpu")


@pytest.mark.parametrize("num_shards", [1, 2])
def test_inspect_of_a_hub_id_reads_the_weights_headers_not_the_weights(monkeypatch, tmp_path, capsys, make_tiny,
                                                                       num_shards):
    """QA: `glimmer inspect owner/name` downloaded every weight file (60 GB for the 30B). The Hub here serves a tiny
    checkpoint's files: the small ones whole, the safetensors files only as their headers; the report is the one of
    the same checkpoint inspected locally."""
    import fnmatch
    import struct

    import huggingface_hub
    from huggingface_hub.hf_api import RepoFile, RepoFolder
    from huggingface_hub.utils import SafetensorsFileMetadata, TensorInfo

    repo = make_tiny(num_shards=num_shards)
    assert main(["inspect", str(repo), "--json"]) == 0
    local = json.loads(capsys.readouterr().out)
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "snapshots" / commit
    fetched: list[str] = []

    def snapshot_download(repo_id, revision=None, allow_patterns=None, ignore_patterns=None, tqdm_class=None):
        snapshot.mkdir(parents=True, exist_ok=True)
        for file in repo.iterdir():
            if any(fnmatch.fnmatch(file.name, pattern) for pattern in allow_patterns):
                fetched.append(file.name)
                shutil.copy(file, snapshot / file.name)
        return str(snapshot)

    def list_repo_tree(repo_id, revision=None):
        assert revision == commit
        yield RepoFolder(path="assets", oid="0" * 40)
        for file in sorted(repo.iterdir()):
            yield RepoFile(path=file.name, size=file.stat().st_size, oid="0" * 40)

    def parse_safetensors_file_metadata(repo_id, filename, revision=None):
        assert revision == commit
        with (repo / filename).open("rb") as file:  # the range read: the first 8 bytes and the header
            header = json.loads(file.read(struct.unpack("<Q", file.read(8))[0]))
        metadata = header.pop("__metadata__", {})
        return SafetensorsFileMetadata(metadata, {name: TensorInfo(info["dtype"], info["shape"],
                                                                   tuple(info["data_offsets"]))
                                                  for name, info in header.items()})

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "list_repo_tree", list_repo_tree)
    monkeypatch.setattr(huggingface_hub, "parse_safetensors_file_metadata", parse_safetensors_file_metadata)
    assert main(["inspect", "owner/tiny", "--json"]) == 0
    assert not [name for name in fetched if name.endswith(".safetensors")]
    assert len([p for p in repo.glob("*.safetensors")]) == num_shards
    assert json.loads(capsys.readouterr().out.replace(str(snapshot), str(repo))) == local
    assert main(["inspect", "owner/tiny"]) == 0
    hub_text = capsys.readouterr().out.replace(str(snapshot), str(repo))
    assert main(["inspect", str(repo)]) == 0
    assert hub_text == capsys.readouterr().out.replace(f"checkpoint:      {repo}", "checkpoint:      owner/tiny")


def test_inspect_of_a_hub_id_whose_headers_cannot_be_read_says_so(monkeypatch, tmp_path, capsys, tiny_checkpoint):
    import huggingface_hub

    def snapshot_download(repo_id, revision=None, allow_patterns=None, ignore_patterns=None, tqdm_class=None):
        snapshot = tmp_path / "snapshot"
        shutil.copytree(tiny_checkpoint, snapshot, ignore=shutil.ignore_patterns("*.safetensors*"))
        return str(snapshot)

    def offline(*args, **kwargs):
        raise OSError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "list_repo_tree", offline)
    assert main(["inspect", "owner/tiny"]) == 2
    assert "could not read the safetensors headers of 'owner/tiny' from the Hugging Face Hub: offline" in \
        capsys.readouterr().err
