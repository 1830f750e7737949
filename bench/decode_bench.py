"""End-to-end decoding benchmark: modes off / hf / baseline / exact / sigmoid on the same clips.

For each draft (the distilled tiny.en draft, in the target's dtype and in bf16 (`--draft-dtype bfloat16`),
and the target itself as draft: every draft accepted, the upper bound) every mode decodes every clip at batch 1, `--repeats` times, interleaved (clip by clip,
mode by mode) so that load changes on a shared machine hit all modes alike. Reported per mode: median
seconds per utterance, tokens/s, speedup vs `off` and ratio vs `hf` (both on the sum of per-clip
medians), acceptance rate, and whether the tokens equal mode `off`'s (greedy identity).

    python bench/decode_bench.py --clips 5 --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from report_io import provenance, result_path

from asr_app.audio import load_audio
from asr_app.decoding import DecodingOptions, SpeculativeDecoder
from asr_app.models import ModelPair, load_pair

REPO = Path(__file__).resolve().parents[1]

SHARED = REPO.parent / "shared"
MODES = ("off", "hf", "baseline", "exact", "sigmoid")


def pick_clips(n: int) -> list[tuple[str, np.ndarray]]:
    """Held-out real speech first: the distilled draft was trained on the test-other and LJSpeech clips,
    not on LibriSpeech test-clean or jfk.flac (its README), so those come first; test-other fills up."""
    files = [SHARED / "audio" / "jfk" / "jfk.flac"]
    files += sorted((SHARED / "audio" / "librispeech").rglob("*.flac"))
    files += sorted((SHARED / "audio" / "librispeech-test-other-audio").rglob("*.flac"))
    clips = []
    for f in files:
        audio = load_audio(f)
        if len(audio) <= 30 * 16_000:
            clips.append((f.name, audio))
        if len(clips) == n:
            break
    return clips


def self_draft_pair(pair: ModelPair) -> ModelPair:
    """The target as its own draft: a separate copy (hf needs a distinct assistant object; our loop
    detects the equal encoder weights and shares the encoder)."""
    from asr_app.models import detect_shared_encoder

    draft = copy.deepcopy(pair.target)
    return ModelPair(pair.target, draft, pair.processor, pair.device, pair.dtype,
                     detect_shared_encoder(pair.target, draft), pair.target_name, "target-as-draft")


def run(pair: ModelPair, clips, repeats: int, modes) -> dict:
    decoder = SpeculativeDecoder(pair)
    times = {m: [[] for _ in clips] for m in modes}
    results = {m: [None] * len(clips) for m in modes}
    for m in modes:  # warm-up (first-call allocations, lazy imports)
        decoder.decode(clips[0][1], DecodingOptions(mode=m))
    for _ in range(repeats):
        for i, (_, audio) in enumerate(clips):
            for m in modes:
                t0 = time.perf_counter()
                res = decoder.decode(audio, DecodingOptions(mode=m))[0]
                times[m][i].append(time.perf_counter() - t0)
                results[m][i] = res
    summary = {}
    per_clip_median = {m: [statistics.median(t) for t in times[m]] for m in modes}
    total = {m: sum(per_clip_median[m]) for m in modes}
    for m in modes:
        tokens = sum(r.stats.tokens_out for r in results[m])
        acc = [r.stats.acceptance_rate for r in results[m] if r.stats.drafted]
        summary[m] = {
            "median_s_per_utt": statistics.median(per_clip_median[m]),
            "total_s": total[m],
            "tokens": tokens,
            "tokens_per_s": tokens / total[m],
            "speedup_vs_off": total["off"] / total[m] if "off" in total else None,
            "ratio_vs_hf": total["hf"] / total[m] if "hf" in total else None,
            "acceptance_rate": statistics.mean(acc) if acc else None,
            "tokens_per_target_call": (sum(r.stats.tokens_out for r in results[m])
                                       / max(1, sum(r.stats.target_calls for r in results[m])))
            if any(r.stats.target_calls for r in results[m]) else None,
            "identical_to_off": all(a.tokens == b.tokens for a, b in zip(results[m], results["off"]))
            if "off" in results else None,
            "per_clip_median_s": per_clip_median[m],
        }
    return summary


def table(name: str, summary: dict) -> str:
    lines = [f"### draft: {name}", "",
             "| mode | median s/utt | tokens/s | speedup vs off | ratio vs hf (>1 = faster) | acceptance | "
             "tokens/target call | == off |",
             "|---|---|---|---|---|---|---|---|"]
    for m, s in summary.items():
        acc = "-" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.3f}"
        tpc = "-" if s["tokens_per_target_call"] is None else f"{s['tokens_per_target_call']:.2f}"
        off = "-" if s["speedup_vs_off"] is None else f"{s['speedup_vs_off']:.2f}x"  # None: that mode was not run
        hf = "-" if s["ratio_vs_hf"] is None else f"{s['ratio_vs_hf']:.2f}x"
        lines.append(f"| {m} | {s['median_s_per_utt']:.3f} | {s['tokens_per_s']:.1f} | {off} | {hf} | {acc} | {tpc} | "
                     f"{s['identical_to_off']} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(SHARED / "models" / "whisper-tiny.en"))
    ap.add_argument("--draft", default=str(SHARED / "models" / "distil-tiny.en-draft"))
    ap.add_argument("--clips", type=int, default=5, help="5 = the held-out clips (jfk + 4 test-clean)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--drafts", nargs="+", default=["distil", "distil-bf16", "self"],
                    choices=["distil", "distil-bf16", "self"])
    ap.add_argument("--out", default=None, help="default: bench/results/<device>/<date>/decode_bench.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    clips = pick_clips(args.clips)
    print(f"{len(clips)} clips, {sum(len(c[1]) for c in clips) / 16_000:.1f} s of audio, "
          f"{args.repeats} repeats, {args.threads} threads, device {args.device}")
    pair = load_pair(target=args.target, draft=args.draft, device=args.device)
    report = {"config": {"target": args.target, "draft": args.draft, "clips": [c[0] for c in clips],
                         "repeats": args.repeats, "threads": args.threads, "device": args.device,
                         "torch": torch.__version__, "machine": platform.processor() or platform.machine()},
              "results": {}}
    for name in args.drafts:
        if name == "distil":
            p = pair
        elif name == "distil-bf16":
            p = load_pair(target=args.target, draft=args.draft, device=args.device, draft_dtype="bfloat16")
        else:
            p = self_draft_pair(pair)
        summary = run(p, clips, args.repeats, args.modes)
        report["results"][name] = summary
        dtype = str(p.draft_compute_dtype).removeprefix("torch.")
        report["config"].setdefault("draft_dtypes", {})[name] = dtype
        print(table(f"{name} ({p.draft_name}, {dtype}, shared encoder: {p.shared_encoder})", summary), "\n",
              flush=True)
    out = Path(args.out) if args.out else result_path("decode_bench", args.device)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": provenance(args.device), **report}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
