"""What a decode's log-mel features cost, computed over the whole 30 s window (what transformers' extractor
does, and what the decoder did before 2026-11-28 unless the encoder's input was shortened) against over the
audio and a 1 s margin only, the rest filled in (`asr_app.decoding.context.feature_samples`), for clips of
several lengths, alone and in batches. The two must be equal value for value; the bench checks it.

The features run on the scheduler's worker thread, before every batch, on the host's CPU even where the
model is on a GPU, so there they are part of every live re-decode's serial cost (docs/serving.md, "A third
H200 loan").

    python bench/features_bench.py --seconds 2 5 10 20 30 --batches 1 16 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from report_io import device_name, result_path, save_results
from serve_bench import SHARED, tiny_pair_decoder

REPO = Path(__file__).resolve().parents[1]


def speech(seconds: float) -> np.ndarray:
    """Real speech of the test clips, joined and repeated to `seconds`."""
    from asr_app.audio import load_audio
    paths = sorted((REPO / "tests/data/audio").rglob("*.flac"))
    audio = np.concatenate([load_audio(str(p)) for p in paths if "espeak" not in p.parts])
    samples = int(seconds * 16_000)
    return np.resize(audio, samples).astype(np.float32)


def median_ms(fn, repeats: int, sync=None) -> float:
    """Median milliseconds of `repeats` calls of fn after one warm-up; `sync` (torch.cuda.synchronize on a GPU)
    before and after each, so queued device work is timed with its call."""
    fn()   # warm-up
    times = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        started = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def measure(decoder, seconds: float, batch: int, repeats: int) -> dict:
    audio = speech(seconds)
    # rows of slightly different lengths, as a batch of live buffers has
    clips = [audio[: max(1, audio.size - 1600 * i)] for i in range(batch)]
    windows = [c.size / 16_000 for c in clips]
    extractor = decoder.feature_extractor
    whole = lambda: extractor(clips, sampling_rate=16_000, return_tensors="pt").input_features  # noqa: E731
    cut = lambda: decoder._features(clips, decoder.options, windows)  # noqa: E731
    if not cut().equal(whole()):
        raise AssertionError(f"features differ from the whole window's at {seconds:g} s x {batch}")
    whole_ms, cut_ms = median_ms(whole, repeats), median_ms(cut, repeats)
    return {"seconds": seconds, "batch": batch, "whole_window_ms": whole_ms, "audio_only_ms": cut_ms,
            "ratio": cut_ms / whole_ms, "equal": True}


def table(report: dict) -> str:
    lines = [f"Log-mel features of real speech, {report['threads']} torch thread(s), {report['device']}; "
             f"medians of {report['repeats']}; values equal to the whole window's in every row", "",
             "| clip s | rows | whole window ms | audio + 1 s ms | ratio |", "|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['seconds']:g} | {r['batch']} | {r['whole_window_ms']:.1f} | {r['audio_only_ms']:.1f} | "
                     f"{r['ratio']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, nargs="+", default=[2, 5, 10, 20, 30])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", type=Path, default=SHARED / "models")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    decoder = tiny_pair_decoder(args.models)
    rows = []
    for batch in args.batches:
        for seconds in args.seconds:
            rows.append(measure(decoder, seconds, batch, args.repeats))
            r = rows[-1]
            print(f"{seconds:g} s x {batch}: whole {r['whole_window_ms']:.1f} ms, audio only {r['audio_only_ms']:.1f} ms",
                  flush=True)
    report = {"command": " ".join(["python", "bench/features_bench.py", *(argv or sys.argv[1:])]),
              "threads": args.threads, "repeats": args.repeats, "device": device_name("cpu"), "rows": rows}
    out = Path(args.out) if args.out else result_path("features_bench", "cpu")
    text = table(report)
    save_results(out, json.loads(json.dumps(report)), text, device="cpu")
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
