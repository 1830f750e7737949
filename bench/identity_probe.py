#!/usr/bin/env python
"""Is greedy output the same however a clip is decoded? The real tiny.en pair on real clips, each decoded
alone with `off` (the reference), alone again (run-to-run), alone with `exact`, and in batches of B rows with
`off` and `exact`, in each dtype asked for. Reports, per way, how many clips differ from the reference and,
for each that does, where the tokens part and both texts.

This separates the causes of a text that changes with load on a server: a decode that is not repeatable, one
that depends on the rows beside it (batch shapes pick other GEMM kernels, whose fp16 sums round differently),
or one that depends on how many tokens the draft proposed (the target scores 1 or gamma + 1 positions).

    python bench/identity_probe.py --models /tmp/models --audio tests/data/audio --device cuda \
        --dtypes float16 float32 --batch 2 4 11 \
        --repeat-clip tests/data/audio/librispeech/LibriSpeech/test-clean/1089/134686/1089-134686-0001.flac
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch
from batch_bench import SHARED, real_clips
from report_io import device_name, result_path, save_results

from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.models import load_pair


def decode_all(decoder: SpeculativeDecoder, clips: list, mode: str, batch: int) -> list[list[int]]:
    options = DecodingOptions(mode=mode)
    tokens: list[list[int]] = []
    for i in range(0, len(clips), batch):
        tokens += [r.tokens for r in decoder.decode(clips[i : i + batch], options)]
    return tokens


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(decoder: SpeculativeDecoder, reference: list[list[int]], other: list[list[int]]) -> dict:
    text = decoder.pair.processor.tokenizer.decode
    differ = [{"clip": i, "at_token": first_difference(a, b), "reference": text(a, skip_special_tokens=True),
               "this": text(b, skip_special_tokens=True)}
              for i, (a, b) in enumerate(zip(reference, other)) if a != b]
    return {"differ": len(differ), "clips": len(reference), "rows": differ}


def probe_dtype(args, clips: list, dtype: str) -> dict:
    pair = load_pair(target=str(args.models / "whisper-tiny.en"), draft=str(args.models / "distil-tiny.en-draft"),
                     device=args.device, dtype=dtype)
    # every batch size and the remainders of the clips' split, with drafts and without: none dropped
    decoder = SpeculativeDecoder(pair, runtime=RuntimeOptions(max_workspaces=64))
    decode_all(decoder, clips[:2], "exact", 1)  # warm-up: step costs measured, kernels made
    reference = decode_all(decoder, clips, "off", 1)
    ways = {"off alone again": ("off", 1), "exact alone": ("exact", 1)}
    ways |= {f"{mode} batch {b}": (mode, b) for b in args.batch for mode in ("off", "exact")}
    report = {}
    for name, (mode, batch) in ways.items():
        started = time.perf_counter()
        report[name] = compare(decoder, reference, decode_all(decoder, clips, mode, batch))
        report[name]["seconds"] = time.perf_counter() - started
        print(f"{dtype:>8} {name:<18} differ {report[name]['differ']}/{len(clips)}", flush=True)
    return report


def repeat_transcribe(args, path: Path, dtype: str) -> dict:
    """`transcribe()` of one file `args.repeats` times per (mode, gamma): the texts each gave, and how often.
    The cost policy picks gammas from timings, so a near-tie the target's fp16 rounding decides differently
    at width 1 and width gamma + 1 can go either way from one run to the next; a fixed gamma cannot."""
    from asr_app.longform import transcribe

    pair = load_pair(target=str(args.models / "whisper-tiny.en"), draft=str(args.models / "distil-tiny.en-draft"),
                     device=args.device, dtype=dtype)
    texts = {}
    for mode, gamma in (("off", None), ("exact", None), *(("exact", g) for g in args.repeat_gammas)):
        decoder = SpeculativeDecoder(pair, DecodingOptions(mode=mode, gamma=gamma))
        counts = collections.Counter(transcribe(decoder, path).text for _ in range(args.repeats))
        texts[f"{mode} gamma {gamma or 'cost'}"] = dict(counts)
        print(dtype, mode, "gamma", gamma, dict(counts), flush=True)
    return texts


def table(report: dict) -> str:
    lines = [f"Greedy tokens against each clip decoded alone with `off`, {report['clips']} real clips, "
             f"{report['device']}", "", "| dtype | way | clips that differ | first difference (token) |",
             "|---|---|---|---|"]
    for dtype, ways in report["dtypes"].items():
        for name, row in ways.items():
            at = ", ".join(str(r["at_token"]) for r in row["rows"]) or "-"
            lines.append(f"| {dtype} | {name} | {row['differ']}/{row['clips']} | {at} |")
    for dtype, ways in report.get("repeated", {}).items():
        lines += ["", f"`transcribe()` of {report['repeat_clip']} {report['repeats']} times, {dtype}:"]
        lines += [f"- {way}: " + "; ".join(f"{n}x \"{text}\"" for text, n in counts.items())
                  for way, counts in ways.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=SHARED / "models")
    parser.add_argument("--audio", type=Path, default=SHARED / "audio")
    parser.add_argument("--clips", type=int, default=11)
    parser.add_argument("--batch", type=int, nargs="+", default=[2, 4, 11])
    parser.add_argument("--dtypes", nargs="+", default=["float32"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat-clip", type=Path, default=None,
                        help="also transcribe() this file --repeats times per dtype, mode and gamma")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--repeat-gammas", type=int, nargs="*", default=[1, 2, 4, 8],
                        help="fixed gammas whose repeated transcripts are compared too")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    clips, _ = real_clips(args.audio, args.clips)
    report = {"command": " ".join(["python", "bench/identity_probe.py", *(argv or sys.argv[1:])]),
              "clips": len(clips), "device": device_name(args.device) if args.device.startswith("cuda") else "cpu",
              "dtypes": {d: probe_dtype(args, clips, d) for d in args.dtypes}}
    if args.repeat_clip:
        report |= {"repeat_clip": args.repeat_clip.name, "repeats": args.repeats,
                   "repeated": {d: repeat_transcribe(args, args.repeat_clip, d) for d in args.dtypes}}
    out = Path(args.out) if args.out else result_path("identity_probe", args.device)
    text = table(report)
    save_results(out, report, text, device=args.device)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
