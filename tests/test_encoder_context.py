"""DecodingOptions.encoder_context_s: the encoder over the audio plus a few seconds of padding instead of the
whole 30 s window (real tiny.en pair, real speech). A short context can make the decoder loop (it does not
see where the audio ends); such rows are decoded again over the whole window, so the option never returns a
loop, and with a few seconds of context the text stays the full window's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import LIBRISPEECH_DIR, lj_clip

from asr_app.audio import load_audio
from asr_app.decoding import DecodingOptions, SpeculativeDecoder
from asr_app.decoding.text import compression_ratio
from asr_app.wer import word_error_rate

LIBRI = {p.stem: p for p in LIBRISPEECH_DIR.rglob("*.flac")}
LOOPING = [LIBRI["1089-134691-0000"], LIBRI["1089-134686-0001"]]   # looped with 0.5 s of context
CLIPS = [LIBRI["1089-134686-0000"], lj_clip("LJ001-0004")]


@pytest.fixture(scope="module")
def decoder(tiny_en_pair, one_torch_thread) -> SpeculativeDecoder:
    return SpeculativeDecoder(tiny_en_pair, DecodingOptions(mode="exact", timestamps=True))


def _one_by_one(decoder, buffers, context):
    """Each buffer alone (a batch's encoder input is its longest row's audio plus the context)."""
    options = dataclasses.replace(decoder.options, encoder_context_s=context)
    return [decoder.decode([b], options)[0] for b in buffers]


def _buffers() -> list[np.ndarray]:
    """Streaming-like buffers: growing prefixes of real clips (2 s, 5 s, whole)."""
    out = []
    for path in CLIPS:
        audio = load_audio(path)
        out += [audio[: s * 16_000] for s in (2, 5) if s * 16_000 < audio.size] + [audio]
    return out


def test_a_short_context_never_returns_a_loop(decoder):
    """With half a second of padding tiny.en loops on some buffers (seen: 'He could wait no longer.' five
    times); those rows are decoded again over the whole window and give the full window's text."""
    buffers = [load_audio(path) for path in LOOPING]
    full = _one_by_one(decoder, buffers, None)
    short = _one_by_one(decoder, buffers, 0.5)
    retried = [r.stats.context_retries for r in short]
    assert sum(retried) >= 1, "no buffer looped with 0.5 s of context: this test no longer tests the retry"
    for buffer, f, s, again in zip(buffers, full, short, retried):
        assert compression_ratio(s.text) <= 2.4 and len(s.tokens) <= 12 * 30 + 16
        if again == 2:
            assert s.tokens == f.tokens   # lost with twice the context too: the whole window's decode
        elif again == 1:
            assert s.tokens == _one_by_one(decoder, [buffer], 1.0)[0].tokens   # kept twice the context's decode


def test_a_few_seconds_of_context_keeps_the_text_and_encodes_less(decoder):
    buffers = _buffers()
    full = _one_by_one(decoder, buffers, None)
    short = _one_by_one(decoder, buffers, 3.0)
    wer = np.mean([word_error_rate(f.text, s.text) for f, s in zip(full, short) if f.text.strip()])
    differing = [(f.text, s.text) for f, s in zip(full, short) if word_error_rate(f.text, s.text) > 0]
    # Seen here: one or two buffers of six differ by a word ("books" / "book"): mean 2.4%.
    assert wer <= 0.05 and len(differing) <= 2, differing
    # The encoder's input: the longest buffer plus 3 s of feature frames (100 a second), not 3000.
    features = decoder.feature_extractor([buffers[0]], sampling_rate=16_000, return_tensors="pt").input_features
    seconds = buffers[0].size / 16_000
    chosen = decoder._encoder_input(features, dataclasses.replace(decoder.options, encoder_context_s=3.0), [seconds])
    assert chosen.shape[-1] == 2 * int(np.ceil((seconds + 3.0) * 50)) < features.shape[-1]
    with pytest.raises(ValueError, match="encoder_context_s"):
        DecodingOptions(encoder_context_s=31.0)


def test_a_shortened_decode_stops_where_it_would_be_redone_anyway(decoder, monkeypatch):
    """A looping row is cut at the token count that marks it lost (token_cap), not run to the decoder's limit:
    in a lock-step batch it would keep every other row stepping. The result is the same (it is redone)."""
    from asr_app.decoding import context

    audio = load_audio(LOOPING[0])
    seconds = audio.size / 16_000
    assert context.token_cap(seconds) == int(12 * seconds + 16) + 1
    seen = []
    real = context.lost_end_of_audio
    monkeypatch.setattr("asr_app.decoding.engine.lost_end_of_audio",
                        lambda result, window, ctx: seen.append(len(result.tokens)) or real(result, window, ctx))
    short = _one_by_one(decoder, [audio], 0.5)[0]
    full = _one_by_one(decoder, [audio], None)[0]
    # Seen here: it loops with 0.5 s and with 1 s of context, so it is decoded a third time, over the window.
    assert short.stats.context_retries == 2, "no longer loops with 0.5 s and 1 s of context: pick another case"
    assert short.tokens == full.tokens
    assert seen and max(seen) <= context.token_cap(seconds), (seen, context.token_cap(seconds))


def test_a_lost_decode_is_done_again_with_twice_the_context_before_the_whole_window(decoder, monkeypatch):
    """Seen here: "He could wait no longer." loops with 1 s of context and not with 2 s; it is redone once,
    over 2 s (a seventh of the whole window's encoder frames), not over all 30 s."""
    from asr_app.decoding.context import lost_end_of_audio, retry_contexts

    assert retry_contexts(3.0, 5.0, 30.0) == (6.0, None)
    assert retry_contexts(3.0, 25.0, 30.0) == (None,)    # twice the context would reach the window's end
    assert retry_contexts(0.0, 5.0, 30.0) == (None,)
    audio = load_audio(LOOPING[0])
    seconds = audio.size / 16_000
    wider = _one_by_one(decoder, [audio], 2.0)[0]
    encoded = []   # the feature frames each decode encodes
    real = decoder._encoder_input
    monkeypatch.setattr(decoder, "_encoder_input", lambda *a: encoded.append((out := real(*a)).shape[-1]) or out)
    result = _one_by_one(decoder, [audio], 1.0)[0]
    assert encoded == [2 * int(np.ceil((seconds + c) * 50)) for c in (1.0, 2.0)], encoded   # never 3000
    assert wider.stats.context_retries == 0 and not lost_end_of_audio(wider, seconds, 2.0)
    assert result.stats.context_retries == 1, "1 s of context no longer loops here: pick another case"
    assert result.tokens == wider.tokens


def test_features_for_a_shortened_input_are_the_whole_windows_value_for_value(decoder, monkeypatch):
    """Only the frames the encoder reads (and a margin) are computed, with a shortened input or the whole window;
    the rest are filled with the padding's value. A batch of different lengths, silence, and speech cut mid-word
    at its end."""
    from asr_app.decoding.context import feature_samples

    speech = np.concatenate([load_audio(path) for path in CLIPS + LOOPING] * 2)
    assert speech.size > 26 * 16_000
    clips = [speech[:5 * 16_000], speech[:2 * 16_000 + 123], np.zeros(16_000, dtype=np.float32),
             speech[:25 * 16_000 + 8_000]]   # the last: about 2950 of 3000 frames computed, the rest filled
    computed = []   # the frames the extractor computed in each of `_features`' calls
    extractor = decoder.feature_extractor
    monkeypatch.setattr(decoder, "feature_extractor", lambda *a, **k: computed.append(
        (out := extractor(*a, **k)).input_features.shape[-1]) or out)
    for batch, context in (([clips[0], clips[1]], 3.0), ([clips[2]], 3.0), ([clips[0], clips[2]], 0.5),
                           ([clips[3]], 3.0), ([clips[3]], 0.5), ([clips[1], clips[3]], 0.0),
                           ([clips[0], clips[1]], None), ([clips[2]], None), ([clips[3]], None)):
        windows = [c.size / 16_000 for c in batch]
        whole = extractor(batch, sampling_rate=16_000, return_tensors="pt").input_features
        options = dataclasses.replace(decoder.options, encoder_context_s=context)
        assert feature_samples(context, windows, 30.0, 16_000) < 30 * 16_000   # frames are filled in each
        assert decoder._features(batch, options, windows).equal(whole), (windows, context)
        assert computed[-1] == feature_samples(context, windows, 30.0, 16_000) // 160 < 3000   # fewer computed
    assert feature_samples(3.0, [5.0, 2.0], 30.0, 16_000) == 9 * 16_000     # 5 s + 3 s + a 1 s margin
    assert feature_samples(None, [5.0, 2.0], 30.0, 16_000) == 6 * 16_000    # no context: 5 s + the margin
    assert feature_samples(3.0, [26.5], 30.0, 16_000) is None and feature_samples(None, [29.5], 30.0, 16_000) is None
