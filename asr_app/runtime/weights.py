"""A Whisper decoder's weights in the layout our own decoder step reads (docs/runtime.md).

Taken from a loaded transformers model (target `WhisperForConditionalGeneration`, decoder-only draft
`WhisperForCausalLM`, or a draft with its own encoder) without copying what can be shared: the
embedding, positions, norms and MLP are the model's own tensors; only the self-attention's Q/K/V
projections are fused into one matrix (one matmul instead of three), with the query rows pre-multiplied
by Whisper's attention scale, as transformers scales the query right after its projection. The scale is
1/sqrt(head_dim) = 1/8 for every Whisper size, a power of two, so pre-scaling is bit-exact; for a head
size whose scale is not a power of two (small test models) the step scales the query after its projection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from asr_app.runtime.ops import Int8Weight, pack


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer: self-attention, cross-attention over the encoder output, MLP (pre-norm)."""

    self_norm: tuple[torch.Tensor, torch.Tensor]
    qkv_weight: torch.Tensor      # [3d, d]: query rows pre-scaled
    qkv_bias: torch.Tensor        # [3d]: the key projection has no bias in Whisper (zeros)
    self_out: tuple[torch.Tensor, torch.Tensor]
    cross_norm: tuple[torch.Tensor, torch.Tensor]
    cross_query: tuple[torch.Tensor, torch.Tensor]  # pre-scaled
    cross_key: torch.Tensor       # [d, d], no bias: applied once per window to the encoder output
    cross_value: tuple[torch.Tensor, torch.Tensor]
    cross_out: tuple[torch.Tensor, torch.Tensor]
    mlp_norm: tuple[torch.Tensor, torch.Tensor]
    fc1: tuple[torch.Tensor, torch.Tensor]
    fc2: tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class DecoderWeights:
    embed_tokens: torch.Tensor     # [V, d]; also the output layer (tied, as in every Whisper checkpoint)
    embed_positions: torch.Tensor  # [max_positions, d]
    embed_scale: float
    layers: tuple[LayerWeights, ...]
    final_norm: tuple[torch.Tensor, torch.Tensor]
    output: torch.Tensor           # [V, d]: the output layer's weight
    heads: int
    eps: float
    query_scale: float             # 1.0 when the query weights are pre-scaled (exact); else applied per step

    @property
    def d_model(self) -> int:
        return self.embed_tokens.shape[1]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def max_positions(self) -> int:
        return self.embed_positions.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device


def module_pair(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of a linear, convolution or norm module, detached."""
    return module.weight.detach(), module.bias.detach()


def query_scales(d_model: int, heads: int) -> tuple[float, float]:
    """(factor folded into the query weights, factor applied per step): Whisper's 1/sqrt(head_dim) is folded
    in where it is a power of two (multiplying by one never rounds), else applied after the projection."""
    scale = (d_model // heads) ** -0.5
    return (scale, 1.0) if math.log2(scale).is_integer() else (1.0, scale)


def fused_qkv(attn, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A self-attention's Q/K/V projections as one [3d, d] matrix and [3d] bias, the query rows multiplied
    by `scale`; the key projection has no bias in Whisper (zeros)."""
    q_w, k_w, v_w = (attn.q_proj.weight.detach(), attn.k_proj.weight.detach(), attn.v_proj.weight.detach())
    zeros = torch.zeros(k_w.shape[0], dtype=q_w.dtype, device=q_w.device)
    k_b = attn.k_proj.bias.detach() if attn.k_proj.bias is not None else zeros
    return (torch.cat([q_w * scale, k_w, v_w]).contiguous(),
            torch.cat([attn.q_proj.bias.detach() * scale, k_b, attn.v_proj.bias.detach()]))


def _layer(layer, scale: float) -> LayerWeights:
    attn, cross = layer.self_attn, layer.encoder_attn
    qkv_weight, qkv_bias = fused_qkv(attn, scale)
    return LayerWeights(
        self_norm=module_pair(layer.self_attn_layer_norm),
        qkv_weight=qkv_weight,
        qkv_bias=qkv_bias,
        self_out=module_pair(attn.out_proj),
        cross_norm=module_pair(layer.encoder_attn_layer_norm),
        cross_query=(cross.q_proj.weight.detach() * scale, cross.q_proj.bias.detach() * scale),
        cross_key=cross.k_proj.weight.detach(),
        cross_value=module_pair(cross.v_proj),
        cross_out=module_pair(cross.out_proj),
        mlp_norm=module_pair(layer.final_layer_norm),
        fc1=module_pair(layer.fc1),
        fc2=module_pair(layer.fc2),
    )


def packed_pair(weights: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) with the weight packed (`ops.pack`, in `dtype` where given and supported) and the
    bias in the packed weight's dtype."""
    packed = pack(weights[0], dtype)
    if isinstance(packed, Int8Weight):  # adds its bias after the product, in the activations' dtype
        return packed, weights[1]
    return packed, weights[1].to(packed.dtype)


def packed_layer(layer: LayerWeights, dtype: torch.dtype | None = None) -> LayerWeights:
    """`layer` with its projection matrices in the form `ops.linear` reads fastest (`ops.pack`), in
    `dtype` where given and supported (biases follow the packed matrices' dtype)."""
    qkv_weight, qkv_bias = packed_pair((layer.qkv_weight, layer.qkv_bias), dtype)
    pairs = {name: packed_pair(getattr(layer, name), dtype)
             for name in ("self_out", "cross_query", "cross_value", "cross_out", "fc1", "fc2")}
    return replace(layer, qkv_weight=qkv_weight, qkv_bias=qkv_bias, cross_key=pack(layer.cross_key, dtype), **pairs)


def decoder_weights(model, packed: bool = True, packed_dtype: torch.dtype | None = None) -> DecoderWeights:
    """The decoder weights of a Whisper model (any size; target or draft). `packed`: projection matrices
    pre-packed where that is faster (`ops.pack`: CPU fp32), in `packed_dtype` where given; the output
    layer stays dense here (a reduced head selects its rows first; `OutputHead` packs its own)."""
    config = model.config
    if getattr(config, "activation_function", "gelu") != "gelu":
        raise ValueError(f"unsupported decoder activation {config.activation_function!r} (Whisper uses gelu)")
    decoder = model.get_decoder()
    heads = config.decoder_attention_heads
    folded, per_step = query_scales(config.d_model, heads)
    with torch.no_grad():
        layers = tuple(_layer(layer, folded) for layer in decoder.layers)
        if packed:
            layers = tuple(packed_layer(layer, packed_dtype) for layer in layers)
    output = model.proj_out.weight.detach()
    return DecoderWeights(
        embed_tokens=decoder.embed_tokens.weight.detach(),
        embed_positions=decoder.embed_positions.weight.detach(),
        embed_scale=math.sqrt(config.d_model) if config.scale_embedding else 1.0,
        layers=layers,
        final_norm=module_pair(decoder.layer_norm),
        output=output,
        heads=heads,
        eps=decoder.layer_norm.eps,
        query_scale=per_step,
    )
