"""PyTorch building blocks shared by the reference implementations of every mode.

Each helper mirrors one step that the Triton kernels also perform, so a reader can put a kernel
and its reference side by side.
"""

from __future__ import annotations

import torch


def scaled_logits(logits: torch.Tensor, inv_temperature: float) -> torch.Tensor:
    """float32 logits divided by the temperature (as a multiplication, like the kernels do)."""
    z = logits.float()
    return z if inv_temperature == 1.0 else z * inv_temperature


def clamp_num_draft(num_draft: torch.Tensor, gamma: int) -> torch.Tensor:
    """num_draft as int64 in [0, gamma] (the kernels clamp the same way, on the device)."""
    return num_draft.to(torch.int64).clamp(0, gamma)


def draft_valid_mask(num_draft: torch.Tensor, gamma: int) -> torch.Tensor:
    """bool [B, gamma]: True where draft c of row b takes part (c < num_draft[b])."""
    return torch.arange(gamma, device=num_draft.device)[None, :] < num_draft[:, None]


def leading_true_count(flags: torch.Tensor) -> torch.Tensor:
    """int64 [B]: how many leading entries of each row are True (the accepted prefix length)."""
    if flags.shape[-1] == 0:
        return torch.zeros(flags.shape[0], dtype=torch.int64, device=flags.device)
    return flags.to(torch.int64).cumprod(dim=-1).sum(dim=-1)


def gather_at_drafts(z: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """z[b, c, x_c] for c < g; out-of-range ids (padding such as -1) read id 0 and are masked later."""
    ids = draft_tokens.clamp(0, z.shape[-1] - 1)
    return z.gather(-1, ids[..., None])[..., 0]


def inverse_cdf_sample(weights: torch.Tensor, fallback: torch.Tensor | None, uniform: torch.Tensor) -> torch.Tensor:
    """One index per row from unnormalised non-negative ``weights`` [B, V] by inverse CDF.

    The cumulative sums run in float64 so that the Triton kernel (which sums tiles in a different
    order) lands on the same index except with probability ~1e-12. Index i is chosen when
    ``cdf[i-1] <= u * total < cdf[i]``, so a zero-weight token can never be chosen. A row whose
    weights are all zero (a residual max(0, p - q) that vanished numerically) uses ``fallback``;
    None: the caller has already made sure no row is empty (this saves a pass over the rows).
    """
    if fallback is not None:
        empty = weights.sum(dim=-1, dtype=torch.float64) <= 0
        weights = torch.where(empty[:, None], fallback, weights)  # no host read of `empty`: graph-safe
    cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)
    threshold = uniform.double() * cdf[:, -1]
    index = torch.searchsorted(cdf, threshold[:, None], right=True)[:, 0]
    return index.clamp_(max=weights.shape[-1] - 1)


def assemble_tokens(
    draft_tokens: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor
) -> torch.Tensor:
    """int64 [B, g+1]: accepted drafts, then ``next_token`` at position num_accepted, then -1."""
    batch, gamma = draft_tokens.shape
    positions = torch.arange(gamma + 1, device=draft_tokens.device)[None, :]
    padded_drafts = torch.cat(
        [draft_tokens.to(torch.int64), torch.full((batch, 1), -1, dtype=torch.int64, device=draft_tokens.device)],
        dim=1,
    )
    n = num_accepted[:, None]
    tokens = torch.where(positions < n, padded_drafts, torch.full_like(padded_drafts, -1))
    return torch.where(positions == n, next_token.to(torch.int64)[:, None], tokens)
