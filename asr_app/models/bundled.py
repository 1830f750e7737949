"""The distilled drafts shipped inside the package, each joined with its target's own embeddings.

Each folder of asr_app/models/data/ that holds a `draft.safetensors` is one draft (its README says how it was
made): only the draft's own tensors; its token and positional embeddings are its target's bit for bit, so they
are copied from the loaded target, after checking that the target's token embedding is the one the draft was
distilled against (a SHA-256 stored with the tensors). A target gets the bundled draft made for it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import GenerationConfig, WhisperConfig, WhisperForCausalLM

from asr_app.models.errors import ModelLoadError

DATA_DIR = Path(__file__).with_name("data")
WEIGHTS_NAME = "draft.safetensors"
BUNDLE_DIR = DATA_DIR / "distil-tiny.en-draft"   # the first one shipped (tests export it as a folder)
WEIGHTS = BUNDLE_DIR / WEIGHTS_NAME


def embedding_fingerprint(embed: torch.Tensor) -> str:
    return hashlib.sha256(embed.detach().to("cpu", torch.float16).contiguous().numpy().tobytes()).hexdigest()


@dataclass(frozen=True)
class Bundle:
    """One shipped draft: its folder, and the target it was distilled for (named in its folder's name)."""

    folder: Path

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def target_name(self) -> str:
        """"tiny.en" of "distil-tiny.en-draft"."""
        return self.name.removeprefix("distil-").removesuffix("-draft")

    @functools.cached_property
    def fingerprint(self) -> str:
        with safe_open(str(self.folder / WEIGHTS_NAME), framework="pt") as f:
            return f.metadata()["embed_sha256"]

    @functools.cached_property
    def embedding_shape(self) -> tuple[int, int]:
        config = WhisperConfig.from_pretrained(self.folder)
        return config.vocab_size, config.d_model

    def fits(self, target) -> bool:
        """Whether `target` carries the token embedding this draft was distilled against."""
        embed = target.get_decoder().embed_tokens.weight
        return tuple(embed.shape) == self.embedding_shape and embedding_fingerprint(embed) == self.fingerprint


@functools.cache   # the package's data folder does not change while it runs: each draft's config and hash read once
def bundles() -> tuple[Bundle, ...]:
    return tuple(Bundle(f) for f in sorted(DATA_DIR.iterdir()) if (f / WEIGHTS_NAME).is_file())


def bundle_for(target) -> Bundle | None:
    """The shipped draft made for `target`, or None."""
    return next((b for b in bundles() if b.fits(target)), None)


def is_tiny_en(target) -> bool:
    """Whether `target` carries tiny.en's token embedding (what the first bundled draft was distilled against)."""
    return Bundle(BUNDLE_DIR).fits(target)


def load_bundled_draft(target, bundle: Bundle | None = None) -> WhisperForCausalLM:
    """The bundled draft made for `target` (`bundle`, when the caller has already found it), on the target's
    device and dtype."""
    bundle = bundle or bundle_for(target)
    embed = target.get_decoder().embed_tokens.weight
    same_shape = any(b.embedding_shape == tuple(embed.shape) for b in bundles())
    if bundle is None and embed.dtype == torch.bfloat16 and same_shape:
        # The fingerprint is of the float16 embedding; bfloat16 keeps fewer mantissa bits, so it cannot be matched.
        raise ModelLoadError("a bundled draft is matched to its target by the target's float16 embedding, which a "
                             "target loaded in bfloat16 no longer holds: pass --dtype float16 or float32, or --draft none")
    if bundle is None:
        made_for = " and ".join(f"Whisper {b.target_name}" for b in bundles())
        raise ModelLoadError(
            f"the bundled drafts were distilled from {made_for} and share their embeddings; the target is a "
            "different model. Pass --draft none (target only), --draft derived, or a draft made for the target")
    config = WhisperConfig.from_pretrained(bundle.folder)
    # WhisperForCausalLM(config) flips is_encoder_decoder on the object it gets (docs/ARCHITECTURE.md, "Traps"): give it a copy.
    draft = WhisperForCausalLM(copy.deepcopy(config))
    source = target.get_decoder()
    state = load_file(str(bundle.folder / WEIGHTS_NAME))
    state["model.decoder.embed_tokens.weight"] = source.embed_tokens.weight.detach().cpu()
    state["model.decoder.embed_positions.weight"] = source.embed_positions.weight.detach().cpu()
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    missing, unexpected = draft.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"the bundled draft {bundle.name} does not fit its config: missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}")
    draft.generation_config = GenerationConfig.from_pretrained(bundle.folder)
    param = next(target.parameters())
    return draft.to(device=param.device, dtype=param.dtype).eval()
