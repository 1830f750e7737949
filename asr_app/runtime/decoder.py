"""Our own Whisper decoder step over a preallocated KV cache (docs/runtime.md).

One code path on every device. A step embeds `L` new tokens at absolute `positions`, writes their
self-attention keys and values into the cache slots at those positions (`index_copy_`), and attends
over the first `span` slots with a mask that lets position i see slots 0..i. Eagerly the caller passes
`span = length + L`, the slots in use; a captured CUDA graph passes the whole cache, so its shapes never
change, and the mask hides the unused slots. Rolling back rejected tokens is moving the length: the
slots past it are overwritten by the next step. Cross-attention keys and values are computed once per
30 s window. Nothing here reads a value back to the host.

Positions may also be given per row, [B, L] (decoding/ragged.py: rows whose caches hold different numbers
of tokens): each row then writes its own slots and sees its own prefix (`visible_keys` per row). Unfused
layers only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from asr_app.runtime import fused
from asr_app.runtime.ops import cross_attention, layer_norm, linear, merge_heads, split_heads, visible_keys
from asr_app.runtime.vocab import OutputHead
from asr_app.runtime.weights import DecoderWeights, LayerWeights, decoder_weights


@dataclass
class DecoderState:
    """One decoder's per-window state for a batch: self-attention cache, cross-attention K/V, length."""

    self_k: torch.Tensor    # [layers, B, H, max_positions, hd]
    self_v: torch.Tensor
    cross_k: torch.Tensor   # [layers, B, H, encoder frames, hd]
    cross_v: torch.Tensor
    length: int = 0         # cache slots holding tokens of the current hypothesis

    @property
    def batch(self) -> int:
        return self.self_k.shape[1]

    def rollback(self, length: int) -> None:
        """Forget the slots from `length` on (rejected drafts): no copy, the next step overwrites them."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back a cache of length {self.length} to {length}")
        self.length = length

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (finished rows leave the batch; eager mode only)."""
        self.self_k, self.self_v = self.self_k[:, rows], self.self_v[:, rows]
        self.cross_k, self.cross_v = self.cross_k[:, rows], self.cross_v[:, rows]


def write_cache(cache: torch.Tensor, positions: torch.Tensor, new: torch.Tensor) -> None:
    """Write `new` [B, H, L, hd] into `cache` [B, H, slots, hd] at `positions` [L], or [B, L] per row."""
    if positions.dim() == 1:
        cache.index_copy_(2, positions, new)
    else:
        cache.scatter_(2, positions[:, None, :, None].expand_as(new), new)


class DecoderRuntime:
    """A Whisper decoder (target or draft) run step by step by our own code, not transformers' modules."""

    def __init__(self, weights: DecoderWeights, head: OutputHead | None = None, fused_layers: bool = False,
                 fused_max_rows: int | None = None) -> None:
        self.weights = weights
        self.head = head or OutputHead.full(weights.output)
        self.fused_layers = fused_layers
        self.fused_max_rows = fused_max_rows  # larger steps run unfused; None: every step fused

    @classmethod
    def from_model(cls, model, head_ids: torch.Tensor | None = None, packed: bool = True,
                   packed_dtype: torch.dtype | None = None, fused_layers: bool = False,
                   fused_max_rows: int | None = None) -> DecoderRuntime:
        """The runtime of `model`'s decoder; `head_ids`: score only these token ids (a reduced head);
        `packed`: weights pre-packed where that is faster (`ops.pack`), in `packed_dtype` where given
        and supported (a draft's matrices in bf16; activations, caches and attention keep the model's
        dtype). `fused_layers`: each layer through the fused Triton kernels (`runtime.fused`; a GPU, or
        Triton's interpreter), on the model's own weights (no packing), for steps of at most `fused_max_rows`
        rows (batch x tokens; None: all), the larger ones through the unfused layers on the same weights."""
        if fused_layers:
            fused.check_supported(next(model.parameters()).device)
            packed = False
        weights = decoder_weights(model, packed, packed_dtype)
        head = (OutputHead.full(weights.output, packed, packed_dtype) if head_ids is None
                else OutputHead.subset(weights.output, head_ids, packed, packed_dtype))
        return cls(weights, head, fused_layers, fused_max_rows)

    @property
    def max_positions(self) -> int:
        return self.weights.max_positions

    # ------------------------------------------------------------------ per-window state
    def new_state(self, encoder_hidden: torch.Tensor, positions: int | None = None,
                  cross: tuple[torch.Tensor, torch.Tensor] | None = None) -> DecoderState:
        """Allocate the cache for `encoder_hidden` [B, frames, d] and compute the cross K/V once.
        `positions`: self-attention slots to allocate (default the decoder's maximum). `cross`: the window's
        cross-attention K/V [layers, B, H, frames, hd], already computed from `encoder_hidden`: the state
        reads them (never writes them) instead of computing its own."""
        w = self.weights
        batch = encoder_hidden.shape[0]
        layers, heads, head_dim = len(w.layers), w.heads, w.head_dim
        shape = (layers, batch, heads, positions or w.max_positions, head_dim)
        self_k = torch.zeros(shape, dtype=w.dtype, device=w.device)
        self_v = torch.zeros(shape, dtype=w.dtype, device=w.device)
        if cross is not None:
            return DecoderState(self_k, self_v, *cross)
        cross_shape = (layers, batch, heads, encoder_hidden.shape[1], head_dim)
        state = DecoderState(self_k, self_v, torch.empty(cross_shape, dtype=w.dtype, device=w.device),
                             torch.empty(cross_shape, dtype=w.dtype, device=w.device))
        self.load_encoder(state, encoder_hidden)
        return state

    def load_encoder(self, state: DecoderState, encoder_hidden: torch.Tensor) -> None:
        """Write a new window's cross-attention K/V into `state` in place and empty its cache."""
        hidden = encoder_hidden.to(self.weights.dtype)
        heads = self.weights.heads
        for i, layer in enumerate(self.weights.layers):
            state.cross_k[i].copy_(split_heads(linear(hidden, layer.cross_key), heads))
            state.cross_v[i].copy_(split_heads(linear(hidden, *layer.cross_value), heads))
        state.length = 0

    # ------------------------------------------------------------------ the step
    def forward(self, state: DecoderState, ids: torch.Tensor, positions: torch.Tensor, span: int,
                mask: torch.Tensor | None, probe: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Hidden states [B, L, d] of tokens `ids` [B, L] at `positions` [L] or [B, L] (device); see the module doc.

        `mask` bool [L, span] (`visible_keys(positions, span)`), or None when every query sees all `span`
        slots (one new token appended eagerly). `probe`: layer index -> filled with that layer's
        cross-attention probabilities [B, H, L, frames] (word alignment reads them)."""
        w = self.weights
        x = w.embed_tokens[ids]
        if w.embed_scale != 1.0:
            x = x * w.embed_scale
        x = x + w.embed_positions[positions]
        fused = self.fused_layers and (self.fused_max_rows is None or ids.numel() <= self.fused_max_rows)
        if fused and positions.dim() > 1:
            raise ValueError("per-row positions need the unfused layers")
        layer_step = self._fused_layer if fused else self._layer
        for i, layer in enumerate(w.layers):
            x = layer_step(x, layer, state, i, positions, span, mask, probe)
        return layer_norm(x, w.final_norm, w.eps)

    def cross_attention(self, encoder_hidden: torch.Tensor, ids: torch.Tensor, layers: set[int],
                        cross: tuple[torch.Tensor, torch.Tensor] | None = None,
                        ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """One pass over the whole sequence `ids` [B, L] with a fresh cache (the decoding caches are left
        alone): the hidden states [B, L, d] and the cross-attention probabilities [B, H, L, frames] of
        `layers`. `cross`: the window's cross-attention K/V [layers, B, H, frames, hd] as the decode computed
        them from `encoder_hidden` (read, never written), instead of computing them again."""
        count = ids.shape[1]
        state = self.new_state(encoder_hidden, positions=count, cross=cross)  # one pass: room for `count` tokens
        probe = dict.fromkeys(layers)
        positions = torch.arange(count, device=ids.device)
        hidden = self.forward(state, ids, positions, count, visible_keys(positions, count), probe)
        return hidden, probe

    def _layer(self, x, layer: LayerWeights, state: DecoderState, index: int, positions, span, mask, probe=None):
        w = self.weights
        heads, width = w.heads, w.d_model
        h = layer_norm(x, layer.self_norm, w.eps)
        qkv = linear(h, layer.qkv_weight, layer.qkv_bias)
        q, k, v = (split_heads(qkv[..., j * width:(j + 1) * width], heads) for j in range(3))
        if w.query_scale != 1.0:
            q = q * w.query_scale
        keys, values = state.self_k[index], state.self_v[index]
        write_cache(keys, positions, k)
        write_cache(values, positions, v)
        attn = F.scaled_dot_product_attention(q, keys[:, :, :span], values[:, :, :span], attn_mask=mask, scale=1.0)
        x = x + linear(merge_heads(attn), *layer.self_out)

        h = layer_norm(x, layer.cross_norm, w.eps)
        attn = self._cross_attend(linear(h, *layer.cross_query), state, index, probe)
        x = x + linear(attn, *layer.cross_out)

        h = layer_norm(x, layer.mlp_norm, w.eps)
        return x + linear(linear(h, *layer.fc1, activation="gelu"), *layer.fc2)

    def _fused_layer(self, x, layer: LayerWeights, state: DecoderState, index: int, positions, span, mask,
                     probe=None):
        """`_layer` in 8 launches (`runtime.fused`); x, the residual stream, is updated in place."""
        w = self.weights
        keys, values = state.self_k[index], state.self_v[index]
        q = fused.qkv(x, layer.qkv_weight, layer.qkv_bias, layer.self_norm, w.eps, w.query_scale, keys, values,
                      positions)
        attn = F.scaled_dot_product_attention(split_heads(q, w.heads), keys[:, :, :span], values[:, :, :span],
                                              attn_mask=mask, scale=1.0)
        fused.linear(merge_heads(attn), *layer.self_out, residual=x)

        queries = fused.linear(x, *layer.cross_query, norm=layer.cross_norm, eps=w.eps)
        fused.linear(self._cross_attend(queries, state, index, probe), *layer.cross_out, residual=x)

        hidden = fused.linear(x, *layer.fc1, norm=layer.mlp_norm, eps=w.eps, activation="gelu")
        return fused.linear(hidden, *layer.fc2, residual=x)

    def _cross_attend(self, queries: torch.Tensor, state: DecoderState, index: int, probe) -> torch.Tensor:
        """Layer `index`'s cross-attention of `queries` [B, L, d] (projected, not yet scaled) over the window:
        [B, L, d]. With the layer in `probe`, its attention probabilities are written there."""
        q = split_heads(queries, self.weights.heads)
        if self.weights.query_scale != 1.0:
            q = q * self.weights.query_scale
        attn = cross_attention(q, state.cross_k[index], state.cross_v[index])
        if probe is not None and index in probe:  # the same scores SDPA used (q and k carry the scale)
            probe[index] = torch.softmax((q @ state.cross_k[index].transpose(-1, -2)).float(), dim=-1)
        return merge_heads(attn)

    def step(self, state: DecoderState, ids: torch.Tensor) -> torch.Tensor:
        """Eager convenience: append `ids` [B, L] after the cache's `length` tokens; hidden [B, L, d]."""
        start, count = state.length, ids.shape[1]
        if start + count > self.max_positions:
            raise ValueError(f"{start + count} tokens exceed the decoder's {self.max_positions} positions")
        positions = torch.arange(start, start + count, device=ids.device)
        span = start + count
        mask = None if count == 1 else visible_keys(positions, span)
        hidden = self.forward(state, ids, positions, span, mask)
        state.length = span
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output-layer scores [B, L, K] of hidden [B, L, d] over the head's K token ids."""
        return self.head.logits(hidden)
