"""The recipes: corpus size, model sizes and optimizer settings of one training run.

`NANO` is the recipe of the shipped model (one GPU, a few minutes); `MICRO` is the same pipeline at a size
a CPU test runs in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from glimmer.tiny import TinyDrafterSpec, TinySpec


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    # corpus
    conversations: int = 128_000
    tokenizer_conversations: int = 4_000
    base_vocab_size: int = 2048
    max_conversation_tokens: int = 1536
    # models
    target: TinySpec = field(default_factory=lambda: TinySpec(
        hidden_size=256, intermediate_size=640, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
        head_dim=32, sliding_window=1024, max_position_embeddings=4096, rope_theta=10000.0, output_base_width=256))
    # the drafter's width is the target's hidden size; it reads target layers 1, 4 and 6 (§10.1)
    drafter: TinyDrafterSpec = field(default_factory=lambda: TinyDrafterSpec(
        intermediate_size=640, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        sliding_window=4096, block_size=16, target_layer_ids=(1, 4, 6), rope_theta=10000.0))
    # optimization: a step sees about batch_tokens tokens (padding included)
    batch_tokens: int = 65_536
    learning_rate: float = 2e-3
    min_learning_rate_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # optimizer steps (on one H200: about 0.15 s a target step, 0.22 s a drafter step)
    target_steps: int = 2000
    drafter_steps: int = 500
    # the drafter trains on the first conversations of the corpus (it sees fewer tokens than one epoch of them)
    drafter_conversations: int = 64_000
    drafter_anchors_per_conversation: int = 16
    held_out_conversations: int = 512
    log_every: int = 50


NANO = Recipe()

MICRO = replace(
    NANO,
    conversations=24,
    tokenizer_conversations=24,
    base_vocab_size=600,
    target=TinySpec(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=16, sliding_window=64, max_position_embeddings=4096,
                    rope_theta=10000.0, output_base_width=32),
    drafter=TinyDrafterSpec(intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                            head_dim=16, sliding_window=4096, block_size=4, target_layer_ids=(0, 1),
                            rope_theta=10000.0),
    batch_tokens=2048,
    learning_rate=3e-3,
    warmup_steps=2,
    target_steps=5,
    drafter_steps=3,
    drafter_conversations=24,
    drafter_anchors_per_conversation=2,
    held_out_conversations=8,
    log_every=1,
)

RECIPES = {"nano": NANO, "micro": MICRO}
