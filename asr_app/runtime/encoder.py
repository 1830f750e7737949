"""Our own Whisper encoder forward over the loaded checkpoint's weights (docs/runtime.md).

The same arithmetic as transformers' `WhisperEncoder` (two convolutions with GELU, sinusoidal
positions, pre-norm layers of self-attention and MLP, a final norm), run as a few large matrix
products: the self-attention's Q/K/V projections fused into one matrix with the query rows pre-scaled
(as in the decoder: bit-exact for Whisper's power-of-two scale), the MLP's GELU fused into its first
projection, every projection through `ops.linear`, which on a CPU in fp32 reads oneDNN-packed
weights, and the attention through `ops.full_attention` (oneDNN products per head there). The
encoder's 30 s window is most of a short clip's compute, so this is where a CPU spends most of its
time. Values agree with transformers' encoder to float rounding (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from asr_app.runtime.ops import full_attention, layer_norm, linear, pack
from asr_app.runtime.weights import fused_qkv, module_pair, packed_pair, query_scales


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

    @property
    def onednn(self) -> bool:
        """Attention through oneDNN exactly where the projections are oneDNN-packed (CPU fp32, packing on)."""
        return bool(self.layers) and self.layers[0].qkv_weight.is_mkldnn

    @property
    def product_dtype(self) -> torch.dtype | None:
        """bf16 for the attention's products where the projections are packed in it
        (RuntimeOptions.encoder_matmul_dtype); None: the activations' own dtype."""
        return torch.bfloat16 if self.onednn and self.layers[0].qkv_weight.dtype == torch.bfloat16 else None


def _layer(layer, scale: float, packed: bool, matmul_dtype: torch.dtype | None) -> EncoderLayerWeights:
    def projection(module) -> tuple[torch.Tensor, torch.Tensor]:
        return packed_pair(module_pair(module), matmul_dtype) if packed else module_pair(module)

    qkv_weight, qkv_bias = fused_qkv(layer.self_attn, scale)
    return EncoderLayerWeights(
        attn_norm=module_pair(layer.self_attn_layer_norm),
        qkv_weight=pack(qkv_weight, matmul_dtype) if packed else qkv_weight,
        qkv_bias=qkv_bias,
        attn_out=projection(layer.self_attn.out_proj),
        mlp_norm=module_pair(layer.final_layer_norm),
        fc1=projection(layer.fc1),
        fc2=projection(layer.fc2),
    )


def encoder_weights(model, packed: bool = True, matmul_dtype: torch.dtype | None = None) -> EncoderWeights:
    """The encoder weights of a Whisper model that has one (target, or a draft with its own encoder).
    `matmul_dtype=torch.bfloat16`: the packed projections in bf16 and the attention's products too, where the
    CPU multiplies bf16 natively (`ops.pack`; elsewhere as without it). Changes the output to bf16 rounding."""
    config = model.config
    if getattr(config, "activation_function", "gelu") != "gelu":
        raise ValueError(f"unsupported encoder activation {config.activation_function!r} (Whisper uses gelu)")
    encoder = model.get_encoder()
    heads = config.encoder_attention_heads
    folded, per_step = query_scales(config.d_model, heads)
    with torch.no_grad():
        layers = tuple(_layer(layer, folded, packed, matmul_dtype) for layer in encoder.layers)
    return EncoderWeights(
        conv1=module_pair(encoder.conv1), conv2=module_pair(encoder.conv2),
        positions=encoder.embed_positions.weight.detach(),
        layers=layers, final_norm=module_pair(encoder.layer_norm), heads=heads, eps=encoder.layer_norm.eps,
        query_scale=per_step,
    )


class EncoderRuntime:
    """A Whisper encoder run by our own code: log-mel features [B, mels, 2 * frames] -> [B, frames, d]."""

    def __init__(self, weights: EncoderWeights) -> None:
        self.weights = weights

    @classmethod
    def from_model(cls, model, packed: bool = True, matmul_dtype: torch.dtype | None = None) -> EncoderRuntime:
        return cls(encoder_weights(model, packed, matmul_dtype))

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        w = self.weights
        frames = w.positions.shape[0]
        if features.shape[-1] > 2 * frames or features.shape[-1] < 2 or features.shape[-1] % 2:
            raise ValueError(f"the encoder takes an even number of feature frames up to {2 * frames}, got "
                             f"{features.shape[-1]}")
        x = F.gelu(F.conv1d(features, *w.conv1, padding=1))
        x = F.gelu(F.conv1d(x, *w.conv2, stride=2, padding=1))
        # A shorter input (DecodingOptions.encoder_context_s) takes the first positions: its frames are the
        # window's first ones.
        x = x.transpose(1, 2) + w.positions[: x.shape[-1]]
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
        x = x + linear(full_attention(q, k, v, onednn=w.onednn, product_dtype=w.product_dtype), *layer.attn_out)
        h = layer_norm(x, layer.mlp_norm, w.eps)
        return x + linear(linear(h, *layer.fc1, activation="gelu"), *layer.fc2)
