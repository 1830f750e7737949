"""Triton import guard, launch geometry and the small Triton helpers shared by the kernels.

Triton is a Linux-only dependency. Without it this module exposes stand-ins so the kernel modules
still import (their PyTorch references keep working on CPU); launching a kernel then raises.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is not installed
    HAS_TRITON = False

    class _UnavailableKernel:
        def __init__(self, fn):
            self.__name__ = getattr(fn, "__name__", "kernel")

        def __getitem__(self, grid):
            raise RuntimeError(f"Triton is not installed; cannot launch {self.__name__}")

        def __call__(self, *args, **kwargs):
            raise RuntimeError(f"Triton is not installed; cannot call {self.__name__}")

    class _TritonStandIn:
        @staticmethod
        def jit(fn=None, **_kwargs):
            return _UnavailableKernel(fn) if fn is not None else _UnavailableKernel

    class _LanguageStandIn:
        @staticmethod
        def constexpr(value=None):  # annotations, and module constants kernels read
            return value

    triton = _TritonStandIn()  # type: ignore[assignment]
    tl = _LanguageStandIn()  # type: ignore[assignment]


def triton_interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class LaunchGeometry:
    """How the vocabulary is cut: each program walks ``tiles`` tiles of ``block_v`` logits."""

    block_v: int
    tiles: int
    num_splits: int
    splits_block: int  # power of two >= num_splits, for vector loads of per-split partials


def launch_geometry(vocab: int, block_v: int | None = None, tiles: int | None = None) -> LaunchGeometry:
    """Tile size and vocabulary split count.

    On a GPU, 1024-wide tiles and one tile per program: 51 programs per row at V=51864. Each program's
    serial work is short, and at B=1, g=5 the exact mode replayed from a CUDA graph took less than with
    4 tiles per program (H100; docs/runtime.md). The interpreter runs programs one after another in
    Python, so there fewer, wider programs are much faster.
    """
    if block_v is None:
        block_v = min(16384, next_power_of_2(vocab)) if triton_interpreting() else 1024
    if tiles is None:
        tiles = 2 if triton_interpreting() else 1
    per_split = block_v * tiles
    num_splits = (vocab + per_split - 1) // per_split
    return LaunchGeometry(block_v, tiles, num_splits, max(2, next_power_of_2(num_splits)))


def last_dim_contiguous(t):
    """The kernels index the vocabulary with unit stride; copy only when that is not already so."""
    return t if t.stride(-1) == 1 else t.contiguous()


@triton.jit
def leading_accepts(accept, rows, nd, ROWS_BLOCK: tl.constexpr):
    """Length of the accepted prefix: index of the first non-accepted draft, capped at nd."""
    first_reject = tl.min(tl.where(accept, ROWS_BLOCK, rows), axis=0)
    return tl.minimum(first_reject, nd)


@triton.jit
def write_tokens(out_tokens_ptr, out_accepted_ptr, draft_tokens_ptr, draft_stride_b, b, n, token, gamma,
                 OUT_BLOCK: tl.constexpr):
    """Row b of the result: drafts before n, ``token`` at n, -1 after (mirrors common.assemble_tokens)."""
    pos = tl.arange(0, OUT_BLOCK)
    drafts = tl.load(draft_tokens_ptr + b * draft_stride_b + pos, mask=pos < n, other=-1).to(tl.int64)
    values = tl.where(pos < n, drafts, tl.where(pos == n, token.to(tl.int64), -1))
    tl.store(out_tokens_ptr + b * (gamma + 1) + pos, values, mask=pos < gamma + 1)
    tl.store(out_accepted_ptr + b, n.to(tl.int64))
