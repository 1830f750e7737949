"""The trained draft on disk: a transformers folder `--draft DIR` loads, and the package's bundle form.

The folder is a complete `WhisperForCausalLM` checkpoint (embeddings included, tokenizer files beside it).
`bundle/` holds the same draft the way the shipped tiny.en draft is packed (tools/bundle_draft.py,
models/bundled.py): only its own tensors, float16, and the SHA-256 of the target's token embedding, since
the embeddings were frozen at the target's values and are joined from the loaded target.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import WhisperForCausalLM

from asr_app.models.bundled import embedding_fingerprint as embed_sha256  # what models/bundled.py checks

SHARED = ("model.decoder.embed_tokens.weight", "model.decoder.embed_positions.weight", "proj_out.weight")
BUNDLE = "bundle"


def save_draft(student: WhisperForCausalLM, processor, folder: Path, dtype: torch.dtype = torch.float16) -> None:
    """`student` as a transformers checkpoint in `dtype` (float16 like the released drafts), loadable
    with `--draft folder`."""
    draft = copy.deepcopy(student).to("cpu", dtype).eval()
    draft.config.architectures = ["WhisperForCausalLM"]
    for param in draft.parameters():
        param.requires_grad_(False)
    draft.save_pretrained(folder)
    processor.save_pretrained(folder)


def write_bundle(student: WhisperForCausalLM, folder: Path) -> Path:
    """The package form of the draft in `folder/bundle`: draft.safetensors (its own tensors, float16, with
    the target's embedding hash in its metadata), config.json and generation_config.json."""
    out = folder / BUNDLE
    out.mkdir(parents=True, exist_ok=True)
    state = student.state_dict()
    own = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in state.items() if k not in SHARED}
    embed = state["model.decoder.embed_tokens.weight"]
    save_file(own, str(out / "draft.safetensors"), metadata={"embed_sha256": embed_sha256(embed)})
    config = copy.deepcopy(student.config)
    config.architectures = ["WhisperForCausalLM"]
    config.dtype = "float16"
    config.save_pretrained(out)
    student.generation_config.save_pretrained(out)
    return out
