"""File and Compare tabs: whole-clip transcription, and exact / sigmoid / baseline side by side.

Plain functions over a `UiEngine`; `asr_app.ui` wires them to Gradio components. Bad input
(not audio, empty, unreadable) comes back as a message in the result, never as an exception.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from asr_app.audio import SAMPLE_RATE, WINDOW_SECONDS, AudioFileReader, AudioLoadError, is_silent
from asr_app.limits import LimitExceeded
from asr_app.longform import TranscribeOptions, transcribe
from asr_app.ui.engine import COMPARE_MODES, UiEngine, public_name
from asr_app.ui.text import count_differences, word_diff
from asr_app.wer import basic_normalize, word_error_rate
from asr_app.writers import write_outputs

log = logging.getLogger(__name__)

DOWNLOAD_FORMATS = ("srt", "vtt", "json")
# Below this the encoder sees mostly padding and Whisper tends to invent words; say so.
SHORT_CLIP_S = 0.3

_downloads_root: Path | None = None


DOWNLOADS_KEPT_S = 3600  # a request's subtitle files are deleted this long after they were written


def _downloads_dir() -> Path:
    """A folder for one request's SRT/VTT/JSON downloads (Gradio copies them to its cache), inside a
    per-process folder that is removed at exit; folders older than DOWNLOADS_KEPT_S go at the next request."""
    global _downloads_root
    if _downloads_root is None:
        _downloads_root = Path(tempfile.mkdtemp(prefix="asr_app_ui_"))
        atexit.register(shutil.rmtree, _downloads_root, ignore_errors=True)
    cutoff = time.time() - DOWNLOADS_KEPT_S
    for old in _downloads_root.iterdir():
        try:
            expired = old.stat().st_mtime < cutoff
        except FileNotFoundError:   # another request cleaned it up between the listing and now
            continue
        if expired:
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(dir=_downloads_root))


def _probe(path: str | Path | None, engine: UiEngine) -> tuple[float | None, bool, str]:
    """(seconds, silent, problem) of an upload: its bytes and duration checked against the engine's limits
    from the header first, then read window by window (an upload of any length costs a window's memory).
    `problem` is what to tell the user (never a server path), seconds None then."""
    if path is None or str(path).strip() == "":
        return None, False, "Upload or record an audio clip first."
    energy_threshold = engine.streaming.energy_threshold
    try:
        reader = AudioFileReader(path)
    except AudioLoadError as exc:
        return None, False, f"Cannot use this file: {_private(str(exc), path)}"
    try:
        engine.limits.check_upload_file(path)
    except LimitExceeded as exc:
        reader.close()
        return None, False, f"Cannot use {_display_name(path)}: {exc}."
    window = int(WINDOW_SECONDS * SAMPLE_RATE)
    try:
        silent = all(is_silent(reader.window(start, window), energy_threshold)
                     for start in range(0, reader.samples, window))
    except AudioLoadError as exc:
        return None, False, f"Cannot use this file: {_private(str(exc), path)}"
    finally:
        reader.close()
    return reader.samples / SAMPLE_RATE, silent, ""


def _display_name(path: str | Path) -> str:
    return Path(path).name


def _private(text: str, path: str | Path) -> str:
    """`text` with the upload's server-side folder taken out (users see the file's name only)."""
    return text.replace(str(path), _display_name(path)).replace(str(Path(path).parent) + "/", "")


@dataclass
class FileOutcome:
    message: str                                  # empty when all went well, else what to tell the user
    text: str = ""
    segments: list[list[str | float]] = field(default_factory=list)   # [start, end, text] rows
    words: list[list[str | float]] = field(default_factory=list)      # [word, start, end, probability] rows
    files: list[str] = field(default_factory=list)                     # SRT, VTT, JSON paths
    stats: dict[str, float | int | str | None] = field(default_factory=dict)


def _file_stats(transcript, audio_s: float, wall_s: float) -> dict:
    """The transcript's decoding stats (summed over its windows) plus wall time and RTF."""
    stats = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in transcript.stats.items()}
    stats.update(audio_s=round(audio_s, 3), wall_s=round(wall_s, 3),
                 real_time_factor=round(wall_s / audio_s, 3) if audio_s else None)
    return stats


def transcribe_file(engine: UiEngine, path: str | Path | None, mode: str, temperature: float,
                    language: str = "auto") -> FileOutcome:
    """Transcribe one uploaded/recorded clip with segment timestamps and downloadable subtitles."""
    audio_s, silent, problem = _probe(path, engine)
    if audio_s is None:
        return FileOutcome(message=problem)
    try:
        decoder = engine.session_decoder(mode, temperature, language, timestamps=True, word_timestamps=True)
    except ValueError as exc:
        return FileOutcome(message=str(exc))
    if silent:
        return FileOutcome(message=f"No speech recognised in {_display_name(path)} ({audio_s:.1f} s): "
                                   "the clip is silent.")
    started = time.perf_counter()
    try:
        # The path (read window by window); the JSON names the uploaded file, not where the server keeps it.
        transcript = transcribe(decoder, path, TranscribeOptions(temperature_fallback=engine.fallback(temperature)))
        transcript.source = _display_name(path)
        transcript.model = {key: public_name(value) if key in ("target", "draft") and value else value
                            for key, value in transcript.model.items()}   # model folders by name, not path
        files = write_outputs(transcript, _downloads_dir(), Path(path).stem or "transcript", DOWNLOAD_FORMATS)
    except Exception as exc:  # shown in the page instead of a traceback
        log.exception("transcription of %s failed", path)
        return FileOutcome(message=_private(f"Transcription of {_display_name(path)} failed: "
                                            f"{type(exc).__name__}: {exc}", path))
    wall_s = time.perf_counter() - started
    segments = [[round(seg.start, 2), round(seg.end, 2), seg.text.strip()] for seg in transcript.segments]
    words = [[w.word.strip(), round(w.start, 2), round(w.end, 2), round(w.probability, 3)]
             for seg in transcript.segments for w in seg.words or []]
    text = transcript.text.strip()
    message = ""
    if not text:
        message = f"No speech recognised in {_display_name(path)} ({audio_s:.1f} s)."
    elif audio_s < SHORT_CLIP_S:
        message = f"{_display_name(path)} is very short ({audio_s:.2f} s); the text may be unreliable."
    return FileOutcome(message=message, text=text, segments=segments, words=words, files=[str(f) for f in files],
                       stats=_file_stats(transcript, audio_s, wall_s))


@dataclass
class ModeRun:
    mode: str
    text: str
    latency_s: float
    acceptance_rate: float | None
    verify_s: float
    verify_steps: int
    tokens_out: int
    wer: float | None = None
    differences: int = 0
    highlighted: list[tuple[str, str | None]] = field(default_factory=list)


@dataclass
class CompareOutcome:
    message: str
    runs: list[ModeRun] = field(default_factory=list)
    anchor: str = ""          # what the highlights are relative to

    def table(self) -> list[list[str | float | None]]:
        """Rows for the metrics table: mode, WER, latency, acceptance, verify time, differing words."""
        return [[run.mode,
                 None if run.wer is None else round(run.wer, 4),
                 round(run.latency_s, 3),
                 None if run.acceptance_rate is None else round(run.acceptance_rate, 4),
                 round(run.verify_s * 1000, 2),
                 run.verify_steps,
                 run.differences] for run in self.runs]

    def chart_rows(self) -> list[dict[str, str | float]]:
        """Stacked bars per mode: the verification step's share of the decoding time and the rest."""
        rows: list[dict[str, str | float]] = []
        for run in self.runs:
            rows.append({"mode": run.mode, "part": "verification step", "seconds": run.verify_s})
            rows.append({"mode": run.mode, "part": "rest of decoding",
                         "seconds": max(run.latency_s - run.verify_s, 0.0)})
        return rows


def compare_modes(engine: UiEngine, path: str | Path | None, reference: str | None,
                  temperature: float) -> CompareOutcome:
    """Decode one clip with exact, sigmoid and baseline (same seed) and line the results up."""
    audio_s, silent, problem = _probe(path, engine)
    if audio_s is None:
        return CompareOutcome(message=problem)
    if not engine.has_draft:
        return CompareOutcome(message="Compare needs a draft model; this app was launched target-only.")
    if silent:
        return CompareOutcome(message=f"{_display_name(path)} is silent: nothing to compare.")
    runs: list[ModeRun] = []
    for mode in COMPARE_MODES:
        try:
            # profile_verify times every verification step (it adds syncs, so only here, not live).
            decoder = engine.session_decoder(mode, temperature, profile_verify=True)
            started = time.perf_counter()
            transcript = transcribe(decoder, path, TranscribeOptions(temperature_fallback=engine.fallback(temperature)))
            latency = time.perf_counter() - started
        except Exception as exc:
            log.exception("compare: mode %s failed on %s", mode, path)
            return CompareOutcome(message=_private(f"Mode {mode} failed on {_display_name(path)}: "
                                                   f"{type(exc).__name__}: {exc}", path))
        text = transcript.text.strip()
        usage = decoder.usage
        runs.append(ModeRun(mode=mode, text=text, latency_s=latency, acceptance_rate=usage.acceptance_rate,
                            verify_s=usage.verify_s, verify_steps=len(usage.verify_steps),
                            tokens_out=usage.tokens_out))
    reference = (reference or "").strip()
    normalize = _normalizer(engine)
    message = ""
    if reference:
        try:
            for run in runs:
                run.wer = word_error_rate(reference, run.text, normalize)
        except ValueError as exc:
            message = f"WER not computed: {exc}."
    anchor_name = "the reference" if reference and not message else "baseline"
    anchor = reference if anchor_name == "the reference" else next(r.text for r in runs if r.mode == "baseline")
    for run in runs:
        run.highlighted = word_diff(run.text, anchor)
        run.differences = count_differences(run.highlighted)
    if float(temperature) == 0.0:
        note = "At temperature 0 all modes decode greedily, so their tokens must be identical."
        message = f"{message} {note}".strip()
    return CompareOutcome(message=message, runs=runs, anchor=anchor_name)


def _normalizer(engine: UiEngine):
    """Whisper's English normaliser (with the model's spelling map) when the tokenizer has one."""
    tokenizer = getattr(engine.pair.processor, "tokenizer", None)
    if tokenizer is not None and hasattr(tokenizer, "normalize"):
        return tokenizer.normalize
    return basic_normalize
