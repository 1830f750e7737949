"""Transcript writers (txt, srt, vtt, tsv, json), each output written atomically (fileio.write_atomic)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from asr_app.fileio import TEMP_PREFIX, write_all_atomic
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


def remove_stale_temps(out_dir: str | Path) -> list[Path]:
    """Delete temporary files a killed run left behind (they are never valid outputs)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    stale = [p for p in out_dir.rglob(TEMP_PREFIX + "*") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale
