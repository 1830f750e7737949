"""The fused decoder-layer kernels (runtime/fused.py) against PyTorch, run by Triton's CPU interpreter: each
kernel against its twin, the fused decoder step against the unfused one on the real tiny.en target, and
decoding through fused layers against target-only decoding. (They compile for sm_90: test_kernels_compile.py;
on a GPU, tests/test_gpu.py.)"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from test_decoding_greedy import load_clip

from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.kernels.triton_support import HAS_TRITON, triton_interpreting
from asr_app.runtime import DecoderRuntime, fused
from asr_app.runtime.ops import split_heads

pytestmark = pytest.mark.skipif(not (HAS_TRITON and triton_interpreting()),
                                reason="runs the kernels in Triton's CPU interpreter (TRITON_INTERPRET=1, set by conftest "
                                       "without a GPU); on a GPU they are tested by test_gpu.py")

FLAGS = [{}, {"norm": True}, {"norm": True, "activation": "gelu"}, {"residual": True}, {"norm": True, "residual": True}]


def _tolerance(dtype: torch.dtype) -> dict:
    # fp32: sums in another order; fp16: one unit in the last place of outputs up to ~8
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 8e-3, "rtol": 2e-3}


def _operands(rows: int, k: int, n: int, dtype: torch.dtype) -> tuple:
    """x [rows, k], a weight [n, k] and bias, a layer norm's (gain, shift) over k, a residual stream [rows, n],
    and the generator they came from (for more operands after them)."""
    generator = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, k, generator=generator) * 3 + 1).to(dtype)
    weight, bias = (torch.randn(n, k, generator=generator) / 8).to(dtype), torch.randn(n, generator=generator).to(dtype)
    norm = ((torch.rand(k, generator=generator) + 0.5).to(dtype), torch.randn(k, generator=generator).to(dtype))
    stream = torch.randn(rows, n, generator=generator).to(dtype)
    return x, weight, bias, norm, stream, generator


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows", [1, 5, 17])  # one token; a speculative step's tokens; more than one row block
def test_fused_linear_matches_its_pytorch_twin(dtype, rows):
    k = 80  # neither k nor n (300) a multiple of the tiles
    x, weight, bias, norm, stream, _ = _operands(rows, k, 300, dtype)
    for flags in FLAGS:
        kwargs = {"norm": norm if flags.get("norm") else None, "activation": flags.get("activation"), "eps": 1e-5}
        expected = fused.linear_reference(x, weight, bias, **kwargs, residual=stream if flags.get("residual") else None)
        residual = stream.clone() if flags.get("residual") else None
        out = fused.linear(x, weight, bias, **kwargs, residual=residual)
        torch.testing.assert_close(out, expected, **_tolerance(dtype), msg=lambda m, f=flags: f"{f}: {m}")
        if residual is not None:
            assert out is residual  # the residual stream is updated in place
    # the twin itself is what the unfused step computes
    torch.testing.assert_close(fused.linear_reference(x.float(), weight.float(), bias.float(), norm=(norm[0].float(), norm[1].float())),
                               F.linear(F.layer_norm(x.float(), (k,), norm[0].float(), norm[1].float()), weight.float(), bias.float()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows, bucket", [(1, 1), (5, 8)])  # one token; a speculative step's 5 tokens
def test_every_tile_the_gpu_may_choose_computes_the_same(dtype, rows, bucket):
    # On a GPU the tuner picks the fastest of `candidate_tiles(bucket)` per shape, so each candidate, element-wise or
    # tensor-core (16 rows, the others masked), must give the twin's values; the interpreter's own tile is
    # only one of them.
    heads, head_dim = 2, 16
    # k = 600: the products walk several tiles deep, not a multiple of them
    x, weight, bias, norm, stream, generator = _operands(rows, 600, 72, dtype)
    width = heads * head_dim
    qkv_weight = (torch.randn(3 * width, width, generator=generator) / 8).to(dtype)
    qkv_bias = torch.randn(3 * width, generator=generator).to(dtype)
    projected = fused.linear_reference(x[None, :, :width], qkv_weight, qkv_bias, norm=(norm[0][:width], norm[1][:width]))
    tiles = fused.candidate_tiles(bucket)
    assert {tile.kwargs["DOT"] for tile in tiles} == {False, True}
    for tile in tiles:
        def same(actual, expected, tile=tile):
            torch.testing.assert_close(actual, expected, **_tolerance(dtype), msg=lambda m: f"{tile.kwargs}: {m}")

        same(fused.linear(x, weight, bias, norm=norm, activation="gelu", tile=tile),
             fused.linear_reference(x, weight, bias, norm=norm, activation="gelu"))
        residual = stream.clone()
        fused.linear(x, weight, bias, residual=residual, tile=tile)
        same(residual, fused.linear_reference(x, weight, bias, residual=stream))
        keys, values = (torch.zeros(1, heads, rows + 2, head_dim, dtype=dtype) for _ in range(2))
        q = fused.qkv(x[None, :, :width].contiguous(), qkv_weight, qkv_bias, (norm[0][:width], norm[1][:width]), 1e-5,
                      1.0, keys, values, torch.arange(2, rows + 2), tile=tile)
        same(q, projected[..., :width])
        same(values[:, :, 2:], split_heads(projected[..., 2 * width:], heads))


def test_fused_linear_checks_its_inputs():
    x, weight, bias = torch.randn(2, 8), torch.randn(4, 8), torch.randn(4)
    with pytest.raises(ValueError, match="width"):
        fused.linear(torch.randn(2, 6), weight, bias)
    with pytest.raises(TypeError, match="contiguous"):
        fused.linear(x, torch.randn(8, 4).T, bias)
    with pytest.raises(ValueError, match="must match"):
        fused.linear(x.half(), weight, bias)
    with pytest.raises(ValueError, match="residual"):
        fused.linear(x, weight, bias, residual=torch.randn(3, 4))
    assert fused.linear(x[:0], weight, bias).shape == (0, 4)


@pytest.fixture
def tuned_launches(monkeypatch):
    """The GPU's launch path (tile shapes tuned on the first call per shape) run by the interpreter, each trial
    timed on the host: `fused` as it runs on a GPU, minus the device."""
    trials = []

    def host_timer(kernel_call, quantiles):
        start = time.perf_counter()
        kernel_call()
        trials.append(time.perf_counter() - start)
        return [1e3 * trials[-1]] * len(quantiles)

    monkeypatch.setattr(fused, "_timed", host_timer)
    monkeypatch.setattr(fused, "triton_interpreting", lambda: False)
    fused._tuned.cache_clear()
    yield trials
    fused._tuned.cache_clear()


def test_tuned_launches_add_the_residual_once_and_write_the_cache(tuned_launches):
    # Tuning runs every candidate tile on the real arguments: the residual stream it updates in place must be
    # restored between trials, or the first step of a decode would add each layer's output several times.
    generator = torch.Generator().manual_seed(4)
    x, weight, bias = torch.randn(3, 64, generator=generator), torch.randn(96, 64, generator=generator), torch.randn(96)
    stream = torch.randn(3, 96, generator=generator)
    residual = stream.clone()
    fused.linear(x, weight, bias, residual=residual)
    assert len(tuned_launches) == len(fused.candidate_tiles(4))  # every candidate tried, on the first call only
    torch.testing.assert_close(residual, fused.linear_reference(x, weight, bias, residual=stream), atol=1e-5, rtol=1e-5)
    residual = stream.clone()
    fused.linear(x, weight, bias, residual=residual)
    assert len(tuned_launches) == len(fused.candidate_tiles(4))
    torch.testing.assert_close(residual, fused.linear_reference(x, weight, bias, residual=stream), atol=1e-5, rtol=1e-5)
    keys, values = torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 16)
    q = fused.qkv(torch.randn(1, 2, 32), torch.randn(96, 32), torch.randn(96), (torch.ones(32), torch.zeros(32)),
                  1e-5, 1.0, keys, values, torch.tensor([3, 4]))
    assert q.shape == (1, 2, 32) and keys[:, :, 3:5].abs().sum() > 0 and keys[:, :, :3].abs().sum() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_qkv_writes_keys_and_values_into_the_slots_of_their_positions(dtype):
    generator = torch.Generator().manual_seed(3)
    batch, tokens, heads, head_dim, slots = 2, 3, 4, 16, 12
    width = heads * head_dim
    x = torch.randn(batch, tokens, width, generator=generator).to(dtype)
    weight = (torch.randn(3 * width, width, generator=generator) / 8).to(dtype)
    bias = torch.randn(3 * width, generator=generator).to(dtype)
    norm = ((torch.rand(width, generator=generator) + 0.5).to(dtype), torch.randn(width, generator=generator).to(dtype))
    positions = torch.tensor([5, 6, 7])
    keys, values = (torch.full((batch, heads, slots, head_dim), 7.0, dtype=dtype) for _ in range(2))

    q = fused.qkv(x, weight, bias, norm, 1e-5, 0.5, keys, values, positions)

    projected = fused.linear_reference(x, weight, bias, norm=norm)
    expected_keys, expected_values = (torch.full_like(keys, 7.0) for _ in range(2))
    expected_keys.index_copy_(2, positions, split_heads(projected[..., width:2 * width], heads))
    expected_values.index_copy_(2, positions, split_heads(projected[..., 2 * width:], heads))
    torch.testing.assert_close(q, (projected[..., :width].float() * 0.5).to(dtype), **_tolerance(dtype))
    torch.testing.assert_close(keys, expected_keys, **_tolerance(dtype))
    torch.testing.assert_close(values, expected_values, **_tolerance(dtype))
    assert (keys[:, :, :5] == 7).all() and (values[:, :, 8:] == 7).all()  # no other slot is touched


@torch.inference_mode()
def test_fused_decoder_step_matches_the_unfused_one_and_rolls_back(tiny_en_pair):
    target = tiny_en_pair.target
    encoded = torch.randn(2, 1500, target.config.d_model, generator=torch.Generator().manual_seed(0))
    plain, fused_rt = DecoderRuntime.from_model(target, packed=False), DecoderRuntime.from_model(target, fused_layers=True)
    assert fused_rt.fused_layers and not plain.fused_layers
    states = plain.new_state(encoded), fused_rt.new_state(encoded)
    steps = [[[50257, 50362, 400], [50257, 50362, 500]], [[401], [501]], [[402, 403], [502, 503]]]
    for ids in map(torch.tensor, steps):
        torch.testing.assert_close(fused_rt.step(states[1], ids), plain.step(states[0], ids), atol=3e-4, rtol=1e-4)
    torch.testing.assert_close(states[1].self_k[:, :, :, :6], states[0].self_k[:, :, :, :6], atol=1e-4, rtol=1e-4)
    for state in states:
        state.rollback(3)
    ids = torch.tensor([[600, 601], [602, 603]])
    torch.testing.assert_close(fused_rt.step(states[1], ids), plain.step(states[0], ids), atol=3e-4, rtol=1e-4)


def test_decoding_through_fused_layers_gives_target_only_tokens_and_words(tiny_en_pair):
    from conftest import JFK_FLAC, LIBRISPEECH_DIR

    # Every step through the interpreted kernels costs seconds, so short inputs: two LibriSpeech clips of 3.3 and
    # 2.1 s (13 and 6 tokens) whose rows end apart, and the first 8 s of JFK, 14 words ("And so my fellow
    # Americans ask not what your country can do for you").
    clips = [load_clip(p) for p in sorted(LIBRISPEECH_DIR.rglob("*.flac"))[1:3]]
    opening = load_clip(JFK_FLAC)[: 8 * 16_000]
    plain = SpeculativeDecoder(tiny_en_pair)
    decoder = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(fused_layers=True, cuda_graphs="emulate"))
    assert decoder.target_runtime.fused_layers and decoder.draft_runtime.fused_layers
    reference = [r.tokens for r in plain.decode(clips, DecodingOptions(mode="off"))]
    assert len({len(tokens) for tokens in reference}) == 2
    assert [r.tokens for r in decoder.decode(clips, DecodingOptions(mode="off"))] == reference  # rows end apart
    # a fixed gamma: emulated graphs capture the target step at every width the decode may use before it starts,
    # and each is an interpreted step of seconds (the cost policy's 13 widths doubled this test)
    words = DecodingOptions(mode="exact", word_timestamps=True, gamma=3)
    expected, result = plain.decode(opening, words)[0], decoder.decode(opening, words)[0]
    assert result.tokens == plain.decode(opening, DecodingOptions(mode="off"))[0].tokens
    assert result.stats.target_calls < len(result.tokens) / 2  # the fused draft speculates
    # word timings come from the target's cross-attention, read through the fused layers' probe
    got = [(w.word, w.start, w.end) for s in result.segments for w in s.words]
    assert got == [(w.word, w.start, w.end) for s in expected.segments for w in s.words] and len(got) > 10


def test_fused_layers_are_refused_where_triton_cannot_run_them(monkeypatch):
    import argparse

    from conftest import DISTIL_DRAFT_DIR, TINY_EN_DIR

    from asr_app.arguments import add_model_args, decoder_from_args

    args = add_model_args(argparse.ArgumentParser()).parse_args(
        ["--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR), "--fused-layers"])
    assert decoder_from_args(args).runtime.fused_layers  # the flag reaches the runtime (interpreter: allowed)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA GPU"):
        decoder_from_args(args)


def test_fused_layers_are_the_default_only_where_they_were_measured_faster(monkeypatch):
    # The decision rule of docs/runtime.md ("Fused layers"): fused `off` measured faster than unfused `off` on an
    # H200 (steps of 1 and 6 rows) and the GPU tests passed, so fused is the default there: CUDA graphs, a Hopper
    # GPU, Triton installed, steps of at most AUTO_MAX_ROWS rows. A CPU never takes it unasked.
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    capability = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability["value"])
    assert RuntimeOptions().use_fused_layers(cuda) and not RuntimeOptions().use_fused_layers(cpu)
    assert RuntimeOptions().fused_max_rows() == fused.AUTO_MAX_ROWS
    assert not RuntimeOptions(cuda_graphs="off").use_fused_layers(cuda)  # eager GPU steps: unfused unless asked
    assert not RuntimeOptions(cuda_graphs="emulate").use_fused_layers(cpu)
    assert not RuntimeOptions(fused_layers=False).use_fused_layers(cuda)
    assert RuntimeOptions(fused_layers=True).use_fused_layers(cpu)  # asked for: the interpreter (or a refusal)
    assert RuntimeOptions(fused_layers=True).fused_max_rows() is None  # asked for: every step
    capability["value"] = (8, 0)  # an A100: not measured
    assert not RuntimeOptions().use_fused_layers(cuda)
    capability["value"] = (9, 0)
    monkeypatch.setattr(fused, "HAS_TRITON", False)  # a CUDA install without Triton: unfused, not an error
    assert not RuntimeOptions().use_fused_layers(cuda)


def test_steps_beyond_the_row_bound_run_unfused(tiny_en_pair):
    # fused_max_rows: a step of more rows (batch x tokens) goes through the unfused layers, on the same weights
    runtime = DecoderRuntime.from_model(tiny_en_pair.target, fused_layers=True, fused_max_rows=4)
    calls = []
    runtime._fused_layer = lambda x, *args: calls.append(("fused", x.shape[0] * x.shape[1])) or x
    runtime._layer = lambda x, *args: calls.append(("unfused", x.shape[0] * x.shape[1])) or x
    hidden = torch.zeros(2, 10, tiny_en_pair.target.config.d_model)
    state = runtime.new_state(hidden)
    for rows in ((1, 4), (2, 2), (1, 5), (2, 3)):
        calls.clear()
        ids = torch.zeros(rows, dtype=torch.long)
        positions = torch.arange(rows[1])
        runtime.forward(state, ids, positions, rows[1], None)
        kind = "fused" if rows[0] * rows[1] <= 4 else "unfused"
        assert calls == [(kind, rows[0] * rows[1])] * len(runtime.weights.layers), rows
