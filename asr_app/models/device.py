"""Device and dtype resolution for model loading (a leaf module)."""

from __future__ import annotations

import torch

from asr_app.models.errors import ModelLoadError


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if isinstance(device, torch.device):
        return device
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device '{device}' requested but CUDA is not available; use --device cpu")
    return dev


_DTYPES = {
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
}


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """fp16 on CUDA and fp32 on CPU unless told otherwise (fp16 convolutions fail on CPU)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "", "auto"):
        return torch.float16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ModelLoadError(f"unknown dtype '{dtype}'; use one of: auto, {', '.join(sorted(_DTYPES))}") from None


def resolve_draft_dtype(draft_dtype: str | torch.dtype | None, device: torch.device,
                        target_dtype: torch.dtype) -> torch.dtype:
    """The draft's dtype: the target's unless told otherwise (None, "", "auto" and "same" all mean the target's).

    The draft only proposes tokens and verification decides what is kept, so its precision changes its
    acceptance rate and the speed, never the output (greedy tokens, or the sampling distribution). A whole bf16
    draft was no faster on the CPU measured (its attention is slow in bf16: docs/decoding.md); the runtime's
    default instead stores only the draft's matrices in int8 with bf16 activations
    (`RuntimeOptions.draft_matmul_dtype`).
    """
    if draft_dtype in (None, "", "auto", "same"):
        return target_dtype
    return resolve_dtype(draft_dtype, device)
