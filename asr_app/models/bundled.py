"""The distilled tiny.en draft shipped inside the package, joined with tiny.en's own embeddings.

See asr_app/models/data/distil-tiny.en-draft/README.md: the package holds only the draft's own tensors;
its token and positional embeddings are tiny.en's bit for bit, so they are copied from the loaded target,
after checking that the target's token embedding is tiny.en's (a SHA-256 stored with the tensors).
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import GenerationConfig, WhisperConfig, WhisperForCausalLM

from asr_app.models.errors import ModelLoadError

BUNDLE_DIR = Path(__file__).with_name("data") / "distil-tiny.en-draft"
WEIGHTS = BUNDLE_DIR / "draft.safetensors"


def embedding_fingerprint(embed: torch.Tensor) -> str:
    return hashlib.sha256(embed.detach().to("cpu", torch.float16).contiguous().numpy().tobytes()).hexdigest()


def expected_fingerprint() -> str:
    with safe_open(str(WEIGHTS), framework="pt") as f:
        return f.metadata()["embed_sha256"]


def is_tiny_en(target) -> bool:
    """Whether `target` carries tiny.en's token embedding (what the bundled draft was distilled against)."""
    embed = target.get_decoder().embed_tokens.weight
    return tuple(embed.shape) == (51864, 384) and embedding_fingerprint(embed) == expected_fingerprint()


def load_bundled_draft(target) -> WhisperForCausalLM:
    """The bundled draft for `target` (which must be tiny.en), on the target's device and dtype."""
    if not is_tiny_en(target):
        raise ModelLoadError(
            "the bundled draft was distilled from Whisper tiny.en and shares its embeddings; the target is a "
            "different model. Pass --draft none (target only), --draft derived, or a draft made for the target")
    config = WhisperConfig.from_pretrained(BUNDLE_DIR)
    # WhisperForCausalLM(config) flips is_encoder_decoder on the object it gets (docs/ARCHITECTURE.md, "Traps"): give it a copy.
    draft = WhisperForCausalLM(copy.deepcopy(config))
    source = target.get_decoder()
    state = load_file(str(WEIGHTS))
    state["model.decoder.embed_tokens.weight"] = source.embed_tokens.weight.detach().cpu()
    state["model.decoder.embed_positions.weight"] = source.embed_positions.weight.detach().cpu()
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    missing, unexpected = draft.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"the bundled draft does not fit its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    draft.generation_config = GenerationConfig.from_pretrained(BUNDLE_DIR)
    param = next(target.parameters())
    return draft.to(device=param.device, dtype=param.dtype).eval()
