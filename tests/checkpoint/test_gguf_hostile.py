"""Hostile and broken GGUF files: each is one line of error from `glimmer inspect` (exit 2), or for tensors that do
not match the metadata one error listing them with the fix, never a crash, a hang or a large allocation. All files
are inspected by the CLI's `main` in one subprocess whose address space is capped at 2 GiB (the files claim
terabytes), under a time limit."""

from __future__ import annotations

import json
import resource
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf_export import export_text_gguf

ADDRESS_SPACE_BYTES = 2 << 30


_RUNNER = """
import contextlib, io, json, sys
from glimmer.cli import main
results = {}
for path in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--log-level", "ERROR", "inspect", path, "--json"])
    results[path] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


def inspect_all(paths: list[Path]) -> dict[str, subprocess.CompletedProcess]:
    """`glimmer inspect --json` on each file, in one subprocess under the address-space cap."""

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))

    result = subprocess.run([sys.executable, "-c", _RUNNER, *map(str, paths)], capture_output=True, text=True,
                            timeout=300, preexec_fn=cap_memory)
    assert result.returncode == 0, result.stderr[-3000:]
    return {path: subprocess.CompletedProcess([], code, out, err)
            for path, (code, out, err) in json.loads(result.stdout.splitlines()[-1]).items()}


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glimmer: error: "), result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def assert_listed_error(result: subprocess.CompletedProcess, summary: str, *fragments: str) -> None:
    """The safetensors mismatch error's form (weight_mismatch.py): a summary of counts, the names, then the fix."""
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("glimmer: error: CheckpointError: ") and lines[0].endswith(summary), lines[0]
    assert lines[-1].startswith("  fix: "), lines[-1]
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def raw_gguf(*, tensor_count: int = 0, kv: bytes = b"", kv_count: int = 0, tensors: bytes = b"",
             magic: bytes = b"GGUF") -> bytes:
    return magic + struct.pack("<IQQ", 3, tensor_count, kv_count) + kv + tensors


ARCH_KV = _string("general.architecture") + struct.pack("<I", 8) + _string("muse-glimmer")


def _rewrite(source: Path, out: Path, change: dict, drop: tuple[str, ...] = (), *,
             drop_tensors: tuple[str, ...] = (), replace_tensors: dict | None = None,
             split_max_tensors: int = 0, add: dict | None = None) -> Path:
    """Copy a GGUF with some metadata changed or dropped (and tensors dropped, replaced by name with (data,
    raw_dtype), or the copy split into parts of `split_max_tensors` tensors as gguf-split does), using gguf's own
    reader and writer."""
    reader = gguf.GGUFReader(source)
    architecture = reader.fields["general.architecture"].contents()  # muse-glimmer, or clip for an mmproj
    writer = gguf.GGUFWriter(out, architecture, split_max_tensors=split_max_tensors)
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop:
            continue
        value = change.get(name, field.contents())
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub_type)
    for name, (value, value_type) in (add or {}).items():  # keys the source lacks
        writer.add_key_value(name, value, value_type)
    for tensor in reader.tensors:
        if tensor.name not in drop_tensors:
            data, raw_dtype = (replace_tensors or {}).get(tensor.name, (tensor.data, tensor.tensor_type))
            writer.add_tensor(tensor.name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _write(directory: Path, name: str, data: bytes) -> Path:
    path = directory / f"{name}.gguf"
    path.write_bytes(data)
    return path


def _tensor(name: str, dims: tuple[int, ...]) -> bytes:
    return _string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, 0, 0)


def _bad_k_norm(good: Path, directory: Path, layer: int = 2) -> Path:
    reader = gguf.GGUFReader(good)
    data = bytearray(good.read_bytes())
    entry = next(t for t in reader.tensors if t.name == f"blk.{layer}.attn_k_norm.weight")
    struct.pack_into("<f", data, entry.data_offset, 2.0)
    return _write(directory, "bad_k_norm", bytes(data))


def _short_vocabulary(good: Path, directory: Path) -> Path:
    """The first 100 tokens only: the merges name tokens the list no longer has (the tokenizers library raised a
    bare Exception, a traceback)."""
    fields = gguf.GGUFReader(good).fields
    change = {name: fields[name].contents()[:100] for name in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")}
    return _rewrite(good, directory / "short_vocabulary.gguf", change)


def _iq4_nl_tensor(good: Path, directory: Path) -> Path:
    """blk.1.attn_v.weight stored as IQ4_NL (a type gguf.quants cannot dequantize), zero bytes of the right size."""
    tensor = next(t for t in gguf.GGUFReader(good).tensors if t.name == "blk.1.attn_v.weight")
    rows, columns = (int(d) for d in reversed(tensor.shape))
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.IQ4_NL]
    iq4_nl = (np.zeros((rows, columns // block * size), np.uint8), gguf.GGMLQuantizationType.IQ4_NL)
    return _rewrite(good, directory / "iq4_nl.gguf", {}, replace_tensors={tensor.name: iq4_nl})


def _tensor_entry_edited(good: Path, directory: Path, name: str, *, offset_of: str | None = None,
                        raw_type: int | None = None) -> Path:
    """blk.0.attn_q.weight's header entry edited in place: its data offset set to tensor `offset_of`'s, or its type
    to `raw_type`; both leave it sharing bytes with another tensor (ggml refuses such a file)."""
    tensors = {t.name: t for t in gguf.GGUFReader(good).tensors}
    data = bytearray(good.read_bytes())
    entry = _string("blk.0.attn_q.weight")
    at = data.index(entry) + len(entry)
    at += 4 + 8 * struct.unpack_from("<I", data, at)[0]  # past the rank and the dimensions: the type, the offset
    if raw_type is not None:
        struct.pack_into("<I", data, at, raw_type)
    if offset_of is not None:
        data_start = min(t.data_offset for t in tensors.values())  # the first tensor's offset is 0
        struct.pack_into("<Q", data, at + 4, tensors[offset_of].data_offset - data_start)
    return _write(directory, name, bytes(data))


def _marker_typed_normal(good: Path, directory: Path) -> Path:
    """<|start|> typed NORMAL (1), not CONTROL: split like text, every prompt's headers were other tokens (P-TOK-1)."""
    fields = gguf.GGUFReader(good).fields
    tokens, types = fields["tokenizer.ggml.tokens"].contents(), list(fields["tokenizer.ggml.token_type"].contents())
    types[tokens.index("<|start|>")] = 1
    return _rewrite(good, directory / "marker_normal.gguf", {"tokenizer.ggml.token_type": types})


def split_in_two(good: Path, directory: Path) -> tuple[Path, Path]:
    """The good file split in two, as `llama-gguf-split` (GGUFWriter(split_max_tensors)) writes and names it."""
    half = len(gguf.GGUFReader(good).tensors) // 2 + 1
    directory.mkdir(exist_ok=True)
    _rewrite(good, directory / "model.gguf", {}, split_max_tensors=half)
    return directory / "model-00001-of-00002.gguf", directory / "model-00002-of-00002.gguf"


def _split_missing_part(good: Path, directory: Path) -> Path:
    first, second = split_in_two(good, directory / "missing")
    second.unlink()
    return first


def _split_broken_part(good: Path, directory: Path, name: str, damage) -> Path:
    """The good file split in two, its second part damaged by `damage(part)`; the first part is given."""
    first, second = split_in_two(good, directory / name)
    damage(second)
    return first


def _link_to_nothing(part: Path) -> None:
    """A Hugging Face cache snapshot's link to a blob that never finished downloading."""
    part.unlink()
    part.symlink_to(part.parent / "blobs" / "never-downloaded")


def _split_renamed(good: Path, directory: Path) -> Path:
    first, _ = split_in_two(good, directory / "renamed")
    return first.rename(first.with_name("model.gguf"))


def _split_upper_case(good: Path, directory: Path) -> Path:
    """The parts named with an upper-case extension (.GGUF), the second given."""
    first, second = split_in_two(good, directory / "upper")
    for part in (first, second):
        part.rename(part.with_suffix(".GGUF"))
    return second.with_suffix(".GGUF")


def _split_bad_k_norm(good: Path, directory: Path) -> Path:
    """A bad K norm (the last layer's) in the second part of a split, the first given: the error names its part."""
    (directory / "split_bad").mkdir()
    first, _ = split_in_two(_bad_k_norm(good, directory / "split_bad", layer=7), directory / "split_bad")
    return first


def _split_parts_of_two_splits(good: Path, directory: Path) -> Path:
    """Part 2 taken from a split into three, beside part 1 of a split into two."""
    first, second = split_in_two(good, directory / "mixed")
    third = len(gguf.GGUFReader(good).tensors) // 3 + 1
    _rewrite(good, directory / "mixed" / "other.gguf", {}, split_max_tensors=third)
    (directory / "mixed" / "other-00002-of-00003.gguf").replace(second)
    return first


# name → (builder(good file, directory) → path, fragments the one-line error must contain)
CASES = {
    "wrong_magic": (lambda g, d: _write(d, "wrong_magic", raw_gguf(magic=b"GGML")), ("not a GGUF file", "wrong magic")),
    "truncated_in_metadata": (lambda g, d: _write(d, "t1", g.read_bytes()[: int(g.stat().st_size * 0.3)]),
                              ("truncated GGUF file",)),
    "truncated_in_tensor_data": (lambda g, d: _write(d, "t2", g.read_bytes()[: int(g.stat().st_size * 0.97)]),
                                 ("truncated GGUF file",)),
    "absurd_tensor_count": (lambda g, d: _write(d, "tc", raw_gguf(tensor_count=1 << 62, kv=ARCH_KV, kv_count=1)),
                            ("tensors", "more than")),
    "absurd_key_count": (lambda g, d: _write(d, "kc", raw_gguf(kv_count=1 << 60)), ("metadata keys", "more than")),
    "absurd_array_length": (
        lambda g, d: _write(d, "al", raw_gguf(kv=ARCH_KV + _string("tokenizer.ggml.tokens")
                                               + struct.pack("<IIQ", 9, 8, 1 << 59), kv_count=2)),
        ("tokenizer.ggml.tokens", "items")),
    "absurd_string_length": (
        lambda g, d: _write(d, "sl", raw_gguf(kv=ARCH_KV + _string("general.name") + struct.pack("<IQ", 8, 1 << 50),
                                              kv_count=2)),
        ("general.name", "bytes")),
    "absurd_tensor_shape": (
        lambda g, d: _write(d, "ts", raw_gguf(tensor_count=1, kv=ARCH_KV, kv_count=1,
                                              tensors=_tensor("token_embd.weight", (1 << 40, 1 << 40))) + bytes(64)),
        ("token_embd.weight", "absurd dimensions")),
    "tensor_past_the_end": (
        lambda g, d: _write(d, "te", raw_gguf(tensor_count=1, kv=ARCH_KV, kv_count=1,
                                              tensors=_tensor("token_embd.weight", (64, 1 << 20))) + bytes(64)),
        ("truncated GGUF file", "token_embd.weight")),
    # ggml refuses tensors that share bytes; each loaded another tensor's data without a word
    "tensors_sharing_bytes": (lambda g, d: _tensor_entry_edited(g, d, "shared", offset_of="token_embd.weight"), (
        "tensor 'token_embd.weight' (Q8_0, bytes ", "overlaps tensor 'blk.0.attn_q.weight'", "the file is corrupt")),
    "type_wider_than_its_bytes": (lambda g, d: _tensor_entry_edited(g, d, "wider", raw_type=int(Q.F32)), (
        "tensor 'blk.0.attn_q.weight' (F32, bytes ", "overlaps tensor 'blk.0.attn_k.weight'")),
    # a flag of another type was read as false: prompts went without their BOS, silently
    "add_bos_token_a_string": (lambda g, d: _rewrite(g, d / "bos_str.gguf", {}, drop=("tokenizer.ggml.add_bos_token",),
                                                      add={"tokenizer.ggml.add_bos_token": (
                                                          "true", gguf.GGUFValueType.STRING)}),
                               ("metadata tokenizer.ggml.add_bos_token is STRING, expected a bool",)),
    "marker_typed_normal": (_marker_typed_normal, ("'<|start|>' (id ", "encodes as 7 tokens, not as itself",
                                                   "CONTROL in a GGUF's tokenizer.ggml.token_type")),
    "pattern_disagrees_with_block_count": (
        lambda g, d: _rewrite(g, d / "p9.gguf", {"muse-glimmer.block_count": 9}),
        ("sliding_window_pattern has 8 entries but block_count=9",)),
    "block_count_too_large": (
        lambda g, d: _rewrite(g, d / "b9.gguf", {"muse-glimmer.block_count": 9,
                                                  "muse-glimmer.attention.sliding_window_pattern": [True] * 9}),
        ("tensor blk.8.attn_q_norm.weight is missing",)),
    "block_count_no_model_has": (  # QA: without the pattern key, 10**9 layers took gigabytes and minutes
        lambda g, d: _rewrite(g, d / "b1e9.gguf", {"muse-glimmer.block_count": 10**9},
                              drop=("muse-glimmer.attention.sliding_window_pattern",)),
        ("muse-glimmer.block_count=1000000000 is more layers than Glimmer builds (at most 4096",)),
    "missing_required_key": (lambda g, d: _rewrite(g, d / "nk.gguf", {}, drop=("muse-glimmer.logit_scale",)),
                             ("required metadata key muse-glimmer.logit_scale is missing",)),
    "k_norm_not_ones": (_bad_k_norm, ("blk.2.attn_k_norm.weight is not all ones",)),
    "tokens_that_miss_the_merges": (_short_vocabulary, ("do not form a BPE tokenizer",)),
    "split_file_missing_a_part": (_split_missing_part, ("part 1 of 2 of a split GGUF, and "
                                                        "model-00002-of-00002.gguf is not beside it",)),
    # a part that is there but broken was reported as not beside the one given
    "split_part_truncated": (lambda g, d: _split_broken_part(
        g, d, "truncated_part", lambda part: part.write_bytes(part.read_bytes()[: part.stat().st_size * 9 // 10])), (
        "model-00001-of-00002.gguf: this is part 1 of 2 of a split GGUF, and its part model-00002-of-00002.gguf is "
        "unreadable or corrupt: truncated GGUF file", "download or copy that part again")),
    "split_part_corrupt": (lambda g, d: _split_broken_part(
        g, d, "corrupt_part", lambda part: part.write_bytes(bytes(4096))), (
        "its part model-00002-of-00002.gguf is unreadable or corrupt: not a GGUF file (wrong magic",)),
    "split_part_a_link_to_nothing": (lambda g, d: _split_broken_part(g, d, "linked_part", _link_to_nothing), (
        "its part model-00002-of-00002.gguf is unreadable: it is a symbolic link to ",
        "a download cut short")),
    "split_part_a_directory": (lambda g, d: _split_broken_part(
        g, d, "directory_part", lambda part: (part.unlink(), part.mkdir())), (
        "its part model-00002-of-00002.gguf is unreadable: it is not a regular file",)),
    "split_part_renamed": (_split_renamed, ("part 1 of 2 of a split GGUF (split.count=2), but its name is not "
                                            "gguf-split's <prefix>-00001-of-00002.gguf", "llama-gguf-split --merge")),
    "split_number_not_a_number": (lambda g, d: _rewrite(g, d / "split_no.gguf", {}, add={
        "split.count": (3, gguf.GGUFValueType.UINT16), "split.no": ("x", gguf.GGUFValueType.STRING)}), (
        "one of 3 parts of a split GGUF (split.count=3), but its name is not gguf-split's "
        "<prefix>-00001-of-00003.gguf",)),
    "split_with_thousands_of_parts_missing": (lambda g, d: _rewrite(g, d / "many-00001-of-60000.gguf", {}, add={
        "split.count": (60000, gguf.GGUFValueType.UINT16), "split.no": (0, gguf.GGUFValueType.UINT16)}), (
        "many-00002-of-60000.gguf, many-00003-of-60000.gguf, many-00004-of-60000.gguf and 59,996 more are not "
        "beside it",)),
    "split_tensor_error_names_its_part": (_split_bad_k_norm, (
        "model-00001-of-00002.gguf: tensor blk.7.attn_k_norm.weight is not all ones",
        "(blk.7.attn_k_norm.weight is in model-00002-of-00002.gguf)")),
    "split_parts_of_different_splits": (_split_parts_of_two_splits, (
        "model-00002-of-00002.gguf: is named part 2 of 2 of a split GGUF but its metadata says split.no=1, "
        "split.count=3",)),
}

# name → (builder, the summary line's end, fragments of the listed error): tensors that do not match the metadata
MISMATCH_CASES = {
    "head_count_mismatch": (lambda g, d: _rewrite(g, d / "hc.gguf", {"muse-glimmer.attention.head_count": 8}),
                            "the tensors do not match the metadata: 24 of the wrong shape", (
                                "  shape mismatches (24):\n    blk.0.attn_q.weight: expected shape [128, 64], found "
                                "[64, 64]\n", "    … and 14 more\n", "  fix: the metadata (embedding_length, "
                                "feed_forward_length, head counts, key_length) describes another size of model")),
    "block_count_too_small": (
        lambda g, d: _rewrite(g, d / "b4.gguf", {"muse-glimmer.block_count": 4,
                                                  "muse-glimmer.attention.sliding_window_pattern": [True] * 4}),
        "the tensors do not match the metadata: 56 unexpected",
        ("    blk.4.attn_gate.weight [64, 64]\n",
         "fix: tensors for layers 4 to 7 exist but muse-glimmer.block_count=4")),
    "unsupported_tensor_type": (_iq4_nl_tensor,
                                "tensor types Glimmer does not read (IQ4_NL ×1): 1 of an unsupported type",
                                ("  tensor types Glimmer does not read (it reads F32, F16, BF16, Q4_0",
                                 "    blk.1.attn_v.weight: IQ4_NL\n", "fix: quantize the original model")),
    "several_problems": (lambda g, d: _rewrite(g, d / "several.gguf", {}, drop_tensors=(
        "blk.0.attn_v.weight", "blk.5.ffn_up.weight")), "the tensors do not match the metadata: 2 missing", (
        "  missing tensors (2):\n    blk.0.attn_v.weight (shape [32, 64])\n    blk.5.ffn_up.weight (shape [128, 64])\n",
        "  fix: the file lacks tensors")),
}


@pytest.fixture(scope="module")
def results(tiny_checkpoint, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    directory = tmp_path_factory.mktemp("hostile")
    good = export_text_gguf(tiny_checkpoint, directory / "good.gguf", Q.Q8_0)
    defaulted = _rewrite(good, directory / "defaulted.gguf", {},
                         drop=("muse-glimmer.final_logit_softcapping", "muse-glimmer.attention.sliding_window"))
    first, second = split_in_two(good, directory / "split")
    paths = {"good": good, "defaulted": defaulted, "split_first": first, "split_second": second,
             "split_upper_case": _split_upper_case(good, directory)}
    paths |= {name: build(good, directory) for name, (build, _) in CASES.items()}
    paths |= {name: build(good, directory) for name, (build, *_) in MISMATCH_CASES.items()}
    outcome = inspect_all(list(paths.values()))
    return {name: outcome[str(path)] for name, path in paths.items()}


def test_the_capped_cli_reads_a_good_file(results):
    assert results["good"].returncode == 0, results["good"].stderr[-2000:]


@pytest.mark.parametrize("part", ["split_first", "split_second", "split_upper_case"])
def test_a_split_file_reads_as_the_whole_from_any_part(results, part):
    """gguf-split's parts (as Hub repositories ship GGUFs over 50 GB) read as the unsplit file: same report."""
    assert results[part].returncode == 0, results[part].stderr[-2000:]
    whole, split = json.loads(results["good"].stdout), json.loads(results[part].stdout)
    for key in ("config", "parameters", "tensor_types", "warnings"):
        assert split[key] == whole[key], key


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_file_is_one_line_of_error(results, case):
    assert_one_line_error(results[case], *CASES[case][1])


@pytest.mark.parametrize("case", list(MISMATCH_CASES))
def test_tensors_that_do_not_match_the_metadata_are_listed_with_the_fix(results, case):
    """QA: these were one line of every problem ("; "-joined, hundreds for another model) and no fix."""
    _, summary, fragments = MISMATCH_CASES[case]
    assert_listed_error(results[case], summary, *fragments)


def test_optional_keys_are_defaulted_in_one_warning(results):
    result = results["defaulted"]
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    defaulted = [w for w in report["warnings"] if "reference defaults" in w]
    assert len(defaulted) == 1
    assert "final_logit_softcapping=20.0" in defaulted[0] and "sliding_window=2048" in defaulted[0]
    assert report["config"]["text"]["final_logit_softcapping"] == 20.0
