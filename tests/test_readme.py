"""The README runs as written: its test command is what CI runs, and every ```python block executes.

Blocks are found generically, so new ones are covered as they are added. They run in README order in one
shared namespace (a later example may use an earlier one's `llm` or `tools`), with two stand-ins:
`/path/to/Muse-Glimmer-30B` is a tiny random checkpoint (the embedded default's recipe, with a vision tower
so the image and video examples run), `/path/to/Muse-Glimmer-30B-assistant` a tiny random DFlash drafter for it
(block 16, as the release's), and `http://127.0.0.1:8000` is a live server of it, serving the
README's model name `muse-glimmer` with the API key in `GLIMMER_API_KEY`. A block that truly cannot run here
(it needs a GPU or a real model) is marked by an HTML comment on the line before its fence:
`<!-- readme-test: skip REASON -->`; the test reports it as skipped with that reason.

A block marked `<!-- readme-test: default-model -->` shows what the embedded default model (glimmer-nano)
really answers: it runs on its own against a live server of that model as `glimmer serve` with no MODEL
serves it (no API key, model name `glimmer-nano`), and what it prints must equal its `# ` comment lines.

The signatures the README shows (`LLM(...)`, `LLM.generate(...)`, `LLM.chat(...)`, `SamplingParams(...)`) are the
code's, and the commands of its ```bash blocks parse with the CLI's own parsers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MODEL_PATH = "/path/to/Muse-Glimmer-30B"
DRAFTER_PATH = "/path/to/Muse-Glimmer-30B-assistant"
SERVER_URL = "http://127.0.0.1:8000"
API_KEY = "readme-key"
_BLOCK = re.compile(r"(?:<!--\s*readme-test:\s*(?P<mode>skip|default-model)\s*(?P<reason>[^>]*?)\s*-->\s*\n)?"
                    r"```python\n(?P<code>.*?)^```", re.S | re.M)


def _readme_test_command() -> str:
    lines = README.read_text().splitlines()
    marker = lines.index("# the test suite")
    return lines[marker + 1].strip()


def test_ci_runs_the_readme_test_command():
    command = _readme_test_command()
    assert "pytest" in command
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines


def _blocks(mode: str | None) -> list[tuple[int, str, str | None]]:
    """(line of the fence, code, skip reason or None) for each ```python block of `mode`, in order
    (mode None: the plain and skipped blocks)."""
    text = README.read_text()
    modes = {mode} if mode is not None else {None, "skip"}
    return [(text.count("\n", 0, match.start("code")), match.group("code"),
             match.group("reason") if match.group("mode") == "skip" else None)
            for match in _BLOCK.finditer(text) if match.group("mode") in modes]


def python_blocks() -> list[tuple[int, str, str | None]]:
    return _blocks(None)


def test_python_blocks_are_found():
    blocks = python_blocks()
    assert len(blocks) >= 6 and all(code.strip() for _, code, _ in blocks)
    assert _blocks("default-model"), "the quick start's round trip with the embedded model"


@pytest.fixture(scope="module")
def namespace(make_tiny, monkeypatch_module, tmp_path_factory):
    from glimmer.engine.async_engine import AsyncEngine
    from glimmer.engine.llm_engine import EngineConfig
    from glimmer.server.app import create_app
    from glimmer.server.background import BackgroundServer
    from glimmer.server.settings import ServerSettings
    from glimmer.tiny import TinyDrafterSpec, write_tiny_drafter

    checkpoint = make_tiny(vision=True)
    drafter = write_tiny_drafter(tmp_path_factory.mktemp("readme-drafter"), checkpoint,
                                 spec=TinyDrafterSpec(block_size=16))
    monkeypatch_module.setenv("GLIMMER_API_KEY", API_KEY)
    engine = AsyncEngine(EngineConfig(model=str(checkpoint), progress=False, kv_cache_memory=32 << 20))
    app = create_app(engine, ServerSettings(served_model_names=("muse-glimmer",), api_key=API_KEY))
    try:
        with BackgroundServer(app) as server:
            yield {"__name__": "readme", "_checkpoint": str(checkpoint), "_drafter": str(drafter),
                   "_url": server.url}
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize(("line", "code", "skip_reason"), python_blocks(), ids=lambda v: f"line{v}"
                         if isinstance(v, int) else "")
def test_readme_python_block_runs(namespace, line, code, skip_reason):
    if skip_reason is not None:
        pytest.skip(f"README.md:{line}: {skip_reason}")
    code = code.replace(DRAFTER_PATH, namespace["_drafter"]).replace(MODEL_PATH, namespace["_checkpoint"])
    code = code.replace(SERVER_URL, namespace["_url"])
    exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102 - the README's own examples


def _shown_output(code: str) -> list[str]:
    """The `# ` comment lines of a block: what its prints show."""
    return [line[2:] for line in code.splitlines() if line.startswith("# ")]


@pytest.mark.parametrize(("line", "code"), [(line, code) for line, code, _ in _blocks("default-model")],
                         ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_readme_default_model_block_prints_what_it_shows(line, code):
    """The quick start's round trip (P-ATEM tool call, tool result, answer) with the real embedded model."""
    import contextlib
    import io

    from glimmer.default_model import DEFAULT_MODEL_NAME, default_model_dir
    from glimmer.engine.async_engine import AsyncEngine
    from glimmer.engine.llm_engine import EngineConfig
    from glimmer.server.app import create_app
    from glimmer.server.background import BackgroundServer
    from glimmer.server.settings import ServerSettings

    shown = _shown_output(code)
    assert shown, f"README.md:{line}: a default-model block shows its output in `# ` comment lines"
    assert SERVER_URL in code
    printed = io.StringIO()
    engine = AsyncEngine(EngineConfig(model=str(default_model_dir()), progress=False, kv_cache_memory=32 << 20))
    try:
        app = create_app(engine, ServerSettings(served_model_names=(DEFAULT_MODEL_NAME,)))
        with BackgroundServer(app) as server, contextlib.redirect_stdout(printed):
            exec(compile(code.replace(SERVER_URL, server.url), f"README.md:{line}", "exec"), {"__name__": "readme"})
    finally:
        engine.shutdown()
    assert printed.getvalue().splitlines() == shown


def _documented_parameters(opening: str) -> list[tuple[str, str, object]]:
    """(name, kind, default) of each parameter of the README's signature that starts with `opening` (`LLM(model`)
    in backticks: kind "positional" or "keyword" (after `*`), default `inspect.Parameter.empty` where none is
    shown."""
    import ast
    import inspect

    from glimmer.multimodal.settings import MediaLimits

    text = README.read_text()
    start = text.index(f"`{opening}") + 1 + opening.index("(")
    end = text.index(")`", start)
    function = ast.parse(f"def documented{' '.join(text[start:end + 1].split())}: pass").body[0]
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(arguments.defaults)) + arguments.defaults
    shown = [(arg.arg, "positional", default) for arg, default in zip(positional, defaults, strict=True)]
    shown += [(arg.arg, "keyword", default) for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults,
                                                                        strict=True)]
    return [(name, kind, default if default is inspect.Parameter.empty or default is None
             else eval(ast.unparse(default), {"MediaLimits": MediaLimits}))  # noqa: S307 - the README's own text
            for name, kind, default in shown]


def _parameters(signature) -> list[tuple[str, str, object]]:
    kinds = {"POSITIONAL_OR_KEYWORD": "positional", "KEYWORD_ONLY": "keyword"}
    return [(p.name, kinds[p.kind.name], p.default) for p in signature.parameters.values()
            if p.kind.name in kinds and p.name != "self"]


def test_readme_signatures_are_the_codes():
    """The README's `LLM(...)`, `LLM.generate(...)`, `LLM.chat(...)` and `SamplingParams(...)` name every
    parameter, in the code's order and kind (LLM's engine options by keyword, in any order), with the code's defaults.
    `LLM.chat` lacked `use_tqdm` (third by position) and `LLM` most of its options, showing `dtype="auto"` and
    `device="cpu"` as defaults."""
    import dataclasses
    import inspect

    from glimmer import LLM, SamplingParams
    from glimmer.engine.llm_engine import EngineConfig

    assert _documented_parameters("LLM.chat(messages,") == _parameters(inspect.signature(LLM.chat))
    assert _documented_parameters("LLM.generate(prompts,") == _parameters(inspect.signature(LLM.generate))
    sampling = {field.name: field.default_factory() if field.default is dataclasses.MISSING else field.default
                for field in dataclasses.fields(SamplingParams)}
    assert _documented_parameters("SamplingParams(*,") == [(name, "keyword", sampling[name]) for name in sampling]
    own = _parameters(inspect.signature(LLM.__init__))
    engine = [(field.name, "keyword", field.default_factory() if field.default is dataclasses.MISSING
               else field.default) for field in dataclasses.fields(EngineConfig) if field.name != "model"]
    documented = _documented_parameters("LLM(model,")
    assert documented[0] == own[0] == ("model", "positional", inspect.Parameter.empty)
    assert sorted(documented[1:], key=str) == sorted({*own[1:], *engine}, key=str)


def _shell_commands() -> list[tuple[int, str]]:
    """(line, command) of each command of the README's ```bash blocks: lines split at `&&`, comments dropped."""
    text = README.read_text()
    commands = []
    for match in re.finditer(r"```bash\n(.*?)^```", text, re.S | re.M):
        first = text.count("\n", 0, match.start(1)) + 1
        for offset, line in enumerate(match.group(1).splitlines()):
            code = line.split(" #", 1)[0].strip()
            if code and not code.startswith("#"):
                commands += [(first + offset, command.strip()) for command in code.split("&&")]
    return commands


def test_readme_shell_commands_parse():
    """The README's `glimmer ...`, `python -m ...` and `python bench/...` commands parse as written (their options
    exist, a `--speculative-config` is a valid config), and the scripts and modules they name exist. The commands
    themselves need a GPU, a real checkpoint or minutes, so they are not run here."""
    import importlib
    import shlex

    from glimmer.cli import build_parser
    from glimmer.engine.spec_decode import SpeculativeConfig

    parsers = {"glimmer": build_parser().parse_args,
               "glimmer.train_nano": importlib.import_module("glimmer.train_nano.__main__").build_parser().parse_args,
               "glimmer.train_nano.evaluate": importlib.import_module("glimmer.train_nano.evaluate").build_parser()
               .parse_args}
    checked = set()
    for line, command in _shell_commands():
        words = shlex.split(command)
        if words[0] == "glimmer":
            program, argv = "glimmer", words[1:]
        elif words[:2] == ["python", "-m"] and words[2] in parsers:
            program, argv = words[2], words[3:]
        elif words[0] == "python" and words[1].startswith("bench/"):
            assert (ROOT / words[1]).is_file(), f"README.md:{line}: {words[1]} does not exist"
            continue
        else:  # pip, pytest: the test command is checked above
            continue
        try:
            options = parsers[program](argv)
        except SystemExit:
            pytest.fail(f"README.md:{line}: {command!r} does not parse")
        if getattr(options, "speculative_config", None) is not None:
            SpeculativeConfig.parse(options.speculative_config)
        checked.add(program)
    assert checked == set(parsers)


@pytest.mark.parametrize("module", ["glimmer.train_nano.__main__", "glimmer.train_nano.evaluate"])
def test_the_readme_names_every_option_of_the_training_commands(module):
    """`python -m glimmer.train_nano`'s --workers, --seed, --conversations, --batch-tokens, --target-steps,
    --drafter-steps and --drafter-conversations, and the evaluation's --seed and --show-failures, were only in
    --help (the `glimmer` commands' options are checked in tests/server/test_cli.py). The evaluation's are looked
    for where the README describes it, so the training command's `--seed` and `--device` do not stand for them."""
    import importlib

    text = README.read_text()
    start = text.index("## The embedded model: glimmer-nano")
    if module.endswith("evaluate"):
        start = text.index("The evaluation takes", start)
    section = text[start:text.index("\n## ", start)]
    parser = importlib.import_module(module).build_parser()
    options = [option for action in parser._actions for option in action.option_strings
               if option.startswith("--") and option != "--help"]
    assert options and [option for option in options if f"`{option}" not in section] == []


def test_the_api_key_a_serve_command_takes_is_the_one_the_client_blocks_read():
    """The Server section started the server with `--api-key $KEY` and its client read `GLIMMER_API_KEY`: run as
    written, the client sent "none" and got HTTP 401. Each `--api-key $VAR` is a variable the README's clients read."""
    import itertools
    import shlex

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    read = set(re.findall(r'os\.environ\.get\("(\w+)"', readme))
    given = [(line, value.removeprefix("$")) for line, command in _shell_commands()
             for option, value in itertools.pairwise(shlex.split(command))
             if option == "--api-key" and value.startswith("$")]
    assert given and read
    assert [(line, name) for line, name in given if name not in read] == []
