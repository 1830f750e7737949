"""Our own Whisper encoder forward over the loaded checkpoint's weights (docs/runtime.md).

The same arithmetic as transformers' `WhisperEncoder` (two convolutions with GELU, sinusoidal
positions, pre-norm layers of self-attention and MLP, a final norm), run as a few large matrix
products: the self-attention's Q/K/V projections fused into one matrix with the query rows pre-scaled
(as in the decoder: bit-exact for Whisper's power-of-two scale), the MLP's GELU fused into its first
projection, and every projection through `ops.linear`, which on a CPU in fp32 reads oneDNN-packed
weights. The encoder's 30 s window is most of a short clip's compute, so this is where a CPU spends
most of its time. Values agree with transformers' encoder to float rounding (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from asr_app.runtime.ops import layer_norm, linear, pack


@dataclass(frozen=True)
class EncoderLayerWeights:
    attn_norm: tuple[torch.Tensor, torch.Tensor]
    qkv_weight: torch.Tensor        # [3d, d]: query rows pre-scaled when the scale is a power of two
    qkv_bias: torch.Tensor          # [3d]: the key projection has no bias in Whisper (zeros)
    attn_out: tuple[torch.Tensor, torch.Tensor]
    mlp_norm: tuple[torch.Tensor, torch.Tensor]
    fc1: tuple[torch.Tensor, torch.Tensor]
    fc2: tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class EncoderWeights:
    conv1: tuple[torch.Tensor, torch.Tensor]
    conv2: tuple[torch.Tensor, torch.Tensor]
    positions: torch.Tensor         # [frames, d]
    layers: tuple[EncoderLayerWeights, ...]
    final_norm: tuple[torch.Tensor, torch.Tensor]
    heads: int
    eps: float
    query_scale: float              # 1.0 when the query weights are pre-scaled; else applied per layer


def _pair(module: torch.nn.Module, packed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    weight = module.weight.detach()
    return (pack(weight) if packed else weight), module.bias.detach()


def _layer(layer, scale: float, packed: bool) -> EncoderLayerWeights:
    attn = layer.self_attn
    q_w, k_w, v_w = (attn.q_proj.weight.detach(), attn.k_proj.weight.detach(), attn.v_proj.weight.detach())
    k_b = attn.k_proj.bias.detach() if attn.k_proj.bias is not None else torch.zeros_like(attn.v_proj.bias)
    qkv = torch.cat([q_w * scale, k_w, v_w]).contiguous()
    return EncoderLayerWeights(
        attn_norm=_pair(layer.self_attn_layer_norm),
        qkv_weight=pack(qkv) if packed else qkv,
        qkv_bias=torch.cat([attn.q_proj.bias.detach() * scale, k_b, attn.v_proj.bias.detach()]),
        attn_out=_pair(attn.out_proj, packed),
        mlp_norm=_pair(layer.final_layer_norm),
        fc1=_pair(layer.fc1, packed),
        fc2=_pair(layer.fc2, packed),
    )


def encoder_weights(model, packed: bool = True) -> EncoderWeights:
    """The encoder weights of a Whisper model that has one (target, or a draft with its own encoder)."""
    config = model.config
    if getattr(config, "activation_function", "gelu") != "gelu":
        raise ValueError(f"unsupported encoder activation {config.activation_function!r} (Whisper uses gelu)")
    encoder = model.get_encoder()
    heads = config.encoder_attention_heads
    scale = (config.d_model // heads) ** -0.5
    exact = math.log2(scale).is_integer()  # multiplying by a power of two never rounds
    with torch.no_grad():
        layers = tuple(_layer(layer, scale if exact else 1.0, packed) for layer in encoder.layers)
    return EncoderWeights(
        conv1=_pair(encoder.conv1), conv2=_pair(encoder.conv2),
        positions=encoder.embed_positions.weight.detach(),
        layers=layers, final_norm=_pair(encoder.layer_norm), heads=heads, eps=encoder.layer_norm.eps,
        query_scale=1.0 if exact else scale,
    )


class EncoderRuntime:
    """A Whisper encoder run by our own code: log-mel features [B, mels, 2 * frames] -> [B, frames, d]."""

    def __init__(self, weights: EncoderWeights) -> None:
        self.weights = weights

    @classmethod
    def from_model(cls, model, packed: bool = True) -> EncoderRuntime:
        return cls(encoder_weights(model, packed))

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        w = self.weights
        frames = w.positions.shape[0]
        x = F.gelu(F.conv1d(features, *w.conv1, padding=1))
        x = F.gelu(F.conv1d(x, *w.conv2, stride=2, padding=1))
        if x.shape[-1] != frames:
            raise ValueError(f"the encoder takes {2 * frames} feature frames, got {features.shape[-1]}")
        x = x.transpose(1, 2) + w.positions
        for layer in w.layers:
            x = self._layer(x, layer)
        return layer_norm(x, w.final_norm, w.eps)

    def _layer(self, x: torch.Tensor, layer: EncoderLayerWeights) -> torch.Tensor:
        w = self.weights
        batch, frames, width = x.shape
        h = layer_norm(x, layer.attn_norm, w.eps)
        qkv = linear(h, layer.qkv_weight, layer.qkv_bias).view(batch, frames, 3, w.heads, width // w.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, frames, hd]
        if w.query_scale != 1.0:
            q = q * w.query_scale
        attn = F.scaled_dot_product_attention(q, k, v, scale=1.0)
        x = x + linear(attn.transpose(1, 2).reshape(batch, frames, width), *layer.attn_out)
        h = layer_norm(x, layer.mlp_norm, w.eps)
        return x + linear(linear(h, *layer.fc1, activation="gelu"), *layer.fc2)
