"""The bad-input corpus: every case gets one clear line naming the file and the reason, the rest of the batch
goes on, nothing is lost and nothing half-written is left; memory stays bounded on long files."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from conftest import DISTIL_DRAFT_DIR, JFK_FLAC, REPO_ROOT, TINY_EN_DIR, lj_clip

from asr_app.audio import SAMPLE_RATE, AudioFileReader, AudioLoadError, load_audio
from asr_app.cli import transcribe as cli
from asr_app.fileio import TEMP_PREFIX

MODEL_ARGS = ["--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR), "--device", "cpu", "--threads", "1"]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def speech(seconds_from: str = "LJ001-0002") -> np.ndarray:
    return load_audio(lj_clip(seconds_from))


def build_corpus(folder: Path) -> dict[str, str | None]:
    """Write every bad (and a few good but unusual) input; returns name -> expected reason (None: fine)."""
    folder.mkdir(parents=True)
    clip = speech()
    rng = np.random.default_rng(0)
    cases: dict[str, str | None] = {}
    data = bytearray(JFK_FLAC.read_bytes())
    data[300:] = rng.integers(0, 256, len(data) - 300, dtype=np.uint8).tobytes()
    (folder / "corrupt.flac").write_bytes(bytes(data))
    cases["corrupt.flac"] = "not a readable audio file"
    (folder / "empty.wav").write_bytes(b"")
    cases["empty.wav"] = "file is empty"
    sf.write(folder / "header-only.wav", np.zeros(0, dtype=np.float32), 16_000)
    cases["header-only.wav"] = "contains no audio samples"
    nan = clip.copy()
    nan[100:110] = np.nan
    sf.write(folder / "nan.wav", nan, 16_000, subtype="FLOAT")
    cases["nan.wav"] = "NaN or infinite"
    (folder / "notes.mp3").write_text("these are meeting notes, not audio")
    cases["notes.mp3"] = "not a readable audio file"
    (folder / "loop.wav").symlink_to(folder / "loop.wav")
    cases["loop.wav"] = "symbolic links"
    # A header that lies about its rate: read as 1 Hz, a second of speech would be 4.4 hours of audio.
    sf.write(folder / "claims-1hz.wav", clip[:16_000], 1)
    cases["claims-1hz.wav"] = "sample rate 1 Hz is outside the 8000-192000 Hz accepted"
    for rate in (8_000, 44_100, 96_000):
        sf.write(folder / f"rate-{rate}.wav", soxr.resample(clip, 16_000, rate), rate)
        cases[f"rate-{rate}.wav"] = None
    sf.write(folder / "stereo.flac", np.stack([clip, 0.3 * clip], axis=1), 16_000)
    cases["stereo.flac"] = None
    sf.write(folder / "silence.wav", np.zeros(5 * 16_000, dtype=np.float32), 16_000)
    cases["silence.wav"] = None
    sf.write(folder / "noise.wav", (rng.standard_normal(5 * 16_000) * 0.03).astype(np.float32), 16_000)
    cases["noise.wav"] = None
    sf.write(folder / "50ms.wav", clip[:800], 16_000)
    cases["50ms.wav"] = None
    sf.write(folder / "héllo wörld 日本.flac", clip, 16_000)
    cases["héllo wörld 日本.flac"] = None
    return cases


def test_the_corpus_in_one_batch(tmp_path, capsys):
    folder, out = tmp_path / "in", tmp_path / "out"
    cases = build_corpus(folder)
    status = cli.main([str(folder), "-o", str(out), "--format", "all", "--mode", "exact", "--quiet", *MODEL_ARGS])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err
    bad = {name: reason for name, reason in cases.items() if reason}
    for name, reason in bad.items():
        lines = [line for line in err.splitlines() if line.startswith("error:") and name in line]
        assert len(lines) == 1 and reason in lines[0], (name, err)  # one line, naming the file and the reason
    assert f"{len(cases) - len(bad)} transcribed, {len(bad)} failed" in err
    for name, reason in cases.items():
        stem = Path(name).stem
        written = sorted(p.name for p in out.glob(f"{stem}.*"))
        assert written == ([] if reason else [f"{stem}.{f}" for f in ("json", "srt", "tsv", "txt", "vtt")]), name
    assert not list(out.rglob(TEMP_PREFIX + "*"))
    for name in ("rate-8000.wav", "rate-44100.wav", "rate-96000.wav", "stereo.flac", "héllo wörld 日本.flac"):
        assert "comparatively modern" in (out / f"{Path(name).stem}.txt").read_text().lower(), name
    assert (out / "silence.txt").read_text().strip() == ""  # silence is not decoded (Whisper would say "you")


def _as_nobody(code: str, *paths: Path) -> subprocess.CompletedProcess:
    """Run Python code as an ordinary user (nobody): root reads and writes whatever it likes."""
    for p in paths:
        p.chmod(p.stat().st_mode | 0o055)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HOME": tempfile.gettempdir()}
    with _passable_to_others(REPO_ROOT, Path(sys.prefix)):
        return subprocess.run([*NOBODY, sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              timeout=120)


@contextlib.contextmanager
def _passable_to_others(*places: Path):
    """Let other users pass through (o+x, not read) the folders above the checkout and the venv while
    the block runs: a clean checkout may sit in a private folder (mktemp -d is 0700), where `nobody`
    could not even import the package."""
    changed = {}
    for place in places:
        for folder in [place.resolve(), *place.resolve().parents]:
            mode = folder.stat().st_mode
            if folder not in changed and not mode & 0o001:
                changed[folder] = mode
                folder.chmod(mode | 0o001)
    try:
        yield
    finally:
        for folder, mode in changed.items():
            folder.chmod(mode)


def test_unreadable_file_and_read_only_folder_as_an_ordinary_user():
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        locked = root / "locked.flac"
        sf.write(locked, speech(), 16_000)
        locked.chmod(0o600)  # the owner (root) only
        readonly = root / "readonly"
        readonly.mkdir()
        readonly.chmod(0o555)
        code = (f"from asr_app.audio import load_audio\n"
                f"try:\n    load_audio({str(locked)!r})\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
                f"from asr_app.fileio import unwritable\nprint(unwritable(__import__('pathlib').Path({str(readonly)!r})))")
        out = _as_nobody(code, root)
        assert out.returncode == 0, out.stderr
        first, second = out.stdout.strip().splitlines()
        assert first == f"AudioLoadError {locked}: cannot be read (Permission denied)"
        assert second == f"cannot write to the output folder {readonly}: Permission denied"


def test_long_files_are_read_window_by_window(tmp_path):
    # 12 minutes of 44.1 kHz stereo: the reader never holds much more than a window and a block of it.
    rate, seconds = 44_100, 720
    path = tmp_path / "long.flac"
    tone = (0.1 * np.sin(np.arange(rate * 60) * 2 * np.pi * 220 / rate)).astype(np.float32)
    with sf.SoundFile(path, "w", rate, 2, format="FLAC") as f:
        for _ in range(seconds // 60):
            f.write(np.stack([tone, tone], axis=1))
    reader = AudioFileReader(path)
    assert reader.samples == seconds * SAMPLE_RATE
    window, peak = 30 * SAMPLE_RATE, 0
    for start in range(0, reader.samples, 25 * SAMPLE_RATE):  # overlapping windows, as long-form reads them
        piece = reader.window(start, window)
        peak = max(peak, reader._buffer.size)
        assert piece.dtype == np.float32 and piece.ndim == 1
    assert peak <= window + int((reader.BLOCK_S + 1) * SAMPLE_RATE)
    with pytest.raises(ValueError, match="only goes forward"):
        reader.window(0, 10)
    # the same samples as reading the whole file at once
    short = tmp_path / "short.flac"
    sf.write(short, np.stack([tone[: rate * 25], tone[: rate * 25]], axis=1), rate)
    whole, streamed = load_audio(short), AudioFileReader(short)
    joined = np.concatenate([streamed.window(s, 7 * SAMPLE_RATE) for s in range(0, len(whole), 7 * SAMPLE_RATE)])
    np.testing.assert_allclose(joined[: len(whole)], whole, atol=1e-6)


def test_reader_messages(tmp_path):
    loop = tmp_path / "loop.wav"
    loop.symlink_to(loop)
    with pytest.raises(AudioLoadError, match=re.escape(f"{loop}: cannot be opened (Too many levels of symbolic links)")):
        AudioFileReader(loop)
    garbage = tmp_path / "garbage.mp3"
    garbage.write_bytes(bytes(range(256)) * 50)
    with pytest.raises(AudioLoadError, match="garbage.mp3: not a readable audio file") as err:
        load_audio(garbage)
    assert "pipe" not in str(err.value) and "System error" not in str(err.value)
