"""Small tensor operations the decoder step is built from, chosen per device (docs/runtime.md)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Up to this many rows a CPU fp32 projection with an unpacked weight runs as W @ x^T (see `linear`).
SKINNY_ROWS = 16
# Fewer rows than this are padded (with copies of the first) before a oneDNN product with a packed weight: for
# one row oneDNN may split the sum between threads, and for two or three it took a slower path than for four
# (docs/runtime.md, "Rows per packed product"). Each row's result is the same for any row count from two on.
PACKED_MIN_ROWS = 4
ACTIVATIONS = (None, "gelu")
# How many rows an int8 weight multiplies through the int8 matrix-vector kernel (half the bytes of bf16, and
# less fixed cost per call than oneDNN) before its bf16 copy is faster: the kernel reads the weight once per
# row, which a small matrix (a layer's) affords for a few rows and a large one (the output layer) for one
# (docs/runtime.md, "int8 draft").
INT8_ROWS_SMALL, INT8_ROWS_LARGE = 4, 1
INT8_SMALL_ELEMENTS = 1 << 20
# PyTorch's int8 x bf16 kernel on AVX-512 CPUs reads its inputs 16 at a time with no tail: for a width that
# is not a multiple of 16 it reads past the row and returns garbage (wrong or inf in 23-93% of calls for widths
# 8, 24, 40, 72; right every time for 16, 48, 384). Whisper's widths are multiples of 64.
INT8_WIDTH_MULTIPLE = 16


@functools.cache
def cpu_has_amx() -> bool:
    """Whether this CPU multiplies bf16 on AMX tiles (Intel Xeon from Sapphire Rapids on), read from the
    kernel's CPU flags: a fact of the machine, so every process on it takes the same attention path."""
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text().split()
    except OSError:   # not Linux: the per-head oneDNN products, as before
        return False


@functools.cache
def onednn_packing_works(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build and CPU run `dtype` projections through oneDNN with pre-packed weights (the
    private ops PyTorch's own compiler uses on CPUs), checked once on a small case against `F.linear`."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        generator = torch.Generator().manual_seed(0)
        weight, x = torch.randn(24, 16, generator=generator), torch.randn(3, 16, generator=generator)
        weight, x = weight.to(dtype), x.to(dtype)
        out = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(weight, None),
                                                 None, "none", [], "")
    except (AttributeError, RuntimeError):  # a build without the ops, or a CPU oneDNN does not support
        return False
    tolerance = 1e-5 if dtype == torch.float32 else 5e-2
    return bool(torch.allclose(out.float(), F.linear(x, weight).float(), rtol=tolerance, atol=tolerance))


@dataclass(frozen=True)
class Int8Weight:
    """A weight [n, k] for a draft: int8 values with one scale per output row (symmetric, weight-only), and
    the same matrix packed in bf16 for calls with more than `max_rows` rows (`linear` picks)."""

    values: torch.Tensor  # int8 [n, k]
    scales: torch.Tensor  # bf16 [n]: row i of the weight is values[i] * scales[i]
    wide: torch.Tensor    # the dequantised matrix packed in bf16 (`pack`)
    max_rows: int         # calls with more rows use `wide`

    @property
    def shape(self) -> torch.Size:
        return self.values.shape


@functools.cache
def int8_matmul_works() -> bool:
    """Whether this torch build and CPU run the int8 weight-only matrix-vector kernel with bf16 activations
    (and bf16 through oneDNN, for the wide copy), checked once on a small case."""
    if not (onednn_packing_works(torch.bfloat16) and hasattr(torch, "_weight_int8pack_mm")):
        return False
    generator = torch.Generator().manual_seed(0)
    values = torch.randint(-127, 128, (24, 64), generator=generator, dtype=torch.int8)
    scales, x = torch.rand(24, generator=generator) / 64, torch.randn(1, 64, generator=generator)
    try:
        out = torch._weight_int8pack_mm(x.bfloat16(), values, scales.bfloat16())
    except (AttributeError, RuntimeError):
        return False
    reference = x.bfloat16().float() @ (values.float() * scales.bfloat16().float()[:, None]).T
    return bool(torch.allclose(out.float(), reference, rtol=2e-2, atol=2e-2))


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """`weight` [n, k] fp32 as int8 with a per-row scale (largest magnitude -> 127); k a multiple of
    INT8_WIDTH_MULTIPLE (`pack` keeps other widths in bf16)."""
    if weight.shape[1] % INT8_WIDTH_MULTIPLE:
        raise ValueError(f"the int8 kernel needs a width that is a multiple of {INT8_WIDTH_MULTIPLE}, "
                         f"got {weight.shape[1]}")
    scales = (weight.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny).bfloat16()
    values = torch.round(weight / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    dequantised = values.float() * scales.float()[:, None]
    max_rows = INT8_ROWS_SMALL if weight.numel() <= INT8_SMALL_ELEMENTS else INT8_ROWS_LARGE
    return Int8Weight(values.contiguous(), scales, pack(dequantised, torch.bfloat16), max_rows)


def pack(weight: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor | Int8Weight:
    """`weight` [n, k] in the form `linear` reads fastest on its device: on a CPU in fp32, a copy
    pre-packed into oneDNN's blocked layout (a matrix library that packs per call reads a weight three
    times; oneDNN also runs AVX-512 where MKL keeps to AVX2 on AMD CPUs: docs/runtime.md). Elsewhere the
    weight itself. The copy is extra memory: the model keeps its own tensors for transformers' modules.

    `dtype=torch.bfloat16` packs an fp32 weight in bf16 where the CPU multiplies bf16 natively (half the
    bytes to stream; `linear` casts the activations in and out): for a draft, whose precision changes
    its acceptance, never the output. Where bf16 is not supported the fp32 packing applies.

    `dtype=torch.int8`: an `Int8Weight` where the CPU runs it (`int8_matmul_works`) and the width suits the
    kernel (INT8_WIDTH_MULTIPLE), else as bf16. Also for a
    draft only: a decoding step multiplies one row per clip, and int8 halves the bytes it streams."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not onednn_packing_works():
        return weight
    if dtype == torch.int8:
        if int8_matmul_works() and weight.shape[1] % INT8_WIDTH_MULTIPLE == 0:
            return quantize_int8(weight.detach())
        dtype = torch.bfloat16
    if dtype == torch.bfloat16 and onednn_packing_works(torch.bfloat16):
        weight = weight.to(torch.bfloat16)
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def linear(x: torch.Tensor, weight: torch.Tensor | Int8Weight, bias: torch.Tensor | None = None,
           activation: str | None = None) -> torch.Tensor:
    """activation(x [..., k] @ weight[n, k]^T (+ bias)); `weight` dense or from `pack`.

    A packed weight runs in oneDNN with the activation fused. For a dense weight: a decoding step
    multiplies a handful of rows by each weight matrix. On a CPU in fp32, `F.linear` takes a path for
    that shape that repacks the weight on every call, so a step that streams its weights from memory
    pays for reading them several times; `weight @ x^T` reads each once. It needs
    at least two columns to stay off the matrix-vector path, which has the same problem, so a single row
    is doubled. Same products, summed in another order: values agree to float rounding.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if isinstance(weight, Int8Weight):
        return _int8_linear(x, weight, bias, activation)
    if weight.is_mkldnn:
        if x.dtype == weight.dtype:
            return _packed_linear(x, weight, bias, activation)
        bias = bias.to(weight.dtype) if bias is not None else None
        return _packed_linear(x.to(weight.dtype), weight, bias, activation).to(x.dtype)
    out = _dense_linear(x, weight, bias)
    return F.gelu(out) if activation == "gelu" else out


def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   activation: str | None) -> torch.Tensor:
    """oneDNN with a packed weight, over at least PACKED_MIN_ROWS rows. For one row oneDNN may split the sum
    over k between threads, and a token's values would then depend on how many tokens shared its step (the
    speculative modes must see the same numbers as target-only decoding); from two rows on, each row's
    result is the same whatever the row count and its place among them (tested). Two or three rows also
    took a slower path than four, which stream the weight at the same cost."""
    rows = x.numel() // x.shape[-1]
    if rows == 0:
        return x.new_zeros(*x.shape[:-1], weight.shape[0])
    flat = x.reshape(rows, x.shape[-1])
    if rows < PACKED_MIN_ROWS:
        flat = torch.cat([flat, flat[:1].expand(PACKED_MIN_ROWS - rows, -1)])
    out = torch.ops.mkldnn._linear_pointwise(flat.contiguous(), weight, bias, activation or "none", [],
                                             "none" if activation else "")
    return out[:rows].reshape(*x.shape[:-1], weight.shape[0])


def _int8_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None,
                 activation: str | None) -> torch.Tensor:
    """bf16 activations in, x's dtype out; the bias (in x's dtype) and GELU after the product."""
    rows = x.numel() // x.shape[-1]
    if rows > weight.max_rows or rows == 0:
        return linear(x, weight.wide, bias, activation)  # casts x and the bias to bf16, and back
    flat = x.reshape(rows, x.shape[-1]).to(torch.bfloat16)
    out = torch._weight_int8pack_mm(flat, weight.values, weight.scales).to(x.dtype)
    if bias is not None:
        out = out + bias
    if activation == "gelu":
        out = F.gelu(out)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu" or x.dtype != torch.float32 or rows > SKINNY_ROWS or rows == 0:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        flat = torch.cat([flat, flat])  # a real second row: a stride-0 view takes the slow path again
    out = torch.mm(weight, flat.t()).t()[:rows]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, onednn: bool = True,
                   product_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Unmasked attention, queries pre-scaled: q, k, v [B, H, L, hd] -> [B, L, H*hd] (the encoder's).

    With `onednn` on a CPU in fp32 (where `onednn_packing_works`), each head runs as two oneDNN products
    around a softmax: PyTorch's fused CPU attention multiplies its blocks with MKL, which keeps to AVX2
    on AMD CPUs (docs/runtime.md). The head's full score matrix is materialised (L x L floats, one head at
    a time, so memory stays bounded by the window). Elsewhere, and with `onednn=False`, PyTorch's SDPA.
    Same products, summed in another order: values agree to float rounding (tested).

    `product_dtype=torch.bfloat16` (on that oneDNN path, where the CPU multiplies bf16): both products take
    bf16 inputs and give bf16 results; the softmax over the scores runs in fp32, and the output is returned in
    fp32 (`RuntimeOptions.encoder_matmul_dtype`). On a CPU with AMX, PyTorch's fused (flash) CPU attention in
    bf16 does the same in blocks, its products on the AMX tiles, without materialising a head's scores: about
    half the time of the per-head products there (docs/runtime.md, "bf16 encoder on the CPU")."""
    if not (onednn and q.device.type == "cpu" and q.dtype == torch.float32 and onednn_packing_works()):
        return merge_heads(F.scaled_dot_product_attention(q, k, v, scale=1.0))
    low = product_dtype == torch.bfloat16 and onednn_packing_works(torch.bfloat16)
    if low and cpu_has_amx():
        bf16 = [t.to(torch.bfloat16) for t in (q, k, v)]
        return merge_heads(F.scaled_dot_product_attention(*bf16, scale=1.0)).float()
    batch, heads, length, head_dim = q.shape
    cast = (lambda t: t.to(torch.bfloat16)) if low else (lambda t: t)
    q, k = cast(q).contiguous(), cast(k).contiguous()
    v_t = cast(v.transpose(-1, -2)).contiguous()  # [B, H, hd, L]: the second product's "weight" is V^T
    product = torch.ops.mkldnn._linear_pointwise
    out = v.new_empty(batch, length, heads, head_dim)
    for b in range(batch):
        for h in range(heads):
            probs = torch.softmax(product(q[b, h], k[b, h], None, "none", [], "").float(), dim=-1)
            out[b, :, h] = product(cast(probs), v_t[b, h], None, "none", [], "")
    return out.view(batch, length, heads * head_dim)


# Without cuDNN's attention PyTorch takes the flash kernel where it applies (half precision, no mask).
_FLASH_FIRST = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A decoding step's queries over the window's keys and values (no mask; q carries the scale). On a GPU
    in half precision through the flash kernel: PyTorch's default there (cuDNN) slows down as a step scores
    more tokens, which is what a speculative step does (docs/runtime.md, "GPU")."""
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        with sdpa_kernel(list(_FLASH_FIRST)):
            return F.scaled_dot_product_attention(q, k, v, scale=1.0)
    return F.scaled_dot_product_attention(q, k, v, scale=1.0)


def layer_norm(x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor], eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), norm[0], norm[1], eps)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, L, H*hd] -> [B, H, L, hd] (a view)."""
    batch, length, width = x.shape
    return x.view(batch, length, heads, width // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, L, hd] -> [B, L, H*hd]."""
    batch, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_dim)


def visible_keys(positions: torch.Tensor, span: int) -> torch.Tensor:
    """bool [L, span]: query i (at absolute position positions[i]) sees cache slots 0..positions[i]; for
    per-row positions [B, L], bool [B, 1, L, span] (one mask per row, shared by the heads)."""
    visible = torch.arange(span, device=positions.device) <= positions[..., None]
    return visible if positions.dim() == 1 else visible[:, None]
