"""Small tensor operations the decoder step is built from, chosen per device (docs/runtime.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Up to this many rows a CPU fp32 projection runs as W @ x^T (see `linear`).
SKINNY_ROWS = 16


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., k] @ weight[n, k]^T (+ bias).

    A decoding step multiplies a handful of rows by each weight matrix. On a CPU in fp32, `F.linear`
    takes a path for that shape that repacks the weight on every call, so a step that streams its
    weights from memory pays for reading them several times; `weight @ x^T` reads each once. It needs
    at least two columns to stay off the matrix-vector path, which has the same problem, so a single row
    is doubled. Same products, summed in another order: values agree to float rounding.
    """
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
    """bool [L, span]: query i (at absolute position positions[i]) sees cache slots 0..positions[i]."""
    return torch.arange(span, device=positions.device)[None, :] <= positions[:, None]
