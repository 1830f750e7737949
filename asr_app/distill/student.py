"""The student: a decoder-only draft made of the target's layers, and what of it is trained.

Distil-Whisper's initialisation (models/derive.py): the target's first and last decoder layers, its final
norm, and its token and position embeddings. The embeddings stay frozen, so they remain the target's bit
for bit and the draft can ship without them (models/bundled.py joins them at load time); the output layer
is the token embedding (tied), so the head is frozen too. Only the layers and the final norm learn.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from transformers import WhisperForCausalLM

from asr_app.decoding.alignment import FRAMES_PER_SECOND
from asr_app.decoding.engine import DRAFT_END_FRAMES
from asr_app.decoding.options import RuntimeOptions
from asr_app.models.derive import derive_draft

FROZEN = ("embed_tokens", "embed_positions", "proj_out")


def default_layers(target) -> tuple[int, ...]:
    last = target.config.decoder_layers - 1
    return (0, last) if last > 0 else (0,)


def build_student(target, layers: Sequence[int] | None = None, start: WhisperForCausalLM | None = None
                  ) -> WhisperForCausalLM:
    """A float32 copy of `layers` of the target's decoder (default: first and last), or of the draft `start`
    (a draft trained further), embeddings frozen."""
    student = (copy.deepcopy(start) if start is not None else derive_draft(target, layers or default_layers(target)))
    student = student.float()
    # No dropout: the recipe uses none, and a resumed run must compute what an uninterrupted one does.
    for name in ("dropout", "attention_dropout", "activation_dropout", "decoder_layerdrop"):
        setattr(student.config, name, 0.0)
    for name, param in student.named_parameters():
        param.requires_grad_(not any(part in name for part in FROZEN))
    return student.train()


def check_start(target, start: WhisperForCausalLM, name: str) -> None:
    """A draft to train further must hold the target's token and position embeddings (its head is the token
    embedding): they stay frozen, and the draft it becomes ships without them."""
    ours, theirs = target.get_decoder(), start.get_decoder()
    for part in ("embed_tokens", "embed_positions"):
        a, b = getattr(ours, part).weight, getattr(theirs, part).weight
        if a.shape != b.shape or not torch.equal(a.detach().cpu().half(), b.detach().cpu().half()):
            raise ValueError(f"{name} does not hold the target's {part.replace('_', ' ')}: it was not made from "
                             "this target, and a draft trained further keeps them frozen")


def trainable(student: WhisperForCausalLM) -> list[tuple[str, torch.nn.Parameter]]:
    return [(name, p) for name, p in student.named_parameters() if p.requires_grad]


def parameter_groups(student: WhisperForCausalLM, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices, none on norms and biases."""
    params = trainable(student)
    return [{"params": [p for _, p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0}]


def encoder_view(hidden: torch.Tensor, seconds: Sequence[float], view: str) -> torch.Tensor:
    """The encoder frames a batch's student reads: the whole window, or what an eager runtime step shows
    the draft (the batch's longest audio plus the runtime's margin, and the window's last frames; see
    SpeculativeDecoder._draft_view)."""
    margin = RuntimeOptions().draft_audio_margin_s
    total = hidden.shape[1]
    if view == "window" or margin is None:
        return hidden
    frames = math.ceil((max(seconds) + margin) * FRAMES_PER_SECOND)
    if frames + DRAFT_END_FRAMES >= total:
        return hidden
    return torch.cat([hidden[:, :frames], hidden[:, total - DRAFT_END_FRAMES :]], dim=1)


def head_weight(student: WhisperForCausalLM, head_ids: torch.Tensor | None) -> torch.Tensor:
    """The rows of the (frozen, tied) output layer the student's training head scores."""
    weight = student.model.decoder.embed_tokens.weight
    return weight if head_ids is None else weight.index_select(0, head_ids.to(weight.device))
