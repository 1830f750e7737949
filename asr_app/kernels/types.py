"""Data types of the verification step: the result record and the random numbers it consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

VerifyMode = Literal["baseline", "exact", "sigmoid", "greedy"]
VERIFY_MODES: tuple[str, ...] = ("baseline", "exact", "sigmoid", "greedy")


@dataclass
class VerifyResult:
    """Outcome of one verification step for a batch of B rows.

    tokens: int64 [B, g+1]: row b holds its ``num_accepted[b]`` accepted drafts, then the corrected
        (after a rejection) or bonus (all accepted) token, then -1 padding.
    num_accepted: int64 [B]: accepted drafts per row; the row emits ``num_accepted + 1`` tokens.
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor


@dataclass
class VerifyRandomness:
    """The random numbers one sampled verification step (modes exact, sigmoid) consumes.

    uniforms: float64 [B, g+1]. Column c < g decides draft c (accept iff ``u * q(x_c) < p(x_c)``);
    column g drives the inverse-CDF draw of the corrected/bonus token (threshold ``u * total mass``).
    float64 so that a token of tiny probability is not rounded away by a 24-bit uniform.
    The Triton kernels and their PyTorch references read the same tensor, which is what makes them
    return identical tokens.
    """

    uniforms: torch.Tensor


def draw_randomness(
    batch: int, gamma: int, device: torch.device, generator: torch.Generator | None = None
) -> VerifyRandomness:
    """Draw every random number of one step up front, on the logits' device (one RNG launch)."""
    uniforms = torch.rand((batch, gamma + 1), dtype=torch.float64, device=device, generator=generator)
    return VerifyRandomness(uniforms=uniforms)
