"""Transcript writers (txt, srt, vtt, tsv, json), each output written atomically (fileio.write_atomic)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from asr_app.fileio import TEMP_PREFIX, host_tag, temp_owner, write_all_atomic
from asr_app.transcript import Transcript

FORMATS = ("txt", "srt", "vtt", "tsv", "json")


def parse_formats(spec: str | Sequence[str]) -> list[str]:
    """'txt,srt' / 'all' / ['json'] -> validated list in a stable order."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = {item.strip().lower() for item in items if item.strip()}
    if "all" in names:
        return list(FORMATS)
    unknown = sorted(names - set(FORMATS))
    if unknown or not names:
        raise ValueError(f"unknown output format(s) {unknown or spec!r}; choose from {', '.join(FORMATS)} or all")
    return [name for name in FORMATS if name in names]


def format_timestamp(seconds: float, decimal_marker: str = ",") -> str:
    """SRT style 'HH:MM:SS,mmm' (VTT uses '.'); hours always shown, both formats accept that."""
    millis = max(0, int(round(seconds * 1000)))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{millis:03d}"


def _cues(transcript: Transcript, max_words: int | None = None) -> Iterable[tuple[float, float, str]]:
    """(start, end, text) per subtitle cue: one per segment, or groups of at most `max_words` words timed by
    the words themselves when the transcript has word timestamps."""
    for seg in transcript.segments:
        if max_words and seg.words:
            for i in range(0, len(seg.words), max_words):
                group = seg.words[i : i + max_words]
                text = " ".join("".join(w.word for w in group).split())
                if text:
                    yield group[0].start, max(group[-1].end, group[0].start + 0.001), text
            continue
        # Blank lines end a cue in SRT/VTT, so collapse all whitespace in the text.
        text = " ".join(seg.text.split())
        if text:
            yield seg.start, max(seg.end, seg.start + 0.001), text


def to_txt(transcript: Transcript) -> str:
    lines = [" ".join(seg.text.split()) for seg in transcript.segments]
    return "\n".join(line for line in lines if line) + "\n"


def to_srt(transcript: Transcript, max_words: int | None = None) -> str:
    blocks = [f"{i}\n{format_timestamp(start)} --> {format_timestamp(end)}\n{text}\n"
              for i, (start, end, text) in enumerate(_cues(transcript, max_words), start=1)]
    return "\n".join(blocks)


def to_vtt(transcript: Transcript, max_words: int | None = None) -> str:
    blocks = [f"{format_timestamp(start, '.')} --> {format_timestamp(end, '.')}\n{text}\n"
              for start, end, text in _cues(transcript, max_words)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def to_tsv(transcript: Transcript) -> str:
    """openai-whisper's TSV: start and end in integer milliseconds, then the text (tabs in it become spaces)."""
    rows = [f"{round(1000 * start)}\t{round(1000 * end)}\t{text.replace(chr(9), ' ')}"
            for start, end, text in _cues(transcript)]
    return "start\tend\ttext\n" + "".join(row + "\n" for row in rows)


def to_json(transcript: Transcript) -> str:
    return json.dumps(transcript.to_dict(), indent=2, ensure_ascii=False) + "\n"


RENDERERS = {"txt": to_txt, "srt": to_srt, "vtt": to_vtt, "tsv": to_tsv, "json": to_json}


def output_paths(out_dir: str | Path, stem: str, formats: Sequence[str]) -> list[Path]:
    return [Path(out_dir) / f"{stem}.{fmt}" for fmt in formats]


def render(transcript: Transcript, fmt: str, max_words_per_line: int | None = None) -> str:
    """One output format; `max_words_per_line` makes SRT/VTT cues of that many words (word timestamps)."""
    if fmt in ("srt", "vtt") and max_words_per_line:
        return RENDERERS[fmt](transcript, max_words_per_line)
    return RENDERERS[fmt](transcript)


def write_outputs(transcript: Transcript, out_dir: str | Path, stem: str, formats: Sequence[str],
                  max_words_per_line: int | None = None) -> list[Path]:
    """Render every format, then write them all together or none (fileio.write_all_atomic); returns the
    written paths. JSON is renamed last."""
    out_dir = Path(out_dir)
    (out_dir / stem).parent.mkdir(parents=True, exist_ok=True)  # stems may hold sub-folders
    ordered = sorted(formats, key=lambda fmt: fmt == "json")
    return write_all_atomic({out_dir / f"{stem}.{fmt}": render(transcript, fmt, max_words_per_line)
                             for fmt in ordered})


STALE_AFTER_S = 24 * 3600.0  # a staged file whose owner cannot be checked is left this long (another host's)


def remove_stale_temps(out_dir: str | Path, max_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Delete the temporary files killed runs left behind (they are never valid outputs), and only those:
    one staged on this host whose process is gone (or whose process id now belongs to a process started
    after the file was written), or, where the owner cannot be checked (another host, an older name), one
    older than `max_age_s`. A file another live run is staging right now is left alone."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    removed = []
    for path in out_dir.rglob(TEMP_PREFIX + "*"):
        try:
            if path.is_file() and _is_stale(path, max_age_s):
                path.unlink()
                removed.append(path)
        except FileNotFoundError:  # renamed or removed by its owner meanwhile
            continue
    return removed


def _is_stale(path: Path, max_age_s: float) -> bool:
    written = path.stat().st_mtime
    owner = temp_owner(path.name)
    if owner is not None and owner[1] == host_tag():
        started = _process_start(owner[0])
        return started is None or started > written + 1.0  # gone, or the id is another process's now
    return time.time() - written > max_age_s


def _process_start(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch; 0.0 when it runs and the time is unknown), or
    None when there is no such process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # another user's process: it exists
    try:  # Linux: the start in clock ticks after boot, field 22 of /proc/<pid>/stat
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0
