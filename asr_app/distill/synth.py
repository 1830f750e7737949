"""Synthetic speech to bootstrap a draft: sentences -> voices (voices.py) -> augmented 16 kHz clips.

Distillation needs audio, not transcripts; where little real speech is at hand, Debian's espeak-ng speaks
any text in many languages (flite and festival add other voices for some), and varied voices, rates and
pitches plus noise, reverb, speed and level changes keep the clips from all sounding alike. Synthetic speech
bootstraps a draft; it is no substitute for real speech in the evaluation (docs/distill.md).
tools/make_synthetic_speech.py is the command.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from asr_app.audio import SAMPLE_RATE
from asr_app.distill.voices import ESPEAK, SpeakError, SynthError, random_voice, synthesize


@dataclass(frozen=True)
class AugmentOptions:
    noise_probability: float = 0.55
    snr_db: tuple[float, float] = (8.0, 40.0)
    reverb_probability: float = 0.2
    rt60_s: tuple[float, float] = (0.15, 0.6)
    speed_probability: float = 0.3
    speed: tuple[float, float] = (0.9, 1.1)
    level_dbfs: tuple[float, float] = (-28.0, -1.0)   # peak level
    silence_s: tuple[float, float] = (0.0, 0.5)       # added before and after


# ---------------------------------------------------------------------- augmentation
def coloured_noise(length: int, colour: str, rng: np.random.Generator) -> np.ndarray:
    """White, pink (1/f power) or brown (1/f^2) noise of unit RMS."""
    white = rng.standard_normal(length)
    if colour != "white":
        spectrum = np.fft.rfft(white)
        freqs = np.maximum(np.fft.rfftfreq(length), 1.0 / length)
        spectrum /= freqs ** (0.5 if colour == "pink" else 1.0)
        white = np.fft.irfft(spectrum, n=length)
    return (white / (np.sqrt(np.mean(white ** 2)) + 1e-12)).astype(np.float32)


def add_noise(x: np.ndarray, snr_db: float, rng: np.random.Generator, colour: str = "white") -> np.ndarray:
    """`x` plus noise at `snr_db` below its power."""
    power = float(np.mean(x.astype(np.float64) ** 2))
    noise = coloured_noise(x.size, colour, rng) * np.sqrt(power / 10 ** (snr_db / 10))
    return (x + noise).astype(np.float32)


def reverb(x: np.ndarray, rt60_s: float, rng: np.random.Generator) -> np.ndarray:
    """`x` in a synthetic room: convolved with exponentially decaying noise (60 dB down after `rt60_s`),
    direct sound first; the tail is cut at the clip's length plus the decay."""
    taps = max(1, int(rt60_s * SAMPLE_RATE))
    t = np.arange(taps) / SAMPLE_RATE
    response = rng.standard_normal(taps) * np.exp(-6.9078 * t / rt60_s)  # ln(1000): 60 dB of amplitude
    response[0] = 1.0
    response /= np.sqrt(np.sum(response ** 2))
    size = x.size + taps - 1
    wet = np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(response, size), n=size)
    return wet.astype(np.float32)


def change_speed(x: np.ndarray, factor: float) -> np.ndarray:
    """Played `factor` times faster (tempo and pitch together, as a tape would)."""
    return soxr.resample(x, SAMPLE_RATE * factor, SAMPLE_RATE).astype(np.float32)


def set_level(x: np.ndarray, peak_dbfs: float) -> np.ndarray:
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    return x if peak == 0 else (x * (10 ** (peak_dbfs / 20) / peak)).astype(np.float32)


def augment(x: np.ndarray, rng: np.random.Generator, options: AugmentOptions = AugmentOptions()) -> tuple[np.ndarray, dict]:
    """A random mix of the changes above; (audio, what was applied)."""
    o, done = options, {}
    if rng.random() < o.speed_probability:
        done["speed"] = round(float(rng.uniform(*o.speed)), 3)
        x = change_speed(x, done["speed"])
    before, after = (int(rng.uniform(*o.silence_s) * SAMPLE_RATE) for _ in range(2))
    x = np.concatenate([np.zeros(before, np.float32), x, np.zeros(after, np.float32)])
    if rng.random() < o.reverb_probability:
        done["rt60_s"] = round(float(rng.uniform(*o.rt60_s)), 3)
        x = reverb(x, done["rt60_s"], rng)
    if rng.random() < o.noise_probability:
        done["snr_db"] = round(float(rng.uniform(*o.snr_db)), 1)
        done["noise"] = str(rng.choice(["white", "pink", "brown"]))
        x = add_noise(x, done["snr_db"], rng, done["noise"])
    done["peak_dbfs"] = round(float(rng.uniform(*o.level_dbfs)), 1)
    return set_level(x, done["peak_dbfs"]), done


def generate(sentences: Iterable[tuple[str, str]], out: Path, seed: int = 0,
             options: AugmentOptions | None = AugmentOptions(),
             progress: Callable[[], None] = lambda: None, engines: tuple[str, ...] = (ESPEAK,),
             skip: Callable[[str, str, str], None] = lambda language, text, reason: None) -> list[Path]:
    """(language, text) pairs as FLAC files under `out/<language>/`, each in a random voice of `engines` and
    (unless `options` is None) augmented; `out/manifest.jsonl` says how each was made. A sentence its voice
    cannot speak is left out and passed to `skip` with the reason; the others go on."""
    rng = np.random.default_rng(seed)
    written = []
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "manifest.jsonl", "a", encoding="utf-8") as manifest:
        for index, (language, text) in enumerate(sentences):
            voice = random_voice(language, rng, engines=engines)
            try:
                audio = synthesize(text, voice)
            except SpeakError as exc:
                skip(language, text, str(exc))
                progress()
                continue
            audio, applied = augment(audio, rng, options) if options is not None else (audio, {})
            path = out / language / f"{language}-{seed}-{index:06d}.flac"
            path.parent.mkdir(exist_ok=True)
            sf.write(str(path), audio, SAMPLE_RATE)
            manifest.write(json.dumps({"file": str(path.relative_to(out)), "text": text, **asdict(voice),
                                       "augment": applied}, ensure_ascii=False) + "\n")
            written.append(path)
            progress()
    return written


def augment_files(paths: Iterable[Path], out: Path, copies: int, seed: int = 0,
                  options: AugmentOptions = AugmentOptions(),
                  progress: Callable[[], None] = lambda: None) -> list[Path]:
    """`copies` augmented versions of each real recording as FLAC files under `out/real/`: a little real
    speech goes further when each clip is also heard faster, slower, noisier and in a room. Files that cannot
    be read raise SynthError naming them; `out/manifest.jsonl` says how each copy was made."""
    from asr_app.audio import AudioLoadError, load_audio

    rng = np.random.default_rng(seed)
    written = []
    (out / "real").mkdir(parents=True, exist_ok=True)
    with open(out / "manifest.jsonl", "a", encoding="utf-8") as manifest:
        for path in paths:
            try:
                audio = load_audio(path)
            except AudioLoadError as exc:
                raise SynthError(f"cannot use {path}: {exc}") from exc
            # Two recordings may share a name in different folders: the source's path names the copies too.
            tag = hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:8]
            for copy in range(copies):
                augmented, applied = augment(audio, rng, options)
                target = out / "real" / f"{path.stem}-{tag}-aug{seed}-{copy}.flac"
                sf.write(str(target), augmented, SAMPLE_RATE)
                manifest.write(json.dumps({"file": str(target.relative_to(out)), "source": str(path),
                                           "augment": applied}) + "\n")
                written.append(target)
            progress()
    return written
