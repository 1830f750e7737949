"""`asr-eval --seeds N [--temperatures T1,T2]`: the sampling study's options and its run (study.py)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from asr_app.eval.study import run_study
from asr_app.eval.study_report import write_study

log = logging.getLogger("asr_app.eval")


def _temperatures(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--temperatures wants numbers like 0.6,1.0, got {text!r}") from None
    if not values or any(not v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"--temperatures wants numbers >= 0, got {text!r}")
    return list(dict.fromkeys(values))


def add_study_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "sampling study", "decode every utterance with several seeds (and temperatures) and compare the modes "
        "paired over (utterance, seed): WER with 95%% intervals, Wilcoxon tests against exact, acceptance, tokens "
        "per target call, verification time (writes study.json, study_items.jsonl, study.md, study.png)")
    group.add_argument("--seeds", type=int, default=None, metavar="N",
                       help="run the study with seeds S..S+N-1 (S = --seed) for every utterance and temperature")
    group.add_argument("--temperatures", type=_temperatures, default=None, metavar="T1,T2",
                       help="the study's temperatures, each compared on its own (not a fallback schedule); "
                       "default: --temperature")
    group.add_argument("--wer-reference", choices=("greedy", "text"), default=None,
                       help="the study's WER reference: each utterance's greedy transcript by the target alone "
                       "(the default; utterances without a transcript count) or the dataset's text")


def study_requested(args: argparse.Namespace) -> bool:
    return args.seeds is not None or args.temperatures is not None


def check_study_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.seeds is not None and args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if (args.temperatures is not None or args.wer_reference is not None) and args.seeds is None:
        parser.error("--temperatures and --wer-reference belong to the sampling study: give --seeds N too")


def run_study_cli(args: argparse.Namespace, decoder, utterances, specs, normalizer, meta: dict, out_dir: Path) -> int:
    temperatures = args.temperatures or [decoder.options.temperature]
    seeds = list(range(decoder.options.seed, decoder.options.seed + args.seeds))
    log.info("study: %d utterances x %d temperatures x %d seeds x %d modes (%s) -> %s", len(utterances),
             len(temperatures), len(seeds), len(specs), ", ".join(s.label for s in specs), out_dir)
    start = time.perf_counter()
    run = run_study(decoder, utterances, specs, temperatures, seeds, normalizer, reference=args.wer_reference or "greedy",
                    progress=not args.no_progress)
    meta = {**meta, "study_seconds": round(time.perf_counter() - start, 1)}
    paths = write_study(run, meta, out_dir)
    print(paths["markdown"].read_text(encoding="utf-8"))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    if not run.items:
        print("asr-eval: error: every utterance was left out (see study.md)", file=sys.stderr)
        return 1
    return 0
