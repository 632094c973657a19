"""The `glimmer` command: serve, chat, run-batch, inspect, make-tiny.

Errors Glimmer raises on purpose (bad config, bad checkpoint, bad arguments) are printed as one
clear message and exit code 2, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import re
import signal
import socket
import stat
import sys
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from glimmer.default_model import DEFAULT_MODEL_BLURB, DEFAULT_MODEL_NAME, EMBEDDED_MODEL_NAMES
from glimmer.engine.sampling_params import SEED_RANGE
from glimmer.errors import ConfigError, GlimmerError, RequestError
from glimmer.multimodal.settings import BLANK_MEDIA_DIRECTORY, NOT_A_HOST_NAME, MediaFetchPolicy, MediaLimits, host_name
from glimmer.server.settings import (
    API_KEY_ROUTES,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_REQUEST_READ_TIMEOUT_S,
    UNSENDABLE_KEY,
    api_keys,
    ascii_only_clients_warning,
    sendable_in_a_header,
)
from glimmer.sigterm import SigtermWatch, Terminated, give_back_sigterm

logger = logging.getLogger(__name__)


class UsageError(GlimmerError):
    """A mistake in the command line (a missing file, a busy port, …): printed as one line, exit code 2."""


class _ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose own errors (an unknown option, `--port abc`) are one line, as every other mistake's,
    pointing at the command's help instead of printing its whole usage before the error."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}  # the top parser's commands, set by build_parser

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"glimmer: error: {message}; see {self.prog} --help\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """As argparse's, but an option the command does not take points at that command's help, not glimmer's, and
        vLLM's dotted keys of JSON options are taken (_with_dotted_keys_joined)."""
        if self.commands:  # the top parser
            # each JSON option with the parser of its value (--speculative-config's is a JSON object, read later)
            json_options = {option: action.type or _json_object for command in self.commands.values()
                            for action in command._actions if _takes_dotted_keys(action)
                            for option in action.option_strings}
            options = {option for command in self.commands.values() for option in command._option_string_actions}
            try:
                spelt = _with_underscores_as_dashes(list(sys.argv[1:] if args is None else args), options)
                args = _with_dotted_keys_joined(
                    _with_config_file_options(spelt, self.commands, self._option_string_actions), json_options)
            except UsageError as error:
                self.error(str(error))
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.commands.get(getattr(parsed, "command", None), self).error(
                f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def _with_underscores_as_dashes(argv: list[str], options: set[str]) -> list[str]:
    """`argv` with each option spelt with underscores, as vLLM's parser takes them (`--max_model_len 4096`,
    `--served_model_name=a`, `--speculative_config.num_speculative_tokens 4`), spelt with dashes where that names one
    of `options`: the name alone, up to a `.` or `=` (a dotted key keeps its own underscores), and none after a `--`,
    after which all is positional."""
    spelt = []
    for index, token in enumerate(argv):
        if token == "--":
            return spelt + argv[index:]
        spelt.append(_spelt_with_dashes(token, options))
    return spelt


def _spelt_with_dashes(token: str, options: Container[str]) -> str:
    """`token` (`--max_model_len`, `--served_model_name=a`, `--speculative_config.num_speculative_tokens`) with its
    option's name, up to a `.` or `=`, spelt with dashes where that names one of `options` (a dotted key keeps its own
    underscores), else as it is."""
    name, rest = re.match(r"([^.=]*)(.*)", token, re.DOTALL).groups()
    dashed = "--" + name[2:].replace("_", "-")
    return dashed + rest if name.startswith("--") and "_" in name and dashed in options else token


def _takes_dotted_keys(action: argparse.Action) -> bool:
    """Whether `action` is a JSON object's option, whose keys vLLM takes dotted (`--hf-overrides.a 1`)."""
    return action.type in (_json_object, _compilation_config, _limit_mm_per_prompt) or \
        action.dest == "speculative_config"


def _dotted_keys_option(name: str) -> str:
    """The option whose key a dotted key before its dot (`name`) gives: vLLM's -O.level=3 is --compilation-config's."""
    return "--compilation-config" if name == "-O" else name


def _option_of(flag: str, actions: Mapping[str, argparse.Action]) -> argparse.Action | None:
    """The option of `actions` that `flag` names (`--max-model-len`), a dotted key (`--hf-overrides.a`) naming its JSON
    object's option (argparse knows no other's dotted keys); None where it names none."""
    name, dot, _ = flag.partition(".")
    action = actions.get(_dotted_keys_option(name) if dot else name)
    return None if dot and action is not None and not _takes_dotted_keys(action) else action


def _with_config_file_options(argv: list[str], commands: Mapping[str, argparse.ArgumentParser],
                              top_actions: Mapping[str, argparse.Action]) -> list[str]:
    """`argv` with vLLM's `--config FILE` (a YAML mapping of long option names to values, as `vllm serve --config`
    reads it) replaced by the file's options, after which the command line's own win: an option the command line
    gives (in any of its spellings) is left out of the file's, and so is the file's `model` where the command line
    names one. A true value is the flag alone, a false one the flag's `--no-` form where it has one (else its
    default), an object its JSON, null the default; a list is its items, each a repeat of the option where repeats
    add to it (served-model-name), else the option and all its items together (nargs '+', cuda-graph-sizes), placed
    after the command line's options (before a `--`) so that no MODEL follows them. A dotted key (hf-overrides.a) is a
    JSON object option's key. Raises UsageError naming --config and the file for a file that cannot be read or is not
    such a mapping, for a key that names no option of the command (the key as written; a checkpoint's config.json is
    named as such), and for a key naming another --config. `top_actions`: glimmer's own options, which may come before
    the command (--log-level LEVEL)."""
    start = 0  # the command's place
    while start < len(argv) and argv[start] not in commands:
        own_option = top_actions.get(argv[start])
        start += 2 if own_option is not None and own_option.nargs != 0 else 1
    command = commands.get(argv[start]) if start < len(argv) else None
    end = argv.index("--") if "--" in argv else len(argv)
    given = [index for index in range(start + 1, end) if argv[index].split("=", 1)[0] == "--config"]
    if command is None or not given or "--config" not in command._option_string_actions:
        return argv
    if len(given) > 1:
        raise UsageError("--config is given more than once; give one file of options")
    index = given[0]
    if "=" in argv[index]:
        path, rest = argv[index].split("=", 1)[1], argv[start + 1:index] + argv[index + 1:]
    elif index + 1 < end:
        path, rest = argv[index + 1], argv[start + 1:index] + argv[index + 2:]
    else:
        raise UsageError("--config needs a value: --config FILE, a YAML file of options")
    actions = command._option_string_actions
    own = {actions[token.split("=", 1)[0]].dest for token in rest if token.split("=", 1)[0] in actions}
    names_a_model = "model_option" in own or bool(_positional_arguments(rest, actions))
    from_file, lists_last = [], []
    options = _read_config_file(path)
    for key, value in options.items():
        flag = _spelt_with_dashes(f"--{key}", actions)
        action = _option_of(flag, actions)
        if flag == "--config":
            raise UsageError(f"--config {path} names another --config file; give its options in this one")
        if action is None:
            checkpoint = "architectures" in options or "model_type" in options
            raise UsageError(f"--config {path}: {key} names no option of {command.prog}" + (
                ": the file looks like a checkpoint's config.json, which is read from MODEL's folder; --config takes a "
                "YAML file of the command's options" if checkpoint else f" ({command.prog} --help lists them)"))
        if value is None or action.dest in own or (key == "model" and names_a_model):
            continue
        if isinstance(value, bool):
            from_file += [flag] if value else [f"--no-{flag[2:]}"] * (f"--no-{flag[2:]}" in actions)
        elif isinstance(value, list) and isinstance(action, argparse._StoreAction) and action.nargs in ("+", "*"):
            # a repeat of such an option (--cuda-graph-sizes) replaces the last, so its items go together, and last
            # of the options, where no MODEL follows them to be taken for one more
            lists_last += [flag, *map(_config_value_text, value)] if value else []
        else:  # `--flag=value`: a value beginning with - is no option; a repeat of a list's option adds to it
            items = value if isinstance(value, list) else [value]
            from_file += [f"{flag}={_config_value_text(item)}" for item in items]
    options_end = rest.index("--") if "--" in rest else len(rest)
    return [*argv[:start + 1], *from_file, *rest[:options_end], *lists_last, *rest[options_end:]]


def _config_value_text(value: Any) -> str:
    """A --config file's value as the command line spells it: an object as its JSON."""
    return json.dumps(value) if isinstance(value, dict) else str(value)


def _read_config_file(path: str) -> dict[str, Any]:
    """The options of a --config FILE: a YAML mapping of option names to values."""
    import yaml

    try:
        with open(Path(path).expanduser(), encoding="utf-8") as file:
            options = yaml.safe_load(file)
    except OSError as error:
        raise UsageError(f"--config {path}: {error.strerror or error}; give a YAML file of options, such as "
                         "'max-model-len: 4096' a line") from None
    except UnicodeDecodeError as error:
        raise UsageError(f"--config {path} is not UTF-8 text ({error.reason} at byte {error.start}); give a YAML "
                         "file of options, such as 'max-model-len: 4096' a line") from None
    except yaml.YAMLError as error:
        raise UsageError(f"--config {path} is not YAML ({' '.join(str(error).split())}); give a mapping of option "
                         "names to values, such as 'max-model-len: 4096' a line") from None
    if not isinstance(options, dict) or not all(isinstance(key, str) and key for key in options):
        raise UsageError(f"--config {path} holds no mapping of option names to values; write one a line, such as "
                         "'max-model-len: 4096'")
    return options


def _positional_arguments(tokens: list[str], actions: Mapping[str, argparse.Action]) -> list[str]:
    """The arguments of `tokens` that no option takes as its value (MODEL), as argparse reads them."""
    positional, index = [], 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "--":
            return positional + tokens[index:]
        action = None if "=" in token else _option_of(token, actions)
        if not token.startswith("-") or token == "-":
            positional.append(token)
        elif action is not None and "." in token:  # a dotted key takes one value (--hf-overrides.a 1)
            index += 1
        elif action is not None and action.nargs in ("+", "*"):
            while index < len(tokens) and not tokens[index].startswith("-"):
                index += 1
        elif action is not None and action.nargs == "?":
            index += index < len(tokens) and not tokens[index].startswith("-")
        elif action is not None and action.nargs != 0:
            index += 1
    return positional


def _with_dotted_keys_joined(argv: list[str], json_options: Mapping[str, Callable[[str], dict[str, Any]]]
                             ) -> list[str]:
    """`argv` with vLLM's dotted keys of its JSON options (`--speculative-config.num_speculative_tokens 4`,
    `--compilation-config.level=3`, `-O.level=3` for --compilation-config, `--hf-overrides.a.b 1`, a list's items
    `--x.key+ 1 --x.key+=2,3`) joined into one JSON object per option: over the option's own value where it is given
    too (read by the option's parser in `json_options`, so `--limit-mm-per-prompt image=4` is an object; a dotted key
    wins), else given after the other options (before a `--`, after which all is positional). A value is read as JSON
    where it is JSON (3, true, [1]), else as text. Raises UsageError naming the key for a key without a value, or one
    that is not an object, and naming the option for an own value its parser refuses."""
    dotted: dict[str, dict[str, Any]] = {}
    rest: list[str] = []
    positional: list[str] = []  # `--` and what follows it
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--":
            positional = argv[index:]
            break
        name, dot, path = token.partition(".")
        name = _dotted_keys_option(name)
        if not dot or name not in json_options:
            rest.append(token)
            index += 1
            continue
        path, equals, value = path.partition("=")
        if not equals:
            if index + 1 >= len(argv):
                raise UsageError(f"{token} needs a value: {token} VALUE, or {token}=VALUE")
            index += 1
            value = argv[index]
        index += 1
        keys = path.split(".")
        if not all(keys) or keys[-1] == "+":
            raise UsageError(f"{token}: a key is empty; give {name}.KEY VALUE (KEY.SUBKEY for a nested one)")
        target = dotted.setdefault(name, {})
        for key in keys[:-1]:
            target = target.setdefault(key, {})
            if not isinstance(target, dict):
                raise UsageError(f"{token}: {key!r} was given a value, which has no keys")
        if keys[-1].endswith("+"):  # list items, one or several apart with commas
            items = target.setdefault(keys[-1][:-1], [])
            if not isinstance(items, list):
                raise UsageError(f"{token}: {keys[-1][:-1]!r} was given a value that is not a list")
            items += [_json_or_text(item) for item in value.split(",")]
        else:
            target[keys[-1]] = _json_or_text(value)
    for name, keys in dotted.items():
        rest += _joined_json_option(rest, name, keys, json_options[name])
    return rest + positional


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _joined_json_option(argv: list[str], name: str, keys: dict[str, Any], parse: Callable[[str], dict[str, Any]]
                        ) -> list[str]:
    """The option `name` with its dotted `keys`: merged into its last value in `argv`, read by `parse` (rewritten
    there as JSON; [] returned), else the option and its value to add. The option may be abbreviated, as argparse
    takes it (`--limit-mm`): added after it, the joined value would replace the one given."""
    for index in range(len(argv) - 1, -1, -1):
        given, equals, text = argv[index].partition("=")
        named = given == name or (len(given) > 2 and given.startswith("--") and name.startswith(given))
        if not named or (not equals and index + 1 == len(argv)):
            continue
        if not equals:
            index, text = index + 1, argv[index + 1]
        try:
            value = parse(text)
        except argparse.ArgumentTypeError as error:
            raise UsageError(f"{name}: {error} (its dotted keys, {name}.KEY, go into this value)") from None
        merged = json.dumps(_merged(value, keys))
        argv[index] = f"{name}={merged}" if equals else merged
        return []
    return [name, json.dumps(keys)]


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s keys, nested objects merged key by key."""
    merged = dict(base)
    for key, value in over.items():
        merged[key] = (_merged(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict)
                       else value)
    return merged


INSPECT_EXIT_STATUS = ("exit status: 0 when the checkpoint loads as serve would load it, warnings or not; 1 with "
                       "--strict when it loads but the report has warnings; 2 when it is refused (the reason on "
                       "stderr) or the command line is wrong")


def _refuse_a_missing_chat_template(args: argparse.Namespace) -> None:
    """UsageError for a --chat-template that is no file, named by the flag, before a checkpoint is read."""
    if args.chat_template is not None and not Path(args.chat_template).expanduser().is_file():
        raise UsageError(f"--chat-template {args.chat_template}: no such file; give the path of a Jinja chat "
                         "template file, or leave it out for the checkpoint's own template")


def _cmd_inspect(args: argparse.Namespace) -> int:
    _refuse_empty_argument(args.model, "MODEL", "give the checkpoint directory, .gguf file or Hub id to inspect")
    _refuse_a_missing_chat_template(args)
    import torch

    from glimmer.checkpoint.inspect import inspect_checkpoint
    from glimmer.checkpoint.resolve import inspected_checkpoint
    from glimmer.engine.tokenizer import load_checkpoint_tokenizer
    from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration

    def meta_model(config):
        with torch.device("meta"):
            return MuseGlimmerForConditionalGeneration(config)

    with inspected_checkpoint(args.model) as (checkpoint, shown):  # a Hub id: its weights' headers, not the weights
        report = inspect_checkpoint(checkpoint, meta_model, load_checkpoint_tokenizer, mmproj=args.mmproj,
                                    allow_pickle=args.allow_pickle, chat_template=args.chat_template)
    if shown != checkpoint:  # a temporary copy of the Hub snapshot, gone now: the report names the snapshot
        report.warnings = [warning.replace(str(checkpoint), str(shown)) for warning in report.warnings]
        if report.chat_template is not None:
            report.chat_template = {key: value.replace(str(checkpoint), str(shown)) if value else value
                                    for key, value in report.chat_template.items()}
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
        return _inspect_status(report.warnings, args.strict)
    config = report.config
    text = config.text
    print(f"checkpoint:      {args.model}")
    print(f"format:          {report.format}")
    if report.tensor_types:
        from glimmer.checkpoint.gguf_model import gguf_quantization_summary

        print(f"tensor types:    {gguf_quantization_summary(report.tensor_types)}")
    if report.quantization and "quantized_modules" in report.quantization:
        quantization = report.quantization
        print(f"quantization:    {quantization['scheme']} ({quantization['method']}, {quantization['format']}); "
              f"{quantization['quantized_modules']} modules ({', '.join(quantization['quantized_module_kinds'])}), "
              f"{quantization['quantized_bytes']:,} bytes on disk; dequantized to {quantization['dequantized_to']}")
    elif report.quantization:  # a config alone: its quantization_config was checked, but there is nothing to read
        quantization = report.quantization
        print(f"quantization:    {quantization['scheme']} ({quantization['method']}, {quantization['format']}); "
              "config only, no weights")
    print(f"config layout:   {config.config_layout}")
    print(f"weight layout:   {report.weight_layout}")
    print(f"RoPE layout:     {report.rope_layout}")
    template = report.chat_template
    print("chat template:   " + (f"{template['origin']} (sha256 {template['sha256'][:16]}…)"
                                 if template["origin"] else "none (see warnings)"))
    vision = "no (text-only)"
    if config.has_vision:
        vision = f"yes (images only: {config.video_unsupported_reason})" if config.video_unsupported_reason else "yes"
    print(f"vision:          {vision}")
    nope = [i for i, rope in enumerate(text.rope_layers) if not rope]
    print(f"layers:          {text.num_hidden_layers} ({len(text.full_attention_layers)} full-attention at "
          f"{list(text.full_attention_layers)}, {len(text.sliding_attention_layers)} sliding-window, "
          f"window {text.sliding_window}; NoPE at {nope})")
    print("parameters:")
    for label, count in report.parameter_counts.items():
        print(f"  {label:34s} {count:,}")
    print("normalized config:")
    print(json.dumps(config.summary(), indent=2))
    if report.warnings:
        print("warnings:")
        for warning in report.warnings:
            print(f"  - {warning}")
    else:
        print("warnings: none")
    return _inspect_status(report.warnings, args.strict)


def _inspect_status(warnings: list[str], strict: bool) -> int:
    """inspect's exit status (INSPECT_EXIT_STATUS): 1 for a checkpoint that loads but has warnings under --strict,
    said on stderr too (the report may be JSON piped elsewhere); 0 otherwise. A refusal is 2, as for every command."""
    if strict and warnings:
        print(f"glimmer: inspect: {len(warnings)} warning{'s' if len(warnings) > 1 else ''} (--strict)",
              file=sys.stderr)
        return 1
    return 0


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    from glimmer.tiny import TINY_DRAFTER_LAYOUTS, write_tiny_checkpoint, write_tiny_drafter

    _refuse_empty_argument(args.dir, "DIR", "give the directory to write the checkpoint to")
    if args.drafter_for is not None:
        _refuse_empty_argument(args.drafter_for, "--drafter-for", "give the target's checkpoint directory")
    out = Path(args.dir)
    if args.drafter_for is not None:
        from glimmer.default_model import embedded_model_dir

        embedded = None if Path(args.drafter_for).exists() else embedded_model_dir(args.drafter_for)
        target = args.drafter_for if embedded is None else str(embedded)  # glimmer-nano, as wherever a model is named
        given = {"--vision": args.vision, "--shards": args.shards != 1, "--preset": args.preset != "tiny",
                 "--config-only": args.config_only, "--quantize": args.quantize is not None}
        inapplicable = [flag for flag, is_given in given.items() if is_given]
        if inapplicable:
            raise UsageError(f"--drafter-for writes a DFlash drafter; leave out {', '.join(inapplicable)} (options "
                             "of a model checkpoint)")
        if Path(target).is_file():  # the drafter is written from the target's config.json and tokenizer
            raise UsageError(f"--drafter-for needs the target's checkpoint directory; {args.drafter_for} is a file "
                             "(GGUF targets are not supported)")
        if not Path(target).is_dir():
            raise UsageError(f"--drafter-for {args.drafter_for}: no such directory; give the target's checkpoint "
                             "directory")
        if args.layout not in TINY_DRAFTER_LAYOUTS:  # write_tiny_drafter would name its argument, `layout=`
            raise UsageError(f"--layout {args.layout} has no drafter; give --layout "
                             f"{' or '.join(TINY_DRAFTER_LAYOUTS)} with --drafter-for")
    try:
        if out.exists() and not out.is_dir():
            raise UsageError(f"{out} exists and is not a directory")
        if out.is_dir() and any(out.iterdir()) and not args.force:
            raise UsageError(f"{out} is not empty; choose an empty directory or pass --force to overwrite its files")
        if args.drafter_for is not None:
            path = write_tiny_drafter(args.dir, target, layout=args.layout, seed=args.seed)
            print(f"wrote a tiny random {args.layout}-layout DFlash drafter for {args.drafter_for} to {path}")
            return 0
        path = write_tiny_checkpoint(args.dir, layout=args.layout, vision=args.vision, seed=args.seed,
                                     num_shards=args.shards, preset=args.preset, config_only=args.config_only,
                                     quantize=args.quantize)
    except OSError as error:  # a parent that is a file, a read-only or virtual file system, a full disk, ...
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(out) else ""
        raise UsageError(f"cannot write to {out}: {error.strerror or error}{where}; choose a directory you can "
                         "create and write") from None
    what = "the released 30B geometry" if args.preset == "30b" else "a tiny random"
    with_vision = " with vision" if args.vision or args.preset == "30b" else ""
    if args.config_only:
        print(f"wrote {what} {args.layout}-layout config{with_vision} (no weights: load it with "
              f"--load-format dummy) to {path}")
    else:
        quantized = " (text Linear layers NVFP4-quantized, compressed-tensors)" if args.quantize else ""
        print(f"wrote {what} {args.layout}-layout checkpoint{with_vision}{quantized} to {path}")
    return 0


def _default_model_note(args: argparse.Namespace) -> str | None:
    """The line that tells the user of a command given no MODEL what it runs: the embedded demo model, or with
    --load-format dummy only the demo's geometry, whose random weights call no tools (the demo's blurb would promise
    that they do). None when a MODEL is given."""
    if args.model is not None:
        return None
    if args.load_format == "dummy":
        return ("No MODEL given: this is the embedded demo model glimmer-nano's geometry with random weights "
                "(--load-format dummy): its replies are noise and it calls no tools; leave out --load-format dummy "
                "for the trained demo.")
    return f"No MODEL given: {DEFAULT_MODEL_BLURB}"


def _served_model_names(args: argparse.Namespace, name: str) -> tuple[str, ...]:
    """The names a body's `model` may give (serve and run-batch): --served-model-name's, else the model's `name` (a
    directory's or a GGUF file's) and MODEL as given, which vLLM serves it as (`vllm serve /models/x` answers to
    `/models/x`, the name its clients send)."""
    return tuple(args.served_model_name or dict.fromkeys([name, args.model or name]))


def _engine_from_args(args: argparse.Namespace) -> tuple[Any, str]:
    """(AsyncEngine, served name) for `serve`, in-process `chat` and `run-batch`."""
    from glimmer.default_model import default_model_dir
    from glimmer.engine.async_engine import AsyncEngine
    from glimmer.engine.llm_engine import EngineConfig
    from glimmer.multimodal import MediaLimits

    is_default = args.model is None
    model = str(default_model_dir()) if is_default else args.model
    local = Path(model).expanduser()
    name = local.resolve().name if local.exists() else model  # a directory's or a GGUF file's name
    config = EngineConfig(
        model=model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, chat_template=args.chat_template, seed=args.seed,
        max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=args.kv_cache_memory,
        block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
        async_scheduling=args.async_scheduling, load_format=args.load_format,
        enable_prefix_caching=args.enable_prefix_caching,
        mmproj=args.mmproj, allow_pickle=args.allow_pickle,
        speculative_config=args.speculative_config,
        media_limits=MediaLimits(**{field: getattr(args, dest) for dest, field in _MEDIA_LIMIT_OPTIONS.items()}),
        # started with stderr closed (as some daemonizers start a server), Python has none: the bars would write to None
        progress=sys.stderr is not None,
    )
    engine = AsyncEngine(config, max_waiting_requests=args.max_waiting_requests,
                         generation_config=args.generation_config)
    return engine, name


def _heeding_sigterm(command: Callable[[argparse.Namespace, SigtermWatch], int], args: argparse.Namespace,
                     stopped: str, stopped_status: int) -> int:
    """`command(args, sigterm)` with SIGTERM raising Terminated (`sigterm`, a SigtermWatch) from the start, before
    the imports (a second or two) and the checks that precede loading the model: as a container's PID 1, where a
    signal without a handler is ignored, `docker stop` went unheard and the process went on to load the model and
    work until killed. The command may stop the watch early (serve does, for uvicorn); a Terminated it lets out
    prints `stopped` and returns `stopped_status`, as does a SIGTERM the entry point noted before (glimmer.sigterm).
    A command heeds SIGTERM by its parser's `sigterm_stop` default, (`stopped`, `stopped_status`): build_parser."""
    sigterm = SigtermWatch()  # noted from here, raised only once armed, inside the try that says so
    try:
        sigterm.arm()
        return command(args, sigterm)
    except Terminated:
        print(stopped, file=sys.stderr)
        return _ended_at_once_if_a_download_was_left(stopped_status)
    finally:
        sigterm.stop()


def _ended_at_once_if_a_download_was_left(status: int) -> int:
    """`status`, for a command stopped (SIGTERM, Ctrl-C) as it loaded the model; where a Hub download was left
    running (glimmer.checkpoint.resolve.abandoned_download), the process ends here with `status`, its output flushed:
    the interpreter's exit waits for the download's file threads, which kept `glimmer serve` up after SIGTERM until
    the whole model was in (or the supervisor's SIGKILL). The download is the process's own work, which nothing else
    waits for; the files fetched so far stay in the Hub cache, where the next run resumes them."""
    from glimmer.checkpoint.resolve import abandoned_download

    if not abandoned_download():
        return status
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    os._exit(status)


def _serve(args: argparse.Namespace, sigterm: SigtermWatch) -> int:
    """`glimmer serve` with SIGTERM raising Terminated until `sigterm` is stopped, which it is before the
    engine shuts down."""
    import uvicorn

    import glimmer
    from glimmer.server.app import create_app
    from glimmer.server.connection import raise_open_file_limit, read_timeout_protocol, server_url
    from glimmer.server.settings import DEFAULT_MAX_REQUEST_BYTES_WITH_MEDIA, ServerSettings

    def server_settings(served_name: str, has_vision: bool) -> ServerSettings:
        max_request_bytes = args.max_request_bytes if args.max_request_bytes is not None else (
            DEFAULT_MAX_REQUEST_BYTES_WITH_MEDIA if has_vision else DEFAULT_MAX_REQUEST_BYTES)
        return ServerSettings(
            served_model_names=_served_model_names(args, served_name),
            # an empty --api-key (`--api-key "$KEY"` with KEY unset) is refused by the settings, not read as no key
            api_key=_serve_api_key(args),
            max_request_bytes=max_request_bytes,
            **_template_defaults(args),
            media_policy=_media_policy(args),
            max_images_per_request=args.max_images_per_request,
            max_videos_per_request=args.max_videos_per_request,
            require_cache_salt=args.require_cache_salt,
            allowed_origins=tuple(args.allowed_origins),
            metrics_require_api_key=args.metrics_require_api_key,
            allow_control_tokens_in_content=args.allow_control_tokens_in_content,
            trust_request_chat_template=args.trust_request_chat_template,
            request_id_headers=args.enable_request_id_headers,
            max_header_count=args.h11_max_header_count,
        )

    _check_engine_options(args)
    _check_serve_options(args)
    _note_vllm_engine_options(args)
    from glimmer.engine.vllm_arguments import VLLM_SERVING_ARGUMENTS

    for note in _check_vllm_options(args, _VLLM_SERVING_OPTIONS, VLLM_SERVING_ARGUMENTS):
        print(note)
    server_settings("model", has_vision=False)  # the server's options are refused before the model loads
    # a busy port is reported before the model loads; vLLM's --uds stands for --host and --port
    listener = _bind_unix(args.uds) if args.uds is not None else _bind(args.host, args.port)
    raise_open_file_limit()
    engine = server = None
    try:
        engine, name = _engine_from_args(args)
        sigterm.check()  # a SIGTERM the loading code dropped
        default_note = _default_model_note(args)
        settings = server_settings(name, engine.engine.model_config.has_vision)
        app = create_app(engine, settings)
        llm_engine = engine.engine
        print(f"Glimmer {glimmer.__version__} serving {', '.join(map(repr, settings.served_model_names))} "
              f"from {llm_engine.checkpoint_dir} on {llm_engine.device} ({llm_engine.dtype}), "
              f"max_model_len {llm_engine.max_model_len}")
        if default_note is not None:
            print(f"{default_note} Run `glimmer serve MODEL` with a checkpoint directory or Hub id to serve a real "
                  "model.")
        key_note = f"API key {'required' if settings.api_key else 'not required'}"
        if args.uds is not None:
            print(f"OpenAI-compatible API on the Unix socket {args.uds}: /v1 ({key_note}); /health, /metrics; "
                  "chat page at /", flush=True)
        else:  # the port bound, which --port 0 leaves to the system
            url = server_url("https" if args.ssl_keyfile else "http", args.host, listener.getsockname()[1])
            print(f"OpenAI-compatible API at {url}/v1 ({key_note}); /health, /metrics; chat page at {url}/", flush=True)
        config = uvicorn.Config(app, log_level=args.uvicorn_log_level or (args.log_level or "INFO").lower(),
                                timeout_graceful_shutdown=5, access_log=not args.disable_uvicorn_access_log,
                                # None: uvicorn decides, colouring on a terminal (it asks sys.stdout: none if closed)
                                use_colors=False if _no_color() or sys.stdout is None else None,
                                root_path=args.root_path, ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile,
                                ssl_ca_certs=args.ssl_ca_certs, ssl_cert_reqs=args.ssl_cert_reqs,
                                # a head (or body piece) h11 holds unparsed beyond this size is refused with 400;
                                # given, h11 parses every request, as httptools has no such limit
                                h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
                                http=read_timeout_protocol(args.request_read_timeout,
                                                           h11=args.h11_max_incomplete_event_size is not None))
        server = _shutdown_server(engine, config)
        # A dead engine thread makes the server useless: stop serving and exit non-zero, so that a supervisor
        # (systemd, Kubernetes) restarts the process instead of keeping a server that only answers 503.
        engine.notify_when_dead(lambda failure: setattr(server, "should_exit", True))
        # uvicorn re-raises the signal it shut down for: Ctrl-C as KeyboardInterrupt, SIGTERM as Terminated
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[listener])
    except _CannotListen as failure:
        if args.uds is not None:  # (listened on before the model loaded, _bind_unix: listening again should not fail)
            raise _cannot_listen(args.uds, failure.error, "--uds") from None
        # the port was bound before the model loaded, but another server loading then holds its own bound and not
        # yet listened on, which that bind (SO_REUSEADDR) does not refuse: the first of the two to be ready takes it
        raise _cannot_listen(f"{args.host}:{args.port}", failure.error, "--port or --host",
                             " (another server began listening there while the model loaded)") from None
    except Terminated:
        if server is None:  # before serving: _heeding_sigterm says so, once this has cleaned up
            raise
    finally:
        sigterm.stop()
        if engine is not None:
            engine.shutdown()
        listener.close()
        if args.uds is not None:  # the socket file would outlive the server, which left it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(args.uds)
    if engine.failure is not None:
        print(f"glimmer: error: the engine stopped after an internal error ({type(engine.failure).__name__}: "
              f"{engine.failure}); exiting so that a supervisor can restart the server", file=sys.stderr)
        return 1
    return 0 if server.started else 1


def _run_batch(args: argparse.Namespace, sigterm: SigtermWatch) -> int:
    """`glimmer run-batch` with SIGTERM raising Terminated (a batch running stops as Ctrl-C stops it)."""
    from glimmer.engine.vllm_arguments import VLLM_RUN_BATCH_ARGUMENTS
    from glimmer.server.batch import parse_batch_input

    _check_engine_options(args)
    _note_vllm_engine_options(args)  # before the output file is opened
    for note in _check_vllm_options(args, _VLLM_RUN_BATCH_OPTIONS, VLLM_RUN_BATCH_ARGUMENTS):
        print(note, file=sys.stderr)  # stdout may be the output
    _refuse_a_model_taken_by_a_list_option(args, "run-batch")
    _check_media_options(args)
    _check_served_model_names(args)
    try:  # an unreadable input before the model loads
        lines = parse_batch_input(_read_batch_input(args.input_file))
    except ValueError as error:
        raise UsageError(f"--input-file {args.input_file}: {error}") from None
    shown = "stdout" if args.output_file == "-" else args.output_file
    output = None
    try:
        with _batch_output(args.output_file, args.input_file) as output:
            summary, engine = _run_batch_file(args, lines, sigterm, output)
    except (Terminated, KeyboardInterrupt) as stop:
        if output is None or not output.started:  # the output is as it was: "stopped before the batch began"
            raise
        by, signum = ("SIGTERM", signal.SIGTERM) if isinstance(stop, Terminated) else ("Ctrl-C", signal.SIGINT)
        print(f"run-batch: stopped by {by}; wrote {_records(output.records)} to {shown}, those finished before it "
              "(the requests in flight were aborted)", file=sys.stderr)
        return 128 + signum
    failed = f", {summary.failed} failed (see their `error`)" * bool(summary.failed)
    print(f"run-batch: wrote {_records(output.records)} to {shown}: {summary.succeeded} answered with status "
          f"200{failed}", file=sys.stderr)
    if engine.failure is not None:
        print(f"glimmer: error: the engine stopped after an internal error ({type(engine.failure).__name__}: "
              f"{engine.failure}); the requests after it failed with status 500", file=sys.stderr)
        return 1
    return 0


def _records(count: int) -> str:
    return f"{count} record{'s' * (count != 1)}"


def _run_batch_file(args: argparse.Namespace, lines: list[Any], sigterm: SigtermWatch,
                    output: _BatchOutput) -> tuple[Any, Any]:
    """Load the engine and run `lines` through the server's routes into `output`: (BatchSummary, engine). Raises
    Terminated when SIGTERM stops the loading (`output` not started) or the batch (it holds the records finished
    before it)."""
    import asyncio

    from tqdm import tqdm

    from glimmer.server.app import create_app
    from glimmer.server.batch import run_batch
    from glimmer.server.json_text import one_line_json
    from glimmer.server.settings import ServerSettings

    engine, name = _engine_from_args(args)
    default_note = _default_model_note(args)
    try:
        sigterm.check()  # a SIGTERM the loading code dropped
        if default_note is not None:
            print(default_note, file=sys.stderr)
        settings = ServerSettings(
            served_model_names=_served_model_names(args, name),
            max_request_bytes=sys.maxsize,  # a line is no upload to limit
            default_reasoning_strength=args.default_reasoning_strength,
            trust_request_chat_template=args.trust_request_chat_template,
            media_policy=_media_policy(args), **_media_counts(args))
        app = create_app(engine, settings)
        # twice the batch the engine runs keeps it full as requests finish; those beyond it wait in its queue,
        # whose --max-waiting-requests they stay within (beyond, the engine's 429 would only be retried)
        max_num_seqs = engine.engine.scheduler_config.max_num_seqs
        max_in_flight = max_num_seqs + min(max_num_seqs, args.max_waiting_requests)

        def write(record: dict[str, Any]) -> None:
            output.write(one_line_json(record) + "\n")

        output.start()

        with tqdm(total=len(lines), desc="run-batch", unit="req", file=sys.stderr) as bar:
            summary = asyncio.run(_cancelled_by_sigterm(run_batch(app, lines, write, max_in_flight=max_in_flight,
                                                                  on_done=bar.update)))
    finally:
        engine.shutdown()
    return summary, engine


async def _cancelled_by_sigterm(work: Any) -> Any:
    """`work` (a coroutine), cancelled by SIGTERM as asyncio.run cancels it at Ctrl-C, so that it stops as it does
    then; raises Terminated once it has. Without it SIGTERM (`docker stop`, a Kubernetes Job deleted) killed
    run-batch at once, the records in the output's buffer lost and its last line cut, or went unheard as a
    container's PID 1."""
    import asyncio
    import threading

    if threading.current_thread() is not threading.main_thread():  # (only the main thread may handle signals)
        return await work
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    terminated = False

    def terminate() -> None:
        nonlocal terminated
        terminated = True
        task.cancel()

    previous = signal.getsignal(signal.SIGTERM)
    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await work
    except asyncio.CancelledError:
        if terminated:
            raise Terminated() from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)  # which sets the default handler, not the one it replaced
        if previous is not None:  # (None: one not set from Python)
            signal.signal(signal.SIGTERM, previous)


def _read_batch_input(source: str) -> bytes:
    """The bytes of run-batch's --input-file (`-`: stdin); UsageError when they cannot be read."""
    _refuse_empty_argument(source, "--input-file", "give the batch file's path, or - for stdin")
    if source == "-" and sys.stdin is None:  # started with stdin closed (`<&-`): Python then has none
        raise UsageError("--input-file -: stdin is closed; give the batch file's path, or pipe the file in")
    if urlsplit(source).scheme in ("http", "https"):
        raise UsageError(f"--input-file {source}: reading a URL is not supported; download it (curl -o requests.jsonl "
                         "URL) and give its path, or pipe it in with --input-file -")
    try:
        return sys.stdin.buffer.read() if source == "-" else Path(source).expanduser().read_bytes()
    except OSError as error:
        raise UsageError(f"--input-file {source}: {error.strerror or error}") from None


class _BatchOutput:
    """run-batch's --output-file (`-`: stdout), opened before the model loads without emptying it: `start()` empties
    it once the batch begins, so that a model that fails to load (a typo in MODEL, a bad config) leaves the results of
    an earlier run there as they were. `write(text)` writes one record's line, counted in `records`, and raises
    UsageError when writing fails (a full disk)."""

    def __init__(self, target: str, output: TextIO):
        self.target = target
        self.output = output
        self.started = False
        self.records = 0

    def start(self) -> None:
        # a device or a pipe (/dev/null, a FIFO) has nothing to empty, and refuses truncate()
        if self.output is not sys.stdout and stat.S_ISREG(os.fstat(self.output.fileno()).st_mode):
            self._written(lambda: self.output.truncate(0))
        # only once emptied: a SIGTERM before then says the output is as it was, not that it holds this run's records
        self.started = True

    def write(self, text: str) -> None:
        self._written(lambda: self.output.write(text))
        self.records += 1

    def flush(self) -> None:
        self._written(self.output.flush)

    def _written(self, action: Callable[[], Any]) -> None:
        try:
            action()
        except BrokenPipeError:  # stdout piped into `head` and the like
            raise
        except OSError as error:
            raise UsageError(f"--output-file {self.target}: {error.strerror or error}") from None


@contextlib.contextmanager
def _reconfigured(stream: TextIO | None, **settings: str) -> Iterator[None]:
    """`stream` (sys.stdin, sys.stdout) with `settings` (encoding, errors) for the block, and as it was after it, even
    where the block raises: glimmer.cli.main run in another program leaves that program's streams as they were. A
    stream that is no TextIOWrapper (a stand-in, a closed stream's None) is left alone, and so is one that refuses
    (io.UnsupportedOperation: stdin's encoding once the program has read from it)."""
    if not isinstance(stream, io.TextIOWrapper):
        yield
        return
    # reconfigure(encoding=...) alone resets errors to 'strict': both are given back
    saved = {"encoding": stream.encoding, "errors": stream.errors}
    try:
        stream.reconfigure(**settings)  # type: ignore[arg-type]
    except io.UnsupportedOperation:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(io.UnsupportedOperation):
            stream.reconfigure(**saved)


@contextlib.contextmanager
def _batch_output(target: str, source: str) -> Iterator[_BatchOutput]:
    """run-batch's --output-file, opened before the model loads; UsageError when it cannot be, when it is the input
    file (which it would overwrite), or when writing fails (a full disk)."""
    _refuse_empty_argument(target, "--output-file", "give the path to write the results to, or - for stdout")
    if urlsplit(target).scheme in ("http", "https"):
        raise UsageError(f"--output-file {target}: writing to a URL is not supported; give a local path (then upload "
                         "it), or - for stdout")
    if target == "-" and sys.stdout is None:  # started with stdout closed: no record could be written
        raise UsageError("--output-file -: stdout is closed; give the path to write the results to")
    path = Path(target).expanduser()
    # samefile: a hard link to the input (or a symbolic one, or another spelling of its path) is the input too
    if target != "-" and source != "-" and path.exists() and path.samefile(Path(source).expanduser()):
        raise UsageError(f"--output-file {target} is the input file, which it would overwrite; give another path")
    created = target != "-" and not path.exists() and not path.is_symlink()
    try:
        # append mode checks that the file can be written without emptying it; start() empties it
        output = sys.stdout if target == "-" else path.open("a", encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--output-file {target}: {error.strerror or error}") from None
    batch_output = _BatchOutput(target, output)
    # a JSON Lines file is UTF-8 text: under another encoding (PYTHONIOENCODING, a latin-1 locale, a Windows code
    # page) a record's "\ufffd" or "é" ended the batch in a UnicodeEncodeError traceback, or was written in it
    utf8 = _reconfigured(output, encoding="utf-8") if output is sys.stdout else contextlib.nullcontext()
    try:
        with utf8:
            yield batch_output
            batch_output.flush()
    finally:
        if output is not sys.stdout:
            with contextlib.suppress(OSError):  # what a failed flush left unwritten: that failure is reported
                output.close()
        if created and not batch_output.started:  # no batch began (the model failed to load, a SIGTERM): the file
            # opened to check it is gone again, so that no empty output passes for the results of an empty batch
            with contextlib.suppress(OSError):
                path.unlink()


def _no_color() -> bool:
    """Whether the environment asks for no ANSI colours, as --no-color does: $NO_COLOR set and not empty
    (no-color.org), or TERM=dumb, a terminal that shows escape sequences as text (as Python's own colours and rich
    take it)."""
    return bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"


class _CannotListen(Exception):
    """The server's socket, bound before the model loaded, could not be listened on (`error`) as it began serving."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def _cannot_listen(where: str, error: OSError, flags: str, why: str = "") -> UsageError:
    """The refusal of an address (`host:port`, a socket file) the server cannot listen on, saying to choose another
    with `flags`."""
    return UsageError(f"cannot listen on {where}: {error.strerror or error}{why}; choose another {flags}")


def _shutdown_server(engine: Any, config: Any) -> Any:
    """A uvicorn server that, at the first shutdown signal, stops the engine's requests: each open stream ends
    with an error event and `[DONE]` and each waiting non-streamed request gets a 503 body, instead of generating
    on until uvicorn's grace period runs out and cuts them (truncated streams, plain-text 500s). It logs a
    connection it cannot accept for want of file descriptors in one line a minute (log_accept_failures_briefly)."""
    import asyncio
    import functools

    import uvicorn

    from glimmer.server.connection import log_accept_failures_briefly

    class ShutdownServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            """Raises _CannotListen where the socket cannot be listened on."""
            log_accept_failures_briefly(asyncio.get_running_loop())
            try:
                await super().startup(sockets)
            except OSError as error:  # uvicorn lets a given socket's listen() fail out of its startup
                await self.lifespan.shutdown()  # (left running, its task was cancelled with a traceback)
                raise _CannotListen(error) from None

        def handle_exit(self, sig: int, frame: Any) -> None:
            # uvicorn runs this signal handler on the event loop's thread, between two bytecodes of whatever runs
            # there: maybe generate() or abort() holding the engine's command-queue locks, which stop_serving takes
            # too. Called here, it waited on its own thread forever; the loop runs it once the interrupted code is
            # done (call_soon_threadsafe takes no lock)
            stop = functools.partial(engine.stop_serving,
                                     "the server is shutting down; retry on another replica or after restart")
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop runs (uvicorn not yet serving): nothing on this thread holds the locks
                stop()
            else:
                loop.call_soon_threadsafe(stop)
            super().handle_exit(sig, frame)

    return ShutdownServer(config)


# media limit option (argparse dest; the flag with dashes) → MediaLimits field
_MEDIA_LIMIT_OPTIONS = {"max_image_pixels": "max_image_pixels", "max_image_side": "max_image_side",
                        "max_image_aspect_ratio": "max_image_aspect_ratio",
                        "max_video_frame_pixels": "max_video_frame_pixels",
                        "max_video_frames": "max_video_source_frames"}


class _StoreNamingTheFlag(argparse.Action):
    """Stores the value, and which of the option's spellings was typed (vLLM's --kv-cache-memory-bytes for
    --kv-cache-memory) as `<dest>_flag`, for errors to name the flag the user wrote."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_flag", option_string)


class _ExtendTakingVllmsJsonList(argparse.Action):
    """A CORS option's values added to those given before, as `action="extend"` adds them, where a value that is one
    JSON list of strings, as vLLM reads these options (`--allowed-origins '["https://app.example.com"]'`), gives its
    items."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        items = list(getattr(namespace, self.dest, None) or [])  # (absent: a vLLM option's default is SUPPRESS)
        for value in values:
            listed = _json_or_text(value) if value.lstrip().startswith("[") else None
            is_list = isinstance(listed, list) and all(isinstance(item, str) for item in listed)
            items += listed if is_list else [value]
        setattr(namespace, self.dest, items)


def _flag_typed(args: argparse.Namespace, dest: str) -> str:
    """The flag of `dest` as the command line spelled it (its first spelling if not given, or stored plainly)."""
    return getattr(args, f"{dest}_flag", None) or f"--{dest.replace('_', '-')}"


def _with_flags_as_typed(message: str, args: argparse.Namespace) -> str:
    """An engine error's `message`, whose fix names --kv-cache-memory, naming --kv-cache-memory-bytes where the
    user gave that spelling."""
    typed = _flag_typed(args, "kv_cache_memory")
    return re.sub(r"--kv-cache-memory(?![\w-])", typed, message) if typed != "--kv-cache-memory" else message


def _refuse_empty_argument(value: str, name: str, fix: str) -> None:
    """UsageError for an argument given empty (or blank), as `"$DIR"` is with DIR unset: it is no value of the
    argument, nor its absence (a path, which Path("") would read as the current directory; --url, whose absence is
    an in-process chat)."""
    if not value.strip():
        raise UsageError(f"{name} is empty; {fix}")


def _check_engine_options(args: argparse.Namespace) -> None:
    """UsageError naming the option, for engine options the engine would accept but that leave it useless, or would
    refuse only once the model is loaded."""
    if args.model_option is not None:  # vLLM's `--model NAME`, which vllm serve still takes (deprecated)
        if args.model is not None and args.model != args.model_option:
            raise UsageError(f"MODEL {args.model} and --model {args.model_option} name two models; give one of them")
        args.model = args.model_option
    if args.model is not None:
        _refuse_empty_argument(args.model, "MODEL", "give a checkpoint directory, .gguf file or Hub id, or leave it "
                                                    "out for the embedded glimmer-nano")
    for dest in _MEDIA_LIMIT_OPTIONS:  # MediaLimits would name its field, not the flag typed
        if getattr(args, dest) < 1:
            raise UsageError(f"--{dest.replace('_', '-')} {getattr(args, dest)} is invalid; give a positive integer")
    # EngineConfig would name its field and Python's None (`max_model_len=0 ... (or None for the default)`)
    for dest in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory"):
        if getattr(args, dest) is not None and getattr(args, dest) < 1:
            raise UsageError(f"{_flag_typed(args, dest)} {getattr(args, dest)} is invalid; give a positive "
                             f"{'size' if dest == 'kv_cache_memory' else 'integer'}, or leave it out for the default")
    if args.block_size is not None and (args.block_size < 1 or args.block_size & (args.block_size - 1)):
        raise UsageError(f"--block-size {args.block_size} is invalid; give a power of two such as 16, or leave it out "
                         "for 16")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization {args.gpu_memory_utilization} is invalid; give a fraction in "
                         "(0, 1], or leave it out for 0.9")
    if not SEED_RANGE[0] <= args.seed < SEED_RANGE[1]:  # EngineConfig would name its field, `seed=...`
        raise UsageError(f"--seed {args.seed} is out of range; give an integer from -2**63 to 2**64 - 1")
    if args.device is not None:
        _check_device(args.device)
    _refuse_a_missing_chat_template(args)
    if args.max_waiting_requests < 1:
        raise UsageError(f"--max-waiting-requests {args.max_waiting_requests} would refuse every request with HTTP "
                         "429; give at least 1")
    if args.speculative_config is not None:  # its JSON and keys, before minutes of loading the model
        from glimmer.engine.spec_decode import SpeculativeConfig

        try:
            SpeculativeConfig.parse(args.speculative_config)
        except ConfigError as error:
            raise UsageError(f"--speculative-config: {error}") from None


def _check_device(name: str) -> None:
    """UsageError naming --device for a device torch cannot name, one Glimmer does not run on, or CUDA that is absent
    (the engine would say `device='cuda' ... use device='cpu'`, in the Python API's words); a CUDA ordinal is left to
    the engine."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name} is not a device; give cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):  # torch names it (mps, xla, meta), but Glimmer runs on neither
        raise UsageError(f"--device {name} is not supported; give --device cpu or cuda, or leave --device out")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available here; give --device cpu, or leave --device out")


def _engine_options_given(args: argparse.Namespace) -> list[str]:
    """The model and engine options of `args` that differ from their defaults (flags as typed)."""
    probe = argparse.ArgumentParser(add_help=False)
    _add_engine_options(probe)
    given = []
    for action in probe._actions:
        if action.dest == "model" and args.model == args.model_option:
            continue  # taken from --model, which names it
        if getattr(args, action.dest, action.default) != action.default:
            given.append("/".join(action.option_strings) if action.option_strings else action.dest.upper())
    return given


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port for the server (port 0: one the system picks); UsageError if the address is
    taken or invalid."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a TCP port; choose one from 1 to 65535, or 0 for a free one")
    from glimmer.server.connection import tcp_listener

    try:
        return tcp_listener(host, port)
    except OSError as error:
        raise _cannot_listen(f"{host}:{port}", error, "--port or --host") from None


def _bind_unix(path: str) -> socket.socket:
    """A Unix domain socket at `path` for the server (vLLM's --uds), listened on; UsageError if it cannot be made. A
    socket file that nothing listens on (left by a server that was killed) is replaced; one a server listens on is
    not. It is listened on at once, before the model loads: a server bound alone looked like a killed one to a
    second server on the path, which replaced its file (connections wait for the server to accept them)."""
    _refuse_empty_argument(path, "--uds", "give the path of the socket file to create")
    try:
        is_socket, exists = Path(path).is_socket(), Path(path).exists()
    except OSError as error:  # a folder on the path this user may not search: PermissionError, not False
        raise UsageError(f"--uds {path}: cannot look there ({error.strerror or error}); choose a path whose "
                         "folders this user can open") from None
    if is_socket:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except ConnectionRefusedError:
                Path(path).unlink()
            else:
                raise UsageError(f"--uds {path}: a server is listening on it; stop it or choose another path")
    elif exists:  # binding would say `Address already in use`
        raise UsageError(f"--uds {path}: a file that is not a socket is there; choose another path")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen()
    except OSError as error:
        listener.close()
        raise _cannot_listen(path, error, "--uds") from None
    return listener


def _chat(args: argparse.Namespace, sigterm: SigtermWatch) -> int:
    """`glimmer chat` with SIGTERM raising Terminated."""
    from glimmer.server.chat_client import run_chat

    # started with one closed (`<&-`, `>&-`: a daemonizer's, a job runner's), Python has none, and the chat failed in a
    # traceback once the model had loaded
    if sys.stdin is None:
        raise UsageError("stdin is closed; the chat reads its messages from stdin: run it at a terminal, or pipe the "
                         "messages in")
    if sys.stdout is None:
        raise UsageError("stdout is closed; the chat writes its replies to stdout: run it at a terminal, or send "
                         "stdout to a file")
    if args.url is not None:  # `--url "$SERVER"` with SERVER unset: not an in-process chat
        _refuse_empty_argument(args.url, "--url", "give the server's address, e.g. http://127.0.0.1:8000, or leave "
                                                  "--url out to load the model in-process")
    options = _chat_request_options(args)
    _check_engine_options(args)
    if args.url is not None:
        from glimmer.server.chat_client import ChatClientError, check_server_url

        if args.api_key is not None:  # `"$KEY"`, KEY unset: no $GLIMMER_API_KEY then (as openai)
            _refuse_empty_argument(args.api_key, "--api-key", "give the server's key, or leave --api-key out to send "
                                                              "$GLIMMER_API_KEY (no key where it is unset)")
        # the server's own limits hold for what it is sent
        ignored = _engine_options_given(args) + ["--limit-mm-per-prompt"] * (args.limit_mm_per_prompt is not None)
        if ignored:
            pronoun = "it" if len(ignored) == 1 else "them"
            raise UsageError(f"--url chats with the model the server at {args.url} serves; {', '.join(ignored)} "
                             f"would be ignored: leave {pronoun} out, or leave out --url to load the model in-process")

        try:
            check_server_url(args.url)
        except ChatClientError as error:
            raise UsageError(f"--url {error}") from None
    else:
        remote_only = [flag for flag, value in (("--served-model", args.served_model), ("--api-key", args.api_key))
                       if value is not None]
        if remote_only:
            verb, pronoun = ("applies", "it") if len(remote_only) == 1 else ("apply", "them")
            raise UsageError(f"{', '.join(remote_only)} only {verb} to a --url server; without --url the model is "
                             f"loaded in-process: leave {pronoun} out, or add --url")
    tools = _read_tools(args.tools) if args.tools is not None else None
    color = not args.no_color and not _no_color() and sys.stdout.isatty()
    # messages piped in (`echo hi | glimmer chat`) are a script's: a failed one is an error on stderr and exit 1
    # after the rest; at a terminal the user sees it and goes on
    interactive = sys.stdin.isatty()
    chat = dict(out=sys.stdout, read_line=input, system=args.system, tools=tools, request_options=options,
                color=color, err=None if interactive else sys.stderr)
    if args.url is not None:
        from glimmer.server.chat_client import check_server

        # the --served-model is checked now, not when the first message is refused
        api_key = args.api_key if args.api_key is not None else os.environ.get("GLIMMER_API_KEY")
        max_model_len = check_server(args.url, api_key, args.served_model)
        max_tokens = options.get("max_tokens")
        if max_model_len is not None and max_tokens is not None and max_tokens >= max_model_len:
            # the context holds the prompt too, of at least one token: the server would refuse every message
            raise UsageError(f"--max-tokens {max_tokens} would make every message fail: the server's model has a "
                             f"context of {max_model_len} tokens, the prompt included; give a --max-tokens that "
                             f"leaves the prompt room (below {max_model_len}), or leave it out")
        with _chat_streams():
            failed = run_chat(args.url, model=args.served_model, api_key=api_key, max_model_len=max_model_len, **chat)
        return _chat_status(failed, interactive)
    from glimmer.server.app import create_app
    from glimmer.server.background import BackgroundServer
    from glimmer.server.settings import ServerSettings

    if args.log_level is None:  # a --log-level given is taken as it is: the user asked for those lines
        logging.getLogger().setLevel(logging.WARNING)
        # what the protocol parser notices in the model's output (a repeated parameter, stray text between tags)
        # would land in the middle of the reply being printed, which shows the parsed call
        logging.getLogger("glimmer.protocol").setLevel(logging.ERROR)
    _note_vllm_engine_options(args)
    if args.limit_mm_per_prompt is not None:
        print(f"vLLM's --limit-mm-per-prompt {args.limit_mm_per_prompt.given} changes nothing here: the "
              "terminal chat sends text only, no images or videos", file=sys.stderr)
    engine, name = _engine_from_args(args)
    default_note = _default_model_note(args)
    try:
        sigterm.check()  # a SIGTERM the loading code dropped
        # the terminal is the server's only client: a message too long is refused by the context length it does not
        # fit (HTTP 400 naming it), not by a body limit that drops the connection (and the reason) mid-upload
        app = create_app(engine, ServerSettings(served_model_names=(name,), max_request_bytes=sys.maxsize))
        _check_chat_fits_context(app.state.context, args, options, tools)
        if default_note is not None:
            print(default_note)
        with BackgroundServer(app) as server, _chat_streams():
            failed = run_chat(server.url, model=name, api_key=None, max_model_len=engine.engine.max_model_len,
                              in_process=True, **chat)
    finally:
        engine.shutdown()
    return _chat_status(failed, interactive)


@contextlib.contextmanager
def _chat_streams() -> Iterator[None]:
    """stdin and stdout set for the chat while it runs (_reconfigured gives them back after): input() decodes by
    stdin's error handler, surrogateescape only under the C locale or UTF-8 mode and 'strict' under a UTF-8 locale
    (en_US.UTF-8), where a byte that is not UTF-8 was a UnicodeDecodeError traceback (run_chat sends such a byte as
    U+FFFD); a reply is shown in stdout's encoding, a character it lacks (PYTHONIOENCODING=ascii, a latin-1 locale, a
    Windows code page) a "?", where it was a UnicodeEncodeError traceback."""
    with _reconfigured(sys.stdin, errors="surrogateescape"), _reconfigured(sys.stdout, errors="replace"):
        yield


def _chat_status(failed: int, interactive: bool) -> int:
    """`chat`'s exit status: 1 where messages read from a pipe or a file failed (each error already on stderr, this
    line counting them), else 0."""
    if failed and not interactive:
        print(f"glimmer chat: {failed} message{'s' * (failed != 1)} failed (errors above)", file=sys.stderr)
        return 1
    return 0


def _chat_request_options(args: argparse.Namespace) -> dict[str, Any]:
    """The fields `chat` sends with every message, checked now as the server checks them (UsageError naming the
    option), so that a bad value is not found one refused message at a time."""
    from glimmer.engine.sampling_params import SamplingParams
    from glimmer.protocol import REASONING_EFFORTS, strength_for_effort
    from glimmer.server.schemas import INT32_MAX

    options: dict[str, Any] = {}
    if args.max_tokens is not None:
        if not 1 <= args.max_tokens <= INT32_MAX:
            raise UsageError(f"--max-tokens {args.max_tokens} is out of range; give at least 1 (at most {INT32_MAX})")
        options["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        try:
            SamplingParams(temperature=args.temperature)
        except RequestError as error:
            raise UsageError(f"--temperature {args.temperature}: {str(error).removeprefix('temperature: ')}") from None
        options["temperature"] = args.temperature
    if args.reasoning_effort is not None:
        try:
            strength_for_effort(args.reasoning_effort)
        except RequestError:
            raise UsageError(f"--reasoning-effort {args.reasoning_effort} is not supported; give one of "
                             f"{', '.join(REASONING_EFFORTS)}") from None
        options["reasoning_effort"] = args.reasoning_effort
    return options


def _check_chat_fits_context(context: Any, args: argparse.Namespace, request_options: dict[str, Any],
                             tools: list[dict[str, Any]] | None) -> None:
    """UsageError naming the flag, for a --max-tokens or --max-model-len (or a --system) with which the server in
    `context` would refuse every message of the in-process chat for the context length. It asks what the server
    asks of a turn, of the shortest turn there can be: an empty message after the --system prompt, with the --tools
    and the request options. Every real turn's prompt adds to that one, so its refusal holds for all of them."""
    from glimmer.protocol.chat_template import ChatTemplateError
    from glimmer.server.chat_prompt import build_chat_prompt
    from glimmer.server.sampling import chat_sampling_params
    from glimmer.server.schemas import ChatCompletionRequest

    system = [{"role": "system", "content": args.system}] if args.system else []
    request = ChatCompletionRequest(messages=[*system, {"role": "user", "content": ""}], tools=tools,
                                    **request_options)
    engine = context.engine.engine
    prompt_len = 0
    try:
        prompt_len = len(build_chat_prompt(request, context).token_ids)
        engine.generation_budget(prompt_len, chat_sampling_params(request, context))
    except ChatTemplateError:
        return  # a template may refuse an empty message and take typed ones: the first message will tell
    except RequestError as error:
        if error.param not in ("max_tokens", "messages"):
            return  # not the context length: as above
        given = " with the --system prompt" * bool(args.system) + " and the --tools" * bool(tools)
        # the engine's own fix ("lower max_tokens", "shorten the messages") is for an API client: the flags replace it
        refused = f"even an empty message (the chat template{given}) is refused: {str(error).partition(';')[0]}"
        larger_context = ", or a larger --max-model-len" if args.max_model_len is not None else ""
        if error.param == "max_tokens":
            raise UsageError(f"--max-tokens {args.max_tokens} would make every message fail: {refused}; give "
                             f"--max-tokens {engine.max_model_len - prompt_len} or less{larger_context}") from None
        fixes = [fix for fix, applies in (("a larger --max-model-len", args.max_model_len is not None),
                                          ("a shorter --system", bool(args.system)), ("fewer --tools", bool(tools)))
                 if applies]
        context_given = (f"--max-model-len {args.max_model_len}" if args.max_model_len is not None
                         else f"the model's context (max_model_len={engine.max_model_len})")
        raise UsageError(f"{context_given} would make every message fail: {refused}; give "
                         f"{' or '.join(fixes) or 'a model whose context holds its chat template'}") from None


def _read_tools(path: str) -> list[dict[str, Any]]:
    """The tool declarations of a JSON file; UsageError naming the file when it cannot be used."""
    from glimmer.protocol import normalize_tools

    # `--tools "$TOOLS"` with TOOLS unset: not a chat without tools
    _refuse_empty_argument(path, "--tools", "give the JSON file of tool declarations, or leave --tools out")
    try:
        # bytes, as run-batch reads its file: json.loads takes them with a UTF-8 BOM (a Windows editor's), where the
        # text read refused it ("Unexpected UTF-8 BOM")
        tools = json.loads(Path(path).read_bytes())
    except OSError as error:
        raise UsageError(f"--tools {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise UsageError(f"--tools {path}: not valid JSON ({error})") from None
    try:
        normalize_tools(tools)
    except GlimmerError as error:
        raise UsageError(f"--tools {path}: {error}") from None
    return tools


_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
"""A Hub model id (owner/name): where a key is expected, `--api-key KEY owner/name` took the MODEL as a second key."""


def _check_serve_options(args: argparse.Namespace) -> None:
    """UsageError naming the option, for serve options that would be accepted but never work: a media directory
    that does not exist (no file under it could ever be read), an origin no browser sends (CORS never matches);
    and for a MODEL that an option of several values took as one more."""
    _refuse_a_model_taken_by_a_list_option(args, "serve")
    _check_media_options(args)
    # ServerSettings would name its field (`max_request_bytes=0 is too small`), not the flag typed
    if args.max_request_bytes is not None and args.max_request_bytes < 1024:
        raise UsageError(f"--max-request-bytes {args.max_request_bytes} is too small; give at least 1024, or leave "
                         "it out for the default")
    if args.h11_max_header_count < 1:  # ServerSettings would name its field
        raise UsageError(f"--h11-max-header-count {args.h11_max_header_count} would refuse every request; give at "
                         f"least 1, or leave it out for {_H11_MAX_HEADER_COUNT}")
    if args.h11_max_incomplete_event_size is not None and args.h11_max_incomplete_event_size < 1:
        raise UsageError(f"--h11-max-incomplete-event-size {args.h11_max_incomplete_event_size} would refuse every "
                         "request; give a size such as 64KiB, or leave it out for h11's 16 KiB")
    if not 0 < args.request_read_timeout < math.inf:  # (nan too)
        raise UsageError(f"--request-read-timeout {args.request_read_timeout:g} is not a time; give a number of "
                         f"seconds above 0, or leave it out for {DEFAULT_REQUEST_READ_TIMEOUT_S:g}")
    limits = args.limit_mm_per_prompt or {}
    for kind, dest, default in (("image", "max_images_per_request", 16), ("video", "max_videos_per_request", 2)):
        flag = f"--{dest.replace('_', '-')}"
        if kind in limits and getattr(args, dest) not in (None, limits[kind]):
            raise UsageError(f"--limit-mm-per-prompt gives {limits[kind]} {kind}s and {flag} {getattr(args, dest)}; "
                             "give one of them")
        setattr(args, dest, limits.get(kind, default if getattr(args, dest) is None else getattr(args, dest)))
    for dest in ("max_images_per_request", "max_videos_per_request"):
        if getattr(args, dest) < 0:
            raise UsageError(f"--{dest.replace('_', '-')} {getattr(args, dest)} is invalid; give 0 or more")
    if (args.ssl_keyfile is None) != (args.ssl_certfile is None):
        raise UsageError(f"{'--ssl-certfile' if args.ssl_certfile is None else '--ssl-keyfile'} is missing: HTTPS "
                         "takes the key and its certificate, --ssl-keyfile KEY.pem --ssl-certfile CERT.pem")
    if args.ssl_keyfile is not None:  # before the model loads, as uvicorn reads them only when it starts
        import ssl

        class Encrypted(Exception):
            pass

        def pass_phrase() -> str:  # OpenSSL would ask on the terminal, here and again in uvicorn, or fail unclearly
            raise Encrypted

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(args.ssl_certfile, args.ssl_keyfile,
                                                                                password=pass_phrase)
        except Encrypted:
            raise UsageError(f"--ssl-keyfile {args.ssl_keyfile}: the key is encrypted (it has a pass phrase), which "
                             "the server cannot ask for; give it unencrypted: openssl pkey -in ENCRYPTED.pem -out "
                             "KEY.pem") from None
        except (OSError, ssl.SSLError) as error:
            raise UsageError(f"--ssl-keyfile {args.ssl_keyfile} --ssl-certfile {args.ssl_certfile}: {error}; give a "
                             "PEM private key and the PEM certificate (chain) it belongs to") from None
    _check_client_certificate_options(args)
    if args.root_path and not args.root_path.startswith("/"):
        raise UsageError(f"--root-path {args.root_path}: give a path starting with /, such as /glimmer")
    if not args.host.strip():  # `--host "$HOST"` with HOST unset: the socket would listen on every interface
        raise UsageError("--host is empty; give the address to listen on: 127.0.0.1 (this machine only, the "
                         "default), or 0.0.0.0 for every interface")
    if args.api_key is not None and not all(key.strip() for key in args.api_key):  # `--api-key "$KEY"`, KEY unset
        raise UsageError("--api-key is empty; give the key clients must send, or leave it out to serve without one")
    from_environment = _api_key_from_environment()
    if args.api_key is None and from_environment is not None and not from_environment[1].strip():
        raise UsageError(f"${from_environment[0]} is blank (whitespace only); set it to the key clients must send, or "
                         "unset it to serve without one")
    keys = tuple(key.strip() for key in api_keys(_serve_api_key(args)))
    source = "--api-key" if args.api_key is not None or from_environment is None else f"${from_environment[0]}"
    if not all(sendable_in_a_header(key) for key in keys):
        raise UsageError(f"{source} {UNSENDABLE_KEY}")
    if (ascii_only := ascii_only_clients_warning(keys)) is not None:
        logger.warning("%s: %s", source, ascii_only)
    if args.metrics_require_api_key and not _serve_api_key(args):
        raise UsageError("--metrics-require-api-key needs a key to require; give --api-key (or GLIMMER_API_KEY)")
    _check_served_model_names(args)
    for origin in args.allowed_origins:
        if not _is_origin(origin):
            raise UsageError(f"--allowed-origins {origin}: not a web origin; give scheme://host[:port] with no "
                             "path (e.g. https://app.example.com), or * for any origin")


def _template_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """ServerSettings' default_reasoning_strength and default_chat_template_kwargs: --default-reasoning-strength, and
    vLLM's --default-chat-template-kwargs, whose reasoning variables (enable_thinking, reasoning_effort,
    reasoning_strength) give the default strength, which a request's own reasoning fields replace as its
    chat_template_kwargs replace the other defaults. UsageError naming the flag for a value a request could not
    send either, or two default strengths."""
    from glimmer.engine.chat_rendering import RENDERING_ARGUMENT_NAMES, STRENGTH_KWARGS
    from glimmer.protocol.reasoning_strength import resolve_reasoning_strength

    kwargs = args.default_chat_template_kwargs or {}
    rendering = [name for name in RENDERING_ARGUMENT_NAMES if name in kwargs]
    if rendering:
        raise UsageError(f"--default-chat-template-kwargs: {rendering[0]!r} is no template variable but a field of "
                         "the chat request; leave it out (requests send it beside messages)")
    try:
        strength = resolve_reasoning_strength(chat_template_kwargs=kwargs)
    except RequestError as error:
        raise UsageError(f"--default-chat-template-kwargs: {error}") from None
    if strength is not None and args.default_reasoning_strength not in (None, strength):
        raise UsageError(f"--default-chat-template-kwargs asks for reasoning strength {strength!r} and "
                         f"--default-reasoning-strength {args.default_reasoning_strength}; give one of them")
    return {"default_reasoning_strength": args.default_reasoning_strength or strength,
            "default_chat_template_kwargs": {name: value for name, value in kwargs.items()
                                             if name not in STRENGTH_KWARGS}}


def _check_client_certificate_options(args: argparse.Namespace) -> None:
    """UsageError naming vLLM's --ssl-ca-certs or --ssl-cert-reqs where the server could not use them: without
    HTTPS, a CA file that holds no certificate, or client certificates asked for with no CA to verify them by."""
    import ssl

    if args.ssl_cert_reqs not in (ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED):
        raise UsageError(f"--ssl-cert-reqs {args.ssl_cert_reqs} is invalid; give 0 (no client certificate, the "
                         "default), 1 (optional) or 2 (required), as Python's ssl.CERT_* values")
    if args.ssl_keyfile is None and (args.ssl_ca_certs is not None or args.ssl_cert_reqs != ssl.CERT_NONE):
        given = "--ssl-ca-certs" if args.ssl_ca_certs is not None else f"--ssl-cert-reqs {args.ssl_cert_reqs}"
        raise UsageError(f"{given}: client certificates are checked over HTTPS only; add --ssl-keyfile KEY.pem "
                         "--ssl-certfile CERT.pem")
    if args.ssl_cert_reqs != ssl.CERT_NONE and args.ssl_ca_certs is None:
        raise UsageError(f"--ssl-cert-reqs {args.ssl_cert_reqs} asks clients for a certificate, which needs the CA "
                         "certificates to verify it by: add --ssl-ca-certs CA.pem")
    if args.ssl_ca_certs is not None:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_verify_locations(cafile=args.ssl_ca_certs)
        except (OSError, ssl.SSLError) as error:
            raise UsageError(f"--ssl-ca-certs {args.ssl_ca_certs}: {error}; give a PEM file of CA certificates") \
                from None
        if args.ssl_cert_reqs == ssl.CERT_NONE:  # uvicorn (and vLLM) load the CA, and ask no client to be verified
            print(f"glimmer: warning: --ssl-ca-certs {args.ssl_ca_certs} with --ssl-cert-reqs 0 (the default) asks "
                  "no client for a certificate, so the CA verifies nothing; add --ssl-cert-reqs 2 to require client "
                  "certificates (1: check those sent), or leave --ssl-ca-certs out", file=sys.stderr)


def _refuse_a_model_taken_by_a_list_option(args: argparse.Namespace, command: str) -> None:
    """UsageError for a MODEL that an option of several values took as one more of its values (`glimmer serve
    --served-model-name muse ./model` would serve the default model as "muse")."""
    if args.model is not None:
        return
    for dest in ("served_model_name", "allowed_media_domains", "allowed_origins", "allowed_methods",
                 "allowed_headers", "api_key"):
        values = getattr(args, dest, None) or []  # absent when not given (vLLM CORS options) or not this command's
        # a key that is a Hub id or the embedded model's name (`--api-key KEY glimmer-nano`) would let anyone in who
        # knows the model's name; as a served name or a host, a model's name is harmless and may be meant
        model_like = values and values[-1] and (Path(values[-1]).expanduser().exists()  # Path("") is the cwd
                                                or dest == "api_key" and (_HUB_ID.fullmatch(values[-1]) is not None
                                                                          or values[-1] in EMBEDDED_MODEL_NAMES))
        if model_like:
            flag = f"--{dest.replace('_', '-')}"
            raise UsageError(f"{flag} took the model {values[-1]} as one of its values, so no MODEL is given and "
                             f"the default model would be served; put MODEL first: glimmer {command} {values[-1]} "
                             f"{flag} ...")


def _check_served_model_names(args: argparse.Namespace) -> None:
    names = args.served_model_name or []
    if not all(names):
        raise UsageError("--served-model-name: a name is empty; give non-empty names, or leave it out for the model's")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UsageError(f"--served-model-name: {', '.join(map(repr, repeated))} given more than once (/v1/models "
                         "would list it twice); give each name once")


def _check_media_options(args: argparse.Namespace) -> None:
    for directory in args.allowed_local_media_path:
        try:
            MediaFetchPolicy.create([directory])  # refuses a blank one, which Path reads as the working directory
        except ConfigError:  # worded for the policy's field, not the option
            raise UsageError(f"--allowed-local-media-path {directory!r} {BLANK_MEDIA_DIRECTORY}") from None
        if not Path(directory).expanduser().is_dir():
            raise UsageError(f"--allowed-local-media-path {directory}: no such directory; give an existing "
                             "directory whose images and videos requests may name")
    for name in args.allowed_media_domains:
        try:
            host_name(name)
        except ConfigError:  # worded for the policy's field, not the option
            raise UsageError(f"--allowed-media-domains {name or repr(name)} {NOT_A_HOST_NAME}") from None
    timeout = args.media_fetch_timeout
    if timeout is not None and not 0 < timeout < math.inf:  # (nan too)
        raise UsageError(f"--media-fetch-timeout {timeout:g} is not a time; give a number of seconds above 0, or "
                         f"leave it out for {MediaFetchPolicy.timeout_s:g}")
    if args.max_media_bytes is not None and args.max_media_bytes < 1:
        raise UsageError(f"--max-media-bytes {args.max_media_bytes} is too small; give a size of at least 1 byte, or "
                         f"leave it out for {MediaFetchPolicy.max_bytes >> 20} MiB")


def _media_policy(args: argparse.Namespace) -> MediaFetchPolicy:
    """The media policy of serve's and run-batch's media options."""
    limits = {name: value for name, value in (("timeout_s", args.media_fetch_timeout),
                                              ("max_bytes", args.max_media_bytes)) if value is not None}
    return MediaFetchPolicy.create(args.allowed_local_media_path, allow_remote=args.allow_remote_media,
                                   allowed_domains=args.allowed_media_domains, **limits)


def _add_media_size_and_time_limits(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-media-bytes", type=parse_size, default=None, metavar="SIZE",
                        help="the largest image or video file a request may send (in a data: URL), name (a local "
                             "file) or have fetched (http(s)), such as 16MiB; a larger one gets HTTP 400 (default "
                             f"{MediaFetchPolicy.max_bytes >> 20} MiB)")
    parser.add_argument("--media-fetch-timeout", type=float, default=None, metavar="SECONDS",
                        help="the longest one http(s) image or video download may take, name resolution, redirects "
                             "and a slow server included; a slower one gets HTTP 400 (default "
                             f"{MediaFetchPolicy.timeout_s:g})")


def _is_origin(text: str) -> bool:
    """Whether browsers could send `text` as an Origin header (scheme://host[:port], no path), or it is `*`."""
    if text == "*":
        return True
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
    except ValueError:
        return False
    return bool(parts.scheme and parts.hostname) and not (parts.path or parts.query or parts.fragment
                                                          or parts.username or parts.password)


def _serve_api_key(args: argparse.Namespace) -> str | tuple[str, ...] | None:
    """The keys `glimmer serve` takes (any one of them): --api-key's, else $GLIMMER_API_KEY, else vLLM's $VLLM_API_KEY
    (a vLLM deployment's key must not leave the server open), else none. An empty --api-key stays empty, to be
    refused."""
    if args.api_key is not None:
        return tuple(args.api_key)
    from_environment = _api_key_from_environment()
    return from_environment[1] if from_environment is not None else None


def _api_key_from_environment() -> tuple[str, str] | None:
    """The variable `glimmer serve` reads its key from when --api-key is not given, and its value: $GLIMMER_API_KEY,
    else vLLM's $VLLM_API_KEY, the first set and not empty; None when neither is."""
    return next(((name, os.environ[name]) for name in ("GLIMMER_API_KEY", "VLLM_API_KEY") if os.environ.get(name)),
                None)


def _generation_config(text: str) -> str:
    """--generation-config's value: vLLM's auto or vllm (vLLM's third form, a folder to read the file from, is
    refused)."""
    from glimmer.checkpoint.generation_config import FOLDER_MODE_REFUSED, check_generation_config_mode

    try:
        check_generation_config_mode(text)
    except ConfigError:  # worded for the option, not the config field
        raise argparse.ArgumentTypeError(f"{text!r}: give auto or vllm ({FOLDER_MODE_REFUSED})") from None
    return text


def _json_object(text: str) -> dict[str, Any]:
    """The value of vLLM's options that take a JSON object (--hf-overrides, --compilation-config, ...)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object such as '{{}}'")
    return value


def _compilation_config(text: str) -> dict[str, Any]:
    """--compilation-config's value: a JSON object, or vLLM's shorthand for a level alone (`--compilation-config 3`)
    as the object that says it ({"level": 3}), which its dotted keys and LLM(compilation_config=...)'s rule read."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if type(value) is int:
        return {"level": value}
    if isinstance(value, dict):
        return value
    raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object such as '{{\"level\": 3}}', nor a level "
                                     "(a whole number, as in --compilation-config 3)")


# `vllm serve` options for the engine arguments Glimmer's has no field for (VLLM_ONLY_LLM_ARGUMENTS: `LLM(...)` takes
# the same ones by the same rule), with how argparse reads each
_VLLM_SERVE_OPTIONS: dict[str, dict[str, Any]] = {
    "--tensor-parallel-size": {"type": int, "metavar": "N"},
    "--pipeline-parallel-size": {"type": int, "metavar": "N"},
    "--data-parallel-size": {"type": int, "metavar": "N"},
    "--distributed-executor-backend": {"metavar": "NAME"},
    "--trust-remote-code": {"action": "store_true"},
    "--tokenizer": {"metavar": "NAME"},
    "--tokenizer-mode": {"metavar": "MODE"},
    "--quantization": {"metavar": "METHOD"},
    "--kv-cache-dtype": {"metavar": "DTYPE"},
    "--swap-space": {"type": float, "metavar": "GIB"},
    "--enable-chunked-prefill": {"action": argparse.BooleanOptionalAction},
    "--disable-log-stats": {"action": "store_true"},
    "--max-seq-len-to-capture": {"type": int, "metavar": "N"},
    "--max-logprobs": {"type": int, "metavar": "N"},
    "--num-gpu-blocks-override": {"type": int, "metavar": "N"},
    "--download-dir": {"metavar": "DIR"},
    "--task": {"metavar": "TASK"},
    "--cpu-offload-gb": {"type": float, "metavar": "GIB"},
    "--disable-custom-all-reduce": {"action": argparse.BooleanOptionalAction},
    "--hf-overrides": {"type": _json_object, "metavar": "JSON"},
    "--revision": {"metavar": "REVISION"},
    "--tokenizer-revision": {"metavar": "REVISION"},
    "--code-revision": {"metavar": "REVISION"},
    "--hf-token": {"nargs": "?", "const": True, "metavar": "TOKEN"},
    "--logprobs-mode": {"metavar": "MODE"},
    "--enable-lora": {"action": argparse.BooleanOptionalAction},
    "--max-lora-rank": {"type": int, "metavar": "N"},
    "--max-loras": {"type": int, "metavar": "N"},
    "--max-cpu-loras": {"type": int, "metavar": "N"},
    "--fully-sharded-loras": {"action": argparse.BooleanOptionalAction},
    "--lora-dtype": {"metavar": "DTYPE"},
    "--enable-sleep-mode": {"action": argparse.BooleanOptionalAction},
    "--skip-tokenizer-init": {"action": argparse.BooleanOptionalAction},
    "--enable-expert-parallel": {"action": argparse.BooleanOptionalAction},
    "--compilation-config": {"type": _compilation_config, "metavar": "JSON|LEVEL"},
    "--mm-processor-kwargs": {"type": _json_object, "metavar": "JSON"},
    "--override-generation-config": {"type": _json_object, "metavar": "JSON"},
    "--scheduling-policy": {"metavar": "POLICY"},
    "--disable-async-output-proc": {"action": argparse.BooleanOptionalAction},
    "--max-parallel-loading-workers": {"type": int, "metavar": "N"},
    "--model-impl": {"metavar": "IMPL"},
    "--config-format": {"metavar": "FORMAT"},
    "--runner": {"metavar": "RUNNER"},
    "--convert": {"metavar": "TYPE"},
    "--pooler-config": {"type": _json_object, "metavar": "JSON"},
    "--override-pooler-config": {"type": _json_object, "metavar": "JSON"},
    "--optimization-level": {"type": int, "metavar": "LEVEL"},
    "--cuda-graph-sizes": {"type": int, "nargs": "+", "metavar": "N"},
    "--max-cudagraph-capture-size": {"type": int, "metavar": "N"},
    "--max-num-partial-prefills": {"type": int, "metavar": "N"},
    "--max-long-partial-prefills": {"type": int, "metavar": "N"},
    "--long-prefill-token-threshold": {"type": int, "metavar": "N"},
    "--attention-backend": {"metavar": "NAME"},
    "--disable-sliding-window": {"action": argparse.BooleanOptionalAction},
    "--disable-cascade-attn": {"action": argparse.BooleanOptionalAction},
    "--enable-prompt-embeds": {"action": argparse.BooleanOptionalAction},
    "--logits-processors": {"nargs": "+", "action": "extend", "metavar": "NAME"},
    "--use-tqdm-on-load": {"action": argparse.BooleanOptionalAction},
    "--prefix-caching-hash-algo": {"metavar": "ALGO"},
    "--calculate-kv-scales": {"action": argparse.BooleanOptionalAction},
    "--enable-eplb": {"action": argparse.BooleanOptionalAction},
    "--kv-transfer-config": {"type": _json_object, "metavar": "JSON"},
    "--ignore-patterns": {"nargs": "+", "action": "extend", "metavar": "PATTERN"},
    "--tokenizer-pool-size": {"type": int, "metavar": "N"},
}
# vLLM's short spellings: -O3 is --optimization-level 3, -tp 1 --tensor-parallel-size 1, ...
_VLLM_SHORT_OPTIONS = {"--optimization-level": "-O", "--tensor-parallel-size": "-tp", "--pipeline-parallel-size": "-pp",
                       "--data-parallel-size": "-dp", "--quantization": "-q", "--api-server-count": "-asc"}


_VLLM_SERVING_OPTIONS: dict[str, dict[str, Any]] = {
    "--enable-auto-tool-choice": {"action": "store_true"},
    "--tool-call-parser": {"metavar": "NAME"},
    "--reasoning-parser": {"metavar": "NAME"},
    "--disable-log-requests": {"action": "store_true"},
    "--max-log-len": {"type": int, "metavar": "N"},
    "--disable-fastapi-docs": {"action": "store_true"},
    "--enable-prompt-tokens-details": {"action": "store_true"},
    "--enable-log-requests": {"action": "store_true"},
    "--response-role": {"metavar": "ROLE"},
    "--allowed-methods": {"nargs": "+", "action": _ExtendTakingVllmsJsonList, "metavar": "METHOD"},
    "--allowed-headers": {"nargs": "+", "action": _ExtendTakingVllmsJsonList, "metavar": "HEADER"},
    "--allow-credentials": {"action": "store_true"},
    "--return-tokens-as-token-ids": {"action": "store_true"},
    "--chat-template-content-format": {"metavar": "FORMAT"},
    "--guided-decoding-backend": {"metavar": "BACKEND"},
    "--structured-outputs-config": {"type": _json_object, "metavar": "JSON"},
    "--enable-force-include-usage": {"action": "store_true"},
    "--disable-frontend-multiprocessing": {"action": "store_true"},
    "--tool-parser-plugin": {"metavar": "FILE"},
    "--api-server-count": {"type": int, "metavar": "N"},
    "--headless": {"action": "store_true"},
    "--enable-log-outputs": {"action": "store_true"},
    "--log-config-file": {"metavar": "FILE"},
    "--enable-tokenizer-info-endpoint": {"action": "store_true"},
    "--enable-server-load-tracking": {"action": "store_true"},
    "--enable-ssl-refresh": {"action": "store_true"},
    "--lora-modules": {"nargs": "+", "action": "extend", "metavar": "NAME=PATH"},
    "--exclude-tools-when-tool-choice-none": {"action": "store_true"},
}
"""`vllm serve`'s serving options (VLLM_SERVING_ARGUMENTS), with how argparse reads each."""


_VLLM_RUN_BATCH_OPTIONS: dict[str, dict[str, Any]] = {
    **{flag: _VLLM_SERVING_OPTIONS[flag] for flag in (
        "--reasoning-parser", "--disable-log-requests", "--max-log-len", "--enable-prompt-tokens-details",
        "--enable-log-requests", "--response-role")},
    "--output-tmp-dir": {"metavar": "DIR"},
    "--enable-force-include-usage": {"action": "store_true"},
    "--enable-metrics": {"action": "store_true"},
    "--url": {"metavar": "HOST"},
    "--port": {"type": int, "metavar": "PORT"},
}
"""`vllm run-batch`'s options beside its engine arguments (VLLM_RUN_BATCH_ARGUMENTS), with how argparse reads each."""


def _dtype(text: str) -> str | None:
    """--dtype's value: float32, bfloat16 or float16, or None for the default, taking vLLM's names too (auto,
    half, float)."""
    names = {"auto": None, "half": "float16", "float": "float32", "float16": "float16", "bfloat16": "bfloat16",
             "float32": "float32"}
    if text not in names:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from float32, bfloat16, float16, or "
                                         "vLLM's auto, half, float)")
    return names[text]


def _media_counts(args: argparse.Namespace) -> dict[str, int]:
    """The ServerSettings media counts run-batch's --limit-mm-per-prompt gives (those it names)."""
    limits = args.limit_mm_per_prompt or {}
    return {f"max_{kind}s_per_request": limits[kind] for kind in ("image", "video") if kind in limits}


_MEDIA_LIMIT_SIZES = {"image": ("width", "height"), "video": ("num_frames", "width", "height")}
"""The keys beside `count` of newer vLLM's `--limit-mm-per-prompt '{"image": {"count": 4, ...}}'`: the sizes of the
dummy media vLLM profiles its memory with, which change nothing here (Glimmer profiles no dummy media)."""


class _MediaLimitCounts(dict[str, int]):
    """--limit-mm-per-prompt's counts by kind, which the limits take, and `given`, the option's value as the command
    line gave it (its dotted keys joined), which a note repeats: the counts alone drop vLLM's profiling sizes."""

    def __init__(self, given: str):
        super().__init__()
        self.given = given


def _limit_mm_per_prompt(text: str) -> _MediaLimitCounts:
    """vLLM's --limit-mm-per-prompt: a JSON object (or `image=N,video=M`) of the most images and videos a request
    may hold, each a count or, as newer vLLM takes it, an object of its `count` and profiling sizes (taken, changing
    nothing; without a count the kind keeps its default). Returns the counts given, by kind."""
    wrong = argparse.ArgumentTypeError(f"{text!r} is not a JSON object like '{{\"image\": 4, \"video\": 1}}'")
    try:
        limits = json.loads(text) if text.lstrip().startswith("{") else {
            key.strip(): int(value) for key, value in (item.split("=", 1) for item in text.split(",") if item.strip())}
    except (ValueError, TypeError):
        raise wrong from None
    if not isinstance(limits, dict) or not limits:
        raise wrong
    counts = _MediaLimitCounts(text)
    for key, value in limits.items():
        if key not in _MEDIA_LIMIT_SIZES:
            raise argparse.ArgumentTypeError(f"{key!r}: this model takes images and videos only")
        if isinstance(value, dict):
            value = _media_limit_count(key, value)
            if value is None:
                continue
        elif not _is_count(value):
            raise argparse.ArgumentTypeError(f"{key}: {value!r} is not a count (a whole number, 0 or more)")
        counts[key] = value
    return counts


def _media_limit_count(kind: str, options: dict[str, Any]) -> int | None:
    """The `count` of one kind's options in newer vLLM's form (None where it names none), its other keys checked as
    vLLM checks them: whole numbers above 0, or null. Raises ArgumentTypeError naming the key."""
    for key, value in options.items():
        if key == "count":
            if not _is_count(value):
                raise argparse.ArgumentTypeError(f"{kind}.count: {value!r} is not a count (a whole number, 0 or more)")
        elif key not in _MEDIA_LIMIT_SIZES[kind]:
            raise argparse.ArgumentTypeError(f"{kind}.{key}: unknown key; {kind} takes count, "
                                             f"{', '.join(_MEDIA_LIMIT_SIZES[kind])}")
        elif value is not None and not (_is_count(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{kind}.{key}: {value!r} is not a size (a whole number above 0)")
    return options.get("count")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_SECRET_VLLM_OPTIONS = {"--hf-token"}
"""vLLM's options whose value is never repeated in a note or an error (its metavar is shown instead)."""


def _shown_value(value: Any) -> str:
    """An option's value as the command line gave it: a list's items apart, a JSON object as JSON."""
    if isinstance(value, list):
        return " ".join(map(str, value))
    return json.dumps(value) if isinstance(value, dict) else str(value)


def _check_vllm_options(args: argparse.Namespace, options: Mapping[str, Any], arguments: Mapping[str, Any]
                        ) -> list[str]:
    """UsageError naming the first of vLLM's `options` given with a value that would change something here (by its
    rule in `arguments`, a table of vllm_arguments); otherwise a line for each given one, saying what Glimmer does in
    its place (`--response-role assistant` too, though it takes no other value)."""
    notes = []
    model = args.model if args.model is not None else DEFAULT_MODEL_NAME  # `--tokenizer glimmer-nano` names it
    for flag in options:
        dest = flag[2:].replace("-", "_")
        if not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        argument = arguments[dest]
        if isinstance(value, bool):
            shown = flag if value else f"--no-{flag[2:]}"
        elif flag in _SECRET_VLLM_OPTIONS:  # the error line and the notes go to logs
            shown = f"{flag} {options[flag]['metavar']}"
        else:
            shown = f"{flag} {_shown_value(value)}"
        if not argument.changes_nothing(value, {"model": model}):
            raise UsageError(f"{shown}: {argument.instead}")
        notes.append(f"vLLM's {shown} changes nothing here: {argument.instead}")
    return notes


def _note_vllm_engine_options(args: argparse.Namespace) -> None:
    """UsageError naming the first of vLLM's engine options given with a value that would change something here;
    otherwise a line on stderr for each given one (stdout may be run-batch's output, or the chat)."""
    from glimmer.engine.vllm_arguments import VLLM_ONLY_LLM_ARGUMENTS

    for note in _check_vllm_options(args, _VLLM_SERVE_OPTIONS, VLLM_ONLY_LLM_ARGUMENTS):
        print(note, file=sys.stderr)


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None,
                        help="checkpoint directory, .gguf file or Hugging Face Hub id (default: the embedded "
                             "glimmer-nano demo)")
    _add_format_options(parser)
    parser.add_argument("--dtype", type=_dtype, default=None, metavar="{float32,bfloat16,float16}",
                        help="default bfloat16 on CUDA, float32 on CPU (vLLM's auto, half and float are taken too)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--max-model-len", type=token_count, default=None,
                        help="context length, e.g. 32768, 32k (32,000) or 32K (32,768) (default: the model's)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="most sequences in one batch (default 256 on CUDA, 64 on the CPU, or "
                             "--max-num-batched-tokens where that is less)")
    parser.add_argument("--max-num-batched-tokens", type=token_count, default=None,
                        help="token budget of one step, each decoding sequence taking one (at least "
                             "--max-num-seqs where both are given); longer prompts are prefilled in chunks (default "
                             "8192 on CUDA, 2048 on the CPU, or --max-num-seqs where that is more)")
    parser.add_argument("--kv-cache-memory", "--kv-cache-memory-bytes", type=kv_cache_size, default=None,
                        metavar="SIZE", action=_StoreNamingTheFlag,
                        help="KV cache size, e.g. 8GiB, 512MiB or a number of bytes (vLLM's --kv-cache-memory-bytes "
                             "is the same option, taking its 8G, 8 GiB, and 8g, 8 GB) (default: on a GPU, what "
                             "--gpu-memory-utilization leaves after the weights; on the CPU, what --max-num-seqs "
                             "sequences of --max-model-len tokens need, 2 GiB at most)")
    parser.add_argument("--block-size", type=int, default=None, metavar="N",
                        help="tokens a KV cache block holds, a power of two (default 16, as vLLM's on CUDA)")
    parser.add_argument("--max-image-pixels", type=int, default=MediaLimits.max_image_pixels,
                        help="larger images or video frames are refused (HTTP 400; default %(default)s)")
    parser.add_argument("--max-image-side", type=int, default=MediaLimits.max_image_side,
                        help="images or video frames with a longer side are refused (HTTP 400; default "
                             "%(default)s)")
    parser.add_argument("--max-image-aspect-ratio", type=int, default=MediaLimits.max_image_aspect_ratio,
                        help="images or video frames more elongated than this many to one are refused (HTTP 400; "
                             "default %(default)s)")
    parser.add_argument("--max-video-frame-pixels", type=int, default=MediaLimits.max_video_frame_pixels,
                        help="videos with larger frames are refused (HTTP 400; default %(default)s)")
    parser.add_argument("--max-video-frames", type=int, default=MediaLimits.max_video_source_frames,
                        help="videos with more source frames, or more packets that hold no frame (empty, or cut by "
                             "an edit list), or more than 64 times as many packets of other streams (audio, "
                             "subtitles), are refused (HTTP 400; default %(default)s)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="fraction of the GPU's memory Glimmer may use, KV cache included (default 0.9)")
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="render prompts with this Jinja chat template file instead of the checkpoint's own "
                             "(default: the checkpoint's template)")
    parser.add_argument("--max-waiting-requests", type=int, default=1024,
                        help="queue length beyond which requests get HTTP 429 (default 1024)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the engine's sampling for requests without their own seed (default 0)")
    parser.add_argument("--speculative-config", default=None, metavar="JSON",
                        help='speculative decoding, as vLLM: \'{"method": "dflash", "model": DRAFTER_DIR, '
                             '"num_speculative_tokens": 15}\' (keys: method, model, num_speculative_tokens, '
                             'draft_policy adaptive|always, disable_by_batch_size)')
    parser.add_argument("--generation-config", type=_generation_config, default="auto", metavar="{auto,vllm}",
                        help="auto: the sampling fields a request leaves out take the checkpoint's "
                             "generation_config.json values (max_new_tokens as a chat request's max_tokens, and as "
                             "a completion's max_tokens null); vllm: OpenAI's defaults, as vLLM's flag (default auto)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="on CUDA, run every step eagerly instead of replaying captured decode graphs")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                        help="launch each plain decode step before the previous one's tokens are read, and make "
                             "each step's text (detokenizing, stop strings) while the device runs the next step "
                             "(default: on with CUDA, off on the CPU)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="reuse the KV blocks of prompt prefixes computed before, as vLLM's flag does (default: "
                             "on; --no-enable-prefix-caching computes every prompt in full)")
    parser.add_argument("--load-format", choices=["auto", "dummy", "safetensors", "pt", "gguf"], default="auto",
                        help="dummy: random weights drawn on the device from config.json alone (for benchmarks); "
                             "vLLM's safetensors, pt and gguf read a checkpoint of that format as auto does")
    vllm = parser.add_argument_group(
        "vLLM's options", "taken where their value changes nothing here, so a vLLM command line runs as written; "
        "any other value is refused saying what to do instead")
    vllm.add_argument("--model", dest="model_option", default=None, metavar="MODEL",
                      help="vLLM's older form of MODEL (vllm serve --model NAME), taken as MODEL")
    vllm.add_argument("--config", default=None, metavar="FILE",
                      help="a YAML file of options, as vLLM's: one 'long-option-name: value' a line (model: MODEL "
                           "too); the command line's own options win")
    for flag, options in _VLLM_SERVE_OPTIONS.items():
        short = (_VLLM_SHORT_OPTIONS[flag],) if flag in _VLLM_SHORT_OPTIONS else ()
        vllm.add_argument(flag, *short, default=argparse.SUPPRESS, help="vLLM's", **options)


def _add_format_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mmproj", default=None, metavar="FILE",
                        help="with a GGUF model: its vision projector GGUF, for images (videos need the safetensors "
                             "checkpoint's vision tower)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="read *.bin / *.pt weights (only through torch.load(weights_only=True)); off by default "
                             "because unpickling can run code")


_H11_MAX_HEADER_COUNT = 256  # vLLM's default

_DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9}
_BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30}


def token_count(text: str) -> int:
    """A number of tokens written as vLLM's command line takes it: '32768', '32k' (32,000), '1.5k' (1,500),
    '32K' (32,768) or '1M'. A binary suffix takes a whole number only; a result that is not whole is refused."""
    value = text.strip()
    if value.lower() in ("auto", "-1"):
        raise argparse.ArgumentTypeError(
            f"{text!r} (vLLM's context fitted to the KV cache) is not supported; leave the option out for the "
            "model's own context, or give a number of tokens")
    suffix = value[-1:] if value.isascii() else ""
    if suffix in _BINARY_SUFFIXES:
        if value[:-1].isdigit():
            return int(value[:-1]) * _BINARY_SUFFIXES[suffix]
        number, decimal = value[:-1], suffix.lower()
        raise argparse.ArgumentTypeError(
            f"invalid number of tokens {text!r}: a binary suffix ({suffix}, {_BINARY_SUFFIXES[suffix]:,}) takes a "
            f"whole number; did you mean {number}{decimal} ({number} × {_DECIMAL_SUFFIXES[decimal]:,})?")
    if suffix in _DECIMAL_SUFFIXES:
        try:
            tokens = Decimal(value[:-1]) * _DECIMAL_SUFFIXES[suffix]
        except InvalidOperation:
            tokens = None
        if tokens is not None and tokens.is_finite() and tokens == tokens.to_integral_value() and value[0].isdigit():
            return int(tokens)
    elif value.isascii() and value.lstrip("-").isdigit():
        return int(value)
    raise argparse.ArgumentTypeError(
        f"invalid number of tokens {text!r}; give an integer such as 32768, or one with a suffix: 32k (thousands), "
        "32K (1,024s), 1m / 1M")


def count(least: int, what: str = "a count", *, step: int = 1) -> Callable[[str], int]:
    """An argparse type for a count an option takes: a whole number, `least` or more, and a multiple of `step`;
    anything else is refused as not `what` ("'0' is not a count: give a whole number, 1 or more")."""
    give = f"a whole number, {least} or more" if step == 1 else f"a multiple of {step}, {least} or more"

    def whole_number(text: str) -> int:
        value = int(text) if text.strip().isascii() and text.strip().isdigit() else least - 1
        if value < least or value % step:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}: give {give}")
        return value
    return whole_number


positive_count = count(1)  # a batch size, a number of runs or of tokens


def number(what: str, *, least: float | None = None, above: float | None = None,
           hint: str = "") -> Callable[[str], float]:
    """An argparse type for a number an option takes: finite, `least` or more and above `above` where given;
    anything else (nan, inf, text) is refused as not `what`, `hint` after what to give ("'-1' is not a size in GiB:
    give a number above 0, such as 7.2")."""
    give = ("a number" + (f", {least:g} or more" if least is not None else "")
            + (f" above {above:g}" if above is not None else "") + hint)

    def finite(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (least is None or value >= least) and (above is None or value > above)):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}: give {give}")
        return value
    return finite


def positive_counts(text: str) -> list[int]:
    """Comma-separated counts, such as a bench's batch sizes '1,8': each a whole number, 1 or more."""
    try:
        return [positive_count(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of counts: give whole numbers, 1 or more, "
                                         "separated by commas, such as 1,8") from None


def parse_size(text: str) -> int:
    """Bytes from '8GiB', '512MB', '1.5gib' or a plain number of bytes."""
    from glimmer.engine.config_checks import parse_size as engine_parse_size  # (imports torch: not for --help)

    try:
        return engine_parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def kv_cache_size(text: str) -> int:
    """--kv-cache-memory's bytes: a size as parse_size reads it ('8GiB', '512MB'), or a number as vLLM reads its
    --kv-cache-memory-bytes, as it reads --max-model-len (token_count: '8G' is 8 GiB, '8g' 8 GB, '16k' 16,000)."""
    try:
        return parse_size(text)
    except argparse.ArgumentTypeError:
        if not re.fullmatch(rf"\s*[0-9]+(\.[0-9]+)?[{''.join([*_DECIMAL_SUFFIXES, *_BINARY_SUFFIXES])}]\s*", text):
            raise
        try:
            return token_count(text)
        except argparse.ArgumentTypeError:  # worded for tokens: '1.5G', a fraction with a binary suffix
            raise argparse.ArgumentTypeError(f"{text!r} is not a size: vLLM's binary suffixes (K, M, G) take a whole "
                                             "number; use e.g. 1536M, 1.5GiB or 1.5g (1.5 GB)") from None


def _add_log_level(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument("--log-level", default=default, type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                        help="logging level (default INFO; WARNING in an in-process chat, whose replies the logs "
                             "would interrupt)")


def build_parser() -> argparse.ArgumentParser:
    import glimmer

    parser = _ArgumentParser(prog="glimmer", description="Run Muse Glimmer models exactly and fast.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {glimmer.__version__}",
                        help="print Glimmer's version and exit")
    _add_log_level(parser, None)  # None: not given, the command's default
    # a command whose parser gives no sigterm_stop ends at once on SIGTERM, as a process does by default
    parser.set_defaults(sigterm_stop=None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to do")

    serve = sub.add_parser("serve", help="serve a model behind the OpenAI-compatible HTTP API")
    _add_engine_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000,
                       help="port to listen on (default 8000; 0: a free one, named in the line giving the API's URL)")
    serve.add_argument("--uds", default=None, metavar="PATH",
                       help="listen on a Unix domain socket at PATH instead of --host and --port (vLLM's)")
    serve.add_argument("--api-key", nargs="+", action="extend", default=None, metavar="KEY",
                       help=f"require `Authorization: Bearer KEY` on {', '.join(API_KEY_ROUTES[:-1])} and "
                            f"{API_KEY_ROUTES[-1]} (and /metrics with --metrics-require-api-key), any one of the keys "
                            "given (repeatable, as vLLM's; default: $GLIMMER_API_KEY, else vLLM's $VLLM_API_KEY, else "
                            "none)")
    serve.add_argument("--served-model-name", nargs="+", action="extend", default=None,
                       help="name(s) clients use as `model` (default: the directory name, or Hub id, and MODEL as "
                            "given)")
    serve.add_argument("--max-request-bytes", type=int, default=None,
                       help="larger request bodies get HTTP 413 (default 4 MiB, 32 MiB for a model with vision)")
    serve.add_argument("--request-read-timeout", type=float, default=DEFAULT_REQUEST_READ_TIMEOUT_S, metavar="SECONDS",
                       help="close a connection whose request's line and headers are not all in within SECONDS, or "
                            "whose body does not come at SECONDS per 64 KiB (HTTP 408); never limits an answer or a "
                            f"stream (default {DEFAULT_REQUEST_READ_TIMEOUT_S:g})")
    serve.add_argument("--allowed-local-media-path", action="append", default=[], metavar="DIR",
                       help="let requests name image/video files under DIR (repeatable; default: none)")
    serve.add_argument("--allow-remote-media", action="store_true",
                       help="let requests name http(s) image/video URLs on public addresses (fetched with size, time "
                            "and redirect limits; loopback, link-local and private addresses are refused)")
    serve.add_argument("--allowed-media-domains", nargs="+", action="extend", default=[], metavar="HOST",
                       help="let requests fetch http(s) media from these hosts, even on private addresses (an internal "
                            "image store); alone, it allows only these hosts")
    _add_media_size_and_time_limits(serve)
    serve.add_argument("--max-images-per-request", type=int, default=None,
                       help="more images in one request get HTTP 400 (default 16)")
    serve.add_argument("--max-videos-per-request", type=int, default=None,
                       help="more videos in one request get HTTP 400 (default 2)")
    serve.add_argument("--limit-mm-per-prompt", type=_limit_mm_per_prompt, default=None, metavar="JSON",
                       help='vLLM\'s form of the two limits above: \'{"image": 4, "video": 1}\' (or image=4,video=1), '
                            'or newer vLLM\'s \'{"image": {"count": 4, "width": 512, "height": 512}}\', whose '
                            'profiling sizes (width, height, num_frames) change nothing')
    serve.add_argument("--default-reasoning-strength", choices=["low", "medium", "high", "xhigh"], default=None,
                       help="when a request names none (default: the template's own, high)")
    serve.add_argument("--default-chat-template-kwargs", type=_json_object, default=None, metavar="JSON",
                       help="template variables every chat request gets, under its own chat_template_kwargs (whose "
                            "values win), as vLLM's: '{\"current_date\": \"2026-01-01\"}'; enable_thinking, "
                            "reasoning_effort or reasoning_strength set the default reasoning strength (as "
                            "--default-reasoning-strength)")
    serve.add_argument("--require-cache-salt", action="store_true",
                       help="refuse requests without a cache_salt (only requests with the same salt share "
                            "cached prompt blocks)")
    serve.add_argument("--allowed-origins", nargs="+", action=_ExtendTakingVllmsJsonList, default=[],
                       metavar="ORIGIN", help="web origins (e.g. https://app.example.com, or *) whose pages may call "
                       "the API from a browser (CORS; default: none); vLLM's one JSON list is taken too")
    serve.add_argument("--metrics-require-api-key", action="store_true",
                       help="require the API key on /metrics too (default: /metrics is open)")
    serve.add_argument("--allow-control-tokens-in-content", action="store_true",
                       help="trusted callers only: control-token text in messages and chat_template_kwargs "
                            "(<|start|>, <|eot|>, ...) becomes those tokens (default: it stays plain text)")
    serve.add_argument("--trust-request-chat-template", action="store_true",
                       help="trusted clients only: render a chat request's own Jinja chat_template (sandboxed, as "
                            "the checkpoint's, from files and Python internals but not from the server's CPU and "
                            "memory, which such a template may spend without bound; default: such a request gets "
                            "HTTP 400)")
    serve.add_argument("--enable-request-id-headers", action="store_true",
                       help="every response carries X-Request-Id: the request's, else one made for it, which a "
                            "completion's id is then built on (as a client's: chatcmpl-ID)")
    serve.add_argument("--ssl-keyfile", default=None, metavar="FILE",
                       help="serve HTTPS: the server's private key (PEM), with --ssl-certfile")
    serve.add_argument("--ssl-certfile", default=None, metavar="FILE",
                       help="serve HTTPS: the server's certificate chain (PEM), with --ssl-keyfile")
    serve.add_argument("--ssl-ca-certs", default=None, metavar="FILE",
                       help="with HTTPS: the CA certificates (PEM) that verify client certificates, as vLLM's")
    serve.add_argument("--ssl-cert-reqs", type=int, default=0, metavar="{0,1,2}",
                       help="with HTTPS and --ssl-ca-certs: 1 asks clients for a certificate, 2 requires one (as "
                            "vLLM's, Python's ssl.CERT_* values; default 0, none)")
    serve.add_argument("--h11-max-incomplete-event-size", type=parse_size, default=None, metavar="SIZE",
                       help="the most bytes of a request head (its line and headers) the HTTP parser holds while "
                            "it is incomplete, as vLLM's; a larger head gets HTTP 400 (default h11's, 16 KiB; given, "
                            "every connection is parsed by h11)")
    serve.add_argument("--h11-max-header-count", type=int, default=_H11_MAX_HEADER_COUNT, metavar="N",
                       help="requests with more header fields get HTTP 431, as vLLM's (default "
                            f"{_H11_MAX_HEADER_COUNT}, vLLM's)")
    serve.add_argument("--root-path", default="", metavar="PATH",
                       help="the path prefix a proxy serves the API under, which the proxy strips (ASGI root_path, "
                            "as uvicorn's)")
    serve.add_argument("--uvicorn-log-level", default=None, type=str.lower,
                       choices=["debug", "info", "warning", "error", "critical", "trace"],
                       help="uvicorn's own logging level (default: --log-level)")
    serve.add_argument("--disable-uvicorn-access-log", action="store_true",
                       help="no line per HTTP request in the log")
    vllm = serve.add_argument_group(
        "vLLM's serving options", "taken where their value changes nothing here (Glimmer parses tool calls and "
        "reasoning with the model's own parser, never logs prompts, serves no /docs page), each noted at startup; "
        "another value is refused saying what to do instead")
    for flag, options in _VLLM_SERVING_OPTIONS.items():
        short = (_VLLM_SHORT_OPTIONS[flag],) if flag in _VLLM_SHORT_OPTIONS else ()
        vllm.add_argument(flag, *short, default=argparse.SUPPRESS, help="vLLM's", **options)
    # before the model began to load, or as it loaded: nothing serves yet, and SIGTERM ends serve with 0, as it does
    # once it serves
    serve.set_defaults(func=_serve, sigterm_stop=("glimmer: stopped by SIGTERM before serving", 0))

    chat = sub.add_parser("chat", help="chat in the terminal, in-process or with a running server (--url)")
    _add_engine_options(chat)
    chat.add_argument("--url", default=None, help="a running server, e.g. http://127.0.0.1:8000 (a trailing /v1 is "
                      "fine; default: in-process)")
    chat.add_argument("--api-key", default=None,
                      help="the key of a --url server that requires one (default: $GLIMMER_API_KEY; an empty one "
                           "is refused)")
    chat.add_argument("--served-model", default=None, help="the `model` to ask a --url server for")
    chat.add_argument("--system", default=None, help="a system prompt")
    chat.add_argument("--tools", default=None, help="a JSON file holding a list of OpenAI tool declarations; you "
                      "type each call's result when the model calls one")
    chat.add_argument("--reasoning-effort", default=None, help="none, minimal, low, medium, high or xhigh")
    chat.add_argument("--max-tokens", type=int, default=None,
                      help="the most tokens the model may generate for each reply, its reasoning included (default: "
                           "in-process, the checkpoint's generation_config.json max_new_tokens, else up to the end of "
                           "the context, as with --generation-config vllm; with --url, the server's default)")
    chat.add_argument("--temperature", type=float, default=None,
                      help="sampling temperature (default: the model's generation_config, else 1)")
    chat.add_argument("--limit-mm-per-prompt", type=_limit_mm_per_prompt, default=None, metavar="JSON",
                      help="vLLM's media limits, taken in-process and noted: the terminal chat sends text only, so "
                           "they change nothing; refused with --url, where the server's own limits hold")
    chat.add_argument("--no-color", action="store_true", help="plain text, no ANSI styles")
    chat.set_defaults(func=_chat, sigterm_stop=("glimmer: chat stopped by SIGTERM", 128 + signal.SIGTERM))

    batch = sub.add_parser("run-batch", help="run an OpenAI batch file (JSON Lines) through the server's endpoints, "
                           "offline, as vLLM's run-batch")
    _add_engine_options(batch)
    batch.add_argument("-i", "--input-file", required=True, metavar="FILE",
                       help="the batch input: one request a line, {\"custom_id\", \"method\": \"POST\", \"url\", "
                            "\"body\"}, url /v1/chat/completions, /v1/completions or /v1/responses (- for stdin)")
    batch.add_argument("-o", "--output-file", required=True, metavar="FILE",
                       help="where to write one result record a line, in input order (- for stdout)")
    batch.add_argument("--served-model-name", nargs="+", action="extend", default=None,
                       help="name(s) a body's `model` may give (default: the directory name, or Hub id, and MODEL as "
                            "given)")
    batch.add_argument("--allowed-local-media-path", action="append", default=[], metavar="DIR",
                       help="let requests name image/video files under DIR (repeatable; default: none)")
    batch.add_argument("--allow-remote-media", action="store_true",
                       help="let requests name http(s) image/video URLs on public addresses (as serve's)")
    batch.add_argument("--allowed-media-domains", nargs="+", action="extend", default=[], metavar="HOST",
                       help="let requests fetch http(s) media from these hosts, even on private addresses")
    _add_media_size_and_time_limits(batch)
    batch.add_argument("--default-reasoning-strength", choices=["low", "medium", "high", "xhigh"], default=None,
                       help="when a request names none (default: the template's own, high)")
    batch.add_argument("--trust-request-chat-template", action="store_true",
                       help="render a line's own Jinja chat_template, as serve's flag does (default: such a line gets "
                            "HTTP 400, whose message names this flag)")
    batch.add_argument("--limit-mm-per-prompt", type=_limit_mm_per_prompt, default=None, metavar="JSON",
                       help='the most images and videos a request may hold, as vLLM\'s: \'{"image": 4, "video": 1}\' '
                            '(or image=4,video=1, or newer vLLM\'s {"image": {"count": 4, ...}}; default 16 images, '
                            '2 videos); more get HTTP 400')
    vllm = batch.add_argument_group(
        "vLLM's run-batch options", "taken where their value changes nothing here (no metrics server, no upload), "
        "each noted at startup; another value is refused saying what to do instead")
    for flag, options in _VLLM_RUN_BATCH_OPTIONS.items():
        vllm.add_argument(flag, default=argparse.SUPPRESS, help="vLLM's", **options)
    batch.set_defaults(func=_run_batch,
                       sigterm_stop=("run-batch: stopped by SIGTERM before the batch began", 128 + signal.SIGTERM))

    inspect = sub.add_parser("inspect", help="validate a checkpoint and print its layout, config and sizes",
                             epilog=INSPECT_EXIT_STATUS)
    inspect.add_argument("model", help="checkpoint directory, .gguf file or Hugging Face Hub id")
    _add_format_options(inspect)
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.add_argument("--chat-template", default=None, metavar="FILE",
                         help="check this Jinja chat template instead of the checkpoint's (as serve would use it)")
    inspect.add_argument("--strict", action="store_true",
                         help="exit with status 1 when the checkpoint loads but the report has warnings")
    inspect.set_defaults(func=_cmd_inspect)

    tiny = sub.add_parser("make-tiny", help="write a small random checkpoint (for tests and demos)")
    tiny.add_argument("dir", help="output directory")
    tiny.add_argument("--layout", default="canonical", choices=["canonical", "legacy", "flat", "native"],
                      help="config and weight layout to write (default canonical)")
    tiny.add_argument("--vision", action="store_true", help="include a vision tower")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    tiny.add_argument("--force", action="store_true",
                      help="write into a directory that is not empty, replacing the weights of a checkpoint there")
    tiny.add_argument("--shards", type=int, default=1, help="number of safetensors shards (with an index)")
    tiny.add_argument("--preset", choices=["tiny", "30b"], default="tiny",
                      help="30b: the released Muse-Glimmer-30B geometry (needs --config-only)")
    tiny.add_argument("--config-only", action="store_true",
                      help="write config, tokenizer and templates but no weights (use --load-format dummy)")
    tiny.add_argument("--quantize", choices=["nvfp4"], default=None,
                      help="nvfp4: store the text decoder's Linear layers as compressed-tensors NVFP4 W4A16, as the "
                           "published NVFP4 release does")
    tiny.add_argument("--drafter-for", default=None, metavar="TARGET",
                      help="write a tiny DFlash drafter fitting the checkpoint TARGET instead "
                           "(--layout canonical: HF safetensors; native: head.pt)")
    tiny.set_defaults(func=_cmd_make_tiny)
    # `glimmer serve --log-level DEBUG` as well as before the command
    for command in (serve, chat, batch, inspect, tiny):
        _add_log_level(command, argparse.SUPPRESS)  # not given there: the value before the command stands
    parser.commands = {"serve": serve, "chat": chat, "run-batch": batch, "inspect": inspect, "make-tiny": tiny}
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stderr is None:  # started with stderr closed (a daemonizer's, a job's `2>&-`): Python then has none, a
        # progress bar on it failed run-batch once its output was emptied, and print(file=None) writes to stdout,
        # where run-batch's notes and summary landed among its records (-o -)
        sys.stderr = open(os.devnull, "w")  # the process's own, as the stream it stands for
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level or "INFO", format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.sigterm_stop is not None:  # serve, chat and run-batch
            return _heeding_sigterm(args.func, args, *args.sigterm_stop)
        give_back_sigterm()
        return args.func(args)
    except UsageError as exc:
        print(f"glimmer: error: {exc}", file=sys.stderr)
        return 2
    except GlimmerError as exc:
        print(f"glimmer: error: {type(exc).__name__}: {_with_flags_as_typed(str(exc), args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _ended_at_once_if_a_download_was_left(130)
    except BrokenPipeError:  # output piped into `head` and the like
        return 0


if __name__ == "__main__":
    sys.exit(main())
