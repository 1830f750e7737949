"""Fused decoder-layer kernels for a GPU: a layer in 8 launches instead of ~20 (docs/runtime.md, "Fused layers").

A captured decoder step on a GPU is a long chain of small kernels, and the gaps between them, plus the passes
that only add a bias, a residual or normalise one row, cost a large share of the step. Here each projection is
one Triton launch that also does the work around its product:

- `linear(x, w, b, norm=..., activation=..., residual=...)`: the input's layer norm in the prologue (each
  program normalises the few rows it multiplies; a row is a few KB and stays in cache), bias and GELU in the
  epilogue, and the residual add written in place into the residual stream;
- `qkv(...)`: the self-attention's norm and fused Q/K/V product, with the keys and values stored straight
  into the cache slots of their positions and the queries into a buffer (no separate cache writes).

A layer is then: qkv, attention, out-projection + residual, norm + cross query, cross-attention, cross
out-projection + residual, norm + fc1 + GELU, fc2 + residual.

Rounding follows the unfused step: the normalised input is rounded to the activations' dtype before its
product, the product plus bias to the output dtype before GELU and before the residual add. Sums run in fp32
in another order than cuBLAS, so values agree to rounding, not bit for bit.

On a GPU each product is a matrix-vector kernel (a handful of rows per step) whose tile, element-wise or on
the tensor cores, is tuned on its first call per matrix shape and row bucket (`triton.autotune`, in the
warm-up before a graph is captured); under Triton's CPU interpreter (tests) fixed wide tiles, element-wise
for one row and tensor-core for more. The default where steps replay CUDA graphs, since an H200 measured it
faster there (`RuntimeOptions.fused_layers`; docs/runtime.md); off on a CPU.
"""

from __future__ import annotations

import functools
import inspect

import torch

from asr_app.kernels.triton_support import HAS_TRITON, next_power_of_2, tl, triton, triton_interpreting

MAX_BLOCK_M = 16  # rows one program multiplies at once (a step's tokens x batch rows); more rows: more programs
DOT_ROWS = 16  # the fewest rows a tensor-core tile (tl.dot) takes; a step's missing rows are masked
# Under the interpreter: the depth of a tile, and its largest element-wise [rows, columns, depth] size.
INTERPRETER_DEPTH, INTERPRETER_TILE = 256, 1 << 18
_GELU_SCALE = tl.constexpr(0.7071067811865476)  # 1/sqrt(2): exact (erf) GELU, as Whisper's


@triton.jit
def _row_tile(x_ptr, rows, x_stride, k, k_in):
    """fp32 x[rows, k] (rows all in range; columns past k_in read as 0) and its [rows, columns] mask."""
    ok = (rows[:, None] >= 0) & (k[None, :] < k_in)  # the column bound, broadcast over the rows
    return tl.load(x_ptr + rows[:, None] * x_stride + k[None, :], mask=ok, other=0.0).to(tl.float32), ok


@triton.jit
def _row_stats(x_ptr, rows, x_stride, k_in, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Mean and 1/std of rows `rows` (all in range) of x over k_in columns, in two passes (no cancellation)."""
    cols = tl.arange(0, BLOCK_K)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        xk, _ = _row_tile(x_ptr, rows, x_stride, k0 + cols, k_in)
        total += tl.sum(xk, 1)
    mean = total / k_in
    squares = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        xk, ok = _row_tile(x_ptr, rows, x_stride, k0 + cols, k_in)
        centred = tl.where(ok, xk - mean[:, None], 0.0)
        squares += tl.sum(centred * centred, 1)
    return mean, 1.0 / tl.sqrt(squares / k_in + eps)


@triton.jit
def _input_tile(x_ptr, norm_w_ptr, norm_b_ptr, safe_rows, row_ok, k, k_ok, x_stride, mean, rstd, NORM: tl.constexpr):
    """x[rows, k] in x's dtype; with NORM normalised (mean, rstd per row) and rounded back to x's dtype, as the
    unfused step's layer norm output is."""
    x_ok = row_ok[:, None] & k_ok[None, :]
    xk = tl.load(x_ptr + safe_rows[:, None] * x_stride + k[None, :], mask=x_ok, other=0.0)
    if NORM:
        gain = tl.load(norm_w_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        shift = tl.load(norm_b_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        normed = (xk.to(tl.float32) - mean[:, None]) * rstd[:, None] * gain[None, :] + shift[None, :]
        xk = tl.where(x_ok, normed, 0.0).to(x_ptr.dtype.element_ty)
    return xk


@triton.jit
def _product(x_ptr, w_ptr, norm_w_ptr, norm_b_ptr, rows, row_ok, cols, col_ok, x_stride, k_in, eps,
             NORM: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N]: (norm(x) if NORM else x)[rows] @ w[cols]^T.

    DOT: tensor-core tiles (`tl.dot`, at least 16 rows, the missing ones masked): Triton stages the weight
    tiles through shared memory several iterations ahead, so a program keeps many loads in flight. Else
    element-wise: products summed per lane across the walk and reduced over the depth once at the end (a
    reduction per tile would exchange values between threads every iteration); its loads are not staged
    ahead, so it needs wide tiles (few rows) to keep enough bytes in flight."""
    safe_rows = tl.where(row_ok, rows, 0)
    mean = tl.zeros([BLOCK_M], dtype=tl.float32)
    rstd = mean
    if NORM:
        mean, rstd = _row_stats(x_ptr, safe_rows, x_stride, k_in, eps, BLOCK_M, BLOCK_K)
    offs = tl.arange(0, BLOCK_K)
    if DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        k = k0 + offs
        k_ok = k < k_in
        w = tl.load(w_ptr + cols[:, None] * k_in + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        xk = _input_tile(x_ptr, norm_w_ptr, norm_b_ptr, safe_rows, row_ok, k, k_ok, x_stride, mean, rstd, NORM)
        if DOT:  # "ieee": fp32 models keep full-precision products (no TF32); half precision is unaffected
            acc = tl.dot(xk, tl.trans(w), acc, input_precision="ieee")
        else:
            acc += xk.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    if DOT:
        product = acc
    else:
        product = tl.sum(acc, axis=2)
    return product


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, bias_ptr, norm_w_ptr, norm_b_ptr, out_ptr,
    n_rows, n_out, k_in, x_stride, out_stride, eps,
    NORM: tl.constexpr, GELU: tl.constexpr, RESIDUAL: tl.constexpr,
    DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Grid (column blocks, row blocks): out[rows, cols] = act(norm?(x) @ w^T + bias), or with RESIDUAL
    out[rows, cols] += that (out is the residual stream, updated in place)."""
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < n_rows, cols < n_out
    acc = _product(x_ptr, w_ptr, norm_w_ptr, norm_b_ptr, rows, row_ok, cols, col_ok, x_stride, k_in, eps,
                   NORM, DOT, BLOCK_M, BLOCK_N, BLOCK_K)
    acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out_type = out_ptr.dtype.element_ty
    acc = acc.to(out_type).to(tl.float32)
    if GELU:
        acc = 0.5 * acc * (1.0 + tl.erf(acc * _GELU_SCALE))
    where = out_ptr + rows[:, None] * out_stride + cols[None, :]
    ok = row_ok[:, None] & col_ok[None, :]
    if RESIDUAL:
        acc += tl.load(where, mask=ok, other=0.0).to(tl.float32)
    tl.store(where, acc.to(out_type), mask=ok)


@triton.jit
def _qkv_kernel(
    x_ptr, w_ptr, bias_ptr, norm_w_ptr, norm_b_ptr, positions_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    n_rows, tokens, width, head_dim, x_stride, cache_stride_b, cache_stride_h, cache_stride_p, eps, q_scale,
    DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Grid (column blocks of 3*width, row blocks): norm(x) @ w_qkv^T + bias; columns [0, width) go to
    q [rows, width] (times q_scale), the key and value columns into the cache slots of their rows' positions
    (row = batch * tokens + token; cache [B, H, slots, head_dim] with the given strides)."""
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < n_rows, cols < 3 * width
    acc = _product(x_ptr, w_ptr, norm_w_ptr, norm_b_ptr, rows, row_ok, cols, col_ok, x_stride, width, eps,
                   True, DOT, BLOCK_M, BLOCK_N, BLOCK_K)
    acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    value = acc.to(q_ptr.dtype.element_ty)
    section = cols // width  # 0 query, 1 key, 2 value
    col = cols % width
    ok = row_ok[:, None] & col_ok[None, :]
    scaled = (value.to(tl.float32) * q_scale).to(q_ptr.dtype.element_ty)
    tl.store(q_ptr + rows[:, None] * width + col[None, :], scaled, mask=ok & (section == 0)[None, :])
    position = tl.load(positions_ptr + rows % tokens, mask=row_ok, other=0).to(tl.int64)
    slot = ((rows // tokens).to(tl.int64) * cache_stride_b + position * cache_stride_p)[:, None] \
        + ((col // head_dim).to(tl.int64) * cache_stride_h + col % head_dim)[None, :]
    tl.store(k_cache_ptr + slot, value, mask=ok & (section == 1)[None, :])
    tl.store(v_cache_ptr + slot, value, mask=ok & (section == 2)[None, :])


_KERNELS = {"linear": _linear_kernel, "qkv": _qkv_kernel}


def row_bucket(rows: int) -> int:
    """The rows one tuned tile is chosen for: a power of two up to MAX_BLOCK_M (more rows take more programs)."""
    return min(MAX_BLOCK_M, next_power_of_2(rows))


def candidate_tiles(block_m: int) -> list:
    """The tiles (`triton.Config`s) tried on a GPU for a bucket of `block_m` rows (`row_bucket`): element-wise
    tiles of 4-8K weights per program (fewer columns per program for more rows, to keep the [rows, columns,
    depth] sums in registers) and tensor-core tiles of 16 rows, whose weight loads Triton stages ahead
    (`_product`). One row leans on the first, a speculative step's rows on the second."""
    lanes = [(8, 512, 4), (16, 256, 4), (16, 512, 8), (32, 256, 8), (4, 1024, 4), (8, 256, 2)]
    dots = [(16, 256, 4, 3), (32, 128, 4, 4), (64, 128, 4, 3), (16, 128, 4, 4)]
    if block_m > 1:
        lanes = [(8, max(64, 512 // block_m), 4), (4, 128, 4)]
    else:
        dots = dots[:2]
    return [triton.Config({"BLOCK_M": block_m, "BLOCK_N": n, "BLOCK_K": k, "DOT": False}, num_warps=w)
            for n, k, w in lanes] + \
        [triton.Config({"BLOCK_M": max(DOT_ROWS, block_m), "BLOCK_N": n, "BLOCK_K": k, "DOT": True}, num_warps=w,
                       num_stages=stages) for n, k, w, stages in dots]


def _timed(kernel_call, quantiles):
    # Triton's default spends 125 ms per tile shape; these kernels take microseconds, so 25 ms measures them
    # well and keeps a model's first step (every matrix shape x row bucket) short.
    from triton.testing import do_bench

    return do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


@functools.cache
def _tuned(kernel_name: str, block_m: int, restore: tuple[str, ...]):
    """The kernel tuned per matrix shape (and epilogue) within one row bucket (block_m): rows of one bucket
    share a tile. The choice is kept on disk where the installed Triton can (`cache_results`), so a new process
    does not tune again; buckets differ in their candidates, so they do not share a choice there either."""
    kernel = _KERNELS[kernel_name]
    key = ["k_in", "n_out", "NORM", "GELU", "RESIDUAL"] if kernel_name == "linear" else ["width"]
    disk = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    tiles = candidate_tiles(block_m)
    return triton.autotune(tiles, key=key, restore_value=list(restore), do_bench=_timed, **disk)(kernel)


def _launch(kernel_name: str, args: tuple, rows: int, columns: int, restore: tuple[str, ...],
            tile: triton.Config | None, **flags) -> None:
    block_m = row_bucket(rows)
    if tile is not None:  # one given tile shape (tests, benchmarks)
        kernel = _KERNELS[kernel_name]
        meta = {**tile.kwargs, "num_warps": tile.num_warps, "num_stages": tile.num_stages}
    elif triton_interpreting():  # programs run one after another in NumPy: few, wide ones; both kinds of tile
        kernel, dot = _KERNELS[kernel_name], rows > 1
        width = INTERPRETER_TILE // INTERPRETER_DEPTH // (1 if dot else block_m)  # the [rows, columns, depth] sums
        meta = {"BLOCK_M": max(DOT_ROWS, block_m) if dot else block_m, "BLOCK_N": min(width, next_power_of_2(columns)),
                "BLOCK_K": INTERPRETER_DEPTH, "DOT": dot}
    else:
        kernel, meta = _tuned(kernel_name, block_m, restore), {}
    kernel[lambda m: (triton.cdiv(columns, m["BLOCK_N"]), triton.cdiv(rows, m["BLOCK_M"]))](*args, **flags, **meta)


def _check(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor) or weight.is_mkldnn or weight.dim() != 2 or not weight.is_contiguous():
        raise TypeError("fused layers need dense, contiguous weight matrices (the models' own, unpacked)")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"input width {x.shape[-1]} does not match the weight's {weight.shape[1]}")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(f"input ({x.dtype}, {x.device}) and weight ({weight.dtype}, {weight.device}) must match")
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *,
           norm: tuple[torch.Tensor, torch.Tensor] | None = None, eps: float = 1e-5,
           activation: str | None = None, residual: torch.Tensor | None = None,
           tile: triton.Config | None = None) -> torch.Tensor:
    """act(norm?(x) @ weight^T + bias) [..., n]; with `residual` (contiguous [..., n]) that is added into
    `residual` in place and `residual` returned. x [..., k] with unit stride along k. `tile`: one
    `triton.Config` of `candidate_tiles` instead of the tuned choice (tests, benchmarks)."""
    flat = _check(x, weight)
    rows, n_out = flat.shape[0], weight.shape[0]
    if residual is not None:
        if not residual.is_contiguous() or residual.shape[-1] != n_out or residual.numel() != rows * n_out:
            raise ValueError("the residual stream must be contiguous [..., n] with one row per input row")
        out = residual
    else:
        out = x.new_empty(*x.shape[:-1], n_out)
    if rows == 0:
        return out
    norm_w, norm_b = norm if norm is not None else (bias, bias)
    args = (flat, weight, bias, norm_w, norm_b, out, rows, n_out, flat.shape[1], flat.stride(0), n_out, eps)
    _launch("linear", args, rows, n_out, ("out_ptr",) if residual is not None else (), tile,
            NORM=norm is not None, GELU=activation == "gelu", RESIDUAL=residual is not None)
    return out


def qkv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor],
        eps: float, q_scale: float, keys: torch.Tensor, values: torch.Tensor,
        positions: torch.Tensor, tile: triton.Config | None = None) -> torch.Tensor:
    """Queries [B, L, d] of norm(x) (x [B, L, d]); the keys and values written into `keys`/`values`
    [B, H, slots, hd] at `positions` [L] (device), as the unfused step's two `index_copy_` do. `tile`: as
    `linear`'s."""
    batch, tokens, width = x.shape
    if weight.shape[0] != 3 * width or keys.shape != values.shape or keys.stride() != values.stride():
        raise ValueError("qkv needs a [3d, d] weight and key/value caches of one layout")
    flat = _check(x, weight)
    q = x.new_empty(batch, tokens, width)
    if flat.shape[0] == 0:
        return q
    args = (flat, weight, bias, *norm, positions, q, keys, values, flat.shape[0], tokens, width,
            keys.shape[-1], flat.stride(0), keys.stride(0), keys.stride(1), keys.stride(2), eps, q_scale)
    _launch("qkv", args, flat.shape[0], 3 * width, (), tile)
    return q


# ------------------------------------------------------------------ PyTorch twins (tests)
def linear_reference(x, weight, bias, *, norm=None, eps=1e-5, activation=None, residual=None):
    """What `linear` computes, in PyTorch with the same roundings (not in place)."""
    if norm is not None:
        x = torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), norm[0].float(), norm[1].float(), eps)
        x = x.to(weight.dtype)
    out = (x.float() @ weight.float().T + bias.float()).to(weight.dtype)
    if activation == "gelu":
        out = torch.nn.functional.gelu(out.float()).to(weight.dtype)
    return out if residual is None else (residual.float() + out.float()).to(residual.dtype)


# Where fused layers are the default (RuntimeOptions.fused_layers None): what was measured faster than the
# unfused step (docs/runtime.md, "Fused layers"): steps of at most this many rows (one and six measured), on
# Hopper GPUs (an H200), with Triton installed. Beyond, the unfused step, whose products are cuBLAS's.
AUTO_MAX_ROWS = 8
AUTO_MIN_CAPABILITY = (9, 0)


def default_on(device: torch.device) -> bool:
    """Whether fused layers are the default on this CUDA device (see AUTO_MAX_ROWS)."""
    return HAS_TRITON and torch.cuda.get_device_capability(device) >= AUTO_MIN_CAPABILITY


def check_supported(device: torch.device) -> None:
    """Fused layers run where Triton does: a CUDA GPU, or Triton's CPU interpreter (tests)."""
    if not HAS_TRITON:
        raise RuntimeError("fused layers need Triton, which is not installed")
    if torch.device(device).type != "cuda" and not triton_interpreting():
        raise ValueError("fused layers run on a CUDA GPU (or under TRITON_INTERPRET=1 for tests); "
                         f"this model is on {torch.device(device).type}")
