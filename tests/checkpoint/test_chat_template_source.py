"""P-TMPL-1: where the chat template comes from."""

import hashlib
import json
import logging
from pathlib import Path

import pytest

from glimmer.checkpoint.chat_template_source import find_chat_template
from glimmer.errors import CheckpointError

JINJA = (
    "{{ bos_token }}{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|eot|>{% endfor %}"
)


def write_config(directory: Path, **fields) -> None:
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", **fields}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def test_override_file_wins_over_the_checkpoint(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("from jinja", encoding="utf-8")
    write_config(tmp_path, chat_template="from config")
    override = tmp_path / "operator.jinja"
    override.write_text("from operator", encoding="utf-8")
    source = find_chat_template(tmp_path, override=str(override))
    assert source.text == "from operator"
    assert source.origin == f"{override} (the caller's template)"


def test_chat_template_jinja_wins_over_tokenizer_config(tmp_path):
    (tmp_path / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
    write_config(tmp_path, chat_template="from config")
    source = find_chat_template(tmp_path)
    assert source.text == JINJA
    assert source.origin == str(tmp_path / "chat_template.jinja")


def test_tokenizer_config_string_template(tmp_path):
    write_config(tmp_path, chat_template=JINJA)
    source = find_chat_template(tmp_path)
    assert source.text == JINJA
    assert "tokenizer_config.json" in source.origin


def test_tokenizer_config_named_list_takes_default(tmp_path):
    write_config(
        tmp_path,
        chat_template=[{"name": "rag", "template": "documents"}, {"name": "default", "template": JINJA}],
    )
    source = find_chat_template(tmp_path)
    assert source.text == JINJA
    assert "default" in source.origin


@pytest.mark.parametrize("layout", ["tokenizer_config", "additional_chat_templates"])
def test_the_tokenizers_named_templates_are_kept_for_a_chat_template_argument_naming_one(tmp_path, layout):
    """transformers' apply_chat_template(chat_template="rag") renders the tokenizer's template of that name."""
    if layout == "tokenizer_config":
        write_config(tmp_path, chat_template=[{"name": "rag", "template": "documents"},
                                              {"name": "default", "template": JINJA}])
    else:
        (tmp_path / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
        (tmp_path / "additional_chat_templates").mkdir()
        (tmp_path / "additional_chat_templates" / "rag.jinja").write_text("documents", encoding="utf-8")
    assert find_chat_template(tmp_path).named == {"default": JINJA, "rag": "documents"}


def test_the_tokenizers_named_templates_are_kept_beside_a_processor_template(tmp_path):
    """The processor's template is the one rendered; a name still picks among the tokenizer's, as there."""
    write_config(tmp_path, chat_template=[{"name": "rag", "template": "documents"},
                                          {"name": "default", "template": JINJA}])
    (tmp_path / "processor_config.json").write_text(json.dumps({"chat_template": JINJA}), encoding="utf-8")
    source = find_chat_template(tmp_path)
    assert "processor_config.json" in source.origin and source.named == {"rag": "documents", "default": JINJA}


@pytest.mark.parametrize("layout", ["tokenizer_config", "chat_template_jinja"])
def test_a_tokenizer_with_one_template_names_none(tmp_path, layout):
    """transformers' tokenizer then holds one template, a string, so chat_template="default" is a template's source
    there, not a name; chat_template.jinja alone was named `default`, and so rendered with."""
    if layout == "tokenizer_config":
        write_config(tmp_path, chat_template=JINJA)
    else:
        write_config(tmp_path)
        (tmp_path / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
    assert find_chat_template(tmp_path).named == {}


def test_a_checkpoint_with_chat_template_jinja_alone_names_no_template_as_transformers(tiny_checkpoint):
    from transformers import AutoTokenizer

    assert (tiny_checkpoint / "chat_template.jinja").is_file()
    assert not (tiny_checkpoint / "additional_chat_templates").exists()
    reference = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    assert isinstance(reference.chat_template, str) and reference.get_chat_template("default") == "default"
    assert find_chat_template(tiny_checkpoint).named == {}


def _tool_use_in_tokenizer_config(directory: Path, tool_use: str) -> None:
    write_config(directory, chat_template=[{"name": "default", "template": JINJA},
                                           {"name": "tool_use", "template": tool_use}])


def _tool_use_beside_chat_template_jinja(directory: Path, tool_use: str) -> None:
    (directory / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
    (directory / "additional_chat_templates").mkdir()
    (directory / "additional_chat_templates" / "tool_use.jinja").write_text(tool_use, encoding="utf-8")


@pytest.mark.parametrize("layout", [_tool_use_in_tokenizer_config, _tool_use_beside_chat_template_jinja])
def test_a_tool_use_template_other_than_the_default_is_refused_naming_the_option(tmp_path, layout):
    """transformers (and vLLM through it) renders a chat with tools with the `tool_use` template where a checkpoint
    names one, and every other chat with `default`; Glimmer rendered both with `default`, so a request with tools
    had another prompt than the reference's, without a word."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    layout(tmp_path, "{{ bos_token }}tools<|start|>assistant")
    templates = {"default": JINJA, "tool_use": "{{ bos_token }}tools<|start|>assistant"}
    holder = type("Holder", (), {"chat_template": templates})()  # transformers' choice, on the templates alone
    assert PreTrainedTokenizerBase.get_chat_template(holder, tools=[{}]) == templates["tool_use"]
    assert PreTrainedTokenizerBase.get_chat_template(holder) == templates["default"]
    with pytest.raises(CheckpointError, match=r"'tool_use' chat template .* --chat-template FILE"):
        find_chat_template(tmp_path)
    override = tmp_path / "operator.jinja"
    override.write_text(JINJA, encoding="utf-8")
    assert find_chat_template(tmp_path, override=override).text == JINJA


@pytest.mark.parametrize("layout", [_tool_use_in_tokenizer_config, _tool_use_beside_chat_template_jinja])
def test_a_tool_use_template_equal_to_the_default_is_read(tmp_path, layout):
    layout(tmp_path, JINJA)
    assert find_chat_template(tmp_path).text == JINJA


def test_named_list_without_default_is_an_error_listing_the_names(tmp_path):
    write_config(tmp_path, chat_template=[{"name": "tool_use", "template": "tools"}])
    with pytest.raises(CheckpointError, match=r"\['tool_use'\].*--chat-template FILE"):
        find_chat_template(tmp_path)


@pytest.mark.parametrize("entry", [{"name": "default", "template": 5}, {"name": "default"}, {"template": JINJA},
                                   "default", {"name": 1, "template": JINJA}])
def test_named_list_with_an_entry_that_is_no_name_and_template_is_an_error_naming_it(tmp_path, entry):
    # such an entry was left out, so a list holding a broken 'default' said it had none named 'default'
    write_config(tmp_path, chat_template=[{"name": "tool_use", "template": "tools"}, entry])
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: chat_template\[1\]=.* is not a \{name, "
                                              r"template\} object of two strings.*--chat-template FILE"):
        find_chat_template(tmp_path)


def test_sha256_is_of_the_file_bytes_with_newlines_untouched(tmp_path):
    raw = b"line one\r\nline two\n"
    (tmp_path / "chat_template.jinja").write_bytes(raw)
    source = find_chat_template(tmp_path)
    assert source.text.encode() == raw
    assert source.sha256 == hashlib.sha256(raw).hexdigest()


def test_origin_and_sha256_are_logged(tmp_path, caplog):
    (tmp_path / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="glimmer.checkpoint.chat_template_source"):
        source = find_chat_template(tmp_path)
    assert source.sha256 in caplog.text and source.origin in caplog.text


def test_no_template_names_every_place_searched_and_the_option(tmp_path):
    """The option is named as the command line and LLM(...) take it: raised from LLM.chat, where there are no flags,
    the refusal named --chat-template FILE alone."""
    write_config(tmp_path)
    with pytest.raises(CheckpointError) as excinfo:
        find_chat_template(tmp_path)
    message = str(excinfo.value)
    for expected in ("chat_template.jinja", "tokenizer_config.json",
                     "Pass the model's template with --chat-template FILE / chat_template="):
        assert expected in message


def test_single_file_checkpoint_uses_its_embedded_template(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    source = find_chat_template(gguf, is_file=True, embedded=JINJA)
    assert source.text == JINJA and "tokenizer.chat_template" in source.origin


def test_single_file_checkpoint_without_template_names_the_key_and_the_option(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(CheckpointError, match=r"tokenizer\.chat_template.*--chat-template FILE"):
        find_chat_template(gguf, is_file=True, embedded=None)


def test_missing_override_file_is_named(tmp_path):
    (tmp_path / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
    missing = tmp_path / "nope.jinja"
    with pytest.raises(CheckpointError, match="nope.jinja"):
        find_chat_template(tmp_path, override=missing)


def test_a_template_file_passed_by_the_caller_is_named_as_theirs_and_the_fix_names_the_option(tmp_path):
    """LLM(..., chat_template=FILE) with an empty file was refused as "the chat template from --chat-template FILE is
    empty", naming a flag the Python caller never used, then as "from FILE (--chat-template / chat_template=) is empty;
    pass the model's template with --chat-template FILE / chat_template=", the option named twice and the fix one
    for a checkpoint lacking a template; the file is named plainly, and the fix alone names the option."""
    empty = tmp_path / "t.jinja"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(CheckpointError) as caught:
        find_chat_template(tmp_path, override=empty)
    assert str(caught.value) == (f"the chat template from {empty} (the caller's template) is empty; fix it or pass "
                                 "another with --chat-template FILE / chat_template=")


def test_empty_template_is_an_error(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="empty"):
        find_chat_template(tmp_path)


def test_unreadable_tokenizer_config_is_named(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{oops", encoding="utf-8")
    with pytest.raises(CheckpointError, match="tokenizer_config.json"):
        find_chat_template(tmp_path)


# --- the checkpoint layouts transformers 5.23 reads, and vLLM's choice between processor and tokenizer ------------

OTHER = JINJA.replace("<|eot|>", "<|eot|>\n")
TOOLS = "{{ bos_token }}tools<|start|>assistant"


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory):
    from glimmer.checkpoint.tiny_tokenizer import write_tiny_tokenizer

    directory = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(directory)
    return directory


def _write(directory: Path, files: dict[str, object]) -> None:
    for name, content in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name == "tokenizer_config.json":  # the tokenizer's own fields, with this chat_template
            config = json.loads(path.read_text(encoding="utf-8"))
            path.write_text(json.dumps({**config, "chat_template": content}), encoding="utf-8")
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")


def _vllm_choices(directory: Path) -> tuple[str | None, str | None]:
    """(the template vLLM renders a chat without tools with, the one for a chat with tools), by transformers 5.23's
    loading: the processor's template where it has one, else the tokenizer's; with tools, the tokenizer's
    (`resolve_hf_chat_template`). None where transformers raises or finds none."""
    from transformers import PreTrainedTokenizerFast
    from transformers.processing_utils import ProcessorMixin

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))

    def choice(pick):
        try:
            return pick()
        except (ValueError, KeyError):
            return None

    def without_tools():
        template = ProcessorMixin.get_processor_dict(str(directory))[0].get("chat_template")
        if isinstance(template, dict):  # ProcessorMixin._resolve_chat_template
            template = template["default"]
        return template if template is not None else tokenizer.get_chat_template()

    return choice(without_tools), choice(lambda: tokenizer.get_chat_template(tools=[{}]))


@pytest.mark.parametrize(("files", "origin"), [
    ({"chat_template.json": {"chat_template": JINJA}}, "chat_template.json (chat_template)"),
    ({"chat_template.json": {"chat_template": JINJA}, "chat_template.jinja": JINJA}, "chat_template.json"),
    ({"chat_template.json": {"chat_template": JINJA}, "tokenizer_config.json": JINJA}, "chat_template.json"),
    ({"chat_template.json": {"chat_template": JINJA}, "chat_template.jinja": OTHER}, None),
    ({"chat_template.json": {"chat_template": JINJA}, "tokenizer_config.json": OTHER}, None),
    ({"chat_template.json": {"chat_template": JINJA}, "additional_chat_templates/tool_use.jinja": JINJA}, None),
    ({"processor_config.json": {"chat_template": JINJA}}, "processor_config.json (chat_template)"),
    ({"processor_config.json": {"chat_template": JINJA}, "chat_template.json": {"chat_template": OTHER},
      "chat_template.jinja": JINJA}, "processor_config.json"),
    ({"processor_config.json": {"chat_template": OTHER}, "chat_template.jinja": JINJA}, None),
    ({"chat_template.jinja": JINJA, "additional_chat_templates/default.jinja": JINJA}, "chat_template.jinja"),
    ({"chat_template.jinja": JINJA, "additional_chat_templates/default.jinja": OTHER}, None),
    ({"chat_template.jinja": JINJA, "additional_chat_templates/rag.jinja": OTHER}, "chat_template.jinja"),
    ({"additional_chat_templates/default.jinja": JINJA, "tokenizer_config.json": OTHER}, "default.jinja"),
    ({"additional_chat_templates/tool_use.jinja": TOOLS, "tokenizer_config.json": JINJA}, None),
    ({"additional_chat_templates/rag.jinja": OTHER, "tokenizer_config.json": JINJA}, None),
    ({"chat_template.jinja": JINJA, "tokenizer_config.json": OTHER}, "chat_template.jinja"),
])
def test_the_template_is_the_one_transformers_and_vllm_render_every_chat_with_or_refused(tokenizer_files, tmp_path,
                                                                                          files, origin):
    """chat_template.json (transformers' older processor file) was not read, and a template in
    additional_chat_templates/ without chat_template.jinja left tokenizer_config.json's in use where transformers
    drops it. Glimmer renders every chat with one template: the one vLLM renders a chat without tools with (the
    processor's, else the tokenizer's) where the one for a chat with tools (the tokenizer's) is none or the same;
    otherwise it refuses, as it does where transformers finds no template or raises."""
    import shutil

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tokenizer_files, checkpoint)
    _write(checkpoint, files)
    without_tools, with_tools = _vllm_choices(checkpoint)
    agreed = without_tools is not None and with_tools in (None, without_tools)
    assert agreed == (origin is not None)  # the table's expectation is transformers' own
    if origin is None:
        with pytest.raises(CheckpointError, match="--chat-template FILE"):
            find_chat_template(checkpoint)
        return
    source = find_chat_template(checkpoint)
    assert source.text == without_tools and origin in source.origin


@pytest.mark.parametrize(("content", "words"), [
    ({"template": JINJA}, "has no 'chat_template' field"),
    ({"chat_template": [JINJA]}, "chat_template is a list; expected the template's text"),
    ([JINJA], "holds a JSON list; expected an object"),
    ("{", "is not readable JSON"),
])
def test_a_chat_template_json_without_a_template_string_is_refused_naming_the_file(tmp_path, content, words):
    (tmp_path / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
    _write(tmp_path, {"chat_template.json": content})
    with pytest.raises(CheckpointError, match="chat_template.json") as excinfo:
        find_chat_template(tmp_path)
    assert words in str(excinfo.value)
