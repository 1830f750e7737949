"""Greedy identity: speculative modes at temperature 0 == target-only `off` == transformers' generate().

Tiny random Whisper models (draft sharing the target's encoder, and a draft with its own encoder) and
the real tiny.en with the real distilled draft and a derived draft, on real clips, with and without
timestamps; plus batching (3 different clips == each alone) and input errors.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from conftest import DISTIL_DRAFT_DIR, JFK_FLAC, LIBRISPEECH_DIR, TINY_EN_DIR
from transformers import (
    GenerationConfig,
    GenerationMixin,
    LogitsProcessorList,
    WhisperConfig,
    WhisperForConditionalGeneration,
    WhisperProcessor,
)
from transformers.generation.logits_process import (
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    WhisperTimeStampLogitsProcessor,
)

from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.models import ModelPair, derive_draft, detect_shared_encoder, load_pair

SPEC_MODES = ("baseline", "exact", "sigmoid")
# Random models ramble over the whole vocabulary: their drafts score all of it, or nothing would be accepted.
FULL_VOCAB = RuntimeOptions(draft_vocab=None)


def load_clip(path) -> np.ndarray:
    x, sr = sf.read(str(path), dtype="float32", always_2d=True)
    return soxr.resample(x.mean(axis=1), sr, 16_000).astype(np.float32)


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    flacs = sorted(LIBRISPEECH_DIR.rglob("*.flac"))
    # jfk (11 s) plus the two shortest LibriSpeech utterances keep the real-model tests affordable
    libri = sorted((load_clip(p) for p in flacs), key=len)[:2]
    return [load_clip(JFK_FLAC), *libri]


@pytest.fixture(scope="module")
def processor() -> WhisperProcessor:
    return WhisperProcessor.from_pretrained(TINY_EN_DIR)


def tiny_target(seed: int = 0, source_positions: int = 1500) -> WhisperForConditionalGeneration:
    """A 2-layer random Whisper with tiny.en's vocabulary, special tokens and logit rules
    (`source_positions` < 1500 makes a cheap encoder for features cut to 2 * source_positions frames)."""
    torch.manual_seed(seed)
    real = WhisperConfig.from_pretrained(TINY_EN_DIR)
    config = WhisperConfig(
        vocab_size=real.vocab_size, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=80,
        max_source_positions=source_positions, max_target_positions=448, decoder_start_token_id=real.decoder_start_token_id,
        bos_token_id=real.bos_token_id, eos_token_id=real.eos_token_id, pad_token_id=real.pad_token_id,
        suppress_tokens=real.suppress_tokens, begin_suppress_tokens=real.begin_suppress_tokens,
    )
    model = WhisperForConditionalGeneration(config).eval()
    gen = WhisperForConditionalGeneration.from_pretrained(TINY_EN_DIR).generation_config
    model.generation_config = copy.deepcopy(gen)
    return model


def perturbed_copy(target, scale: float, seed: int) -> WhisperForConditionalGeneration:
    """The target with noise on every weight: its own encoder, and a decoder that agrees only partly."""
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp(min=1e-3))
    return draft


def make_pair(target, draft, processor) -> ModelPair:
    return ModelPair(target=target, draft=draft, processor=processor, device=torch.device("cpu"),
                     dtype=torch.float32, shared_encoder=detect_shared_encoder(target, draft),
                     target_name="tiny-random", draft_name="tiny-draft")


def generate_tokens(pair: ModelPair, features: torch.Tensor, timestamps: bool, max_new_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = pair.target.generate(features, do_sample=False, return_timestamps=timestamps,
                                   max_new_tokens=max_new_tokens)
    tokens = out[0].tolist()
    eos = pair.target.generation_config.eos_token_id
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def raw_generate_tokens(model, features: torch.Tensor, timestamps: bool, max_new_tokens: int) -> list[int]:
    """transformers' plain greedy `GenerationMixin.generate` with Whisper's own logits processors on one
    30-s window. (Whisper's `generate(return_timestamps=True)` adds long-form segment handling: it
    re-decodes from the last timestamp and drops an unfinished tail, which is not one window's decoding.)"""
    gc = model.generation_config
    prompt = [gc.decoder_start_token_id] + ([] if timestamps else [gc.no_timestamps_token_id])
    begin = len(prompt)
    processors = [SuppressTokensAtBeginLogitsProcessor(gc.begin_suppress_tokens, begin),
                  SuppressTokensLogitsProcessor(gc.suppress_tokens)]
    if timestamps:
        processors.append(WhisperTimeStampLogitsProcessor(gc, begin_index=begin))
    config = GenerationConfig(decoder_start_token_id=gc.decoder_start_token_id, eos_token_id=gc.eos_token_id,
                              pad_token_id=gc.pad_token_id, do_sample=False, num_beams=1,
                              max_new_tokens=max_new_tokens)
    with torch.inference_mode():
        out = GenerationMixin.generate(model, input_features=features, decoder_input_ids=torch.tensor([prompt]),
                                       logits_processor=LogitsProcessorList(processors), generation_config=config)
    tokens = out[0, begin:].tolist()
    return tokens[: tokens.index(gc.eos_token_id)] if gc.eos_token_id in tokens else tokens


@pytest.fixture(scope="module")
def tiny_features(processor, clips) -> torch.Tensor:
    return processor.feature_extractor(clips[0], sampling_rate=16_000, return_tensors="pt").input_features


@pytest.mark.parametrize("draft_kind", ["shared_encoder", "own_encoder"])
@pytest.mark.parametrize("timestamps", [False, True])
def test_greedy_identity_tiny_random(processor, tiny_features, draft_kind, timestamps):
    target = tiny_target()
    if draft_kind == "shared_encoder":
        draft = derive_draft(target, layers=(0,))
    else:
        draft = perturbed_copy(target, scale=0.3, seed=1)
    pair = make_pair(target, draft, processor)
    assert pair.shared_encoder == (draft_kind == "shared_encoder")
    decoder = SpeculativeDecoder(pair, runtime=FULL_VOCAB)
    max_new = 24
    reference = raw_generate_tokens(target, tiny_features, timestamps, max_new)
    if not timestamps:
        assert generate_tokens(pair, tiny_features, timestamps, max_new) == reference
    off = decoder.decode_features(tiny_features, DecodingOptions(mode="off", timestamps=timestamps,
                                                                 max_new_tokens=max_new))[0]
    assert off.tokens == reference
    assert len(reference) > 10  # a random model rambles: the comparison covers many positions
    accepted = 0
    for mode in SPEC_MODES:
        # transformers' gamma schedule: deterministic, and always drafting (the cost-aware policy may rightly
        # stop drafting for a draft this poor, which would leave the multi-token paths untested)
        res = decoder.decode_features(tiny_features, DecodingOptions(mode=mode, timestamps=timestamps,
                                                                     max_new_tokens=max_new,
                                                                     gamma_policy="heuristic"))[0]
        assert res.tokens == reference, mode
        assert res.stats.shared_encoder == pair.shared_encoder
        accepted += res.stats.accepted
    assert accepted > 0  # some drafts were accepted, so the multi-token/crop paths ran
    if timestamps:
        assert reference[0] >= pair.target.generation_config.no_timestamps_token_id + 1  # rules were active


@pytest.fixture(scope="module")
def real_pair():
    return load_pair(target=str(TINY_EN_DIR), draft=str(DISTIL_DRAFT_DIR), device="cpu")


@pytest.fixture(scope="module")
def derived_pair(real_pair):
    return ModelPair(target=real_pair.target, draft=derive_draft(real_pair.target), processor=real_pair.processor,
                     device=real_pair.device, dtype=real_pair.dtype, shared_encoder=True,
                     target_name=real_pair.target_name, draft_name="derived")


@pytest.mark.parametrize("timestamps", [False, True])
def test_greedy_identity_real_tiny_en(real_pair, derived_pair, clips, timestamps):
    features = real_pair.processor.feature_extractor(clips, sampling_rate=16_000, return_tensors="pt").input_features
    distil = SpeculativeDecoder(real_pair)
    derived = SpeculativeDecoder(derived_pair)
    for i in range(2):  # jfk and the shortest LibriSpeech clip (the third clip is covered by the batch test)
        reference = generate_tokens(real_pair, features[i : i + 1], timestamps, 224)
        off = distil.decode(clips[i], DecodingOptions(mode="off", timestamps=timestamps))[0]
        assert off.tokens == reference
        for mode in SPEC_MODES:
            res = distil.decode(clips[i], DecodingOptions(mode=mode, timestamps=timestamps))[0]
            assert res.tokens == reference, (i, mode)
            assert res.text == off.text
        # with transformers' gamma schedule the distilled draft speculates deep: several tokens per call (exact
        # only: at T = 0 every speculative mode verifies through one greedy function, kernels/api.py)
        deep = distil.decode(clips[i], DecodingOptions(mode="exact", timestamps=timestamps,
                                                       gamma_policy="heuristic"))[0]
        assert deep.tokens == reference and deep.stats.target_calls < len(reference) / 2
        # the derived (undistilled) draft is mostly rejected, which exercises the correction path
        res = derived.decode(clips[i], DecodingOptions(mode="exact", timestamps=timestamps))[0]
        assert res.tokens == reference, (i, "derived")
    jfk = distil.decode(clips[0], DecodingOptions(mode="exact", timestamps=timestamps))[0]
    assert "ask not what your country can do for you" in jfk.text
    if timestamps:
        assert len(jfk.segments) >= 2 and all(s.end > s.start for s in jfk.segments)


def test_hf_mode_matches_off(real_pair, clips):
    decoder = SpeculativeDecoder(real_pair)
    off = decoder.decode(clips[0], DecodingOptions(mode="off"))[0]
    hf = decoder.decode(clips[0], DecodingOptions(mode="hf"))[0]
    assert hf.tokens == off.tokens and hf.stats.mode == "hf"


def test_batch_of_three_equals_each_alone(real_pair, clips):
    decoder = SpeculativeDecoder(real_pair)
    for mode in ("off", "exact"):
        alone = [decoder.decode(c, DecodingOptions(mode=mode))[0].tokens for c in clips]
        together = decoder.decode(clips, DecodingOptions(mode=mode))
        assert len({len(t) for t in alone}) > 1  # the rows really finish at different steps
        assert [r.tokens for r in together] == alone, mode


def test_prompt_and_no_speech(real_pair, clips):
    decoder = SpeculativeDecoder(real_pair)
    silence = np.zeros(16_000 * 2, dtype=np.float32)
    speech, quiet = decoder.decode([clips[0], silence], DecodingOptions(mode="exact"))
    assert 0.0 <= speech.no_speech_prob < 0.5 < quiet.no_speech_prob
    assert np.isfinite(speech.avg_logprob) and speech.avg_logprob < 0
    # a previous-text prompt goes through <|startofprev|>; rows with different prompt lengths still decode
    prompted = decoder.decode([clips[0], clips[0]], DecodingOptions(mode="exact"),
                              prompts=["And so my fellow Americans", None])
    assert prompted[1].tokens == speech.tokens
    assert "country" in prompted[0].text


def test_input_errors(real_pair):
    decoder = SpeculativeDecoder(real_pair)
    with pytest.raises(ValueError, match="empty"):
        decoder.decode(np.zeros(0, dtype=np.float32))
    with pytest.raises(ValueError, match="no audio"):
        decoder.decode([])
    with pytest.raises(ValueError, match="NaN"):
        decoder.decode(np.full(1600, np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match="30 s"):
        decoder.decode(np.zeros(16_000 * 31, dtype=np.float32))
    with pytest.raises(ValueError, match="mono"):
        decoder.decode(np.zeros((1600, 2), dtype=np.float32))  # stereo is not 1600 clips
    with pytest.raises(ValueError, match="mono"):
        decoder.decode([np.zeros((1600, 2), dtype=np.float32)])
    with pytest.raises(ValueError, match="features must have shape"):
        decoder.decode_features(torch.zeros(1, 80, 100))
    target_only = SpeculativeDecoder(ModelPair(real_pair.target, None, real_pair.processor, real_pair.device,
                                               real_pair.dtype, False, "t", None))
    with pytest.raises(ValueError, match="needs a draft"):
        target_only.decode(np.zeros(1600, dtype=np.float32), DecodingOptions(mode="exact"))
    with pytest.raises(ValueError, match="unknown decoding mode"):
        DecodingOptions(mode="fast")


def test_stats_and_profiled_verify(processor, tiny_features):
    target = tiny_target()
    pair = make_pair(target, perturbed_copy(target, scale=0.1, seed=3), processor)
    decoder = SpeculativeDecoder(pair, runtime=FULL_VOCAB)
    opts = DecodingOptions(mode="exact", max_new_tokens=20, gamma=3, profile_verify=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        res = decoder.decode_features(tiny_features, opts)[0]
    st = res.stats
    labelled = [e for e in prof.events() if e.name == "asr_app.verify"]
    # one labelled, timed verify per step that drafted (a last step with no room to draft has none)
    assert 0 < len(labelled) == len(st.verify_steps) <= st.target_calls
    assert all(0 < g <= 3 and s > 0 for g, s in st.verify_steps)
    assert st.drafted == sum(g for g, _ in st.verify_steps)
    assert 0 <= st.accepted <= st.drafted and st.acceptance_rate == pytest.approx(st.accepted / st.drafted)
    assert st.tokens_out == len(res.tokens) + (1 if st.tokens_out < 20 else 0)
    assert st.tokens_out == st.target_calls + st.accepted  # each step keeps its accepted drafts + one token
    assert st.total_s >= st.encoder_s + st.draft_s + st.target_s + st.verify_s > 0
    plain = decoder.decode_features(tiny_features, DecodingOptions(mode="exact", max_new_tokens=20, gamma=3))[0]
    assert plain.tokens == res.tokens and plain.stats.verify_steps == []


@pytest.mark.parametrize("draft_dtype", [torch.float32, torch.bfloat16])
def test_draft_dtype_changes_speed_not_tokens(real_pair, clips, draft_dtype):
    # The draft in its own dtype (ModelPair.draft_dtype, `--draft-dtype`):
    # every mode, hf included, still gives the target-only tokens, and the draft is still accepted often.
    pair = load_pair(target=str(TINY_EN_DIR), draft=str(DISTIL_DRAFT_DIR), device="cpu", draft_dtype=draft_dtype)
    assert next(pair.draft.parameters()).dtype == draft_dtype
    decoder = SpeculativeDecoder(pair)
    reference = SpeculativeDecoder(real_pair).decode(clips[0], DecodingOptions(mode="off", timestamps=True))[0]
    for mode in (*SPEC_MODES, "hf"):
        res = decoder.decode(clips[0], DecodingOptions(mode=mode, timestamps=True, gamma_policy="heuristic"))[0]
        assert res.tokens == reference.tokens, (mode, draft_dtype)
        if mode != "hf":
            assert res.stats.target_calls < len(reference.tokens) / 2
