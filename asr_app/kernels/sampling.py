"""The corrected/bonus token draw shared by modes exact and sigmoid (Triton side).

Both modes end the same way: one row per batch entry (target row n, and draft row n after a
rejection) defines weights ``a(x)``: the residual after a rejection, the target's softmax
``p(x) = softmax(z_p / T)`` when every draft was accepted (and when the residual vanished). One token
is drawn by inverse CDF with the row's uniform ``u``: the first x whose cumulative weight exceeds
``u * sum(a)``. The accept kernel of each mode has already summed the weights per vocabulary split
(float64); ``finalize_sample_kernel`` finds the split holding the threshold and rescans only that split.
PyTorch reference: ``common.inverse_cdf_sample``.

The residual is ``max(0, p - q)`` with softmax p, q in mode exact; in mode sigmoid it is
``max(0, p_hat - q_hat)`` over the ids the draft scores (``sigmoid_residual``). Mode sigmoid has no
log-sum-exp of the row before its accept kernel, so that kernel records per split the online
(max, sum of exp) of the target row and the finalize kernel combines them (``SIGMOID``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .triton_support import (
    LaunchGeometry,
    last_dim_contiguous,
    launch_geometry,
    next_power_of_2,
    tl,
    triton,
    write_tokens,
)
from .types import VerifyRandomness, VerifyResult


@triton.jit
def online_logsumexp(m, s, z):
    """Fold one tile into a running (max, sum of exp(z - max)); all -inf stays (-inf, 0)."""
    m_new = tl.maximum(m, tl.max(z, axis=0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(z - m_safe), axis=0)
    return m_new, s


@triton.jit
def load_sampling_tile(t_row, d_row, idx, vocab, rejected, inv_temperature):
    """Temperature-scaled float32 logits of the sampling row over one tile; the draft row is read
    only after a rejection (-inf otherwise)."""
    d_limit = tl.where(rejected, vocab, 0)
    zt = tl.load(t_row + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temperature
    zd = tl.load(d_row + idx, mask=idx < d_limit, other=float("-inf")).to(tl.float32) * inv_temperature
    return zt, zd


@triton.jit
def sigmoid_residual(zt, zd, alpha, inv_width):
    """max(0, p_hat - q_hat) over the ids the draft scores (zd > -inf), 0 elsewhere (mirrors
    ``sigmoid.sigmoid_residual``). A reduced draft head leaves ids at -inf (q_hat = 0): without the
    restriction their p_hat (~0.62 at the paper's constants) would outweigh every scored id."""
    p_hat = tl.sigmoid((zt - alpha) * inv_width)
    q_hat = tl.sigmoid((zd - alpha) * inv_width)
    return tl.where(zd > float("-inf"), tl.maximum(p_hat - q_hat, 0.0), 0.0)


@triton.jit
def row_weights(t_row, d_row, idx, vocab, rejected, inv_temperature, lse_t, lse_d, alpha, inv_width,
                SIGMOID: tl.constexpr):
    """p = exp(z_p - lse_p) (the target's softmax, both modes) and the residual over one tile of the
    sampling row: exact max(0, p - q) (q = 0 unless the row was rejected), sigmoid ``sigmoid_residual``
    (0 unless rejected). -inf logits give weight 0."""
    zt, zd = load_sampling_tile(t_row, d_row, idx, vocab, rejected, inv_temperature)
    p = tl.exp(zt - lse_t)
    if SIGMOID:
        resid = sigmoid_residual(zt, zd, alpha, inv_width)
    else:
        resid = tl.maximum(p - tl.exp(zd - lse_d), 0.0)
    return p, resid


@triton.jit
def split_masses(t_row, d_row, split, vocab, rejected, inv_temperature, lse_t, lse_d,
                 BLOCK_V: tl.constexpr, TILES: tl.constexpr):
    """Mode exact: float64 sums of the residual and of p over this program's split of the vocabulary."""
    offs = tl.arange(0, BLOCK_V)
    resid_mass = tl.zeros([], dtype=tl.float64)
    p_mass = tl.zeros([], dtype=tl.float64)
    for i in tl.static_range(TILES):
        idx = (split * TILES + i) * BLOCK_V + offs
        p, resid = row_weights(t_row, d_row, idx, vocab, rejected, inv_temperature, lse_t, lse_d,
                               0.0, 1.0, False)
        resid_mass += tl.sum(resid.to(tl.float64), axis=0)
        p_mass += tl.sum(p.to(tl.float64), axis=0)
    return resid_mass, p_mass


@triton.jit
def sigmoid_split_stats(t_row, d_row, split, vocab, rejected, inv_temperature, alpha, inv_width,
                        BLOCK_V: tl.constexpr, TILES: tl.constexpr):
    """Mode sigmoid, one pass over this program's split: the float64 sum of the residual and the online
    (max, sum of exp(z - max)) of the target row, which ``finalize_sample_kernel`` turns into p's masses."""
    offs = tl.arange(0, BLOCK_V)
    resid_mass = tl.zeros([], dtype=tl.float64)
    m = tl.full([], float("-inf"), dtype=tl.float32)
    s = tl.zeros([], dtype=tl.float32)
    for i in tl.static_range(TILES):
        idx = (split * TILES + i) * BLOCK_V + offs
        zt, zd = load_sampling_tile(t_row, d_row, idx, vocab, rejected, inv_temperature)
        resid_mass += tl.sum(sigmoid_residual(zt, zd, alpha, inv_width).to(tl.float64), axis=0)
        m, s = online_logsumexp(m, s, zt)
    return resid_mass, m, s


@triton.jit
def finalize_sample_kernel(
    target_ptr, draft_ptr, draft_tokens_ptr, uniforms_ptr, masses_ptr, split_max_ptr, row_n_ptr, row_lse_ptr,
    num_draft_ptr, out_tokens_ptr, out_accepted_ptr,
    t_stride_b, t_stride_c, d_stride_b, d_stride_c, tok_stride_b,
    vocab, gamma, num_splits, inv_temperature, alpha, inv_width,
    BLOCK_V: tl.constexpr, TILES: tl.constexpr, SPLITS_BLOCK: tl.constexpr, OUT_BLOCK: tl.constexpr,
    SIGMOID: tl.constexpr,
):
    """Grid (B,): inverse-CDF draw of the next token, then the row's output tokens."""
    b = tl.program_id(0).to(tl.int64)
    nd = tl.minimum(tl.maximum(tl.load(num_draft_ptr + b).to(tl.int32), 0), gamma)
    n = tl.load(row_n_ptr + b)
    rejected = n < nd
    lse_d = tl.load(row_lse_ptr + 2 * b + 1)
    splits = tl.arange(0, SPLITS_BLOCK)
    live = splits < num_splits
    resid_mass = tl.load(masses_ptr + b * 2 * num_splits + splits, mask=live, other=0.0)
    p_mass = tl.load(masses_ptr + b * 2 * num_splits + num_splits + splits, mask=live, other=0.0)
    if SIGMOID:
        # p_mass holds each split's sum of exp(z - m_split): combine into the row's log-sum-exp, then
        # each split's softmax mass.
        m = tl.load(split_max_ptr + b * num_splits + splits, mask=live, other=float("-inf"))
        m_max = tl.max(m, axis=0)
        m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
        total = tl.sum(p_mass * tl.exp(m - m_safe).to(tl.float64), axis=0)
        lse_t = m_safe + tl.log(tl.where(total > 0, total, 1.0).to(tl.float32))
        p_mass = p_mass * tl.exp(m - lse_t).to(tl.float64)
    else:
        lse_t = tl.load(row_lse_ptr + 2 * b)

    # Choose residual or (all accepted, or the residual vanished) p; find the split holding the threshold.
    use_resid = tl.sum(resid_mass, axis=0) > 0
    mass = tl.where(use_resid, resid_mass, p_mass)
    cum = tl.cumsum(mass, axis=0)
    threshold = tl.load(uniforms_ptr + b * (gamma + 1) + gamma) * tl.sum(mass, axis=0)
    chosen = tl.min(tl.where((cum > threshold) & live, splits, SPLITS_BLOCK), axis=0)
    last_heavy = tl.max(tl.where((mass > 0) & live, splits, 0), axis=0)
    chosen = tl.where(chosen == SPLITS_BLOCK, last_heavy, chosen)  # rounding guard
    running = tl.sum(tl.where(splits == chosen, cum - mass, 0.0), axis=0)

    # Rescan the chosen split tile by tile with a float64 running cumulative sum.
    t_row = target_ptr + b * t_stride_b + n * t_stride_c
    d_row = draft_ptr + b * d_stride_b + n * d_stride_c
    offs = tl.arange(0, BLOCK_V)
    big = vocab + BLOCK_V
    found = tl.full([], big, dtype=tl.int32)
    last_nonzero = tl.full([], -1, dtype=tl.int32)
    for i in tl.static_range(TILES):
        idx = (chosen * TILES + i) * BLOCK_V + offs
        in_vocab = idx < vocab
        p, resid = row_weights(t_row, d_row, idx, vocab, rejected, inv_temperature, lse_t, lse_d,
                               alpha, inv_width, SIGMOID)
        a = tl.where(use_resid, resid, p)
        a64 = a.to(tl.float64)
        hit = (running + tl.cumsum(a64, axis=0) > threshold) & (a > 0) & in_vocab
        found = tl.minimum(found, tl.min(tl.where(hit, idx, big), axis=0))
        last_nonzero = tl.maximum(last_nonzero, tl.max(tl.where((a > 0) & in_vocab, idx, -1), axis=0))
        running += tl.sum(a64, axis=0)
    token = tl.where(found == big, last_nonzero, found)

    write_tokens(out_tokens_ptr, out_accepted_ptr, draft_tokens_ptr, tok_stride_b, b, n, token, gamma, OUT_BLOCK)


@dataclass
class SampledLaunch:
    """Inputs and buffers the exact and sigmoid wrappers both prepare: their accept kernel fills
    ``masses``/``row_n``/``row_lse``; ``finalize_sample_kernel`` reads them and writes the result."""

    target: torch.Tensor
    draft: torch.Tensor
    draft_tokens: torch.Tensor
    uniforms: torch.Tensor
    geo: LaunchGeometry
    strides: tuple[int, int, int, int]
    masses: torch.Tensor
    split_max: torch.Tensor  # mode sigmoid: per-split max of the target row (exact leaves it unused)
    row_n: torch.Tensor
    row_lse: torch.Tensor
    tokens: torch.Tensor
    accepted: torch.Tensor

    @property
    def rows_block(self) -> int:
        return max(2, next_power_of_2(self.target.shape[1]))


def prepare_sampled_launch(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_tokens: torch.Tensor,
                           randomness: VerifyRandomness, block_v: int | None, tiles: int | None) -> SampledLaunch:
    batch, rows, vocab = target_logits.shape
    device = target_logits.device
    target_logits = last_dim_contiguous(target_logits)
    if rows == 1:  # no draft rows: any valid tensor serves, its rows are never read
        draft_logits, draft_tokens = target_logits, torch.zeros((batch, 1), dtype=torch.int64, device=device)
    draft_logits = last_dim_contiguous(draft_logits)
    geo = launch_geometry(vocab, block_v, tiles)
    return SampledLaunch(
        target=target_logits, draft=draft_logits, draft_tokens=draft_tokens,
        uniforms=randomness.uniforms.contiguous(), geo=geo,
        strides=(target_logits.stride(0), target_logits.stride(1), draft_logits.stride(0), draft_logits.stride(1)),
        masses=torch.empty((batch, 2, geo.num_splits), dtype=torch.float64, device=device),
        split_max=torch.empty((batch, geo.num_splits), dtype=torch.float32, device=device),
        row_n=torch.empty(batch, dtype=torch.int32, device=device),
        row_lse=torch.empty((batch, 2), dtype=torch.float32, device=device),
        tokens=torch.empty((batch, rows), dtype=torch.int64, device=device),
        accepted=torch.empty(batch, dtype=torch.int64, device=device),
    )


def launch_finalize(launch: SampledLaunch, num_draft: torch.Tensor, inv_temperature: float, alpha: float,
                    inv_width: float, sigmoid: bool) -> VerifyResult:
    """The last launch of both sampled modes: the corrected/bonus draw and the output row."""
    batch, rows, vocab = launch.target.shape
    geo = launch.geo
    finalize_sample_kernel[(batch,)](
        launch.target, launch.draft, launch.draft_tokens, launch.uniforms, launch.masses, launch.split_max,
        launch.row_n, launch.row_lse, num_draft, launch.tokens, launch.accepted,
        *launch.strides, launch.draft_tokens.stride(0), vocab, rows - 1, geo.num_splits, inv_temperature, alpha,
        inv_width, BLOCK_V=geo.block_v, TILES=geo.tiles, SPLITS_BLOCK=geo.splits_block,
        OUT_BLOCK=launch.rows_block, SIGMOID=sigmoid,
    )
    return VerifyResult(tokens=launch.tokens, num_accepted=launch.accepted)
