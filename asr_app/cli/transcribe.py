"""asr-transcribe: long-form transcription of audio files and folders.

    asr-transcribe asr_app/samples/sample.flac                  # transcript to stdout
    asr-transcribe talks/ -o out/ --format all --recursive --skip-existing
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import soundfile as sf

from asr_app.audio import is_audio_path
from asr_app.cli.common import add_model_args, load_decoder_or_report
from asr_app.writers import FORMATS, RENDERERS, output_paths, parse_formats, remove_stale_temps, write_outputs


@dataclasses.dataclass
class Job:
    path: Path
    stem: str          # output name relative to OUTDIR, without extension ("nested/clip")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asr-transcribe",
        description="Transcribe audio files or folders (long files in 30 s windows) with speculative Whisper.")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="audio files and/or folders")
    parser.add_argument("-o", "--output-dir", type=Path, default=None,
                        help="write outputs here (default: print the transcript to stdout)")
    parser.add_argument("--format", default="txt", metavar="FMT",
                        help=f"comma-separated subset of {','.join(FORMATS)}, or 'all' (default: txt)")
    parser.add_argument("--recursive", action="store_true", help="descend into sub-folders")
    parser.add_argument("--skip-existing", action="store_true",
                        help="skip files whose outputs all exist already (resume an interrupted run)")
    parser.add_argument("--batch-size", type=int, default=1, help="files decoded together (default 1)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--no-fallback", action="store_true",
                        help="no temperature fallback (by default a window that loops or is improbable is decoded "
                             "again at T = 0.2 ... 1.0, as Whisper does)")
    add_model_args(parser)
    if "--language" not in parser._option_string_actions:  # common.py may or may not define it
        parser.add_argument("--language", default="en", help="spoken language (default en)")
    return parser


def collect_jobs(paths: list[str], recursive: bool) -> tuple[list[Job], list[str]]:
    """Files as given; folders expanded to their audio files (mirrored under OUTDIR)."""
    jobs: list[Job] = []
    errors: list[str] = []
    seen: dict[str, Path] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            pattern = "**/*" if recursive else "*"
            found = sorted(p for p in path.glob(pattern) if p.is_file() and is_audio_path(p))
            if not found:
                errors.append(f"{path}: no audio files found" + ("" if recursive else " (try --recursive)"))
            candidates = [(p, str(p.relative_to(path).with_suffix(""))) for p in found]
        elif path.exists():
            candidates = [(path, path.stem)]
        else:
            errors.append(f"{path}: no such file or folder")
            continue
        for file, stem in candidates:
            if stem in seen:
                errors.append(f"{file}: output name '{stem}' already used by {seen[stem]}; skipped")
                continue
            seen[stem] = file
            jobs.append(Job(file, stem))
    return jobs, errors


def _duration(path: Path) -> float:
    try:
        return sf.info(str(path)).duration
    except Exception:  # noqa: BLE001 - unreadable files are reported when they are loaded
        return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        formats = parse_formats(args.format)
    except ValueError as exc:
        parser.error(str(exc))
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")

    jobs, failures = collect_jobs(args.paths, args.recursive)
    for message in failures:
        print(f"error: {message}", file=sys.stderr)
    skipped = 0
    if args.skip_existing and args.output_dir is None:
        print("warning: --skip-existing has no effect without -o OUTDIR", file=sys.stderr)
    if args.output_dir is not None:
        remove_stale_temps(args.output_dir)
        if args.skip_existing:
            todo = [j for j in jobs if not all(p.exists() for p in output_paths(args.output_dir, j.stem, formats))]
            skipped = len(jobs) - len(todo)
            jobs = todo
    if not jobs:
        if skipped:
            print(f"nothing to do: all {skipped} file(s) already transcribed", file=sys.stderr)
        return 1 if failures else 0

    # Imported here so that argument errors and "nothing to do" stay instant.
    from asr_app.transcribe import TranscribeOptions, transcribe_many

    decoder = load_decoder_or_report(args, "asr-transcribe")  # the models load once, here
    if decoder is None:
        return 2
    decoding = dataclasses.replace(decoder.options, language=args.language)
    options = TranscribeOptions(decoding=decoding, batch_size=args.batch_size,
                                **({"temperature_fallback": ()} if args.no_fallback else {}))

    from tqdm import tqdm

    total_audio = sum(_duration(j.path) for j in jobs)
    bar = tqdm(total=total_audio, unit="s", unit_scale=False, desc="audio", disable=args.quiet,
               file=sys.stderr, bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s audio "
                                           "[{elapsed}<{remaining}, {rate_fmt}]")
    started = time.perf_counter()
    done = 0
    by_key = {i: j for i, j in enumerate(jobs)}
    items = ((i, j.path) for i, j in by_key.items())
    for key, outcome in transcribe_many(decoder, items, options, on_progress=bar.update):
        job = by_key[key]
        if isinstance(outcome, Exception):
            failures.append(str(outcome) if str(job.path) in str(outcome) else f"{job.path}: {outcome}")
            bar.write(f"error: {failures[-1]}", file=sys.stderr)
            continue
        done += 1
        if args.output_dir is not None:
            write_outputs(outcome, args.output_dir, job.stem, formats)
        else:
            header = f"==> {job.path} <==\n" if len(jobs) > 1 else ""
            bar.clear()
            sys.stdout.write(header + RENDERERS[formats[0]](outcome))
            sys.stdout.flush()
            bar.refresh()
    if not failures:
        bar.n = bar.total  # header durations and decoded lengths differ by resampling rounding
        bar.refresh()
    bar.close()

    elapsed = time.perf_counter() - started
    summary = f"{done} transcribed, {len(failures)} failed"
    if skipped:
        summary += f", {skipped} skipped (outputs exist)"
    print(f"{summary} in {elapsed:.1f} s" + (f" -> {args.output_dir}" if args.output_dir else ""),
          file=sys.stderr)
    if failures:
        print("failed:\n" + "\n".join(f"  {m}" for m in failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
