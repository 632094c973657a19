"""The test oracle: the reference implementation in transformers 5.23, built from a tiny checkpoint.

Only tests import transformers; the package never does.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def reference_model(canonical_checkpoint: Path, dtype: torch.dtype = torch.float32):
    """transformers' MuseGlimmerForConditionalGeneration with the checkpoint's exact tensors.

    The checkpoint must be in the canonical layout (config and weights). Tensors are copied, not
    re-initialized: HF's random init would set every centered norm to 1 (architecture.md §12.2).
    """
    from transformers import MuseGlimmerConfig, MuseGlimmerForConditionalGeneration

    raw = json.loads((canonical_checkpoint / "config.json").read_text())
    if raw.get("vision_config") is None:
        # text-only: HF would build its full-size default vision tower; a minimal one changes nothing
        raw["vision_config"] = {"hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
                                "num_attention_heads": 1, "pos_emb_height": 2, "pos_emb_width": 2}
        raw["out_hidden_size"], raw["projector_hidden_size"] = 32, 8
    config = MuseGlimmerConfig.from_dict(raw)
    model = MuseGlimmerForConditionalGeneration(config).eval()
    state = {}
    for file in sorted(canonical_checkpoint.glob("*.safetensors")):
        state.update(load_file(file))
    if config.tie_word_embeddings:  # a tied checkpoint holds no lm_head.weight; the model's is the embedding
        state.setdefault("lm_head.weight", state["model.language_model.embed_tokens.weight"])
    missing, unexpected = model.load_state_dict(state, strict=False)
    # a text-only checkpoint leaves the (unused) vision tower at its random init
    assert not unexpected, unexpected
    assert all(name.startswith("model.vision") for name in missing), missing
    return cast_keeping_rope_frequencies(model, dtype)


def cast_keeping_rope_frequencies(model, dtype: torch.dtype):
    """`model.to(dtype)` as `from_pretrained(dtype=...)` leaves it: the rotary inverse frequencies stay float32
    (architecture.md §2.5.4). A plain `.to` would round those buffers to 16 bits, and the reference's positions with
    them (its 16-bit logits then differ from `from_pretrained`'s by ~0.2)."""
    frequencies = {name: buffer.clone() for name, buffer in model.named_buffers() if name.endswith("inv_freq")}
    model = model.to(dtype)
    for name, buffer in frequencies.items():
        owner, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(owner), attribute, buffer)
    return model


@torch.no_grad()
def reference_logits(model, token_ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([token_ids])).logits[0].float()


@torch.no_grad()
def reference_greedy(model, token_ids: list[int], max_new_tokens: int, token_count: int | None = None) -> list[int]:
    """transformers' greedy `generate`. token_count: the tokenizer's ids; the logit rows past them (a tiny
    checkpoint's vocabulary is padded to a multiple) are suppressed, as Glimmer never samples a row that is no
    token (a random model's argmax can land there; a trained one's does not)."""
    vocab = model.config.get_text_config().vocab_size
    suppress = list(range(token_count, vocab)) if token_count is not None and token_count < vocab else None
    out = model.generate(
        torch.tensor([token_ids]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        suppress_tokens=suppress,
    )
    return out[0, len(token_ids):].tolist()


def reference_drafter(canonical_drafter: Path, dtype: torch.dtype = torch.float32):
    """transformers' MuseGlimmerAssistantModel with the tiny drafter checkpoint's exact tensors (HF layout)."""
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    config = MuseGlimmerAssistantConfig.from_dict(json.loads((canonical_drafter / "config.json").read_text()))
    model = MuseGlimmerAssistantModel(config).eval()
    model.load_state_dict(load_file(canonical_drafter / "model.safetensors"), strict=True)
    return cast_keeping_rope_frequencies(model, dtype)
