"""Training audio: folders of files -> clips of at most one 30 s window, each named by its content.

A clip's key is a hash of its file's bytes plus its window index, so a cached teacher record follows the
audio, not its path: renaming or moving files keeps the cache, and changing a file's audio does not.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from asr_app.audio import (
    SAMPLE_RATE,
    WINDOW_SECONDS,
    AudioLoadError,
    check_sample_rate,
    is_audio_path,
    load_audio,
)
from asr_app.distill.errors import DistillError
from asr_app.folders import files_under
from asr_app.languages import LANGUAGES

MIN_SECONDS = 0.3  # a file's last window shorter than this is left out (nothing to transcribe)


@dataclass(frozen=True)
class Clip:
    key: str          # content hash of the file + window index
    path: Path
    window: int       # which 30 s window of the file
    seconds: float    # audio in this window
    folder_language: str | None = None   # the language its folders name, below the --audio folder (see below)

    @property
    def start(self) -> float:
        return self.window * WINDOW_SECONDS

    @property
    def digest(self) -> str:
        """The hash of its file's bytes (a file's windows share it)."""
        return self.key.rsplit("-w", 1)[0]


def folder_language(path: Path, root: Path) -> str | None:
    """The language a file's folders name below `root` (the --audio folder it was found in): the nearest folder
    called by a Whisper language code (`speech/de/clip.flac` -> "de", as tools/make_synthetic_speech.py lays
    its output out), or None. Folders above `root` are not asked: they name where the data lives, and
    `/work/ml/...` is not Malayalam."""
    try:
        below = path.relative_to(root).parent
    except ValueError:
        return None
    return next((name for name in reversed(below.parts) if name in LANGUAGES), None)


@dataclass
class Inventory:
    """The clips found in some folders, and what was left out (with why)."""

    clips: list[Clip]
    files: int
    skipped: list[str]

    @property
    def hours(self) -> float:
        return sum(c.seconds for c in self.clips) / 3600


def audio_files(sources: Iterable[Path]) -> tuple[list[Path], list[str]]:
    """Audio files under `sources` (folders searched recursively, files as given), and the sources that
    are neither."""
    files: list[Path] = []
    missing: list[str] = []
    for source in sources:
        source = Path(source)
        if source.is_dir():
            files += files_under(source, is_audio_path)
        elif source.is_file():
            files.append(source)
        else:
            missing.append(f"{source}: no such file or folder")
    return list(dict.fromkeys(files)), missing


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:24]


def _header_seconds(path: Path) -> float:
    """The file's length from its header alone (AudioLoadError / OSError when it cannot be used): cheap, so
    every file is checked before any model loads, not found broken half way through the teacher pass."""
    if path.stat().st_size == 0:
        raise AudioLoadError(f"{path}: file is empty (0 bytes)")
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioLoadError(f"{path}: not a readable audio file ({exc})") from exc
    if not info.frames > 0:
        raise AudioLoadError(f"{path}: contains no audio (0 frames)")
    check_sample_rate(info.samplerate, str(path))   # a 1 Hz header would pass for hours of audio
    return info.frames / info.samplerate


def _file_clips(path: Path, language: str | None) -> list[Clip]:
    """The windows of one file (AudioLoadError / OSError when it cannot be used)."""
    seconds = _header_seconds(path)
    if seconds < MIN_SECONDS:
        raise AudioLoadError(f"{path}: {seconds:.2f} s of audio, shorter than the {MIN_SECONDS} s a clip needs")
    digest = file_hash(path)
    windows = max(1, math.ceil(seconds / WINDOW_SECONDS))
    clips = []
    for index in range(windows):
        length = min(WINDOW_SECONDS, seconds - index * WINDOW_SECONDS)
        if length >= MIN_SECONDS:
            clips.append(Clip(f"{digest}-w{index}", path, index, round(length, 3), language))
    return clips


def _ignore(line: str) -> None:
    """Where no one listens for skipped files (the error when none is left still says why)."""


def inventory(sources: Sequence[Path], role: str = "training", skip: Callable[[str], None] = _ignore) -> Inventory:
    """The clips of every usable file under `sources`; `skip` hears one line for each file left out (which
    and why), as it is found; DistillError when there is none."""
    files, skipped = audio_files(sources)
    for line in skipped:
        skip(line)
    folders = [Path(s) for s in sources if Path(s).is_dir()]
    clips: list[Clip] = []
    keys: set[str] = set()
    for path in files:
        # The outermost folder given that holds the file: `--audio speech speech/de` and `speech/de speech` agree.
        roots = [f for f in folders if path.is_relative_to(f)]
        language = folder_language(path, min(roots, key=lambda f: len(f.parts))) if roots else None
        try:
            # The same bytes under two names (a copy, a link) are one clip: trained on once, labelled once.
            fresh = [c for c in _file_clips(path, language) if c.key not in keys]
        except (AudioLoadError, OSError) as exc:
            skipped.append(str(exc))
            skip(str(exc))
            continue
        keys.update(c.key for c in fresh)
        clips += fresh
    if not clips:
        where = ", ".join(str(s) for s in sources)
        why = f"; first problem: {skipped[0]}" if skipped else ""
        raise DistillError(f"no usable {role} audio in {where}: {len(files)} audio file(s) found, none usable "
                           f"(extensions read: wav, flac, ogg, opus, mp3, ...){why}")
    return Inventory(clips, len(files), skipped)


def split_holdout(clips: list[Clip], fraction: float) -> tuple[list[Clip], list[Clip]]:
    """(training, held-out): the files whose hashes sort first are held out, whole (a file's windows never
    land on both sides), at least one file when there are two or more."""
    digests = sorted({c.digest for c in clips})
    count = math.ceil(fraction * len(digests)) if fraction > 0 and len(digests) > 1 else 0
    held = set(digests[: min(count, len(digests) - 1)])
    return [c for c in clips if c.digest not in held], [c for c in clips if c.digest in held]


class ClipReader:
    """A clip's 16 kHz samples; the last file read is kept, since a long file's windows come in order."""

    def __init__(self) -> None:
        self._path: Path | None = None
        self._samples = np.zeros(0, dtype=np.float32)

    def __call__(self, clip: Clip) -> np.ndarray:
        if clip.path != self._path:
            self._samples, self._path = load_audio(clip.path), clip.path
        start = int(clip.start * SAMPLE_RATE)
        samples = self._samples[start : start + int(WINDOW_SECONDS * SAMPLE_RATE)]
        if samples.size == 0:
            raise AudioLoadError(f"{clip.path}: window {clip.window} holds no samples")
        return samples
