"""Derive a decoder-only draft from a target by keeping a subset of its decoder layers.

This is the Distil-Whisper initialisation (maximally spaced teacher layers, shared encoder) without
the distillation: useful where no distilled draft exists and for tests with the real tiny.en.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import WhisperForCausalLM, WhisperForConditionalGeneration


def derive_draft(target: WhisperForConditionalGeneration, layers: Sequence[int] = (0, 3)) -> WhisperForCausalLM:
    """A `WhisperForCausalLM` holding copies of `target`'s decoder layers `layers` (plus embeddings,
    positions and final norm); it runs on the target's encoder output."""
    n_layers = target.config.decoder_layers
    layers = list(layers)
    if not layers or any(not 0 <= i < n_layers for i in layers):
        raise ValueError(f"layers {layers} must be a non-empty subset of 0..{n_layers - 1}")
    # WhisperForCausalLM(config) flips config.is_encoder_decoder on the object it is given: copy first.
    config = copy.deepcopy(target.config)
    config.decoder_layers = len(layers)
    config.architectures = ["WhisperForCausalLM"]
    param = next(target.parameters())
    draft = WhisperForCausalLM(config).to(device=param.device, dtype=param.dtype)
    src = target.model.decoder
    dst = draft.model.decoder
    with torch.no_grad():
        dst.embed_tokens.weight.copy_(src.embed_tokens.weight)
        dst.embed_positions.weight.copy_(src.embed_positions.weight)
        dst.layer_norm.load_state_dict(src.layer_norm.state_dict())
        for new_index, old_index in enumerate(layers):
            dst.layers[new_index].load_state_dict(src.layers[old_index].state_dict())
        draft.proj_out.weight.copy_(target.proj_out.weight)
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()
