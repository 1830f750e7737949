"""Mode ``exact``: speculative sampling whose output follows the target distribution exactly.

Rules (Leviathan et al. 2023; Wagner et al. 2024 fuse them on the GPU):
  p = softmax(z_target / T), q = softmax(z_draft / T)
  draft c is accepted iff  u_c * q(x_c) < p(x_c)   (probability min(1, p/q); p = 0 never accepted)
  at the first rejection n the next token is drawn from max(0, p_n - q_n) (normalised),
  if all drafts are accepted the bonus token is drawn from p_n.
Draws use inverse CDF with the row's last uniform (see ``common.inverse_cdf_sample``).

``verify_exact_torch`` is the PyTorch reference (the CPU path); ``verify_exact_triton`` runs the
same rules in three launches with no host synchronisation:
  1. ``_row_partials_kernel``  grid (B, g+1, splits): per-split online max / sum-exp of every
     target and draft row (the paper's per-block partials of the softmax denominator);
  2. ``_accept_kernel``        grid (B, splits): combine partials into log-sum-exp, accept or
     reject the drafts from p(x_c), q(x_c) at the drafted ids only, then sum the residual (or p)
     over this split of the one row that is sampled;
  3. ``sampling.finalize_sample_kernel`` grid (B,): inverse-CDF draw and the output row.
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
from .sampling import launch_finalize, online_logsumexp, prepare_sampled_launch, split_masses
from .triton_support import leading_accepts, tl, triton
from .types import VerifyRandomness, VerifyResult

# Rows are independent and their random numbers are drawn up front, so the CPU path may work
# through the batch in chunks: probability tensors above ~32 MB are fresh mmaps whose page faults
# cost more than the softmax itself (B=16, g=20, V=51864 would be 140 MB at once).
_CHUNK_BYTES = 16 * 2**20


def verify_exact_torch(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    randomness: VerifyRandomness,
    temperature: float = 1.0,
) -> VerifyResult:
    """PyTorch reference of the exact mode (same random numbers -> same tokens as the kernels).

    p and q come from ``torch.softmax`` (fused and the fastest route on CPU) where the kernels use
    exp(z - logsumexp) from per-split partials: equal up to float rounding, which could flip an
    accept decision or a draw only if a uniform fell within ~1e-7 of the boundary.
    """
    batch, rows, vocab = target_logits.shape
    per_row = (2 * rows) * vocab * 4
    chunk = max(1, _CHUNK_BYTES // per_row)
    if target_logits.is_cuda or batch <= chunk:
        return _verify_exact_rows(target_logits, draft_logits, draft_tokens, num_draft, randomness.uniforms,
                                  temperature)
    parts = [
        _verify_exact_rows(target_logits[i : i + chunk], draft_logits[i : i + chunk], draft_tokens[i : i + chunk],
                           num_draft[i : i + chunk], randomness.uniforms[i : i + chunk], temperature)
        for i in range(0, batch, chunk)
    ]
    return VerifyResult(tokens=torch.cat([r.tokens for r in parts]),
                        num_accepted=torch.cat([r.num_accepted for r in parts]))


def _verify_exact_rows(target_logits, draft_logits, draft_tokens, num_draft, u, temperature) -> VerifyResult:
    batch, rows, _ = target_logits.shape
    gamma = rows - 1
    inv_temperature = 1.0 / temperature
    p = torch.softmax(scaled_logits(target_logits, inv_temperature), dim=-1)  # [B, g+1, V]
    q = torch.softmax(scaled_logits(draft_logits, inv_temperature), dim=-1)  # [B, g, V]
    nd = clamp_num_draft(num_draft, gamma)

    # Acceptance needs p and q only at the drafted ids.
    p_x = gather_at_drafts(p[:, :gamma], draft_tokens)
    q_x = gather_at_drafts(q, draft_tokens)
    accept = (u[:, :gamma] * q_x.double() < p_x.double()) & draft_valid_mask(nd, gamma)
    n = leading_true_count(accept)
    rejected = n < nd

    # The one row that is sampled: residual after a rejection, the target itself otherwise.
    rows_b = torch.arange(batch, device=p.device)
    p_n = p[rows_b, n]
    weights = p_n
    if gamma > 0:
        q_n = q[rows_b, n.clamp(max=gamma - 1)]
        weights = torch.where(rejected[:, None], (p_n - q_n).clamp_min(0.0), p_n)
    next_token = inverse_cdf_sample(weights, p_n, u[:, gamma])
    return VerifyResult(tokens=assemble_tokens(draft_tokens, n, next_token), num_accepted=n)


@triton.jit
def _row_partials_kernel(
    target_ptr, draft_ptr, num_draft_ptr, partials_ptr,
    t_stride_b, t_stride_c, d_stride_b, d_stride_c,
    vocab, gamma, num_splits, inv_temperature,
    BLOCK_V: tl.constexpr, TILES: tl.constexpr,
):
    """Grid (B, g+1, splits). partials[b, c, :, split] = (max_t, sumexp_t, max_d, sumexp_d).

    Rows a ragged batch does not use (target c > num_draft, draft c >= num_draft) are not read.
    """
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    split = tl.program_id(2)
    nd = tl.minimum(tl.maximum(tl.load(num_draft_ptr + b).to(tl.int32), 0), gamma)
    t_row = target_ptr + b * t_stride_b + c * t_stride_c
    d_row = draft_ptr + b * d_stride_b + c * d_stride_c
    offs = tl.arange(0, BLOCK_V)
    m_t = tl.full([], float("-inf"), dtype=tl.float32)
    s_t = tl.zeros([], dtype=tl.float32)
    m_d = tl.full([], float("-inf"), dtype=tl.float32)
    s_d = tl.zeros([], dtype=tl.float32)
    # Unused rows read nothing: their vocabulary limit is 0 (a scalar limit, not a scalar mask).
    t_limit = tl.where(c <= nd, vocab, 0)
    d_limit = tl.where(c < nd, vocab, 0)
    for i in tl.static_range(TILES):
        idx = (split * TILES + i) * BLOCK_V + offs
        zt = tl.load(t_row + idx, mask=idx < t_limit, other=float("-inf")).to(tl.float32)
        m_t, s_t = online_logsumexp(m_t, s_t, zt * inv_temperature)
        zd = tl.load(d_row + idx, mask=idx < d_limit, other=float("-inf")).to(tl.float32)
        m_d, s_d = online_logsumexp(m_d, s_d, zd * inv_temperature)
    out = partials_ptr + ((b * (gamma + 1) + c) * 4) * num_splits + split
    tl.store(out, m_t)
    tl.store(out + num_splits, s_t)
    tl.store(out + 2 * num_splits, m_d)
    tl.store(out + 3 * num_splits, s_d)


@triton.jit
def _combine_partials(m, s):
    """Per-row log-sum-exp from per-split (max, sumexp) pairs [rows, splits]; unused rows give 0."""
    m_max = tl.max(m, axis=1)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    total = tl.sum(s * tl.exp(m - m_safe[:, None]), axis=1)
    return tl.where(total > 0, m_safe + tl.log(tl.where(total > 0, total, 1.0)), 0.0)


@triton.jit
def _accept_kernel(
    target_ptr, draft_ptr, draft_tokens_ptr, num_draft_ptr, uniforms_ptr, partials_ptr,
    masses_ptr, row_n_ptr, row_lse_ptr,
    t_stride_b, t_stride_c, d_stride_b, d_stride_c, tok_stride_b,
    vocab, gamma, num_splits, inv_temperature,
    BLOCK_V: tl.constexpr, TILES: tl.constexpr, ROWS_BLOCK: tl.constexpr, SPLITS_BLOCK: tl.constexpr,
):
    """Grid (B, splits). Every program decides the row's acceptance (cheap: g gathers), then sums
    the sampling row over its split; program 0 of the row records n and the row's log-sum-exps."""
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    nd = tl.minimum(tl.maximum(tl.load(num_draft_ptr + b).to(tl.int32), 0), gamma)

    rows = tl.arange(0, ROWS_BLOCK)
    splits = tl.arange(0, SPLITS_BLOCK)
    part = partials_ptr + ((b * (gamma + 1) + rows[:, None]) * 4) * num_splits + splits[None, :]
    split_live = (splits < num_splits)[None, :]
    t_live = (rows <= nd)[:, None] & split_live
    d_live = (rows < nd)[:, None] & split_live
    lse_t = _combine_partials(tl.load(part, mask=t_live, other=float("-inf")),
                              tl.load(part + num_splits, mask=t_live, other=0.0))
    lse_d = _combine_partials(tl.load(part + 2 * num_splits, mask=d_live, other=float("-inf")),
                              tl.load(part + 3 * num_splits, mask=d_live, other=0.0))

    # Accept draft c iff u_c * q(x_c) < p(x_c), reading the logits at the drafted ids only.
    drafted = rows < nd
    x = tl.load(draft_tokens_ptr + b * tok_stride_b + rows, mask=drafted, other=0)
    x = tl.minimum(tl.maximum(x, 0), vocab - 1)
    zt_x = tl.load(target_ptr + b * t_stride_b + rows * t_stride_c + x, mask=drafted, other=float("-inf"))
    zd_x = tl.load(draft_ptr + b * d_stride_b + rows * d_stride_c + x, mask=drafted, other=float("-inf"))
    p_x = tl.exp(zt_x.to(tl.float32) * inv_temperature - lse_t)
    q_x = tl.exp(zd_x.to(tl.float32) * inv_temperature - lse_d)
    u = tl.load(uniforms_ptr + b * (gamma + 1) + rows, mask=drafted, other=1.0)
    accept = (u * q_x.to(tl.float64) < p_x.to(tl.float64)) & drafted
    n = leading_accepts(accept, rows, nd, ROWS_BLOCK)
    rejected = n < nd
    lse_t_n = tl.sum(tl.where(rows == n, lse_t, 0.0), axis=0)
    lse_d_n = tl.sum(tl.where(rows == n, lse_d, 0.0), axis=0)

    t_row = target_ptr + b * t_stride_b + n * t_stride_c
    d_row = draft_ptr + b * d_stride_b + n * d_stride_c
    resid_mass, p_mass = split_masses(t_row, d_row, split, vocab, rejected, inv_temperature, lse_t_n, lse_d_n,
                                      BLOCK_V, TILES)
    tl.store(masses_ptr + b * 2 * num_splits + split, resid_mass)
    tl.store(masses_ptr + b * 2 * num_splits + num_splits + split, p_mass)
    if split == 0:
        tl.store(row_n_ptr + b, n)
        tl.store(row_lse_ptr + 2 * b, lse_t_n)
        tl.store(row_lse_ptr + 2 * b + 1, lse_d_n)


def verify_exact_triton(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    randomness: VerifyRandomness,
    temperature: float = 1.0,
    block_v: int | None = None,
    tiles: int | None = None,
) -> VerifyResult:
    """The exact mode in three Triton launches; results stay on the logits' device."""
    batch, rows, vocab = target_logits.shape
    launch = prepare_sampled_launch(target_logits, draft_logits, draft_tokens, randomness, block_v, tiles)
    geo, inv_temperature = launch.geo, 1.0 / temperature
    partials = torch.empty((batch, rows, 4, geo.num_splits), dtype=torch.float32, device=target_logits.device)
    _row_partials_kernel[(batch, rows, geo.num_splits)](
        launch.target, launch.draft, num_draft, partials, *launch.strides,
        vocab, rows - 1, geo.num_splits, inv_temperature, BLOCK_V=geo.block_v, TILES=geo.tiles,
    )
    _accept_kernel[(batch, geo.num_splits)](
        launch.target, launch.draft, launch.draft_tokens, num_draft, launch.uniforms, partials, launch.masses,
        launch.row_n, launch.row_lse, *launch.strides, launch.draft_tokens.stride(0), vocab, rows - 1,
        geo.num_splits, inv_temperature, BLOCK_V=geo.block_v, TILES=geo.tiles, ROWS_BLOCK=launch.rows_block,
        SPLITS_BLOCK=geo.splits_block,
    )
    return launch_finalize(launch, num_draft, inv_temperature, 0.0, 1.0, sigmoid=False)
