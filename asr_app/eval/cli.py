"""`asr-eval`: compare decoding modes (default: the paper's baseline/exact/sigmoid) on WER and latency."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import logging
import platform
import shlex
import sys
from pathlib import Path

import torch

from asr_app.arguments import add_model_args, check_args_or_report, load_decoder_or_report
from asr_app.eval.datasets import DATASETS, DatasetError, load_dataset
from asr_app.eval.plots import write_plots
from asr_app.eval.report import (
    mode_table,
    sweep_table,
    table1,
    write_report_md,
    write_summary_json,
    write_utterances_jsonl,
)
from asr_app.eval.runner import MODES, PAPER_MODES, EvalRun, mode_specs, run_evaluation
from asr_app.eval.study_cli import add_study_args, check_study_args, run_study_cli, study_requested
from asr_app.fileio import unwritable
from asr_app.wer import normalizer_for_tokenizer

log = logging.getLogger("asr_app.eval")
DEFAULT_SPLIT = "test-clean"


def _csv_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _scales(text: str) -> list[float]:
    try:
        scales = [float(x) for x in _csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sweep-scale wants numbers like 1e1,1e3,1e4, got {text!r}") from None
    if not scales or any(s <= 0 for s in scales):
        raise argparse.ArgumentTypeError(f"--sweep-scale wants positive numbers, got {text!r}")
    return scales


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asr-eval",
        description="Offline evaluation of speculative Whisper decoding: WER, latency, verification-step time "
        "and acceptance per mode, on the same utterances. Default: the paper's comparison (sampling at "
        "temperature 1.0, fixed seed, modes baseline/exact/sigmoid); --temperature 0 for greedy.",
    )
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASETS, default="librispeech")
    data.add_argument("--split", default=None, help=f"LibriSpeech split (default: {DEFAULT_SPLIT})")
    data.add_argument("--data-dir", default=None,
                      help="librispeech: the folder holding LibriSpeech/ or the split itself; ljspeech: the folder "
                      "with metadata.csv; folder: audio + same-name .txt, or a .tsv/.jsonl manifest")
    data.add_argument("--max-samples", type=int, default=None, help="evaluate only the first N utterances (sorted ids)")
    run = parser.add_argument_group("evaluation")
    run.add_argument("--modes", type=_csv_list, default=list(PAPER_MODES),
                     help=f"comma-separated, any of {','.join(MODES)} (default: {','.join(PAPER_MODES)})")
    run.add_argument("--sweep-scale", type=_scales, default=[], metavar="S1,S2,...",
                     help="also run sigmoid with alpha=-s, beta=s for each s (the paper's Table 2), e.g. 1e1,1e3,1e4,1e5")
    run.add_argument("--warmup", type=int, default=1, help="utterances decoded once per mode before measuring (default 1)")
    run.add_argument("--profile", choices=("separate", "inline", "off"), default="separate",
                     help="verification-step profiling: a separate profiled decode per utterance and mode (default; "
                     "latency stays clean), inline (one decode, latency includes profiler overhead) or off")
    run.add_argument("--output-dir", type=Path, default=None,
                     help="where to write utterances.jsonl, summary.json, report.md and plots "
                     "(default: asr-eval-results/<dataset>-<UTC time>)")
    run.add_argument("--max-new-tokens", type=int, default=None,
                     help="cap on generated tokens per utterance (default: the decoder's, 224)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_study_args(parser)
    add_model_args(parser, no_fallback="asr-eval compares the modes at one temperature (run it once per "
                                       "temperature)")
    # The evaluator's default comparison is the paper's: sampling at temperature 1.0. It compares the
    # modes given by --modes, so the shared single --mode is hidden (and refused when given).
    parser.set_defaults(temperature=(1.0,), mode=None)
    for action in parser._actions:
        if action.dest == "temperature":
            action.help = ("sampling temperature (default 1.0, the paper's comparison); 0 = greedy. One number: the "
                           "modes are compared at it, with no fallback")
        elif action.dest == "mode":
            action.help = argparse.SUPPRESS
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.mode is not None:
        parser.error("asr-eval compares several modes: use --modes (comma-separated), not --mode")
    # Only a target-only comparison may skip loading the draft.
    args.mode = "off" if set(args.modes) == {"off"} and not args.sweep_scale else "exact"
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or not args.modes:
        parser.error(f"--modes: unknown mode(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(MODES)}")
    if args.max_samples is not None and args.max_samples < 1:
        parser.error("--max-samples must be >= 1")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        parser.error("--max-new-tokens must be >= 1")
    check_study_args(parser, args)
    if args.split is not None and args.dataset != "librispeech":
        parser.error(f"--split picks a LibriSpeech split; --dataset {args.dataset} has none")
    args.split = args.split or DEFAULT_SPLIT

    if not check_args_or_report(args, "asr-eval"):
        return 2
    try:
        utterances = load_dataset(args.dataset, args.data_dir, split=args.split, max_samples=args.max_samples)
    except DatasetError as exc:
        print(f"asr-eval: error: {exc}", file=sys.stderr)
        return 2
    out_dir = args.output_dir or Path("asr-eval-results") / (
        f"{args.dataset}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}")
    problem = unwritable(out_dir, keep=False)   # made when the results are written
    if problem:
        print(f"asr-eval: error: {problem}", file=sys.stderr)
        return 2

    decoder = load_decoder_or_report(args, "asr-eval")  # the models load once, here
    if decoder is None:
        return 2
    pair = decoder.pair
    needs_draft = [m for m in args.modes if m != "off"] + (["sigmoid"] if args.sweep_scale else [])
    if pair.draft is None and needs_draft:
        print(f"asr-eval: error: mode(s) {', '.join(dict.fromkeys(needs_draft))} need a draft model, and "
              f"{pair.target_name} was loaded without one; pass --draft DIR|derived, or --modes off", file=sys.stderr)
        return 2
    normalizer, has_spelling = normalizer_for_tokenizer(pair.processor.tokenizer, pair.target_name)
    base = decoder.options
    if args.max_new_tokens is not None:
        base = dataclasses.replace(base, max_new_tokens=args.max_new_tokens)
    specs = mode_specs(base, args.modes, args.sweep_scale)

    if study_requested(args):
        meta = run_metadata(args, decoder, utterances, has_spelling, argv)
        return run_study_cli(args, decoder, utterances, specs, normalizer, meta, out_dir)
    log.info("%d utterances x %d modes (%s) -> %s", len(utterances), len(specs), ", ".join(s.label for s in specs), out_dir)
    run = run_evaluation(decoder, utterances, specs, normalizer, warmup=args.warmup, profile=args.profile,
                         progress=not args.no_progress)
    meta = run_metadata(args, decoder, utterances, has_spelling, argv)
    write_outputs(run, meta, out_dir)
    print_tables(run, meta, out_dir)
    if len(run.failures) == len(run.records):
        print("asr-eval: error: every utterance was excluded (see report.md)", file=sys.stderr)
        return 1
    return 0


def run_metadata(args: argparse.Namespace, decoder, utterances, has_spelling: bool, argv: list[str] | None) -> dict:
    pair, options = decoder.pair, decoder.options
    label = {"librispeech": f"LibriSpeech {args.split}", "ljspeech": "LJSpeech", "folder": "folder",
             "local": "local clips"}[args.dataset]
    return {
        "command": shlex.join(["asr-eval", *(sys.argv[1:] if argv is None else argv)]),
        "dataset": args.dataset,
        "dataset_label": label,
        "data_dir": args.data_dir,
        "target": pair.target_name,
        "draft": pair.draft_name,
        "shared_encoder": pair.shared_encoder,
        "device": str(pair.device),
        "device_name": torch.cuda.get_device_name(pair.device) if pair.device.type == "cuda" else platform.processor() or platform.machine(),
        "dtype": str(pair.dtype).replace("torch.", ""),
        "draft_dtype": str(pair.draft_dtype).replace("torch.", "") if pair.draft_dtype else None,
        "temperature": options.temperature,
        "seed": options.seed,
        "gamma": options.gamma if options.gamma is not None else options.gamma_policy,
        "max_new_tokens": args.max_new_tokens or options.max_new_tokens,
        "alpha": options.alpha,
        "beta": options.beta,
        "spelling_map": has_spelling,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def write_outputs(run: EvalRun, meta: dict, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_utterances_jsonl(run, out_dir / "utterances.jsonl")
    write_summary_json(run, meta, out_dir / "summary.json")
    plots = write_plots(run, out_dir)
    write_report_md(run, meta, plots, out_dir / "report.md")
    return {"utterances": out_dir / "utterances.jsonl", "summary": out_dir / "summary.json",
            "report": out_dir / "report.md", **{k: out_dir / v for k, v in plots.items()}}


def print_tables(run: EvalRun, meta: dict, out_dir: Path) -> None:
    print(table1(run, meta))
    print()
    print(mode_table(run))
    sweep = sweep_table(run)
    if sweep:
        print()
        print(sweep)
    if run.failures:
        print(f"\n{len(run.failures)} utterance(s) excluded:")
        for r in run.failures:
            print(f"  {r.id}: {r.error}")
    print(f"\nwrote {out_dir}/report.md, summary.json, utterances.jsonl and plots")


if __name__ == "__main__":
    raise SystemExit(main())
