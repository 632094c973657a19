"""Shared fixtures: tiny random checkpoints written once per session into a temporary directory, and a record
of the decode steps launched ahead (engine/lookahead.py)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from glimmer.engine import model_loader
from glimmer.engine.lookahead import LaunchedStep
from glimmer.engine.scheduler import Scheduler
from glimmer.model.kernels.packed_linear import packs
from glimmer.tiny import TinySpec, write_tiny_checkpoint

DEFAULT_SPEC = TinySpec()

# No property test has a deadline: hypothesis fails an example slower than 200 ms as "unreliable test timings", and
# on a loaded CI machine one garbage collection or lost time slice in a long run makes any example that slow. The
# tests that declare their own settings inherit this.
settings.register_profile("glimmer", deadline=None)
settings.load_profile("glimmer")

# A suite started in the background (`nohup ... &`, a shell without job control) inherits SIGINT ignored, and Python
# then installs no KeyboardInterrupt handler: every Ctrl-C test would fail, in this process and in the `glimmer`
# processes it starts (an ignored signal stays ignored across exec). Tests take Python's usual Ctrl-C, as a terminal
# gives it; a caught signal is reset to its default in a child, so the children get it too.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` (kernels, CUDA graphs) run only where a CUDA GPU is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """On a machine with a GPU, a test not marked `cuda` runs as on the CPU-only machines CI uses: the engine would
    otherwise default to the GPU (`device=None`), where these tests' sizes, budgets and stand-in runners do not
    apply. Covers the test's setup (module- and session-scoped fixtures it builds too), call, teardown and child
    processes."""
    if "cuda" in item.keywords or not torch.cuda.is_available():
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        yield


@pytest.fixture(scope="session")
def make_tiny(tmp_path_factory):
    """make_tiny(layout="canonical", vision=False, seed=0, spec=TinySpec(), num_shards=1) -> Path, cached."""
    cache: dict[tuple, Path] = {}

    def make(layout: str = "canonical", *, vision: bool = False, seed: int = 0, spec: TinySpec = DEFAULT_SPEC,
             num_shards: int = 1) -> Path:
        key = (layout, vision, seed, spec, num_shards)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"tiny-{layout}")
            cache[key] = write_tiny_checkpoint(out, layout=layout, vision=vision, seed=seed, spec=spec,
                                               num_shards=num_shards)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(make_tiny) -> Path:
    """The default tiny text checkpoint (canonical layout)."""
    return make_tiny()


@pytest.fixture(scope="session")
def vision_tokenizer(make_tiny):
    """The tiny vision checkpoint's tokenizer.json as the `tokenizers` library reads it (its <|patch|>, <|video|> and
    marker tokens): what the engine counts a processed prompt with."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(make_tiny(vision=True) / "tokenizer.json"))


@pytest.fixture(scope="session")
def named_templates_checkpoint(make_tiny, tmp_path_factory) -> Path:
    """The tiny checkpoint with its template in tokenizer_config.json's list of named templates, `default` beside a
    `rag` one that writes "RAG:" at the start of every message body."""
    import json
    import shutil

    checkpoint = tmp_path_factory.mktemp("named-templates") / "tiny"
    shutil.copytree(make_tiny(), checkpoint)
    template_file = checkpoint / "chat_template.jinja"  # transformers would take it as the default instead
    default = template_file.read_text(encoding="utf-8")
    template_file.unlink()
    config = json.loads((checkpoint / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = [{"name": "default", "template": default},
                               {"name": "rag", "template": default.replace("<|message|>", "<|message|>RAG:")}]
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return checkpoint


@pytest.fixture
def same_cpu_kernels(monkeypatch):
    """Engines loaded in the test take the same CPU kernels: the load-time timings that choose them (the C decoder
    stack or op by op, packed or dense weights: engine/model_loader.py) are fixed to the stack and dense weights. On a
    busy machine two engines can time differently and compute the same step with kernels that differ in float32
    rounding, so a test that compares their floats exactly needs this."""
    _pin_cpu_kernels(monkeypatch)


@pytest.fixture(scope="module")
def same_cpu_kernels_in_module():
    """`same_cpu_kernels` for the engines a module-scoped fixture loads (that fixture requests this one)."""
    with pytest.MonkeyPatch.context() as patch:
        _pin_cpu_kernels(patch)
        yield


@pytest.fixture(params=["dense", pytest.param("packed", marks=pytest.mark.skipif(
    not packs("cpu", torch.float32), reason="this torch build has no working oneDNN"))])
def op_by_op_cpu_kernels(request, monkeypatch) -> str:
    """`same_cpu_kernels` fixed to the other ways the load-time timings can choose: decode steps op by op, with dense
    weights and (a second run of the test) with the projections packed for oneDNN. `same_cpu_kernels` covers the C
    decoder stack alone, so a test comparing two engines exactly takes this as well to cover these. The way's name."""
    _pin_cpu_kernels(monkeypatch, stack=False, packed=request.param == "packed")
    return request.param


def _pin_cpu_kernels(patch: pytest.MonkeyPatch, *, stack: bool = True, packed: bool = False) -> None:
    patch.setattr(model_loader, "stack_keeps_up", lambda text, rows, repeats=5, margin=1.1: stack)
    patch.setattr(model_loader, "packing_pays", lambda weights, rows, repeats=5: packed)


@pytest.fixture
def launches(monkeypatch):
    """The decode steps launched ahead of the host, recorded as they start (LaunchedStep.start keeps its
    behaviour): "steps", "rows", each step's size in "sizes", and "rows_past_max_tokens" (rows whose token would
    come after their sequence's max_tokens)."""
    counted = {"steps": 0, "rows": 0, "rows_past_max_tokens": 0, "sizes": []}
    start = LaunchedStep.start.__func__

    def spy(cls, step, *args, **kwargs):
        counted["steps"] += 1
        counted["rows"] += len(step.seqs)
        counted["sizes"].append(len(step.seqs))
        # a row's token would be the sequence's (num_tokens + pending + 1)-th: never past max_tokens
        counted["rows_past_max_tokens"] += sum(s.num_tokens + s.num_pending_tokens >= s.max_total_tokens
                                               for s in step.seqs)
        return start(cls, step, *args, **kwargs)

    monkeypatch.setattr(LaunchedStep, "start", classmethod(spy))
    return counted


@pytest.fixture
def greedy_admission(monkeypatch):
    """Admit a waiting sequence whenever its chunk fits now, as the scheduler did before it kept room for the running
    sequences' growth: for tests of preemption itself, which the growth reserve otherwise mostly avoids."""
    monkeypatch.setattr(Scheduler, "_expected_growth", lambda self, seq, held_end: [0] * len(self.kv.page_pools))
