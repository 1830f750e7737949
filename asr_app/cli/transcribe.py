"""asr-transcribe: long-form transcription of audio files and folders.

    asr-transcribe asr_app/samples/sample.flac                  # transcript to stdout
    asr-transcribe talks/ -o out/ --format all --recursive --skip-existing
    asr-transcribe talk.mp3 --model tiny.en --output_dir out --output_format srt   # openai-whisper's flags

Arguments are checked before anything heavy is imported: --help and a bad option answer at once.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path

import soundfile as sf

from asr_app.arguments import (
    FALLBACK_INCREMENT,
    add_model_args,
    check_args_or_report,
    fallback_schedule,
    load_decoder_or_report,
    parse_bool,
)
from asr_app.audio import is_audio_path
from asr_app.cli.progress import Progress
from asr_app.cluster import FILE_TIMEOUT_S, TIMEOUT_PER_AUDIO_S, ray_device_problem
from asr_app.fileio import unwritable
from asr_app.writers import FORMATS, output_paths, parse_formats, remove_stale_temps, render, write_outputs


@dataclasses.dataclass
class Job:
    path: Path
    stem: str          # output name relative to OUTDIR, without extension ("nested/clip")
    seconds: float = 0.0  # audio length from the file header (0 when unreadable), for the progress


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asr-transcribe",
        description="Transcribe audio files or folders (long files in 30 s windows) with speculative Whisper.")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="audio files and/or folders")
    parser.add_argument("-o", "--output-dir", "--output_dir", dest="output_dir", type=Path, default=None,
                        help="write outputs here (default: print the transcript to stdout)")
    parser.add_argument("-f", "--format", "--output_format", dest="format", default="txt", metavar="FMT",
                        help=f"comma-separated subset of {','.join(FORMATS)}, or 'all' (default: txt)")
    parser.add_argument("--vad_filter", "--vad-filter", action="store_true",
                        help="skip audio without speech, found by Silero VAD (the vad extra), as faster-whisper does")
    parser.add_argument("--word_timestamps", "--word-timestamps", type=parse_bool, nargs="?", const=True,
                        default=False, metavar="BOOL",
                        help="word start/end times from the target's cross-attention, in the json output "
                             "(and the SRT/VTT cues with --max_words_per_line)")
    parser.add_argument("--max_words_per_line", "--max-words-per-line", type=int, default=None, metavar="N",
                        help="SRT/VTT cues of at most N words, timed by their words (needs --word_timestamps)")
    parser.add_argument("--initial_prompt", "--initial-prompt", default=None,
                        help="text to condition the first window on (names, spellings, style)")
    parser.add_argument("--recursive", action="store_true", help="descend into sub-folders")
    parser.add_argument("--skip-existing", action="store_true",
                        help="skip files whose outputs all exist already (resume an interrupted run)")
    parser.add_argument("--batch-size", type=int, default=1, help="files decoded together (default 1)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--no-fallback", action="store_true",
                        help="no temperature fallback (by default a window that loops or is improbable is decoded "
                             "again at T = 0.2 ... 1.0, as Whisper does)")
    cluster = parser.add_argument_group("scale-out (docs/scale.md)")
    cluster.add_argument("--engine", choices=("local", "ray"), default="local",
                         help="local: this process; ray: worker actors on a Ray cluster (the cluster extra)")
    cluster.add_argument("--address", default=None,
                         help="Ray cluster to join: auto or ray://host:port (default: start a local instance)")
    cluster.add_argument("--num-workers", "--num_workers", dest="num_workers", type=int, default=None,
                         help="worker actors, each with its own model copy (default 2)")
    cluster.add_argument("--gpus-per-worker", "--gpus_per_worker", dest="gpus_per_worker", type=float, default=0.0,
                         help="GPUs per worker actor, fractions allowed (default 0: CPU workers)")
    cluster.add_argument("--file-timeout", "--file_timeout", dest="file_timeout", type=float, default=None,
                         metavar="S", help=f"a worker holding a file longer than S seconds plus {TIMEOUT_PER_AUDIO_S:g}x "
                                           "its audio length is taken as stuck: it is stopped and the file moves to "
                                           f"another worker (default {FILE_TIMEOUT_S:g})")
    parser.add_argument("--temperature_increment_on_fallback", "--temperature-increment-on-fallback", type=float,
                        default=None, help="fallback temperature step when --temperature is one number "
                                           f"(default {FALLBACK_INCREMENT:g})")
    add_model_args(parser)
    return parser


def collect_jobs(paths: list[str], recursive: bool) -> tuple[list[Job], list[str]]:
    """Files as given; folders expanded to their audio files (mirrored under OUTDIR). Outputs are named by
    the file's name without its extension; files that share that name (a.wav and a.flac) keep their
    extension in it (a.wav.txt, a.flac.txt), so neither is skipped. A file listed twice is decoded once."""
    errors: list[str] = []
    candidates: list[tuple[Path, str]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            pattern = "**/*" if recursive else "*"
            # a broken or looping link is kept: it fails loudly when read instead of vanishing from the batch
            found = sorted(p for p in path.glob(pattern) if is_audio_path(p) and (p.is_file() or p.is_symlink()))
            if not found:
                errors.append(f"{path}: no audio files found" + ("" if recursive else " (try --recursive)"))
            candidates += [(p, str(p.relative_to(path).with_suffix(""))) for p in found]
        elif path.exists():
            candidates.append((path, path.stem))
        else:
            errors.append(f"{path}: no such file or folder")
    extensions: dict[str, set[str]] = collections.defaultdict(set)   # the extensions each stem comes with
    for file, stem in candidates:
        extensions[stem].add(file.suffix.lower())
    jobs: list[Job] = []
    seen: dict[str, Path] = {}
    for file, stem in candidates:
        name = stem if len(extensions[stem]) == 1 else stem + file.suffix
        if name in seen:
            if seen[name].resolve() != file.resolve():   # the same name in two folders given
                errors.append(f"{file}: output name '{name}' already used by {seen[name]}; skipped")
            continue
        seen[name] = file
        jobs.append(Job(file, name))
    return jobs, errors


def decoding_summary(transcripts: list) -> str:
    """One line: how the files were decoded, and how well the draft did."""
    stats = [t.stats for t in transcripts]
    drafted = sum(s.get("drafted") or 0 for s in stats)
    accepted = sum(s.get("accepted") or 0 for s in stats)
    tokens = sum(s.get("tokens_out") or 0 for s in stats)
    calls = sum(s.get("target_calls") or 0 for s in stats)
    first = transcripts[0]
    line = f"decoded with mode {first.mode}: {short_model_name(first.model.get('target'))}"
    if first.model.get("draft") and drafted:
        line += (f" + {short_model_name(first.model['draft'])}; draft acceptance {100 * accepted / drafted:.0f}%, "
                 f"{tokens / max(calls, 1):.2f} tokens per target call")
    return line


def short_model_name(spec: object) -> str:
    """A local model folder by its last two parts (models/whisper-tiny.en); a hub id or a name as it is."""
    path = Path(str(spec))
    if not path.is_dir():
        return str(spec)
    path = path.resolve()
    return f"{path.parent.name}/{path.name}"


def _duration(path: Path) -> float:
    try:
        return sf.info(str(path)).duration
    except Exception:  # noqa: BLE001 - unreadable files are reported when they are loaded
        return 0.0


def _pending(args, formats: list[str], jobs: list[Job]) -> tuple[list[Job], int, str | None]:
    """(jobs still to do, how many were skipped, a problem that stops the run before any model loads)."""
    if args.output_dir is None:
        return jobs, 0, None
    problem = unwritable(args.output_dir, keep=False)   # made with the first outputs: none left by a failed load
    if problem:
        return jobs, 0, problem
    remove_stale_temps(args.output_dir)
    if not args.skip_existing:
        return jobs, 0, None
    todo = [j for j in jobs if not all(p.exists() for p in output_paths(args.output_dir, j.stem, formats))]
    return todo, len(jobs) - len(todo), None


def _emit(outcome, job: Job, args, formats: list[str], several: bool, progress: Progress) -> str | None:
    """Write (all formats of the file, or none) or print one transcript; the failure, if writing failed."""
    if args.output_dir is None:
        progress.clear()
        sys.stdout.write((f"==> {job.path} <==\n" if several else "") + render(outcome, formats[0], args.max_words_per_line))
        sys.stdout.flush()
        return None
    try:
        write_outputs(outcome, args.output_dir, job.stem, formats, args.max_words_per_line)
    except OSError as exc:  # a full disk, a folder made read-only meanwhile: this file fails, not the batch
        return f"{job.path}: cannot write its outputs to {args.output_dir}: {exc.strerror or exc}"
    return None


def transcribe_options(args, decoder):
    """The long-form options the arguments ask for, over `decoder`'s decoding options (also built inside
    each Ray worker, from the same arguments)."""
    from asr_app.longform import TranscribeOptions

    increment = args.temperature_increment_on_fallback
    fallback = fallback_schedule(args.temperature, FALLBACK_INCREMENT if increment is None else increment,
                                 not args.no_fallback)
    decoding = dataclasses.replace(decoder.options, word_timestamps=args.word_timestamps)
    return TranscribeOptions(decoding=decoding, batch_size=args.batch_size, temperature_fallback=fallback,
                             initial_prompt=args.initial_prompt, vad_filter=args.vad_filter)


def _run(outcomes, jobs: list[Job], args, formats: list[str], failures: list[str], progress: Progress,
         per_window: bool) -> list:
    """Write each file as its outcome arrives; returns the transcripts. `per_window`: progress already
    came window by window (local engine), else it moves a whole file at a time."""
    decoded = []
    for key, outcome in outcomes:
        job = jobs[key]
        failure = None
        if isinstance(outcome, Exception):
            failure = str(outcome) if str(job.path) in str(outcome) else f"{job.path}: {outcome}"
            progress.drop(job.seconds)
        else:
            if not per_window:
                progress.update(job.seconds)
            failure = _emit(outcome, job, args, formats, len(jobs) > 1, progress)
        if failure:
            failures.append(failure)
            progress.write(f"error: {failure}")
        else:
            decoded.append(outcome)
    progress.close()
    return decoded


def _run_local(args, jobs: list[Job], formats: list[str], failures: list[str]) -> tuple[list, str] | None:
    from asr_app.longform import transcribe_many

    decoder = load_decoder_or_report(args, "asr-transcribe")  # the models load once, here
    if decoder is None:
        return None
    started = time.perf_counter()
    progress = Progress(sum(j.seconds for j in jobs), enabled=not args.quiet)
    items = ((i, j.path) for i, j in enumerate(jobs))
    outcomes = transcribe_many(decoder, items, transcribe_options(args, decoder), on_progress=progress.update)
    decoded = _run(outcomes, jobs, args, formats, failures, progress, per_window=True)
    return decoded, _elapsed(started, args)


def _run_ray(args, jobs: list[Job], formats: list[str], failures: list[str]) -> tuple[list, str] | None:
    import functools

    from asr_app.arguments import decoder_from_args
    from asr_app.cluster import ClusterError, ClusterOptions, RayTranscriber, summary_lines

    started = time.perf_counter()
    try:
        cluster = ClusterOptions(address=args.address, num_workers=args.num_workers,
                                 cpus_per_worker=float(args.threads or 1), gpus_per_worker=args.gpus_per_worker,
                                 file_timeout_s=FILE_TIMEOUT_S if args.file_timeout is None else args.file_timeout)
        with RayTranscriber(functools.partial(decoder_from_args, args), functools.partial(transcribe_options, args),
                            cluster) as transcriber:
            progress = Progress(sum(j.seconds for j in jobs), enabled=not args.quiet)
            outcomes = transcriber.run([(i, j.path) for i, j in enumerate(jobs)], args.batch_size,
                                       durations={i: j.seconds for i, j in enumerate(jobs)})
            decoded = _run(outcomes, jobs, args, formats, failures, progress, per_window=False)
    except (ClusterError, ValueError) as exc:
        print(f"asr-transcribe: error: {exc}", file=sys.stderr)
        return None
    for line in summary_lines(transcriber.report, time.perf_counter() - started):
        print(line, file=sys.stderr)
    return decoded, _elapsed(started, args)


def _elapsed(started: float, args) -> str:
    return f" in {time.perf_counter() - started:.1f} s" + (f" -> {args.output_dir}" if args.output_dir else "")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        formats = parse_formats(args.format)
    except ValueError as exc:
        parser.error(str(exc))
    _check_cli_options(parser, args)
    if not check_args_or_report(args, "asr-transcribe"):
        return 2
    missing = _missing_extra(args)
    if missing:
        print(f"asr-transcribe: error: {missing}", file=sys.stderr)
        return 2
    jobs, failures = collect_jobs(args.paths, args.recursive)
    for message in failures:
        print(f"error: {message}", file=sys.stderr)
    jobs, skipped, problem = _pending(args, formats, jobs)
    if problem:  # before any model loads: nothing could be saved
        print(f"asr-transcribe: error: {problem}", file=sys.stderr)
        return 2
    if not jobs:
        if skipped:
            print(f"nothing to do: all {skipped} file(s) already transcribed", file=sys.stderr)
        return 1 if failures else 0
    for job in jobs:
        job.seconds = _duration(job.path)
    try:
        ran = (_run_ray if args.engine == "ray" else _run_local)(args, jobs, formats, failures)
    except KeyboardInterrupt:   # Ctrl-C: files finished before it keep their outputs, the one under way has none
        if failures:
            print("failed before the interruption:\n" + "\n".join(f"  {m}" for m in failures), file=sys.stderr)
        kept = (" the files finished before it are written (the same command with --skip-existing goes on from "
                "there)") if args.output_dir else ""
        print(f"\nasr-transcribe: interrupted;{kept}", file=sys.stderr)
        return 130
    if ran is None:
        return 2
    decoded, elapsed = ran
    summary = f"{len(decoded)} transcribed, {len(failures)} failed" + (
        f", {skipped} skipped (outputs exist)" if skipped else "")
    print(summary + elapsed, file=sys.stderr)
    if decoded:
        print(decoding_summary(decoded), file=sys.stderr)
    if failures:
        print("failed:\n" + "\n".join(f"  {m}" for m in failures), file=sys.stderr)
        return 1
    return 0


def _check_cli_options(parser: argparse.ArgumentParser, args) -> None:
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")
    if args.max_words_per_line is not None and (args.max_words_per_line < 1 or not args.word_timestamps):
        parser.error("--max_words_per_line needs --word_timestamps and a count >= 1")
    if args.engine != "ray" and (args.address or args.num_workers is not None or args.gpus_per_worker
                                 or args.file_timeout is not None):
        parser.error("--address, --num-workers, --gpus-per-worker and --file-timeout need --engine ray")
    if args.file_timeout is not None and not args.file_timeout > 0:
        parser.error("--file-timeout must be > 0 seconds")
    if args.skip_existing and args.output_dir is None:
        parser.error("--skip-existing needs -o OUTDIR (it skips files whose outputs are there)")
    increment = args.temperature_increment_on_fallback
    if increment is not None and (args.no_fallback or len(args.temperature) > 1):
        parser.error("--temperature_increment_on_fallback steps up from a single --temperature; it has no effect "
                     "with " + ("--no-fallback" if args.no_fallback else "a --temperature list (the list is the schedule)"))
    if increment is not None and not 0 < increment <= 1:
        parser.error(f"--temperature_increment_on_fallback must be in (0, 1], got {increment:g}")
    if args.num_workers is None:
        args.num_workers = 2
    if args.num_workers < 1 or args.gpus_per_worker < 0:
        parser.error("--num-workers must be >= 1 and --gpus-per-worker >= 0")
    if args.engine == "ray":   # a worker sees only the GPUs it reserves: said here, not inside a worker
        if (problem := ray_device_problem(args.device, args.gpus_per_worker, "--gpus-per-worker", "worker")):
            parser.error(problem)


def _missing_extra(args) -> str | None:
    """The optional package an option needs and is not installed, said before any model loads."""
    if args.vad_filter and importlib.util.find_spec("silero_vad") is None:
        return '--vad_filter needs Silero VAD: pip install "asr-app[vad]"'
    if args.engine == "ray" and importlib.util.find_spec("ray") is None:
        return '--engine ray needs Ray: pip install "asr-app[cluster]"'
    return None


if __name__ == "__main__":
    sys.exit(main())
