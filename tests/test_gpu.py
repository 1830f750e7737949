"""On a CUDA GPU: the graph-captured decoding path on real speech, and the Triton kernels on the device.

Skipped without a GPU (CI has none); run on a lent GPU with the real pair joined there:
    ASR_APP_TEST_MODELS=/tmp/models python -m pytest -q tests/test_gpu.py
The CPU suite proves capture safety by emulation (test_runtime.py); these tests replay real CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch
from test_decoding_greedy import SPEC_MODES, load_clip
from test_kernels_distribution import VOCAB, adversarial_pairs, chi_square_pvalue
from token_lists import check_same_or_near_ties
from transformers.generation.logits_process import (
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    WhisperTimeStampLogitsProcessor,
)

from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.kernels import VerifyRandomness, draft_probs_from_logits, verify
from asr_app.runtime import fused
from asr_app.runtime.ops import cross_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")
UNFUSED = RuntimeOptions(fused_layers=False)  # the unfused layers, chosen explicitly (fused is the CUDA default)


@pytest.fixture(scope="module", params=[torch.float32, torch.float16], ids=["fp32", "fp16"])
def cuda_pair(request):
    from conftest import DISTIL_DRAFT_DIR, TINY_EN_DIR

    from asr_app.models import load_pair

    torch.backends.cuda.matmul.allow_tf32 = False
    return load_pair(target=str(TINY_EN_DIR), draft=str(DISTIL_DRAFT_DIR), device="cuda", dtype=request.param)


@pytest.fixture(scope="module")
def clips():
    from conftest import JFK_FLAC, LIBRISPEECH_DIR

    return [load_clip(JFK_FLAC)] + [load_clip(p) for p in sorted(LIBRISPEECH_DIR.rglob("*.flac"))[:2]]


NEAR_TIE = 0.25  # logits: fp16 rounds ~0.02 at Whisper's logit sizes, and a layer stack adds up such errors


def target_logits_along(pair, clip, timestamps: bool, path: list[int]) -> torch.Tensor:
    """The target's logits after each prefix of `path` ([len(path) + 1, vocab]), by transformers' own forward
    (an independent one) and Whisper's rules as transformers applies them (forbidden tokens at -inf)."""
    gc = pair.target.generation_config
    prompt = [gc.decoder_start_token_id] + ([] if timestamps else [gc.no_timestamps_token_id])
    begin = len(prompt)
    rules = [SuppressTokensAtBeginLogitsProcessor(gc.begin_suppress_tokens, begin),
             SuppressTokensLogitsProcessor(gc.suppress_tokens)]
    if timestamps:
        rules.append(WhisperTimeStampLogitsProcessor(gc, begin_index=begin))
    feats = pair.processor.feature_extractor(clip, sampling_rate=16_000, return_tensors="pt").input_features
    ids = torch.tensor([prompt + list(path)], device=pair.device)
    with torch.inference_mode():
        logits = pair.target(input_features=feats.to(pair.device, pair.dtype), decoder_input_ids=ids).logits[0]
    rows = []
    for j in range(len(path) + 1):
        scores = logits[begin - 1 + j : begin + j].float().clone()
        for rule in rules:
            scores = rule(ids[:, : begin + j], scores)
        rows.append(scores[0])
    return torch.stack(rows)


def assert_same_or_near_tie(pair, batch, timestamps, got: list[list[int]], expected: list[list[int]], what,
                            any_dtype: bool = False, max_new_tokens: int = DecodingOptions.max_new_tokens):
    """Equal token lists; in fp16, where the order of a sum depends on how many tokens a step scores, a
    list may instead part from the reference where the target's two candidates are within NEAR_TIE (in any
    dtype with `any_dtype`: two different kernels for the same products), and from there on it is checked
    against the target's own choices after its own prefix, to its end (tests/token_lists.py). Every
    divergence is printed."""
    eos = pair.target.generation_config.eos_token_id
    for row, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g == e:
            continue
        check_same_or_near_ties(g, e, lambda path, row=row: target_logits_along(pair, batch[row], timestamps, path),
                                eos, NEAR_TIE, f"{what} row {row}", may_differ=any_dtype or pair.dtype == torch.float16,
                                got_ended=len(g) < max_new_tokens, expected_ended=len(e) < max_new_tokens)


@torch.inference_mode()
def test_cuda_graphs_give_the_eager_tokens_in_every_mode(cuda_pair, clips):
    eager = SpeculativeDecoder(cuda_pair, runtime=RuntimeOptions(cuda_graphs="off"))
    graphed = SpeculativeDecoder(cuda_pair, runtime=UNFUSED)  # graphs against eager, the same kernels
    assert graphed.graph_mode == "cuda" and eager.graph_mode == "eager"
    for timestamps in (False, True):
        for batch in ([clips[0]], clips):  # batch 3: rows finish at different steps
            reference = [r.tokens for r in eager.decode(batch, DecodingOptions(mode="off", timestamps=timestamps))]
            for mode in ("off", *SPEC_MODES):
                opts = DecodingOptions(mode=mode, timestamps=timestamps)
                results = graphed.decode(batch, opts)
                assert_same_or_near_tie(cuda_pair, batch, timestamps, [r.tokens for r in results], reference,
                                        f"{mode} graphs, timestamps {timestamps}, batch {len(batch)}")
                if mode != "off":
                    assert all(r.stats.accepted > 0 for r in results)
    captured = [key for ws in graphed._workspaces.values() for key in ws.runner.captured]
    assert any(k[0] == "draft" for k in captured) and any(k[0] == "target" for k in captured)


@torch.inference_mode()
def test_cuda_graphs_with_hints_and_a_second_window(cuda_pair, clips):
    graphed = SpeculativeDecoder(cuda_pair, runtime=UNFUSED)
    opts = DecodingOptions(mode="exact")
    plain = graphed.decode(clips[0], opts)[0]
    hinted = graphed.decode(clips[0], opts, hints=[plain.tokens[:12]])[0]
    # the hint extends the draft's own proposals: every hinted token is accepted
    assert hinted.tokens == plain.tokens and hinted.stats.hint_accepted == hinted.stats.hinted > 0
    assert graphed.decode(clips[0], opts)[0].tokens == plain.tokens  # the workspace's graphs replayed again


def test_a_capture_runs_with_the_garbage_collector_paused():
    # runtime/graphs.cyclic_gc_paused: no automatic collection can free an old graph inside a capture (whether
    # one would break it: bench/capture_gc_probe.py); the collector is back on after it
    import gc

    from asr_app.runtime.graphs import StepRunner

    seen = []

    def step(*, positions, span, mask, x):
        if torch.cuda.is_current_stream_capturing():
            seen.append(gc.isenabled())
        return {"y": torch.relu(x * 2 + positions.float().sum()) + 1}

    x = torch.full((4096,), 3.0, device=CUDA)
    out = StepRunner("cuda", 8).run(("new",), step, {"x": x}, 2, 1)["y"]
    assert seen == [False] and gc.isenabled()
    assert torch.equal(out, torch.relu(x * 2 + 2) + 1)


@torch.inference_mode()
def test_sampling_with_cuda_graphs_repeats_for_a_seed(cuda_pair, clips):
    graphed = SpeculativeDecoder(cuda_pair, runtime=UNFUSED)
    for mode in ("exact", "sigmoid"):
        opts = DecodingOptions(mode=mode, temperature=0.7, seed=3)
        first = graphed.decode(clips[0], opts)[0]
        assert graphed.decode(clips[0], opts)[0].tokens == first.tokens
        assert first.stats.accepted > 0


def test_exact_triton_kernel_first_token_follows_the_target_on_the_gpu():
    # The Triton kernel itself on CUDA tensors, with its own uniforms from a CUDA generator.
    trials, gamma = 40_000, 4
    for name, (p_logits, q_logits) in adversarial_pairs().items():
        target = torch.stack([p_logits] + [p_logits.roll(c) for c in range(1, gamma + 1)]).to(CUDA)
        draft = torch.stack([q_logits.roll(c) for c in range(gamma)]).to(CUDA)
        gen = torch.Generator(device=CUDA).manual_seed(5)
        q = draft_probs_from_logits(draft, "exact", 1.0, -1e3, 1e3)
        tokens = torch.multinomial(q, trials, replacement=True, generator=gen).T.contiguous()
        num_draft = torch.full((trials,), gamma, dtype=torch.int64, device=CUDA)
        result = verify(target.expand(trials, -1, -1).contiguous(), draft.expand(trials, -1, -1).contiguous(), tokens, num_draft, "exact", 1.0,
                        generator=gen)
        first = result.tokens[:, 0].cpu()
        assert first.max() < VOCAB
        pvalue = chi_square_pvalue(first, torch.softmax(p_logits, dim=-1))
        assert pvalue > 1e-3, f"{name}: chi-square p = {pvalue:.2e}"


@pytest.mark.parametrize("mode", ["exact", "sigmoid", "greedy"])
def test_verification_replayed_from_a_cuda_graph_equals_the_eager_call(mode):
    gen = torch.Generator().manual_seed(0)
    batch, gamma, vocab = 3, 5, 51864
    target = (torch.randn(batch, gamma + 1, vocab, generator=gen) * 3).to(CUDA, torch.float16)
    draft = (target[:, :gamma].float().cpu() + torch.randn(batch, gamma, vocab, generator=gen)).to(CUDA, torch.float16)
    tokens = target[:, :gamma].float().argmax(-1)
    num_draft = torch.tensor([5, 2, 0], device=CUDA)
    uniforms = torch.rand(batch, gamma + 1, dtype=torch.float64, generator=gen).to(CUDA)

    def call():
        return verify(target, draft, tokens, num_draft, mode, 1.0, -1e3, 1e3,
                      randomness=VerifyRandomness(uniforms), check_values=False)

    eager = call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    uniforms.copy_(torch.rand(batch, gamma + 1, dtype=torch.float64, generator=gen).to(CUDA))
    graph.replay()
    fresh = call()  # the new uniforms, eagerly
    assert torch.equal(captured.tokens, fresh.tokens) and torch.equal(captured.num_accepted, fresh.num_accepted)
    assert eager.num_accepted.tolist()[2] == 0


def test_cross_attention_through_the_flash_kernel_matches_fp32():
    gen = torch.Generator().manual_seed(0)
    q = (torch.randn(2, 20, 6, 64, generator=gen) / 8).to(CUDA, torch.float16)
    k, v = (torch.randn(2, 20, 1500, 64, generator=gen).to(CUDA, torch.float16) for _ in range(2))
    reference = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=1.0)
    assert torch.allclose(cross_attention(q, k, v).float(), reference, atol=2e-3)


@torch.inference_mode()
def test_fused_layers_with_cuda_graphs_give_the_unfused_tokens(cuda_pair, clips):
    plain = SpeculativeDecoder(cuda_pair, runtime=UNFUSED)
    fused_decoder = SpeculativeDecoder(cuda_pair)  # fused layers are the default with CUDA graphs
    assert fused_decoder.target_runtime.fused_layers and fused_decoder.draft_runtime.fused_layers
    assert fused_decoder.graph_mode == "cuda"
    for timestamps in (False, True):
        for batch in ([clips[0]], clips):
            reference = [r.tokens for r in plain.decode(batch, DecodingOptions(mode="off", timestamps=timestamps))]
            for mode in ("off", "exact"):
                results = fused_decoder.decode(batch, DecodingOptions(mode=mode, timestamps=timestamps))
                assert_same_or_near_tie(cuda_pair, batch, timestamps, [r.tokens for r in results], reference,
                                        f"fused {mode}, timestamps {timestamps}, batch {len(batch)}", any_dtype=True)


@pytest.mark.parametrize("rows", [1, 6, 40])
def test_fused_linear_on_the_gpu_at_large_v2_widths(rows):
    # The tuned launch runs each candidate tile several times on its first call: the residual stream it
    # updates in place must be restored between them (added once, not once per trial).
    generator = torch.Generator(device=CUDA).manual_seed(rows)
    width, hidden = 1280, 5120
    x = torch.randn(rows, width, device=CUDA, generator=generator, dtype=torch.float16)
    norm = (torch.rand(width, device=CUDA, generator=generator, dtype=torch.float16) + 0.5,
            torch.randn(width, device=CUDA, generator=generator, dtype=torch.float16))
    w1 = torch.randn(hidden, width, device=CUDA, generator=generator, dtype=torch.float16) / 40
    w2 = torch.randn(width, hidden, device=CUDA, generator=generator, dtype=torch.float16) / 80
    b1, b2 = (torch.randn(n, device=CUDA, generator=generator, dtype=torch.float16) for n in (hidden, width))
    stream = torch.randn(rows, width, device=CUDA, generator=generator, dtype=torch.float16)
    h = fused.linear(x, w1, b1, norm=norm, activation="gelu")
    torch.testing.assert_close(h, fused.linear_reference(x, w1, b1, norm=norm, activation="gelu"), atol=1e-2, rtol=1e-2)
    residual = stream.clone()
    fused.linear(h, w2, b2, residual=residual)
    torch.testing.assert_close(residual, fused.linear_reference(h, w2, b2, residual=stream), atol=1e-2, rtol=1e-2)


GPU_TOLERANCE = {torch.float32: {"atol": 1e-4, "rtol": 1e-4},  # no TF32 in the tensor-core tiles
                 torch.float16: {"atol": 1e-2, "rtol": 1e-2}, torch.bfloat16: {"atol": 6e-2, "rtol": 2e-2}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows, bucket", [(1, 1), (6, 8)])
def test_every_fused_tile_on_the_gpu_at_large_v2_widths(dtype, rows, bucket):
    # The tuner may choose any candidate of the bucket for a shape: each must compute the twin's values on
    # the device (the compiled element-wise and tensor-core code, not the interpreter's).
    generator = torch.Generator(device=CUDA).manual_seed(rows)
    width, hidden = 1280, 5120
    x = torch.randn(rows, width, device=CUDA, generator=generator).to(dtype)
    norm = ((torch.rand(width, device=CUDA, generator=generator) + 0.5).to(dtype),
            torch.randn(width, device=CUDA, generator=generator).to(dtype))
    weight = (torch.randn(hidden, width, device=CUDA, generator=generator) / 40).to(dtype)
    bias = torch.randn(hidden, device=CUDA, generator=generator).to(dtype)
    expected = fused.linear_reference(x, weight, bias, norm=norm, activation="gelu")
    for tile in fused.candidate_tiles(bucket):
        out = fused.linear(x, weight, bias, norm=norm, activation="gelu", tile=tile)
        torch.testing.assert_close(out, expected, **GPU_TOLERANCE[dtype], msg=lambda m, t=tile: f"{t}: {m}")
