"""Batched throughput: the same clips decoded in lock-step batches of B rows, per decoding mode, so the batch at
which verification stops paying is measured rather than guessed.

For each B (default 1, 2, 4, 8, 16, 32) every mode decodes the same `--clips` clips in batches of B (the last
batch may be short), greedy, `--repeats` rounds interleaved (B by B, mode by mode, so load changes hit all
alike). Reported per (mode, B): wall seconds for all the clips (median of the rounds, raw rounds kept), tokens
per second, RTFx (audio seconds / wall seconds), the decoding loop's share (the rest is the encoder),
tokens per target call, and whether `exact`'s tokens equal `off`'s (greedy identity). Modes: `off`, `exact`,
and `transformers` (Whisper's own batched `generate`, greedy, the anchor; real pair only).

    python bench/batch_bench.py                                   # real tiny.en pair, ../shared clips, CPU
    python bench/batch_bench.py --clips 16 --batch 1 2 4 8 16     # a smaller CPU run
    python bench/batch_bench.py --shape large-v2 --device cuda --batch 1 2 4 8 16 32 64 --clips 64 --tokens 64

`--shape large-v2` (or `base`, `tiny`, `toy`) decodes random-weight models of that shape (bench/runtime_bench.py's pair,
which never emits end-of-text: every row runs `--tokens` steps) on random features: tokens/s only.
Results: bench/results/<device>/<date>/batch_bench[_<shape>].{json,md,png} (bench/report_io.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from report_io import batch_table, provenance, result_path
from runtime_bench import SHAPES

from asr_app.audio import SAMPLE_RATE, WINDOW_SECONDS, load_audio
from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.models import load_pair

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MODES = ("off", "exact", "transformers")


# Held-out speech first: the distilled draft was trained on the LJSpeech and test-other clips, not on
# LibriSpeech test-clean or jfk.flac (../shared/models/README.md), and its acceptance there is higher.
FOLDER_ORDER = ("jfk", "librispeech", "ljspeech", "librispeech-test-other-audio")
HELD_OUT = ("jfk", "librispeech")


def real_clips(audio: Path, count: int, cycle: bool = False) -> tuple[list[np.ndarray], int]:
    """The first `count` clips of at most 30 s in `audio`'s English speech folders (FOLDER_ORDER: held-out
    folders first, then by path; others, such as tests/data/audio/espeak, are left out), and how many of them are held out from the draft's training. With `cycle`, fewer clips are
    repeated up to `count` rows (a repeated clip's rows end together: kinder to lock-step than new clips)."""
    def order(path: Path) -> tuple[int, Path]:
        return FOLDER_ORDER.index(path.relative_to(audio).parts[0]), path

    files = sorted((p for p in audio.rglob("*") if p.suffix.lower() in (".flac", ".wav")
                    and p.relative_to(audio).parts[0] in FOLDER_ORDER), key=order)
    clips, held_out = [], 0
    for path in files:
        clip = load_audio(path)
        if len(clip) <= WINDOW_SECONDS * SAMPLE_RATE:
            clips.append(clip)
            held_out += path.relative_to(audio).parts[0] in HELD_OUT
        if len(clips) == count:
            return clips, held_out
    if cycle and clips:
        return [clips[i % len(clips)] for i in range(count)], held_out
    raise SystemExit(f"only {len(clips)} clips of at most 30 s under {audio}, {count} asked")


class Workload:
    """What every (mode, B) decodes: real clips through `SpeculativeDecoder.decode`, or random features."""

    def __init__(self, args) -> None:
        self.device = torch.device(args.device)
        # every batch size keeps its workspace (and, on a GPU, its graphs): none is recaptured in a timed round
        runtime = RuntimeOptions(max_workspaces=len(args.batch) + 1, fused_layers=args.fused_layers)
        self.real = args.shape == "real"
        self.tokens = args.tokens
        if self.real:
            models = args.models
            self.pair = load_pair(target=str(models / "whisper-tiny.en"), draft=str(models / "distil-tiny.en-draft"),
                                  device=args.device)
            self.items, self.held_out = real_clips(args.audio, args.clips, args.cycle_clips)
            self.audio_s = sum(len(c) for c in self.items) / SAMPLE_RATE
            self.decoder = SpeculativeDecoder(self.pair, runtime=runtime)
        else:
            from runtime_bench import EOS, VOCAB, random_pair

            from asr_app.decoding.engine import draft_runtime
            from asr_app.runtime.vocab import ranked_subset

            dtype = torch.float16 if self.device.type == "cuda" else torch.float32
            self.pair = random_pair(args.shape, self.device, dtype)
            gen = torch.Generator().manual_seed(0)
            self.items = [torch.randn(80, 3000, generator=gen).to(self.device, dtype) for _ in range(args.clips)]
            self.audio_s = None
            self.decoder = SpeculativeDecoder(self.pair, runtime=runtime)
            # the draft head reduced as for a real tiny.en pair (the random pair's tokenizer cannot be checked)
            self.decoder.draft_runtime = draft_runtime(self.pair.draft, ranked_subset(VOCAB, EOS, runtime.draft_vocab),
                                                       runtime)

    def options(self, mode: str) -> DecodingOptions:
        return DecodingOptions(mode=mode, max_new_tokens=self.tokens) if self.tokens else DecodingOptions(mode=mode)

    def decode(self, mode: str, rows: list) -> tuple[list[list[int]], int, float, int]:
        """(tokens per row, tokens generated (end-of-text included), decoding-loop seconds, target calls summed
        over the rows) of one batch."""
        if mode == "transformers":
            return self._generate(rows)
        if self.real:
            results = self.decoder.decode(rows, self.options(mode))
        else:
            results = self.decoder.decode_features(torch.stack(rows), self.options(mode))
        stats = results[0].stats  # encoder and total seconds are the batch's, on every row
        loop_s = stats.total_s - stats.setup_s - stats.encoder_s  # setup: captures a new batch size makes first
        return ([r.tokens for r in results], sum(r.stats.tokens_out for r in results), loop_s,
                sum(r.stats.target_calls for r in results))

    def _generate(self, rows: list) -> tuple[list[list[int]], int, float, int]:
        """Whisper's own batched greedy `generate` (its output tokens after the prompt, end-of-text dropped)."""
        model, processor = self.pair.target, self.pair.processor
        feats = processor.feature_extractor(rows, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        kwargs = {"max_new_tokens": self.tokens} if self.tokens else {}
        with torch.inference_mode():
            out = model.generate(feats.to(self.device, self.pair.dtype), do_sample=False, num_beams=1, **kwargs)
        eos = model.generation_config.eos_token_id  # also the padding of rows that ended first
        tokens = [[t for t in row if t < eos] for row in out.tolist()]
        generated = sum(len(t) + (eos in row) for t, row in zip(tokens, out.tolist()))
        return tokens, generated, float("nan"), 0


def measure(work: Workload, modes: list[str], batches: list[int], repeats: int) -> list[dict]:
    """One row per (mode, B): every round's wall seconds for all the clips, and what the last round produced."""
    for mode in modes:  # warm-up: step costs measured, kernels made; on a GPU every B's graphs captured
        for b in batches if work.device.type == "cuda" else batches[:1]:
            work.decode(mode, work.items[:b])
    samples = {(mode, b): [] for b in batches for mode in modes}
    last: dict[tuple[str, int], dict] = {}
    for _ in range(repeats):
        for b in batches:
            for mode in modes:
                tokens, count, loop_s, calls = [], 0, 0.0, 0
                if work.device.type == "cuda":
                    torch.cuda.synchronize(work.device)
                start = time.perf_counter()
                for i in range(0, len(work.items), b):
                    out, generated, seconds, steps = work.decode(mode, work.items[i : i + b])
                    tokens += out
                    count += generated
                    loop_s += seconds
                    calls += steps
                if work.device.type == "cuda":
                    torch.cuda.synchronize(work.device)
                samples[(mode, b)].append(time.perf_counter() - start)
                last[(mode, b)] = {"tokens": tokens, "count": count, "loop_s": loop_s, "target_calls": calls}
    rows = []
    for (mode, b), times in samples.items():
        wall = statistics.median(times)
        out = last[(mode, b)]
        count = out["count"]
        off = last.get(("off", b))
        rows.append({
            "mode": mode, "batch": b, "samples_s": times, "median_s": wall, "tokens": count,
            "tokens_per_s": count / wall, "rtfx": work.audio_s / wall if work.audio_s else None,
            "loop_share": None if math.isnan(out["loop_s"]) else out["loop_s"] / wall,
            "tokens_per_target_call": count / out["target_calls"] if out["target_calls"] else None,  # per row
            "identical_to_off": out["tokens"] == off["tokens"] if off and mode != "off" else None,
        })
    for row in rows:
        off = next((r for r in rows if r["mode"] == "off" and r["batch"] == row["batch"]), None)
        row["speedup_vs_off"] = row["tokens_per_s"] / off["tokens_per_s"] if off else None
    return rows


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, ratio) = plt.subplots(1, 2, figsize=(9, 3.4))
    modes = list(dict.fromkeys(r["mode"] for r in report["rows"]))
    for mode in modes:
        rows = [r for r in report["rows"] if r["mode"] == mode]
        rate.plot([r["batch"] for r in rows], [r["tokens_per_s"] for r in rows], marker="o", label=mode)
        if mode != "off":
            ratio.plot([r["batch"] for r in rows], [r["speedup_vs_off"] for r in rows], marker="o", label=mode)
    rate.set(xscale="log", xlabel="batch size B", ylabel="tokens/s", title="throughput")
    ratio.axhline(1.0, color="grey", linewidth=0.8)
    ratio.set(xscale="log", xlabel="batch size B", ylabel="tokens/s over `off`", title="over `off`")
    for ax in (rate, ratio):
        ax.set_xticks(sorted({r["batch"] for r in report["rows"]}), labels=None)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        if ax.lines[1:] or ax is rate:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{report['config']['workload']}, {report['meta']['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=["real", *SHAPES], default="real",
                    help="real: tiny.en + the distilled draft on real clips; else random weights of that shape")
    ap.add_argument("--models", type=Path, default=SHARED / "models",
                    help="a folder with whisper-tiny.en and distil-tiny.en-draft (--shape real)")
    ap.add_argument("--audio", type=Path, default=SHARED / "audio", help="clips of at most 30 s under it (--shape real)")
    ap.add_argument("--clips", type=int, default=32, help="clips (rows) every (mode, B) decodes")
    ap.add_argument("--cycle-clips", action="store_true",
                    help="repeat the clips found up to --clips rows (the repository's 13 test clips on a lent GPU)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--modes", nargs="+", default=["off", "exact"], choices=MODES)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=None,
                    help="max new tokens per row (default: 64 for random weights, Whisper's limit for real clips)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--fused-layers", action=argparse.BooleanOptionalAction, default=None,
                    help="fused decoder layers (default: the runtime's, on with CUDA graphs)")
    ap.add_argument("--out", type=Path, default=None, help="default: bench/results/<device>/<date>/batch_bench.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.shape != "real":
        args.tokens = args.tokens or 64
        if "transformers" in args.modes:
            ap.error("--modes transformers needs --shape real")
    if max(args.batch) > args.clips:
        ap.error(f"the largest batch ({max(args.batch)}) exceeds --clips ({args.clips})")
    load_before = os.getloadavg()
    work = Workload(args)
    workload = (f"real tiny.en + distilled draft, {args.clips} clips ({work.audio_s:.0f} s of audio, {work.held_out} "
                f"held out from the draft's training{', repeated' if args.cycle_clips else ''})" if work.real
                else f"random-weight {args.shape} pair, {args.clips} rows of {args.tokens} tokens")
    report = {"meta": provenance(args.device),
              "config": {"workload": workload, "shape": args.shape, "clips": args.clips, "batches": args.batch,
                         "modes": args.modes, "repeats": args.repeats, "max_new_tokens": args.tokens,
                         "threads": torch.get_num_threads(), "dtype": str(work.pair.dtype).removeprefix("torch."),
                         "greedy": True, "gamma": "cost-aware policy (default)",
                         "fused_layers": work.decoder.target_runtime.fused_layers,
                         "fused_max_rows": work.decoder.target_runtime.fused_max_rows},  # wider steps: unfused
              "rows": measure(work, args.modes, args.batch, args.repeats)}
    # a shared machine's other work shows here (a 2-core VM at load 5 runs everything slower)
    report["config"]["loadavg_before_after"] = [load_before[0], os.getloadavg()[0]]
    text = batch_table(report)
    print(text)
    out = args.out or result_path("batch_bench" if work.real else f"batch_bench_{args.shape}", args.device)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(text + "\n")
    plot(report, out.with_suffix(".png"))
    print(f"wrote {out}, .md and .png")


if __name__ == "__main__":
    main()
