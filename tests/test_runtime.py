"""The decoding runtime: our own decoder step against transformers' modules, cache rollback, the reduced
draft head, and capture safety of the graph-captured steps (emulated on the CPU)."""

from __future__ import annotations

import inspect

import pytest
import torch
from test_decoding_greedy import load_clip
from transformers import DynamicCache, EncoderDecoderCache

from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.decoding.engine import DRAFT_END_FRAMES
from asr_app.decoding.prompt import build_prompt
from asr_app.decoding.steps import Steps
from asr_app.runtime import (
    DecoderRuntime,
    EncoderRuntime,
    HostReadError,
    OutputHead,
    TokenSpace,
    draft_vocabulary,
    no_host_reads,
)
from asr_app.runtime.ops import (
    Int8Weight,
    full_attention,
    int8_matmul_works,
    linear,
    merge_heads,
    onednn_packing_works,
    pack,
    quantize_int8,
)
from asr_app.runtime.vocab import RANKING_FILE

needs_onednn = pytest.mark.skipif(not onednn_packing_works(), reason="this torch build has no oneDNN linear ops")


def transformers_hidden(model, ids, encoder_hidden, cache=None):
    decoder = model.get_decoder()
    cache = cache if cache is not None else EncoderDecoderCache(DynamicCache(), DynamicCache())
    # transformers 5.24 renamed the decoder's `past_key_values` to `cache` (the old name warns, then goes)
    name = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    out = decoder(input_ids=ids, encoder_hidden_states=encoder_hidden, use_cache=True, **{name: cache})
    return out.last_hidden_state, cache  # updated in place


@pytest.fixture(scope="module")
def real_encoded(tiny_en_pair):
    from conftest import JFK_FLAC

    clip = load_clip(JFK_FLAC)
    feats = tiny_en_pair.processor.feature_extractor(clip, sampling_rate=16_000, return_tensors="pt").input_features
    with torch.inference_mode():
        return tiny_en_pair.target.get_encoder()(feats).last_hidden_state


def jfk_opening():
    """The first 8 s of the JFK clip ("And so, my fellow Americans, ask not what your country can do for you"):
    15 tokens, enough for every step kind (prompt, draft, verify, rollback, end of text) at half the decode time
    of the whole clip, for the tests that decode it many times."""
    from conftest import JFK_FLAC

    return load_clip(JFK_FLAC)[: 8 * 16_000]


@torch.inference_mode()
def test_decoder_step_matches_transformers_and_rolls_back(tiny_en_pair, real_encoded):
    target = tiny_en_pair.target
    runtime = DecoderRuntime.from_model(target)
    prompt = torch.tensor([[50257, 50362]])
    steps = [torch.tensor([[400, 401, 402]]), torch.tensor([[403]]), torch.tensor([[404, 405]])]
    state = runtime.new_state(real_encoded)
    ours = [runtime.step(state, prompt)] + [runtime.step(state, ids) for ids in steps]
    ref, cache = transformers_hidden(target, prompt, real_encoded)
    refs = [ref]
    for ids in steps:
        ref, cache = transformers_hidden(target, ids, real_encoded, cache)
        refs.append(ref)
    for a, b in zip(ours, refs):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4)
    assert state.length == 2 + 3 + 1 + 2
    # Rolling back is moving the length: feeding other tokens after it equals never having fed the rejected ones.
    state.rollback(3)  # keep the prompt and token 400
    after = runtime.step(state, torch.tensor([[500, 501]]))
    fresh = runtime.new_state(real_encoded)
    runtime.step(fresh, torch.tensor([[50257, 50362, 400]]))
    # Equal to rounding, not bit for bit: attention over 5 slots with 2 masked and over 3 slots sums in
    # another order. A leak of the rejected slots would differ by the size of the values themselves.
    torch.testing.assert_close(after, runtime.step(fresh, torch.tensor([[500, 501]])), atol=2e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="roll back"):
        state.rollback(state.length + 1)


@needs_onednn
def test_onednn_attention_matches_pytorch_attention():
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 300, 64, generator=generator) * 0.3 for _ in range(3))
    reference = merge_heads(torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0))
    assert torch.equal(full_attention(q, k, v, onednn=False), reference)
    # Strided views as the encoder passes them (heads split out of the fused QKV output).
    qkv = torch.stack([q, k, v]).permute(1, 3, 0, 2, 4).contiguous()  # [B, L, 3, H, hd]
    q_view, k_view, v_view = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    fast = full_attention(q_view, k_view, v_view)
    assert fast.shape == (2, 300, 3 * 64)
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-4)
    # Each (clip, head) is its own product: a wrong head or clip index would differ by the values' size.
    assert not torch.allclose(fast[1], reference[0], atol=1e-2)


@needs_onednn
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_linear_matches_dense_and_does_not_depend_on_the_row_count(threads):
    # A token's numbers must not depend on how many tokens shared its step, or a speculative step (g + 1
    # rows) and a target-only step (one row) would score the same token differently.
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(1)
        for n, k in [(1152, 384), (384, 1536), (51864, 384), (1280, 5120)]:
            weight, bias = torch.randn(n, k, generator=generator), torch.randn(n, generator=generator)
            x = torch.randn(24, k, generator=generator)
            packed = pack(weight)
            assert packed.is_mkldnn and not weight.is_mkldnn
            torch.testing.assert_close(linear(x, packed, bias), torch.nn.functional.linear(x, weight, bias),
                                       atol=2e-3, rtol=1e-4)
            torch.testing.assert_close(linear(x, packed, bias, "gelu"),
                                       torch.nn.functional.gelu(torch.nn.functional.linear(x, weight, bias)),
                                       atol=2e-3, rtol=1e-4)
            for rows in (1, 2, 3, 6, 11, 24):  # fewer than ops.PACKED_MIN_ROWS are padded: only theirs come back
                together = linear(x[:rows], packed, bias)
                torch.testing.assert_close(together, torch.nn.functional.linear(x[:rows], weight, bias),
                                           atol=2e-3, rtol=1e-4)
                for j in range(rows):
                    assert torch.equal(together[j], linear(x[j : j + 1], packed, bias)[0]), (n, k, rows, j)
            assert linear(x[:0], packed).shape == (0, n)
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not onednn_packing_works(torch.bfloat16), reason="this CPU has no oneDNN bf16 matmul")
def test_bf16_packing_keeps_the_callers_dtype():
    generator = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(16384, 384, generator=generator), torch.randn(16384, generator=generator)
    x = torch.randn(3, 384, generator=generator)
    packed = pack(weight, torch.bfloat16)
    assert packed.is_mkldnn and packed.dtype == torch.bfloat16
    out = linear(x, packed, bias)
    assert out.dtype == torch.float32
    reference = torch.nn.functional.linear(x, weight, bias)
    assert 0 < (out - reference).abs().max() < 0.02 * reference.abs().max()  # bf16 rounding, not fp32's


needs_int8 = pytest.mark.skipif(not int8_matmul_works(), reason="this CPU or torch build has no int8 x bf16 kernel")


@needs_int8
def test_int8_weights_match_their_dequantised_matrix_at_every_row_count():
    generator = torch.Generator().manual_seed(3)
    for n, k in [(1152, 384), (384, 1536), (16384, 384)]:
        weight, bias = torch.randn(n, k, generator=generator) / 20, torch.randn(n, generator=generator)
        packed = pack(weight, torch.int8)
        assert isinstance(packed, Int8Weight) and packed.shape == (n, k) and packed.values.dtype == torch.int8
        dequantised = packed.values.float() * packed.scales.float()[:, None]
        # within half a step of the row's scale: the rounding is right, not merely the magnitude
        assert ((dequantised - weight).abs() <= packed.scales.float()[:, None] * 0.502).all()
        assert packed.max_rows == (4 if n * k <= 1 << 20 else 1)
        x = torch.randn(2, 3, k, generator=generator)
        reference = torch.nn.functional.linear(x, dequantised, bias)
        for rows in (1, packed.max_rows, packed.max_rows + 1, 6):  # the int8 kernel, then the bf16 copy
            flat = x.reshape(6, k)[:rows]
            for activation, expected in ((None, reference), ("gelu", torch.nn.functional.gelu(reference))):
                out = linear(flat, packed, bias, activation)
                assert out.dtype == torch.float32 and out.shape == (rows, n)
                error = (out - expected.reshape(6, n)[:rows]).abs().max()
                assert error < 0.02 * expected.abs().max(), (n, k, rows, activation, error)
        assert linear(x, packed, bias).shape == (2, 3, n)  # leading dimensions kept
        assert linear(x[:, :0], packed).shape == (2, 0, n)


@needs_int8
def test_int8_quantisation_keeps_zero_rows_and_extremes():
    weight = torch.zeros(4, 16)
    weight[1, 3], weight[2] = -5.0, torch.linspace(-1, 1, 16)
    packed = quantize_int8(weight)
    assert packed.values[0].eq(0).all() and packed.values[1, 3] == -127 and packed.values[2].abs().max() == 127
    out = linear(torch.ones(1, 16), packed)
    assert torch.allclose(out, torch.tensor([[0.0, -5.0, 0.0, 0.0]]), atol=0.05), out


@needs_int8
def test_int8_packing_keeps_widths_the_kernel_misreads_in_bf16():
    # The kernel reads 16 inputs at a time: at width 24 it read past each row (wrong or inf in most calls).
    generator = torch.Generator().manual_seed(4)
    weight, x = torch.randn(8, 24, generator=generator), torch.randn(1, 24, generator=generator)
    packed = pack(weight, torch.int8)
    assert not isinstance(packed, Int8Weight) and packed.dtype == torch.bfloat16
    assert torch.allclose(linear(x, packed), x @ weight.T, rtol=0.05, atol=0.05)
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_int8(weight)


@torch.inference_mode()
def test_draft_matmul_dtype_changes_speed_not_tokens(tiny_en_pair):
    clip = jfk_opening()
    default = SpeculativeDecoder(tiny_en_pair)
    bf16 = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(draft_matmul_dtype="bfloat16"))
    same = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(draft_matmul_dtype="same"))
    if int8_matmul_works():
        assert isinstance(default.draft_runtime.head.weight, Int8Weight)
        assert isinstance(default.draft_runtime.weights.layers[0].fc1[0], Int8Weight)
    if onednn_packing_works(torch.bfloat16):
        assert bf16.draft_runtime.head.weight.dtype == torch.bfloat16
    assert same.draft_runtime.head.weight.dtype == torch.float32
    for decoder in (default, bf16):  # the target is never reduced
        assert decoder.target_runtime.head.weight.dtype == torch.float32
        assert not isinstance(decoder.target_runtime.weights.layers[0].fc1[0], Int8Weight)
    for timestamps in (False, True):
        off = default.decode(clip, DecodingOptions(mode="off", timestamps=timestamps))[0].tokens
        for decoder in (default, bf16, same):
            result = decoder.decode(clip, DecodingOptions(mode="exact", timestamps=timestamps))[0]
            assert result.tokens == off and result.stats.accepted > 0


@torch.inference_mode()
def test_the_draft_attends_to_the_audio_not_the_padding(tiny_en_pair):
    from conftest import JFK_FLAC

    clip = load_clip(JFK_FLAC)  # 11 s in a 30 s window
    short = clip[: 3 * 16_000]
    audio_only = SpeculativeDecoder(tiny_en_pair)
    whole = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(draft_audio_margin_s=None))
    captured = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(cuda_graphs="emulate"))
    frames = torch.arange(1500.0)[None, :, None].expand(2, 1500, 8)
    view = audio_only._draft_view(frames, [3.0, 11.0])  # the longest row's (11 + 1) s x 50, and the end
    assert torch.equal(view[0, :, 0], torch.cat([torch.arange(600.0), torch.arange(1500.0 - DRAFT_END_FRAMES, 1500)]))
    assert audio_only._draft_view(frames, [29.5]) is frames
    assert whole._draft_view(frames, [3.0]) is frames and captured._draft_view(frames, [3.0]) is frames
    # The batch holds both cases: its long row is decoded with the view a lone 11 s clip gets (cut at the longest
    # row), its short row with a view that reaches past its own audio.
    clips = [short, clip]
    for timestamps in (False, True):
        expected = [r.tokens for r in whole.decode(clips, DecodingOptions(mode="off", timestamps=timestamps))]
        for decoder in (audio_only, whole):
            results = decoder.decode(clips, DecodingOptions(mode="exact", timestamps=timestamps))
            assert [r.tokens for r in results] == expected
            assert all(r.stats.accepted > 0 for r in results)


def test_pack_leaves_other_dtypes_alone():
    weight = torch.randn(8, 4, dtype=torch.float64)
    assert pack(weight) is weight
    with pytest.raises(ValueError, match="activation"):
        linear(torch.randn(2, 4), torch.randn(3, 4), activation="relu")


@torch.inference_mode()
def test_encoder_runtime_matches_transformers(tiny_en_pair):
    from conftest import JFK_FLAC

    clip = load_clip(JFK_FLAC)
    feats = tiny_en_pair.processor.feature_extractor([clip, clip[:16_000]], sampling_rate=16_000,
                                                     return_tensors="pt").input_features
    reference = tiny_en_pair.target.get_encoder()(feats).last_hidden_state
    # Dense weights: the same products in the same order as transformers' modules.
    assert torch.equal(EncoderRuntime.from_model(tiny_en_pair.target, packed=False)(feats), reference)
    packed = EncoderRuntime.from_model(tiny_en_pair.target)(feats)
    torch.testing.assert_close(packed, reference, atol=2e-4, rtol=1e-4)
    # A shorter input (DecodingOptions.encoder_context_s) encodes its own frames with the first positions;
    # more than a window, or an odd count, is refused.
    assert EncoderRuntime.from_model(tiny_en_pair.target)(feats[..., :2000]).shape[1] == 1000
    for frames in (3002, 1999):
        bad = torch.zeros(*feats.shape[:2], frames, dtype=feats.dtype)
        with pytest.raises(ValueError, match="even number of feature frames up to 3000"):
            EncoderRuntime.from_model(tiny_en_pair.target)(bad)


needs_bf16 = pytest.mark.skipif(not onednn_packing_works(torch.bfloat16), reason="this CPU has no oneDNN bf16 matmul")


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@needs_bf16
def test_bf16_attention_products_round_to_bf16_and_keep_fp32_out():
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 300, 64, generator=generator) * 0.3 for _ in range(3))
    reference = full_attention(q, k, v)
    low = full_attention(q, k, v, product_dtype=torch.bfloat16)
    assert low.dtype == torch.float32 and low.shape == reference.shape
    # bf16 keeps 8 bits of mantissa: an error of that order, not fp32's, and not a wrong head's.
    assert 1e-4 < _relative_error(low, reference) < 2e-2


def test_the_cpu_probes_run_once_per_process():
    """full_attention asks onednn_packing_works on every layer of every window: the probe (a weight reorder, a
    product and a comparison) must be answered from its cache, as must the CPU's flags."""
    from asr_app.runtime import ops

    for probe in (ops.onednn_packing_works, ops.cpu_has_amx, ops.int8_matmul_works):
        assert hasattr(probe, "cache_info"), probe.__name__
    ops.onednn_packing_works()
    hits = ops.onednn_packing_works.cache_info().hits
    ops.onednn_packing_works()
    assert ops.onednn_packing_works.cache_info().hits == hits + 1


@needs_bf16
@pytest.mark.parametrize("amx", [False, True])
def test_bf16_attention_takes_the_fused_kernel_exactly_where_the_cpu_has_amx(monkeypatch, amx):
    """With AMX, PyTorch's fused bf16 attention (its products on the tiles, no head's scores materialised);
    without, the per-head oneDNN products. The same rounding either way, and each path is the one taken."""
    import torch.nn.functional as F

    from asr_app.runtime import ops

    monkeypatch.setattr(ops, "cpu_has_amx", lambda: amx)
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 300, 64, generator=generator) * 0.3 for _ in range(3))
    low = full_attention(q, k, v, product_dtype=torch.bfloat16)
    fused = ops.merge_heads(F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), scale=1.0))
    assert low.dtype == torch.float32 and 1e-4 < _relative_error(low, full_attention(q, k, v)) < 2e-2
    assert torch.equal(low, fused.float()) == amx


@needs_bf16
@torch.inference_mode()
def test_a_bf16_encoder_packs_its_products_in_bf16_and_stays_within_its_rounding(tiny_en_pair):
    from conftest import JFK_FLAC

    feats = tiny_en_pair.processor.feature_extractor([load_clip(JFK_FLAC)], sampling_rate=16_000,
                                                     return_tensors="pt").input_features
    full = EncoderRuntime.from_model(tiny_en_pair.target)
    low = EncoderRuntime.from_model(tiny_en_pair.target, matmul_dtype=torch.bfloat16)
    layer = low.weights.layers[0]
    assert layer.qkv_weight.dtype == layer.fc1[0].dtype == layer.fc2[0].dtype == torch.bfloat16
    assert low.weights.product_dtype == torch.bfloat16 and full.weights.product_dtype is None
    reference, got = full(feats), low(feats)
    assert got.dtype == torch.float32
    assert 1e-4 < _relative_error(got, reference) < 3e-2


@torch.inference_mode()
def test_a_bf16_encoder_on_a_cpu_without_bf16_runs_in_fp32(tiny_en_pair, monkeypatch):
    from asr_app.runtime import ops

    monkeypatch.setattr(ops, "onednn_packing_works", lambda dtype=torch.float32: dtype == torch.float32)
    feats = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(4))
    low = EncoderRuntime.from_model(tiny_en_pair.target, matmul_dtype=torch.bfloat16)
    assert low.weights.layers[0].qkv_weight.dtype == torch.float32 and low.weights.product_dtype is None
    assert torch.equal(low(feats), EncoderRuntime.from_model(tiny_en_pair.target)(feats))


@needs_bf16
def test_a_bf16_encoder_decodes_the_same_text_in_every_mode(tiny_en_pair):
    from conftest import JFK_FLAC

    clip = load_clip(JFK_FLAC)
    full = SpeculativeDecoder(tiny_en_pair, DecodingOptions(mode="off"))
    low = SpeculativeDecoder(tiny_en_pair, DecodingOptions(mode="off"), RuntimeOptions(encoder_matmul_dtype="bfloat16"))
    assert low.target_encoder.weights.product_dtype == torch.bfloat16
    assert full.target_encoder.weights.product_dtype is None
    want = full.decode(clip)[0]
    off = low.decode(clip)[0]
    assert off.tokens == low.decode(clip, DecodingOptions(mode="exact"))[0].tokens
    assert off.text == want.text   # bf16 rounding of the encoder does not change a clear clip's words
    with pytest.raises(ValueError, match="encoder_matmul_dtype must be one of same, bfloat16"):
        RuntimeOptions(encoder_matmul_dtype="int8")


@torch.inference_mode()
def test_static_span_with_mask_equals_eager_span(tiny_en_pair, real_encoded):
    # A captured step attends over the whole cache with a mask; eagerly only over the slots in use.
    from asr_app.runtime.ops import visible_keys

    runtime = DecoderRuntime.from_model(tiny_en_pair.target)
    eager, static = runtime.new_state(real_encoded), runtime.new_state(real_encoded)
    runtime.step(eager, torch.tensor([[50257, 50362, 400]]))
    runtime.step(static, torch.tensor([[50257, 50362, 400]]))
    ids = torch.tensor([[401, 402]])
    expected = runtime.step(eager, ids)
    positions = torch.tensor([3, 4])
    full = runtime.max_positions
    got = runtime.forward(static, ids, positions, full, visible_keys(positions, full))
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)  # other kernels, other summation order


def test_reduced_draft_vocabulary_and_head(tiny_en_pair):
    tokenizer = tiny_en_pair.processor.tokenizer
    eos, vocab = 50256, 51864
    ids = draft_vocabulary(tokenizer, vocab, eos, 8192)
    assert ids.numel() == 8192 and bool((ids[1:] > ids[:-1]).all())
    assert ids[-(vocab - eos):].tolist() == list(range(eos, vocab))  # every special and timestamp token
    common = tokenizer(" the country and you", add_special_tokens=False)["input_ids"]
    assert set(common) <= set(ids.tolist())
    assert draft_vocabulary(tokenizer, vocab, eos, vocab) is None  # nothing to reduce
    with pytest.raises(ValueError, match="cannot hold"):
        draft_vocabulary(tokenizer, vocab, eos, 1000)
    # another tokenizer than the one the ranking was made for: the whole vocabulary, not a wrong subset
    assert draft_vocabulary(tokenizer, 51865, eos, 8192) is None
    assert RANKING_FILE.read_text().startswith("# English-only")

    weight = tiny_en_pair.target.proj_out.weight
    head = OutputHead.subset(weight, ids)
    hidden = torch.randn(2, 3, weight.shape[1])
    with torch.inference_mode():
        reduced = head.logits(hidden)
        full = OutputHead.full(weight).logits(hidden)
    torch.testing.assert_close(reduced, full[..., ids], atol=1e-4, rtol=1e-5)
    widened = head.space.to_full(reduced)
    left_out = next(i for i in range(eos) if i not in set(ids.tolist()))
    assert widened.shape == full.shape and torch.isinf(widened[..., left_out]).all()
    torch.testing.assert_close(widened[..., ids], reduced)
    space = TokenSpace(vocab, ids)
    assert space.index(eos) == space.size - (vocab - eos)
    with pytest.raises(ValueError, match="not in this reduced"):
        space.index(left_out)


def test_a_drafts_own_ranking_chooses_its_head_and_is_checked(tiny_en_pair):
    """A draft made by asr-distill for a tokenizer without a shipped ranking carries the text ids its head was
    trained on (most frequent first): the head is those ids (at most; fewer when --draft-vocab asks for fewer)
    plus every special, whatever the tokenizer; a malformed ranking is refused with one sentence."""
    import copy

    from asr_app.runtime.vocab import RANKING_ATTR, draft_ranking

    tokenizer = tiny_en_pair.processor.tokenizer
    eos, vocab = 50256, 51864
    ranking = (500, 7, 12000, 3, 40000)
    specials = list(range(eos, vocab))
    assert draft_vocabulary(tokenizer, 51865, eos, 8192, ranking).tolist() == [3, 7, 500, 12000, 40000, *range(eos, 51865)]
    assert draft_vocabulary(tokenizer, vocab, eos, len(specials) + 2, ranking).tolist() == [7, 500, *specials]
    assert draft_vocabulary(tokenizer, vocab, eos, vocab, ranking) is None   # --draft-vocab 0: every id
    draft = copy.deepcopy(tiny_en_pair.draft)
    assert draft_ranking(draft) is None   # the shipped draft: the shipped ranking applies
    setattr(draft.config, RANKING_ATTR, list(ranking))
    assert draft_ranking(draft) == ranking
    with pytest.raises(ValueError, match="special tokens"):   # an id from eos up is always scored, never ranked
        draft_vocabulary(tokenizer, vocab, eos, 8192, (5, eos + 3))
    for bad in ([1, 1], [vocab + 5], ["the"], "12", [True, 3]):
        setattr(draft.config, RANKING_ATTR, bad)
        with pytest.raises(ValueError, match="malformed"):
            draft_ranking(draft)


def test_reduced_head_keeps_greedy_output_and_speculates(tiny_en_pair):
    from conftest import JFK_FLAC

    clip = load_clip(JFK_FLAC)
    full = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(draft_vocab=None))
    reduced = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(draft_vocab=8192))
    assert reduced.draft_runtime.head.weight.shape[0] == 8192 and reduced.draft_runtime.head.space.reduced
    assert not full.draft_runtime.head.space.reduced
    for timestamps in (False, True):
        opts = DecodingOptions(mode="exact", timestamps=timestamps, gamma_policy="heuristic")
        a, b = full.decode(clip, opts)[0], reduced.decode(clip, opts)[0]
        assert a.tokens == b.tokens
        assert b.stats.target_calls < len(b.tokens) / 2  # the reduced draft still speculates well


def test_a_tokens_scores_depend_on_its_steps_width_only_to_float_rounding(tiny_en_pair):
    # Modes are token-identical at T = 0 because a token scores the same in a one-row step (off) and a wider
    # one (a speculative step). The projections are bit-identical at any row count (tested above); PyTorch's
    # CPU attention is not, so the logits may differ by float rounding (docs/runtime.md, "A token's scores and
    # its step's width"): far below the gaps between the top two tokens of real speech, and the same argmax.
    from conftest import JFK_FLAC

    decoder = SpeculativeDecoder(tiny_en_pair)
    clip = load_clip(JFK_FLAC)
    result = decoder.decode(clip, DecodingOptions(mode="off"))[0]
    prompt = build_prompt(tiny_en_pair.target.generation_config, decoder.tokenizer, language=None, task="transcribe",
                          timestamps=False, previous_text=None, max_target_positions=decoder.max_positions)
    ids = torch.tensor([[*prompt.tokens, *result.tokens]])
    features = decoder.feature_extractor(clip, sampling_rate=16_000, return_tensors="pt").input_features
    runtime = decoder.target_runtime
    with torch.inference_mode():
        hidden = decoder.target_encoder(features)
        by_width = []
        for width in (1, 6):
            state = runtime.new_state(hidden)
            steps = [runtime.step(state, ids[:, i : i + width]) for i in range(0, ids.shape[1], width)]
            by_width.append(runtime.logits(torch.cat(steps, dim=1))[0])
    one, six = by_width
    assert one.shape == (ids.shape[1], runtime.head.space.size)
    assert (one - six).abs().max() < 1e-3
    assert torch.equal(one.argmax(-1), six.argmax(-1))
    assert one[len(prompt.tokens) - 1 : -1].argmax(-1).tolist() == result.tokens  # what off chose (after the rules, which agree here)


def test_emulated_graphs_are_capture_safe_and_token_identical(tiny_en_pair):
    # Every captured step runs with host reads made to raise, from static input and output tensors that the
    # next call overwrites, the way a CUDA graph replays: tokens must equal the eager run's.
    clip = jfk_opening()
    eager = SpeculativeDecoder(tiny_en_pair)
    emulated = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(cuda_graphs="emulate"))
    assert emulated.graph_mode == "emulate" and eager.graph_mode == "eager"
    for mode in ("off", "exact"):   # at T = 0 every speculative mode verifies through one greedy function
        for timestamps in (False, True):
            opts = DecodingOptions(mode=mode, timestamps=timestamps)
            a, b = eager.decode(clip, opts)[0], emulated.decode(clip, opts)[0]
            assert a.tokens == b.tokens, (mode, timestamps)
    captured = [ws.runner.captured for ws in emulated._workspaces.values()]
    assert any(key[0] == "draft" for c in captured for key in c) and any(key[0] == "target" for c in captured for key in c)
    # the second window reuses the workspace and its captured steps (the states are refilled in place)
    again = emulated.decode(clip, DecodingOptions(mode="exact"))[0]
    assert again.tokens == eager.decode(clip, DecodingOptions(mode="exact"))[0].tokens
    # sampling is capture-safe too: the step's uniforms are drawn before it runs
    sampled = emulated.decode(clip, DecodingOptions(mode="exact", temperature=0.7, seed=1))[0]
    assert sampled.tokens == emulated.decode(clip, DecodingOptions(mode="exact", temperature=0.7, seed=1))[0].tokens


def test_with_graphs_no_step_runs_eagerly_unless_a_previous_text_lengthens_the_prompt(tiny_en_pair, monkeypatch):
    # Every step replays a captured graph, the prompt's included (eagerly on a GPU a tiny.en step costs its
    # ~150 launches, ~1-2 ms), while a prompt with previous text, whose length varies, runs eagerly.
    clip = jfk_opening()
    eager = SpeculativeDecoder(tiny_en_pair)
    decoder = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(cuda_graphs="emulate"))
    spans = []
    original = DecoderRuntime.forward

    def recording(self, state, ids, positions, span, mask, probe=None):
        spans.append((self is decoder.draft_runtime, span))
        return original(self, state, ids, positions, span, mask, probe)

    monkeypatch.setattr(DecoderRuntime, "forward", recording)
    for timestamps in (False, True):
        opts = DecodingOptions(mode="exact", gamma=4, timestamps=timestamps)
        spans.clear()
        result = decoder.decode(clip, opts)[0]
        assert len(spans) > 8 and all(span == decoder.max_positions for _, span in spans)  # captured: whole cache
        reference = eager.decode(clip, opts)[0]
        assert result.tokens == reference.tokens
        assert result.no_speech_prob == pytest.approx(reference.no_speech_prob, abs=1e-6)
    spans.clear()
    previous = "And so, my fellow Americans, ask not."
    result = decoder.decode(clip, DecodingOptions(mode="exact", gamma=4), prompts=[previous])[0]
    eager_steps = [(is_draft, span) for is_draft, span in spans if span < decoder.max_positions]
    assert eager_steps == [(False, eager_steps[0][1])]  # the target's prompt step only: the draft skips the text
    assert result.tokens == eager.decode(clip, DecodingOptions(mode="exact", gamma=4), prompts=[previous])[0].tokens


def test_a_long_hint_step_runs_eagerly_so_graphs_stay_few(tiny_en_pair):
    # A hint can propose the whole expected answer; a graph per such width would hold its own memory.
    from conftest import JFK_FLAC

    from asr_app.decoding.loop import MAX_CAPTURED_PROPOSALS

    clip = load_clip(JFK_FLAC)
    decoder = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(cuda_graphs="emulate"))
    answer = decoder.decode(clip, DecodingOptions(mode="off"))[0].tokens
    assert len(answer) > MAX_CAPTURED_PROPOSALS + 2
    hinted = decoder.decode(clip, DecodingOptions(mode="off"), hints=[answer])[0]
    assert hinted.tokens == answer and hinted.stats.target_calls <= 2
    widths = [key[3] for ws in decoder._workspaces.values() for key in ws.runner.captured if key[0] in ("first", "target")]
    assert widths and max(widths) <= MAX_CAPTURED_PROPOSALS


def test_emulation_catches_a_host_read(tiny_en_pair, monkeypatch):
    # The negative control: a step that reads a device value on the host fails under emulation.
    from conftest import JFK_FLAC

    original = Steps.draft_step

    def reads_the_token(self, **kwargs):
        out = original(self, **kwargs)
        int(out["token"][0])  # what a capturable step must never do
        return out

    monkeypatch.setattr(Steps, "draft_step", reads_the_token)
    clip = load_clip(JFK_FLAC)
    SpeculativeDecoder(tiny_en_pair).decode(clip, DecodingOptions(mode="exact"))  # eagerly it is allowed
    with pytest.raises(HostReadError, match="__int__"):
        SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(cuda_graphs="emulate")).decode(
            clip, DecodingOptions(mode="exact"))
    with no_host_reads(), pytest.raises(HostReadError):
        torch.ones(1).tolist()
    assert torch.ones(1).tolist() == [1.0]  # restored afterwards


def test_batched_rows_finish_at_different_steps_under_emulation(tiny_en_pair):
    # Captured graphs keep finished rows in the batch; their tokens must not leak into the others.
    from conftest import LIBRISPEECH_DIR

    clips = [load_clip(p) for p in sorted(LIBRISPEECH_DIR.rglob("*.flac"))[1:4]]  # 3.3, 2.1 and 5.4 s
    eager = SpeculativeDecoder(tiny_en_pair)
    emulated = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(cuda_graphs="emulate"))
    for mode in ("off", "exact"):
        alone = [eager.decode(c, DecodingOptions(mode=mode))[0].tokens for c in clips]
        together = [r.tokens for r in emulated.decode(clips, DecodingOptions(mode=mode))]
        assert len({len(t) for t in alone}) > 1
        assert together == alone, mode


def test_runtime_options_are_checked():
    with pytest.raises(ValueError, match="cuda_graphs"):
        RuntimeOptions(cuda_graphs="always")
    with pytest.raises(ValueError, match="draft_vocab"):
        RuntimeOptions(draft_vocab=0)
    with pytest.raises(ValueError, match="draft_matmul_dtype"):
        RuntimeOptions(draft_matmul_dtype="float16")
    for margin in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="draft_audio_margin_s"):
            RuntimeOptions(draft_audio_margin_s=margin)
    assert RuntimeOptions().graph_mode(torch.device("cpu")) == "eager"
    assert RuntimeOptions().graph_mode(torch.device("cuda")) == "cuda"
    assert RuntimeOptions(cuda_graphs="off").graph_mode(torch.device("cuda")) == "eager"
