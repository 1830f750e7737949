"""Mode ``sigmoid``: the paper's softmax-free acceptance (Wagner et al. 2024), not exact.

  p_hat = sigmoid((z_target / T - alpha) / (beta - alpha)), q_hat likewise for the draft,
elementwise, with no normalisation, so no reduction over the vocabulary is needed to decide:
  draft c is accepted iff  u_c * q_hat(x_c) < p_hat(x_c)   (probability min(1, p_hat/q_hat)),
  at the first rejection n the next token is drawn from max(0, p_hat_n - q_hat_n) normalised over
  the ids the draft scores (its logit > -inf: a reduced draft head puts q_hat = 0 on the ids it
  leaves out, which would otherwise hold nearly all of the residual),
  if all are accepted (or that residual is empty) from the target's own softmax(z_target / T),
  as transformers draws its bonus token.
Why not the normalised p_hat for that last token: at the paper's alpha/beta = -/+1e3 every p_hat is
0.619-0.626, so normalised p_hat is nearly uniform over the vocabulary and each such step would add
one random token (the rule until issue 31; docs/kernels.md has the figures).
The draft samples from its own softmax, as in the paper (``draft_probs_from_logits``); the sigmoid
replaces the softmax only in acceptance and the residual.

``verify_sigmoid_torch`` is the reference; ``verify_sigmoid_triton`` takes two launches and reads
only the drafted ids plus one row per batch entry (two after a rejection):
  1. ``_accept_kernel`` grid (B, splits): acceptance from gathered logits, then per split the
     residual's sum and the target row's online (max, sum of exp);
  2. ``sampling.finalize_sample_kernel`` grid (B,): the row's log-sum-exp from those partials,
     inverse-CDF draw and the output row.
"""

from __future__ import annotations

import torch

from .common import (
    assemble_tokens,
    clamp_num_draft,
    draft_valid_mask,
    gather_at_drafts,
    inverse_cdf_sample,
    leading_true_count,
    scaled_logits,
)
from .sampling import launch_finalize, prepare_sampled_launch, sigmoid_split_stats
from .triton_support import leading_accepts, tl, triton
from .types import VerifyRandomness, VerifyResult


def sigmoid_weights(z: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """p_hat = sigmoid((z - alpha) / (beta - alpha)) for temperature-scaled float32 logits z."""
    return torch.sigmoid((z - alpha) * (1.0 / (beta - alpha)))


def sigmoid_residual(zt: torch.Tensor, zd: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """max(0, p_hat - q_hat) where the draft scores an id (zd > -inf), 0 elsewhere; zt, zd are
    temperature-scaled float32 logits of one position. The same arithmetic as ``sigmoid_weights``, in
    place: on a CPU each extra row-sized temporary costs as much as the operation that fills it."""
    inv_width = 1.0 / (beta - alpha)
    resid = (zt - alpha).mul_(inv_width).sigmoid_()
    resid.sub_((zd - alpha).mul_(inv_width).sigmoid_()).clamp_min_(0.0)
    return torch.where(torch.isneginf(zd), 0.0, resid)  # isneginf + where: a third of masked_fill's time here


def verify_sigmoid_torch(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    randomness: VerifyRandomness,
    temperature: float = 1.0,
    alpha: float = -1e3,
    beta: float = 1e3,
) -> VerifyResult:
    """PyTorch reference of the sigmoid mode (same random numbers -> same tokens as the kernels)."""
    batch, rows, _ = target_logits.shape
    gamma = rows - 1
    inv_temperature = 1.0 / temperature
    nd = clamp_num_draft(num_draft, gamma)
    u = randomness.uniforms

    # Acceptance reads the logits at the drafted ids only.
    zt_x = scaled_logits(gather_at_drafts(target_logits[:, :gamma], draft_tokens), inv_temperature)
    zd_x = scaled_logits(gather_at_drafts(draft_logits, draft_tokens), inv_temperature)
    p_x = sigmoid_weights(zt_x, alpha, beta)
    q_x = sigmoid_weights(zd_x, alpha, beta)
    accept = (u[:, :gamma] * q_x.double() < p_x.double()) & draft_valid_mask(nd, gamma)
    n = leading_true_count(accept)
    rejected = n < nd

    # The one row that is sampled: the restricted sigmoid residual after a rejection, else the target's softmax.
    zt_n = _scaled_copy(_row_at(target_logits, n), inv_temperature)
    p_n = torch.softmax(zt_n, dim=-1)
    weights = p_n
    if gamma > 0:
        zd_n = _scaled_copy(_row_at(draft_logits, n.clamp(max=gamma - 1)), inv_temperature)
        resid = sigmoid_residual(zt_n, zd_n, alpha, beta)
        use_resid = rejected & (resid.sum(dim=-1, dtype=torch.float64) > 0)  # an empty residual falls back to p
        weights = torch.where(use_resid[:, None], resid, p_n)
    next_token = inverse_cdf_sample(weights, None, u[:, gamma])
    return VerifyResult(tokens=assemble_tokens(draft_tokens, n, next_token), num_accepted=n)


def _row_at(logits: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """logits[b, n[b]] for every b, [B, V], as a fresh copy (index_select over a flat view is ~3x faster than
    advanced indexing on a CPU; strided views, as the model may give, take advanced indexing)."""
    batch, rows, vocab = logits.shape
    if logits.is_contiguous():
        return logits.view(batch * rows, vocab).index_select(0, torch.arange(batch, device=n.device) * rows + n)
    return logits[torch.arange(batch, device=n.device), n]


def _scaled_copy(rows: torch.Tensor, inv_temperature: float) -> torch.Tensor:
    """``scaled_logits`` of rows that advanced indexing has just copied: scaled in place."""
    z = rows.float()
    return z if inv_temperature == 1.0 else z.mul_(inv_temperature)


@triton.jit
def _accept_kernel(
    target_ptr, draft_ptr, draft_tokens_ptr, num_draft_ptr, uniforms_ptr,
    masses_ptr, split_max_ptr, row_n_ptr, row_lse_ptr,
    t_stride_b, t_stride_c, d_stride_b, d_stride_c, tok_stride_b,
    vocab, gamma, num_splits, inv_temperature, alpha, inv_width,
    BLOCK_V: tl.constexpr, TILES: tl.constexpr, ROWS_BLOCK: tl.constexpr,
):
    """Grid (B, splits): acceptance (recomputed by every program: g gathers), then this split's residual
    sum and (max, sum of exp) of the sampling row; program 0 records n."""
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    nd = tl.minimum(tl.maximum(tl.load(num_draft_ptr + b).to(tl.int32), 0), gamma)

    rows = tl.arange(0, ROWS_BLOCK)
    drafted = rows < nd
    x = tl.load(draft_tokens_ptr + b * tok_stride_b + rows, mask=drafted, other=0)
    x = tl.minimum(tl.maximum(x, 0), vocab - 1)
    zt_x = tl.load(target_ptr + b * t_stride_b + rows * t_stride_c + x, mask=drafted, other=float("-inf"))
    zd_x = tl.load(draft_ptr + b * d_stride_b + rows * d_stride_c + x, mask=drafted, other=float("-inf"))
    p_x = tl.sigmoid((zt_x.to(tl.float32) * inv_temperature - alpha) * inv_width)
    q_x = tl.sigmoid((zd_x.to(tl.float32) * inv_temperature - alpha) * inv_width)
    u = tl.load(uniforms_ptr + b * (gamma + 1) + rows, mask=drafted, other=1.0)
    accept = (u * q_x.to(tl.float64) < p_x.to(tl.float64)) & drafted
    n = leading_accepts(accept, rows, nd, ROWS_BLOCK)
    rejected = n < nd

    t_row = target_ptr + b * t_stride_b + n * t_stride_c
    d_row = draft_ptr + b * d_stride_b + n * d_stride_c
    resid_mass, m, s = sigmoid_split_stats(t_row, d_row, split, vocab, rejected, inv_temperature, alpha, inv_width,
                                           BLOCK_V, TILES)
    tl.store(masses_ptr + b * 2 * num_splits + split, resid_mass)
    tl.store(masses_ptr + b * 2 * num_splits + num_splits + split, s.to(tl.float64))
    tl.store(split_max_ptr + b * num_splits + split, m)
    if split == 0:
        tl.store(row_n_ptr + b, n)
        tl.store(row_lse_ptr + 2 * b, 0.0)
        tl.store(row_lse_ptr + 2 * b + 1, 0.0)


def verify_sigmoid_triton(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    randomness: VerifyRandomness,
    temperature: float = 1.0,
    alpha: float = -1e3,
    beta: float = 1e3,
    block_v: int | None = None,
    tiles: int | None = None,
) -> VerifyResult:
    """The sigmoid mode in two Triton launches; results stay on the logits' device."""
    batch, rows, vocab = target_logits.shape
    launch = prepare_sampled_launch(target_logits, draft_logits, draft_tokens, randomness, block_v, tiles)
    geo = launch.geo
    inv_temperature, inv_width = 1.0 / temperature, 1.0 / (beta - alpha)
    _accept_kernel[(batch, geo.num_splits)](
        launch.target, launch.draft, launch.draft_tokens, num_draft, launch.uniforms, launch.masses,
        launch.split_max, launch.row_n, launch.row_lse, *launch.strides, launch.draft_tokens.stride(0), vocab, rows - 1, geo.num_splits,
        inv_temperature, alpha, inv_width, BLOCK_V=geo.block_v, TILES=geo.tiles, ROWS_BLOCK=launch.rows_block,
    )
    return launch_finalize(launch, num_draft, inv_temperature, alpha, inv_width, sigmoid=True)
