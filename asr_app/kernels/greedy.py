"""Mode ``greedy`` (temperature 0): accept while the draft equals the target's argmax.

The next token is the target argmax at the first mismatch (or after the last draft). Ties go to
the lowest token id, as ``torch.argmax`` does. ``verify_greedy_torch`` is the reference;
``verify_greedy_triton`` takes two launches:
  1. ``_argmax_partials_kernel`` grid (B, g+1, splits): per-split (max, argmax) of each target row;
  2. ``_greedy_finalize_kernel`` grid (B,): row argmax from the partials, match, output row.
"""

from __future__ import annotations

import torch

from .common import assemble_tokens, clamp_num_draft, draft_valid_mask, leading_true_count
from .triton_support import (
    last_dim_contiguous,
    launch_geometry,
    leading_accepts,
    next_power_of_2,
    tl,
    triton,
    write_tokens,
)
from .types import VerifyResult


def verify_greedy_torch(
    target_logits: torch.Tensor, draft_tokens: torch.Tensor, num_draft: torch.Tensor
) -> VerifyResult:
    """PyTorch reference of greedy verification."""
    batch, rows, _ = target_logits.shape
    gamma = rows - 1
    nd = clamp_num_draft(num_draft, gamma)
    target_argmax = _first_argmax(target_logits)  # [B, g+1]
    match = (draft_tokens[:, :gamma] == target_argmax[:, :gamma]) & draft_valid_mask(nd, gamma)
    n = leading_true_count(match)
    next_token = target_argmax[torch.arange(batch, device=target_logits.device), n]
    return VerifyResult(tokens=assemble_tokens(draft_tokens, n, next_token), num_accepted=n)


def _first_argmax(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary (lowest id on ties). On CPU, half-precision argmax has no
    vectorised kernel, so rows are upcast (exactly) a few MB at a time and reduced in float32."""
    if logits.is_cuda or logits.dtype == torch.float32:
        return logits.argmax(dim=-1)
    rows = logits.reshape(-1, logits.shape[-1])
    step = max(1, (8 * 2**20) // (4 * rows.shape[-1]))
    parts = [rows[i : i + step].float().argmax(dim=-1) for i in range(0, rows.shape[0], step)]
    return torch.cat(parts).reshape(logits.shape[:-1])


@triton.jit
def _argmax_partials_kernel(
    target_ptr, num_draft_ptr, best_val_ptr, best_idx_ptr,
    t_stride_b, t_stride_c, vocab, gamma, num_splits,
    BLOCK_V: tl.constexpr, TILES: tl.constexpr,
):
    """Grid (B, g+1, splits): (max, first argmax) of target row c over this split; rows past
    num_draft are not read."""
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    split = tl.program_id(2)
    nd = tl.minimum(tl.maximum(tl.load(num_draft_ptr + b).to(tl.int32), 0), gamma)
    t_row = target_ptr + b * t_stride_b + c * t_stride_c
    offs = tl.arange(0, BLOCK_V)
    best_val = tl.full([], float("-inf"), dtype=tl.float32)
    best_idx = (split * TILES * BLOCK_V).to(tl.int32)
    limit = tl.where(c <= nd, vocab, 0)  # unused rows read nothing
    for i in tl.static_range(TILES):
        idx = (split * TILES + i) * BLOCK_V + offs
        z = tl.load(t_row + idx, mask=idx < limit, other=float("-inf")).to(tl.float32)
        tile_max = tl.max(z, axis=0)
        tile_arg = tl.min(tl.where(z == tile_max, idx, vocab + BLOCK_V), axis=0)
        better = tile_max > best_val  # strict: an earlier tile keeps ties
        best_idx = tl.where(better, tile_arg, best_idx)
        best_val = tl.where(better, tile_max, best_val)
    out = (b * (gamma + 1) + c) * num_splits + split
    tl.store(best_val_ptr + out, best_val)
    tl.store(best_idx_ptr + out, best_idx)


@triton.jit
def _greedy_finalize_kernel(
    draft_tokens_ptr, num_draft_ptr, best_val_ptr, best_idx_ptr, out_tokens_ptr, out_accepted_ptr,
    tok_stride_b, vocab, gamma, num_splits,
    ROWS_BLOCK: tl.constexpr, SPLITS_BLOCK: tl.constexpr,
):
    """Grid (B,): argmax per row from the split partials, accepted prefix, output row."""
    b = tl.program_id(0).to(tl.int64)
    nd = tl.minimum(tl.maximum(tl.load(num_draft_ptr + b).to(tl.int32), 0), gamma)
    rows = tl.arange(0, ROWS_BLOCK)
    splits = tl.arange(0, SPLITS_BLOCK)
    live = (rows <= nd)[:, None] & (splits < num_splits)[None, :]
    at = (b * (gamma + 1) + rows[:, None]) * num_splits + splits[None, :]
    vals = tl.load(best_val_ptr + at, mask=live, other=float("-inf"))
    idxs = tl.load(best_idx_ptr + at, mask=live, other=2147483647)
    row_max = tl.max(vals, axis=1)
    row_arg = tl.min(tl.where(vals == row_max[:, None], idxs, 2147483647), axis=1)

    drafted = rows < nd
    x = tl.load(draft_tokens_ptr + b * tok_stride_b + rows, mask=drafted, other=-1)
    n = leading_accepts((x == row_arg) & drafted, rows, nd, ROWS_BLOCK)
    token = tl.sum(tl.where(rows == n, row_arg, 0), axis=0)
    write_tokens(out_tokens_ptr, out_accepted_ptr, draft_tokens_ptr, tok_stride_b, b, n, token, gamma, ROWS_BLOCK)


def verify_greedy_triton(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    block_v: int | None = None,
    tiles: int | None = None,
) -> VerifyResult:
    """Greedy verification in two Triton launches; results stay on the logits' device."""
    batch, rows, vocab = target_logits.shape
    gamma = rows - 1
    device = target_logits.device
    target_logits = last_dim_contiguous(target_logits)
    if gamma == 0:
        draft_tokens = torch.zeros((batch, 1), dtype=torch.int64, device=device)
    geo = launch_geometry(vocab, block_v, tiles)
    best_val = torch.empty((batch, rows, geo.num_splits), dtype=torch.float32, device=device)
    best_idx = torch.empty((batch, rows, geo.num_splits), dtype=torch.int32, device=device)
    tokens = torch.empty((batch, rows), dtype=torch.int64, device=device)
    accepted = torch.empty(batch, dtype=torch.int64, device=device)
    _argmax_partials_kernel[(batch, rows, geo.num_splits)](
        target_logits, num_draft, best_val, best_idx, target_logits.stride(0), target_logits.stride(1),
        vocab, gamma, geo.num_splits, BLOCK_V=geo.block_v, TILES=geo.tiles,
    )
    _greedy_finalize_kernel[(batch,)](
        draft_tokens, num_draft, best_val, best_idx, tokens, accepted, draft_tokens.stride(0),
        vocab, gamma, geo.num_splits, ROWS_BLOCK=max(2, next_power_of_2(rows)), SPLITS_BLOCK=geo.splits_block,
    )
    return VerifyResult(tokens=tokens, num_accepted=accepted)
