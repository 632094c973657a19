"""The whole Muse Glimmer model: text decoder, optional vision path, untied lm_head, logit transform.

Module names mirror the canonical checkpoint (`model.language_model.*`, `model.vision_tower.*`,
`model.vision_adapter.*`, `model.vision_projection.*`, `lm_head.*`), so every checkpoint layout is
mapped onto these names once, in `glimmer.checkpoint`, and loaded with a strict `load_state_dict`.
"""

from __future__ import annotations

import torch
from torch import nn

from glimmer.checkpoint.config import ModelConfig
from glimmer.model.context import ForwardContext
from glimmer.model.kernels.logits import softcapped_logits
from glimmer.model.text import TextModel


class MuseGlimmerBackbone(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.language_model = TextModel(config.text)
        if config.vision is not None:
            from glimmer.model.vision import VisionAdapter, VisionTower

            self.vision_tower = VisionTower(config.vision)
            self.vision_adapter = VisionAdapter(config.out_hidden_size, config.projector_hidden_size)
            self.vision_projection = nn.Linear(config.projector_hidden_size, config.text.hidden_size, bias=False)


class MuseGlimmerForConditionalGeneration(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = MuseGlimmerBackbone(config)
        self.lm_head = nn.Linear(config.text.hidden_size, config.text.vocab_size, bias=False)
        self.multimodal_token_ids = tuple(
            t for t in (config.image_token_id, config.video_token_id) if t is not None and config.has_vision
        )
        self._placeholder_ids: dict[torch.device, torch.Tensor] = {}  # per device, made outside graph capture

    def fuse_for_inference(self) -> None:
        """Shared-input projections as single GEMMs and fused norm passes."""
        self.model.language_model.fuse_for_inference()

    def pack_projections(self) -> None:
        """After `fuse_for_inference`, on the CPU: projections read weights packed for oneDNN."""
        self.model.language_model.pack_projections()

    def bind_decoder_stack(self) -> bool:
        """After `fuse_for_inference`, on the CPU in float32: decode steps run the decoder layers in one C call."""
        return self.model.language_model.bind_decoder_stack()

    @property
    def embed_tokens(self) -> nn.Module:
        return self.model.language_model.embed_tokens

    def embed(
        self,
        input_ids: torch.Tensor,
        multimodal_embeds: torch.Tensor | None = None,
        multimodal_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Normed token embeddings with vision rows scattered into the placeholder positions (§4.9).

        Placeholder ids are looked up as id 0 and overwritten, as the reference does; the scattered rows
        are already normed by the perception norm and are not normed again.
        """
        if self.multimodal_token_ids:
            device = input_ids.device
            if device not in self._placeholder_ids:
                self._placeholder_ids[device] = torch.tensor(self.multimodal_token_ids, device=device)
            input_ids = input_ids.masked_fill(torch.isin(input_ids, self._placeholder_ids[device]), 0)
        embeds = self.embed_tokens(input_ids)
        if multimodal_embeds is not None and multimodal_mask is not None:
            embeds = embeds.masked_scatter(multimodal_mask[:, None], multimodal_embeds.to(embeds.dtype))
        return embeds

    def encode_vision(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
        """Vision features per image or video, ready to scatter into the text embeddings (§4.6)."""
        from glimmer.model.vision import project_vision_features

        backbone = self.model
        return project_vision_features(
            backbone.vision_tower,
            backbone.vision_adapter,
            backbone.vision_projection,
            pixel_values,
            grid_thw,
            perception_norm_eps=self.config.text.rms_norm_eps,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        ctx: ForwardContext,
        multimodal_embeds: torch.Tensor | None = None,
        multimodal_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states (N, H) for a flat batch of N tokens laid out by `ctx`."""
        embeds = self.embed(input_ids, multimodal_embeds, multimodal_mask)
        return self.model.language_model(embeds, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """logits = cap · tanh(multiplier · z / cap), in the model dtype and in this order (§2.7, §14.9)."""
        text = self.config.text
        # where the engine bound the C decoder stack, as many rows as its decode steps take run the C kernel too, on
        # the threads its last step ran on (one while other processes hold the cores: kernels/decoder_stack.py TeamSize)
        stack = self.model.language_model.decoder_stack
        c_rows = stack.max_rows if stack is not None and stack.max_rows is not None else 0
        return softcapped_logits(hidden, self.lm_head.weight, text.output_multiplier, text.final_logit_softcapping,
                                 c_rows=c_rows, c_threads=stack.team.last if stack is not None else None)
