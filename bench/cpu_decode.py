"""CPU decode speed: Glimmer against transformers' `generate` on the same small model, in the same run.

    python bench/cpu_decode.py [--batches 1,8] [--prompt-tokens 32] [--new-tokens 128] [--threads N]

Writes a random checkpoint of hidden size 512 and 8 layers with `glimmer.tiny` (float32, every weight random),
then for each batch size decodes `--new-tokens` greedy tokens from fresh random prompts (no prefix-cache hit)
with `LLM.generate` and with transformers' `generate` (static shapes: same-length prompts, no padding, no
early stop). Prints decode tokens/s of both and the ratio; the figure times whole generate calls, prefill
included, measured after one warm-up call each. Beside them, the floor on this machine, in the same run:
one decode step's weight products alone (every projection and the lm_head, the input `batch` rows), with
the fastest of PyTorch's `F.linear`, `torch.mv` (one row), oneDNN's packed product and the C decoder stack's own
product, and the tokens/s that floor allows. The first line says whether Glimmer's decode steps ran in the C
decoder stack (chosen at load where its products keep up with torch's) or op by op.
Needs transformers with the Muse Glimmer model (the test oracle); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from glimmer.cli import number, positive_count, positive_counts
from glimmer.engine.llm import LLM
from glimmer.engine.sampling_params import SamplingParams
from glimmer.model.kernels import cpu
from glimmer.model.kernels.decoder_stack import stack_linear
from glimmer.tiny import TinySpec, write_tiny_checkpoint

SPARE_POSITIONS = 8  # the engine's context past a prompt and its new tokens
SPEC = TinySpec(hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=4, head_dim=64, sliding_window=128)


def reference_model(checkpoint: Path):
    """transformers' model with the checkpoint's exact tensors (as tests/oracle.py builds it)."""
    from transformers import MuseGlimmerConfig, MuseGlimmerForConditionalGeneration

    raw = json.loads((checkpoint / "config.json").read_text())
    raw["vision_config"] = {"hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
                            "num_attention_heads": 1, "pos_emb_height": 2, "pos_emb_width": 2}
    raw["out_hidden_size"], raw["projector_hidden_size"] = 32, 8
    model = MuseGlimmerForConditionalGeneration(MuseGlimmerConfig.from_dict(raw)).eval()
    state = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        state.update(load_file(file))
    model.load_state_dict(state, strict=False)
    return model


def random_prompts(batch: int, length: int, vocab: int, generator: torch.Generator) -> list[list[int]]:
    # ids from 1 up: id 0 and the special tokens sit low in the tiny vocabulary; stops are ignored anyway
    return torch.randint(300, vocab, (batch, length), generator=generator).tolist()


def weight_matrices(checkpoint: Path) -> list[torch.Tensor]:
    """The matrices one decode step multiplies by: every 2-D weight but the embedding table (a lookup), which
    counts once as the lm_head when the checkpoint ties them."""
    state = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        state.update(load_file(file))
    matrices = [t for name, t in state.items() if t.dim() == 2 and "embed_tokens" not in name]
    if not any(name.endswith("lm_head.weight") for name in state):
        matrices += [t for name, t in state.items() if name.endswith("embed_tokens.weight")]
    return [m.float().contiguous() for m in matrices]


def weight_products_seconds(matrices: list[torch.Tensor], batch: int, repeats: int = 20) -> tuple[float, str]:
    """Seconds for one step's weight products alone at `batch` rows, and the way that took them: the best of dense
    `F.linear`, at one row `torch.mv` (BLAS's matrix-vector product, on some machines faster than both others
    there), where PyTorch has oneDNN weights packed for it (as the engine may pack them), and where the C kernels
    build the C decoder stack's own product (`stack_linear`, which the engine's decode steps may run)."""
    inputs = {m.shape[1]: torch.randn(batch, m.shape[1]) for m in matrices}
    ways = {"F.linear": lambda: [F.linear(inputs[m.shape[1]], m) for m in matrices]}
    if batch == 1:
        ways["mv"] = lambda: [torch.mv(m, inputs[m.shape[1]][0]) for m in matrices]
    if torch.backends.mkldnn.is_available():
        packed = [(m.shape[1], torch.ops.mkldnn._reorder_linear_weight(m, 64)) for m in matrices]
        ways["oneDNN"] = lambda: [torch.ops.mkldnn._linear_pointwise(inputs[k], w, None, "none", [], "")
                                  for k, w in packed]
    if cpu.library() is not None:
        ways["C stack"] = lambda: [stack_linear(inputs[m.shape[1]], m) for m in matrices]
    best, fastest = float("inf"), ""
    for name, run in ways.items():
        run()
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(repeats):
                run()
            seconds = (time.perf_counter() - start) / repeats
            if seconds < best:
                best, fastest = seconds, name
    return best, fastest


def time_glimmer(llm: LLM, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return elapsed, [o.outputs[0].token_ids for o in outputs]


@torch.inference_mode()
def time_transformers(model, prompts: list[list[int]], new_tokens: int, token_count: int
                      ) -> tuple[float, list[list[int]]]:
    """token_count: the tokenizer's ids; the logit rows past them (the tiny vocabulary is padded to a multiple) are
    suppressed, as Glimmer never samples them, so the greedy outputs can be compared."""
    ids = torch.tensor(prompts)
    padding = list(range(token_count, model.config.get_text_config().vocab_size))
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
                         suppress_tokens=padding or None)
    elapsed = time.perf_counter() - start
    return elapsed, out[:, ids.shape[1]:].tolist()


def thread_count(text: str) -> int:
    """--threads: a positive integer (0 was taken for torch's choice, and a negative count was set_num_threads'
    RuntimeError, a stack trace)."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a thread count: give a positive integer, or leave --threads "
                                         "out for torch's choice")
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=positive_counts, default=[1, 8], help="comma-separated batch sizes")
    parser.add_argument("--prompt-tokens", type=positive_count, default=32)
    parser.add_argument("--new-tokens", type=positive_count, default=128)
    parser.add_argument("--repeats", type=positive_count, default=2,
                        help="timed runs per engine and batch; the best counts")
    parser.add_argument("--threads", type=thread_count, default=None, help="torch threads (default: torch's choice)")
    # nan was never met whatever the run, and -1 met by any
    parser.add_argument("--target", type=number("a ratio to transformers", least=0, hint=", such as 2"), default=2.0,
                        help="the ratio to transformers to reach")
    args = parser.parse_args()
    room = SPEC.max_position_embeddings - SPARE_POSITIONS
    if args.prompt_tokens + args.new_tokens > room:
        parser.error(f"argument --prompt-tokens: {args.prompt_tokens} prompt and {args.new_tokens} new tokens pass the "
                     f"model's {SPEC.max_position_embeddings:,} positions: give at most {room:,} together")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    batches = args.batches
    generator = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_tiny_checkpoint(Path(tmp) / "cpu-bench", spec=SPEC)
        llm = LLM(str(checkpoint), device="cpu", dtype="float32", max_num_seqs=max(batches),
                  max_model_len=args.prompt_tokens + args.new_tokens + SPARE_POSITIONS, progress=False)
        reference = reference_model(checkpoint)
        matrices = weight_matrices(checkpoint)
    vocab = llm.engine.model_config.text.vocab_size
    token_count = llm.engine.token_count  # prompt ids are tokens (the rows past them are the vocabulary's padding)
    stacked = llm.engine.loaded.model.model.language_model.decoder_stack is not None
    print(f"model: hidden {SPEC.hidden_size}, {SPEC.num_hidden_layers} layers, vocab {vocab}, float32; "
          f"torch threads {torch.get_num_threads()}; {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens; "
          f"Glimmer's decode steps {'in the C decoder stack' if stacked else 'op by op'}")
    met = True
    for batch in batches:
        warm = random_prompts(batch, args.prompt_tokens, token_count, generator)
        time_glimmer(llm, warm, 4)
        time_transformers(reference, warm, 4, token_count)
        ours, theirs, same = [], [], 0
        for _ in range(args.repeats):
            prompts = random_prompts(batch, args.prompt_tokens, token_count, generator)
            seconds, tokens = time_glimmer(llm, prompts, args.new_tokens)
            ours.append(seconds)
            ref_seconds, ref_tokens = time_transformers(reference, prompts, args.new_tokens, token_count)
            theirs.append(ref_seconds)
            same += sum(a == b for a, b in zip(tokens, ref_tokens, strict=True))
        glimmer_rate = batch * args.new_tokens / min(ours)
        reference_rate = batch * args.new_tokens / min(theirs)
        ratio = glimmer_rate / reference_rate
        met &= ratio >= args.target
        print(f"batch {batch:>3}: Glimmer {glimmer_rate:8.1f} tok/s  transformers {reference_rate:8.1f} tok/s  "
              f"ratio {ratio:5.2f}x (target {args.target:.1f}x: {'met' if ratio >= args.target else 'NOT met'})  "
              f"greedy outputs identical: {same}/{batch * args.repeats}")
        floor, fastest = weight_products_seconds(matrices, batch)
        ceiling = batch / floor
        rate_gb_s = sum(m.numel() for m in matrices) * 4 / floor / 1e9
        print(f"           floor: the weight products alone {floor * 1e3:.2f} ms a step ({fastest}: "
              f"{rate_gb_s:.1f} GB/s of fp32 weights) = {ceiling:,.0f} tok/s, {ceiling / reference_rate:.2f}x "
              f"transformers; Glimmer at {glimmer_rate / ceiling:.2f} of it")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
