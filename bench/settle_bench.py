"""When live re-decodes fall behind: commit latency and WER with and without LocalAgreement's settling.

A loaded server re-decodes each live session once per round of everyone's decodes, so a session's step (the
new audio per re-decode) grows to seconds, and LocalAgreement-2 makes every word wait for a second decode.
`StreamingOptions.settle_s` (`asr-serve --live-settle`) commits the words new to a hypothesis from it alone
once they end that far before the buffer's end. This bench isolates the policy from the server: each long
stream (consecutive real clips joined, as `serve_bench.py --stream-seconds`) goes through one
StreamingProcessor, unpaced, re-decoded every `--steps` seconds, at each `--settle` value (`none`: off).
Reported per step and settle value:

- the commit lag in audio time (audio received when a word is committed minus the word's end), p50 and p90
  over all words: the policy's own latency, to which a server adds its queueing;
- the mean WER against the transcripts, and the worst stream's WER minus its WER at a 0.5 s step without
  settling (the stream as a server that keeps up decodes it).

    python bench/settle_bench.py --steps 2,3,6 --settle none,1.5 --context 3 --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import serve_bench
from report_io import cpu_facts, describe_cpu, result_path, save_results
from stream_bench import stream_clip

SHORT_STEP_S = 0.5   # the reference: a server that keeps up re-decodes every half second of new audio


def variant(decoder, streams: list, step_s: float, settle_s: float | None) -> dict:
    """Every stream at one step and settle value: texts, WER, and each committed word's lag in audio time."""
    from asr_app.streaming import StreamingOptions
    from asr_app.wer import word_error_rate
    started = time.perf_counter()
    texts, lags = [], []
    options = StreamingOptions(step_s=step_s, settle_s=settle_s)
    for audio, _ in streams:   # fed in 0.5 s blocks, unpaced
        streamed = stream_clip(decoder, audio.astype(np.float32) / 32768, options, "fast", block_s=0.5)
        texts.append(streamed["committed"])
        lags += streamed["audio_lags"]
    return {"step_s": step_s, "settle_s": settle_s, "seconds": time.perf_counter() - started, "texts": texts,
            "wer": [word_error_rate(ref, text) for (_, ref), text in zip(streams, texts)],
            "lag_p50_s": float(np.percentile(lags, 50)) if lags else None,
            "lag_p90_s": float(np.percentile(lags, 90)) if lags else None, "words": len(lags)}


def table(report: dict) -> str:
    reference = report["reference"]["wer"]
    context = f"encoder context {report['context_s']:g} s" if report["context_s"] is not None else "whole windows"
    lines = [f"{len(reference)} real streams (consecutive real clips joined to {report['stream_seconds']:g} s or "
             f"more; {report['audio_s']:.0f} s), tiny.en + distilled draft, `exact`, {context}, unpaced, "
             f"{report['threads']} threads; {report['cpu']}", "",
             "| step s | settle s | words | lag p50 s | lag p90 s | mean WER | worst WER - step 0.5 s |",
             "|---|---|---|---|---|---|---|"]
    for row in [report["reference"], *report["variants"]]:
        worst = max(100 * (w - r) for w, r in zip(row["wer"], reference))
        settle = "off" if row["settle_s"] is None else f"{row['settle_s']:g}"
        lines.append(f"| {row['step_s']:g} | {settle} | {row['words']} | {row['lag_p50_s']:.2f} | "
                     f"{row['lag_p90_s']:.2f} | {100 * np.mean(row['wer']):.1f}% | {worst:+.1f} |")
    return "\n".join(lines)


def settle_values(text: str) -> list[float | None]:
    values = [None if v.strip() == "none" else float(v) for v in text.split(",")]
    from asr_app.streaming import StreamingOptions
    for v in values:
        StreamingOptions(settle_s=v)   # a value the product refuses is refused here too
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="2,3,6", help="seconds of new audio per re-decode (comma-separated)")
    parser.add_argument("--settle", default="none,1.5", help="settle_s values, `none` for off (comma-separated)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-seconds", type=float, default=25.0)
    parser.add_argument("--context", type=float, default=3.0,
                        help="encoder context in seconds, as asr-serve --live-encoder-context (-1: whole windows)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", type=Path, default=serve_bench.SHARED / "models")
    parser.add_argument("--audio", type=Path, default=None, help="clips with transcripts (default the shared audio)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        steps = [float(s) for s in args.steps.split(",")]
        settles = settle_values(args.settle)
    except ValueError as exc:
        parser.error(str(exc))
    import torch
    torch.set_num_threads(args.threads)
    decoder = serve_bench.tiny_pair_decoder(args.models)
    context = None if args.context < 0 else args.context
    decoder.options = dataclasses.replace(decoder.options, encoder_context_s=context)
    streams = serve_bench.load_clips(args.streams, args.audio, args.stream_seconds)
    if not streams:
        parser.error(f"no clips make a stream of {args.stream_seconds:g} s")
    report = {"command": " ".join(["python", "bench/settle_bench.py", *(argv if argv is not None else sys.argv[1:])]),
              "context_s": context, "stream_seconds": args.stream_seconds, "threads": args.threads,
              "cpu": describe_cpu(cpu_facts(args.threads)), "audio_s": sum(len(a) for a, _ in streams) / 16_000,
              "transcripts": [t for _, t in streams], "reference": variant(decoder, streams, SHORT_STEP_S, None),
              "variants": [variant(decoder, streams, step, settle) for step in steps for settle in settles]}
    out = Path(args.out) if args.out else result_path("settle_bench")
    save_results(out, report, table(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
