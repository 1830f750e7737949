"""Audio loading and sources on real files (tests/data/audio) and deliberately broken ones."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from conftest import JFK_FLAC, lj_clip

from asr_app.audio import (
    SAMPLE_RATE,
    AudioFileReader,
    AudioLoadError,
    FileSource,
    MicrophoneError,
    MicrophoneSource,
    is_audio_path,
    load_audio,
    prepare_audio,
)


@pytest.fixture(scope="module")
def stereo_44k(tmp_path_factory) -> Path:
    """jfk.flac as a recording would arrive: 44.1 kHz stereo FLAC (the two channels differ)."""
    mono, rate = sf.read(str(JFK_FLAC), dtype="float32")
    up = soxr.resample(mono, rate, 44_100)
    path = tmp_path_factory.mktemp("formats") / "jfk-44k-stereo.flac"
    sf.write(str(path), np.stack([up, 0.5 * up], axis=1), 44_100, subtype="PCM_24")
    return path


@pytest.fixture(scope="module")
def lj_wav_22k(tmp_path_factory) -> Path:
    """LJ001-0002 as the corpus ships it: 22.05 kHz mono WAV."""
    mono, rate = sf.read(str(lj_clip("LJ001-0002")), dtype="float32")
    path = tmp_path_factory.mktemp("formats") / "LJ001-0002.wav"
    sf.write(str(path), soxr.resample(mono, rate, 22_050), 22_050, subtype="PCM_16")
    return path


def test_stereo_44k_flac_is_downmixed_and_resampled(stereo_44k):
    raw, rate = sf.read(str(stereo_44k), dtype="float32", always_2d=True)
    assert rate == 44_100 and raw.shape[1] == 2  # the premise of the test
    audio = load_audio(stereo_44k)
    assert audio.ndim == 1 and audio.dtype == np.float32
    assert abs(audio.size - raw.shape[0] * SAMPLE_RATE / rate) <= 2
    expected = soxr.resample(raw.mean(axis=1), rate, SAMPLE_RATE, quality="HQ")
    np.testing.assert_allclose(audio, expected, atol=1e-6)
    assert 0.05 < np.abs(audio).max() <= 1.0


def test_22k_wav_is_resampled(lj_wav_22k):
    info = sf.info(str(lj_wav_22k))
    assert info.samplerate == 22_050
    audio = load_audio(lj_wav_22k)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(audio.size - info.frames * SAMPLE_RATE / 22_050) <= 2
    assert np.isfinite(audio).all() and audio.std() > 0.01


def test_corrupt_flac_names_file_and_reason(tmp_path):
    data = JFK_FLAC.read_bytes()
    bad = tmp_path / "broken.flac"
    bad.write_bytes(data[:200] + bytes(range(256)) * 20)
    with pytest.raises(AudioLoadError, match=r"broken\.flac: not a readable audio file"):
        load_audio(bad)


def test_truncated_flac_is_an_error(tmp_path):
    bad = tmp_path / "half.flac"
    bad.write_bytes(JFK_FLAC.read_bytes()[: JFK_FLAC.stat().st_size // 2])
    with pytest.raises(AudioLoadError, match=r"half\.flac"):
        load_audio(bad)


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(AudioLoadError, match=r"empty\.wav: file is empty"):
        load_audio(empty)


def test_zero_length_audio(tmp_path):
    path = tmp_path / "zero.wav"
    sf.write(str(path), np.zeros(0, dtype=np.float32), 16_000)
    with pytest.raises(AudioLoadError, match=r"zero\.wav: contains no audio samples"):
        load_audio(path)


def test_non_audio_file(tmp_path):
    text = tmp_path / "notes.wav"
    text.write_text("this is a shopping list, not a recording\n" * 20)
    with pytest.raises(AudioLoadError, match=r"notes\.wav: not a readable audio file.*Format not recognised"):
        load_audio(text)


def test_missing_file(tmp_path):
    with pytest.raises(AudioLoadError, match="file not found"):
        load_audio(tmp_path / "nope.flac")


def test_nan_samples_in_file(tmp_path):
    path = tmp_path / "nan.wav"
    samples = np.full(1600, 0.1, dtype=np.float32)
    samples[100:110] = np.nan
    samples[500] = np.inf
    sf.write(str(path), samples, 16_000, subtype="FLOAT")
    with pytest.raises(AudioLoadError, match=r"nan\.wav: 11 samples are NaN or infinite"):
        load_audio(path)


@pytest.mark.parametrize("rate", [1, 4_000, 384_000])
def test_rates_outside_8_to_192_khz_are_refused_before_resampling(tmp_path, rate):
    """A header claiming 1 Hz would be resampled 16,000-fold (gigabytes from a 30 kB file): every reader
    refuses it first, the in-memory one, the window-by-window one and the array one."""
    path = tmp_path / "lies.wav"
    sf.write(str(path), np.zeros(16_000, dtype=np.float32), rate)
    message = rf"lies\.wav: sample rate {rate} Hz is outside the 8000-192000 Hz accepted"
    with pytest.raises(AudioLoadError, match=message):
        load_audio(path)
    with pytest.raises(AudioLoadError, match=message):
        AudioFileReader(path)
    with pytest.raises(AudioLoadError, match="sample rate"):
        prepare_audio(np.zeros(16, dtype=np.int16), rate)
    for fine in (8_000, 192_000):
        assert prepare_audio(np.zeros(fine // 100, dtype=np.float32), fine).size == 160


def test_prepare_int16_browser_chunk_scales_by_full_range():
    # A quiet 48 kHz stereo int16 chunk: must stay quiet (never normalised by its own max).
    t = np.arange(4800) / 48_000
    tone = (300 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    chunk = np.stack([tone, tone], axis=1)
    out = prepare_audio(chunk, 48_000)
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(out.size - 1600) <= 1
    assert 0.8 * 300 / 32768 < np.abs(out).max() < 1.2 * 300 / 32768


def test_prepare_silent_int16_chunk_is_zero_not_nan():
    out = prepare_audio(np.zeros((2400, 2), dtype=np.int16), 48_000)
    assert out.size == 800 and np.all(out == 0)


def test_float_audio_far_past_full_scale_is_refused_as_integer_pcm_sent_as_float():
    speech_as_int16_values = (8000 * np.sin(np.arange(1600) / 7)).astype(np.float32)
    with pytest.raises(AudioLoadError, match=r"float samples should lie within \[-1, 1\] but reach 8000.*16-bit PCM"):
        prepare_audio(speech_as_int16_values, SAMPLE_RATE, source="audio frame")
    with pytest.raises(AudioLoadError, match="reach 1e\\+30"):
        prepare_audio(np.array([0.0, 1e30], dtype=np.float32), SAMPLE_RATE)
    hot = prepare_audio(np.array([0.0, 1.5, -2.0], dtype=np.float32), SAMPLE_RATE)   # a little past: kept as is
    assert hot.tolist() == [0.0, 1.5, -2.0]
    assert prepare_audio((speech_as_int16_values).astype(np.int16), SAMPLE_RATE).max() < 0.25   # integers scale


def test_prepare_channels_first_and_empty():
    left = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)
    out = prepare_audio(np.stack([left, -left]), SAMPLE_RATE)  # (2, N): mean is zero
    assert out.shape == (1600,) and np.allclose(out, 0)
    assert prepare_audio(np.zeros(0, dtype=np.int16), 48_000).size == 0
    with pytest.raises(AudioLoadError, match="NaN"):
        prepare_audio(np.array([0.0, np.nan], dtype=np.float32), SAMPLE_RATE)


def test_audio_extensions():
    assert is_audio_path("a/B.FLAC") and is_audio_path("x.mp3") and not is_audio_path("notes.txt")


def test_file_source_fast_yields_the_whole_file_in_blocks():
    source = FileSource(JFK_FLAC, block_s=0.25, realtime=False)
    blocks = list(source)
    assert all(b.dtype == np.float32 for b in blocks)
    assert {b.size for b in blocks[:-1]} == {4000}
    np.testing.assert_array_equal(np.concatenate(blocks), load_audio(JFK_FLAC))


def test_file_source_realtime_paces_and_drains_when_late():
    audio = np.random.default_rng(0).normal(0, 0.1, SAMPLE_RATE).astype(np.float32)  # 1 s
    source = FileSource(audio, block_s=0.1, realtime=True, speed=4.0)  # 1 s of audio in >= 0.25 s
    start = time.monotonic()
    sizes = []
    for i, block in enumerate(source):
        sizes.append(block.size)
        if i == 0:
            time.sleep(0.15)  # a slow consumer: the next yield must hand over everything recorded
    assert time.monotonic() - start >= 0.25 - 1e-3  # blocks are never early
    assert sum(sizes) == SAMPLE_RATE
    assert max(sizes[1:]) > 1600  # the backlog came as one larger block, not as a queue of small ones


def test_microphone_without_portaudio_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # import fails as when the library is absent
    with pytest.raises(MicrophoneError, match="microphone unavailable.*--simulate FILE"):
        MicrophoneSource()


def test_microphone_without_input_device_is_a_clear_error(monkeypatch):
    fake = types.ModuleType("sounddevice")

    class PortAudioError(Exception):
        pass

    def query_devices(device=None, kind=None):
        raise PortAudioError("Error querying device -1")

    fake.PortAudioError = PortAudioError
    fake.query_devices = query_devices
    monkeypatch.setitem(sys.modules, "sounddevice", fake)
    with pytest.raises(MicrophoneError, match="no usable input device"):
        MicrophoneSource()


def test_energy_gate_on_silence_noise_and_speech():
    from asr_app.audio import SILENCE_RMS, is_silent, peak_frame_rms

    assert is_silent(np.zeros(16_000, dtype=np.float32)) and peak_frame_rms(np.zeros(0, np.float32)) == 0.0
    hiss = np.random.default_rng(0).normal(0, SILENCE_RMS / 4, 16_000).astype(np.float32)
    assert is_silent(hiss)
    speech = load_audio(JFK_FLAC)
    assert not is_silent(speech) and peak_frame_rms(speech) > 10 * SILENCE_RMS
    # one loud 30 ms frame in a second of silence is enough to count as sound
    blip = np.zeros(16_000, dtype=np.float32)
    blip[4800:5280] = 0.1
    assert not is_silent(blip)


def test_a_many_channel_file_is_read_in_blocks_bounded_in_samples_not_frames(tmp_path):
    """Each read takes BLOCK_S of mono audio in samples over all channels: a 16-channel file is read in blocks of
    a sixteenth of the frames, so one block never holds more than a mono block would (and the downmix is right)."""
    speech, rate = sf.read(str(lj_clip("LJ001-0002")), dtype="float32")
    path = tmp_path / "sixteen.wav"
    sf.write(path, np.repeat(speech[:, None], 16, axis=1), rate, subtype="FLOAT")
    reader = AudioFileReader(path)
    read, sizes = reader._file.read, []
    reader._file = types.SimpleNamespace(
        read=lambda frames, **kw: sizes.append(frames) or read(frames, **kw),
        tell=reader._file.tell, frames=reader._file.frames, channels=16, close=reader._file.close)
    audio = reader.window(0, reader.samples)
    reader.close()
    assert sizes and max(sizes) * 16 <= AudioFileReader.BLOCK_S * rate
    expected = soxr.resample(speech, rate, 16_000) if rate != 16_000 else speech
    assert audio.shape[0] == pytest.approx(expected.shape[0], abs=2)
    assert np.abs(audio[:1000] - expected[:1000]).max() < 1e-3
