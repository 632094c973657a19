"""On a CUDA machine: exactness against the reference on the GPU, and generation throughput.

Part 1 (exactness, float32 on CUDA): tiny random checkpoints; greedy tokens of `LLM.generate` against the
reference's greedy `generate` on the same GPU, prompt logits against the reference, an image and a
video prompt, and the bf16 error compared with the reference's own bf16 error.

Part 2 (speed, bf16): a mid-size random model (~0.8B parameters, no download); batched generation
through the engine against the reference's batched `generate` in the same run, and single-stream decode.

    python bench/cuda_check.py [--skip-speed] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from oracle import reference_model  # noqa: E402

from glimmer import LLM, SamplingParams  # noqa: E402
from glimmer.model.context import ForwardContext  # noqa: E402
from glimmer.multimodal import DecodedVideo  # noqa: E402
from glimmer.tiny import TinySpec, write_tiny_checkpoint  # noqa: E402

KV_BYTES = 4 << 30


def _greedy_reference(model, ids, new_tokens, **kwargs):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0, **kwargs)
    return out[0, len(ids):].tolist()


def exactness(tmp: Path) -> dict:
    results: dict = {}
    path = write_tiny_checkpoint(tmp / "text", spec=TinySpec(sliding_window=16), seed=11)
    llm = LLM(str(path), device="cuda", dtype="float32", progress=False, kv_cache_memory=KV_BYTES)
    reference = reference_model(path).cuda()
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 480, (n,), generator=generator).tolist() for n in (3, 40, 17, 1, 25)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=72, ignore_eos=True))
    results["greedy_prompts_identical"] = sum(
        o.token_ids == _greedy_reference(reference, p, 72) for p, o in zip(prompts, outputs, strict=True))
    results["greedy_prompts_total"] = len(prompts)
    model = llm.engine.loaded.model
    ids = prompts[1]
    with torch.no_grad():
        ours = model.compute_logits(model(torch.tensor(ids, device="cuda"),
                                          ForwardContext.without_cache([len(ids)], device="cuda")))
        expected = reference(input_ids=torch.tensor([ids], device="cuda")).logits[0]
    results["fp32_logits_max_abs_diff"] = (ours - expected).abs().max().item()

    llm16 = LLM(str(path), device="cuda", dtype="bfloat16", progress=False, kv_cache_memory=KV_BYTES)
    ref16 = reference_model(path, dtype=torch.bfloat16).cuda()
    m16 = llm16.engine.loaded.model
    with torch.no_grad():
        ours16 = m16.compute_logits(m16(torch.tensor(ids, device="cuda"),
                                        ForwardContext.without_cache([len(ids)], device="cuda"))).float()
        theirs16 = ref16(input_ids=torch.tensor([ids], device="cuda")).logits[0].float()
    results["bf16_error_ours"] = (ours16 - expected).abs().max().item()
    results["bf16_error_reference"] = (theirs16 - expected).abs().max().item()
    out16 = llm16.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    results["bf16_generation_lengths"] = [len(o.token_ids) for o in out16]

    vpath = write_tiny_checkpoint(tmp / "vision", vision=True, seed=17)
    vllm = LLM(str(vpath), device="cuda", dtype="float32", progress=False, kv_cache_memory=KV_BYTES)
    vref = reference_model(vpath).cuda()
    from PIL import Image

    image = Image.fromarray((np.random.RandomState(0).rand(150, 230, 3) * 255).astype("uint8"))
    prompt = "<|begin_of_text|>Describe <|patch|> briefly."
    got = vllm.generate({"prompt": prompt, "multi_modal_data": {"image": image}},
                        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].token_ids
    vids, items = vllm.engine.prepare_prompt(prompt, [image])
    want = _greedy_reference(vref, vids, 24, pixel_values=items[0].pixel_values.cuda(),
                             image_grid_thw=items[0].grid_thw.cuda())
    results["image_greedy_identical"] = got == want
    video = DecodedVideo(frames=(np.random.RandomState(4).rand(8, 90, 120, 3) * 255).astype("uint8"), fps=4.0)
    vprompt = "<|begin_of_text|>Watch <|video|> and tell."
    got = vllm.generate({"prompt": vprompt, "multi_modal_data": {"video": video}},
                        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].token_ids
    vids, items = vllm.engine.prepare_prompt(vprompt, [], [video])
    want = _greedy_reference(vref, vids, 24, pixel_values_videos=items[0].pixel_values.cuda(),
                             video_grid_thw=items[0].grid_thw.cuda())
    results["video_greedy_identical"] = got == want
    return results


def speed(tmp: Path, batch: int = 64, prompt_len: int = 256, new_tokens: int = 128) -> dict:
    spec = TinySpec(hidden_size=2048, intermediate_size=6144, num_hidden_layers=16, num_attention_heads=16,
                    num_key_value_heads=2, head_dim=128, sliding_window=512, max_position_embeddings=8192)
    path = write_tiny_checkpoint(tmp / "mid", spec=spec, seed=1, dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 480, (prompt_len,), generator=generator).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    seconds = {}
    tokens = {}
    for mode, eager in (("graphs", False), ("eager", True)):
        llm = LLM(str(path), device="cuda", dtype="bfloat16", progress=False, kv_cache_memory=KV_BYTES,
                  enforce_eager=eager)
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up / capture
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokens[mode] = [o.token_ids for o in llm.generate(prompts, params)]
        torch.cuda.synchronize()
        batch_s = time.perf_counter() - start
        start = time.perf_counter()
        llm.generate(prompts[:1], params)
        torch.cuda.synchronize()
        seconds[mode] = (batch_s, time.perf_counter() - start)
        del llm
        torch.cuda.empty_cache()
    identical = sum(a == b for a, b in zip(tokens["graphs"], tokens["eager"], strict=True))

    reference = reference_model(path, dtype=torch.bfloat16).cuda()
    batch_ids = torch.tensor(prompts, device="cuda")

    def run_reference(ids) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            reference.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    run_reference(batch_ids[:4, :32])  # warm-up
    seconds["reference"] = (run_reference(batch_ids), run_reference(batch_ids[:1]))
    return speed_figures(sum(p.numel() for p in reference.parameters()), batch, prompt_len, new_tokens, seconds,
                         identical)


def speed_figures(model_parameters: int, batch: int, prompt_len: int, new_tokens: int,
                  seconds: dict[str, tuple[float, float]], identical: int) -> dict:
    """The speed report (printed, and what --json writes) from the seconds measured: of `batch` prompts together
    and of one alone, each making `new_tokens`, by "graphs", "eager" (ours) and "reference"; `identical`, the prompts
    whose tokens CUDA graphs and eager made alike. The ratios are CUDA graphs' rate to the reference's."""
    rates = {run: (batch * new_tokens / batch_s, new_tokens / single_s) for run, (batch_s, single_s) in seconds.items()}
    figures = {}
    for mode in ("graphs", "eager"):
        figures[f"ours_{mode}_batch_tokens_per_s"] = round(rates[mode][0], 1)
        figures[f"ours_{mode}_single_tokens_per_s"] = round(rates[mode][1], 1)
    ref_batch, ref_single = rates["reference"]
    return {
        "model_parameters": model_parameters,
        "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, **figures,
        "graphs_and_eager_tokens_identical": identical,
        "reference_batch_tokens_per_s": round(ref_batch, 1),
        "batch_ratio": round(figures["ours_graphs_batch_tokens_per_s"] / ref_batch, 2),
        "reference_single_tokens_per_s": round(ref_single, 1),
        "single_ratio": round(figures["ours_graphs_single_tokens_per_s"] / ref_single, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cuda_check.py needs a CUDA GPU")
    with tempfile.TemporaryDirectory() as tmp:
        report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "exactness": exactness(Path(tmp))}
        print(json.dumps(report, indent=2), flush=True)
        if not args.skip_speed:
            report["speed"] = speed(Path(tmp))
        print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
