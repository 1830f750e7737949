"""Streaming benchmark: simulated real-time streaming of real clips through StreamingProcessor.

For each decoding mode (default: off and exact) and each clip, the clip is played at real-time
pace by FileSource (0.1 s blocks), fed to a StreamingProcessor re-decoding every --step
seconds, and finished. Reported per mode, following whisper_streaming's definitions:

- first-partial latency: emission time of the first event showing text minus the end (in the
  audio) of its first word; median over clips;
- finalization latency: for every committed word, emission time minus the word's end time in
  the audio; p50/p90 over all words of all clips (word end times from the target's
  cross-attention, see asr_app/decoding/alignment.py);
- RTF: decoding compute time / audio duration;
- WER of the committed text vs the offline long-form transcript of the same clip (and vs the
  human reference where the dataset has one), after Whisper's English normaliser.

Each mode runs with and without hypothesis reuse (`--reuse both`, rows `MODE+reuse` and `MODE`):
with reuse, each re-decode gets the previous decode of the buffer as a hint, which the target
verifies in one pass (asr_app/decoding/engine.py); the text is the same, only the compute differs.

Variants: every mode x reuse x `--policies` (local-agreement, alignatt) x `--steps` (least new audio
before a re-decode; the next decode starts as soon as the previous one ended and that much arrived).
Word times, and so the latencies, come from the target's cross-attention (`--alignment on`).

Example (CPU, tiny.en with its distilled draft):
    python bench/stream_bench.py --modes off,exact --reuse on --policies local-agreement,alignatt --steps 1.0,0.3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from report_io import provenance, result_path

from asr_app.audio import SAMPLE_RATE, FileSource, load_audio
from asr_app.decoding import DecodingOptions, SpeculativeDecoder
from asr_app.longform import transcribe
from asr_app.models import load_pair
from asr_app.streaming import EDGE_S, StreamingOptions, StreamingProcessor, latency_report
from asr_app.wer import corpus_wer

REPO = Path(__file__).resolve().parents[1]

SHARED = Path(os.environ.get("ASR_SHARED_DIR", REPO.parent / "shared"))
LIBRI = SHARED / "audio" / "librispeech" / "LibriSpeech" / "test-clean" / "1089"
DEFAULT_CLIPS = [
    SHARED / "audio" / "jfk" / "jfk.flac",
    LIBRI / "134686" / "1089-134686-0000.flac",
    LIBRI / "134691" / "1089-134691-0001.flac",
    SHARED / "audio" / "ljspeech" / "wavs" / "LJ001-0001.wav",
]


def reference_text(path: Path) -> str | None:
    """Human transcript for the shared clips (jfk.txt, LibriSpeech trans.txt, LJSpeech metadata)."""
    if path.name == "jfk.flac":
        return (path.parent / "jfk.txt").read_text().strip()
    trans = list(path.parent.glob("*.trans.txt"))
    if trans:
        for line in trans[0].read_text().splitlines():
            key, _, text = line.partition(" ")
            if key == path.stem:
                return text
    meta = path.parent.parent / "metadata.csv"
    if meta.is_file():
        for line in meta.read_text().splitlines():
            key, _, text = line.partition("|")
            if key == path.stem:
                return text
    return None


def wer(refs: list[str], hyps: list[str], normalise) -> float:
    value = corpus_wer([normalise(r) for r in refs], [normalise(h) for h in hyps]).wer
    return float("nan") if value is None else value


class CpuClock:
    """Virtual wall clock of a machine with one core to itself: it advances with this process's
    CPU time while decoding and jumps forward to the audio's arrival time while waiting for it."""

    def __init__(self) -> None:
        self.offset = -time.process_time()

    def __call__(self) -> float:
        return time.process_time() + self.offset

    def wait_until(self, t: float) -> None:
        if self() < t:
            self.offset += t - self()


def stream_clip(decoder, audio: np.ndarray, options: StreamingOptions, pacing: str, block_s: float = 0.1) -> dict:
    """pacing: 'realtime' (FileSource at the audio's pace, wall clock), 'fast' (unpaced) or
    'cpu-clock' (audio arrives at its pace on the CpuClock: a simulated dedicated core). `block_s`: the
    FileSource's blocks (not with 'cpu-clock', whose blocks follow its clock)."""
    events = []
    cpu_start = time.process_time()
    if pacing == "cpu-clock":
        clock = CpuClock()
        processor = StreamingProcessor(decoder, options, clock=clock)
        block, position = 1600, 0
        while position < audio.size:
            # Everything recorded by now (at least one block) arrives as one chunk.
            recorded = int(clock() * SAMPLE_RATE) // block * block
            end = min(audio.size, max(position + block, recorded))
            clock.wait_until(end / SAMPLE_RATE)
            processor.insert_audio(audio[position:end])
            events.extend(processor.process())
            position = end
    else:
        processor = StreamingProcessor(decoder, options)
        for chunk in FileSource(audio, block_s=block_s, realtime=pacing == "realtime"):
            processor.insert_audio(chunk)
            events.extend(processor.process())
    events.extend(processor.finish())
    compute = processor.compute_s   # (the per-step figures below read the last STEP_HISTORY decodes: clips are short)
    cpu = time.process_time() - cpu_start
    report = latency_report(events, processor.audio_seconds, compute)
    rates = [s.acceptance_rate for s in processor.steps if s.acceptance_rate is not None]
    hinted = sum(s.hint_tokens for s in processor.steps)
    return {
        "audio_s": processor.audio_seconds,
        "compute_s": compute,
        "cpu_s": cpu,
        "decodes": len(processor.steps),
        "max_buffer_s": max((s.buffer_end - s.buffer_start for s in processor.steps), default=0.0),
        "acceptance_rate": statistics.fmean(rates) if rates else None,
        "hint_tokens": hinted,
        "hint_accepted": sum(s.hint_accepted for s in processor.steps),
        "word_latencies": [ev.emitted_at - w.end for ev in events if ev.kind == "commit" for w in ev.words],
        "audio_lags": [ev.audio_received - w.end for ev in events if ev.kind == "commit" for w in ev.words],
        "committed": processor.committed_text,
        **report,
    }


def stream_clips(decoder, clips: list[Path], audios: dict, options: StreamingOptions, args, offline: dict,
                 name: str) -> list[dict]:
    """Each clip streamed with `options` (paced as asked), next to its offline transcript (`offline`, filled on
    first use per mode) and reference."""
    import torch

    per_clip = []
    for clip in clips:
        if clip not in offline:
            offline[clip] = transcribe(decoder, audios[clip]).text
        streamed = stream_clip(decoder, audios[clip], options, "fast" if args.fast else "realtime")
        streamed.update(clip=clip.name, offline=offline[clip], reference=reference_text(clip))
        if not args.fast and not args.realtime_only:
            # The same stream unpaced: the commit policy's own latency, without compute delays.
            streamed["policy_lags"] = stream_clip(decoder, audios[clip], options, "fast")["audio_lags"]
            # And on a simulated dedicated core (virtual clock driven by CPU time). With several torch
            # threads, CPU time counts every thread and the clock would run too fast: single thread only.
            if torch.get_num_threads() == 1:
                dedicated = stream_clip(decoder, audios[clip], options, "cpu-clock")
                streamed["dedicated_latencies"] = dedicated["word_latencies"]
                streamed["dedicated_first_partial_s"] = dedicated["first_partial_s"]
                streamed["cpu_s"] = dedicated["cpu_s"]
        per_clip.append(streamed)
        print(f"[{name}] {clip.name}: {streamed['words']} words, p90 {streamed['finalization_p90_s']:.2f} s, "
              f"RTF {streamed['rtf']:.2f}", file=sys.stderr)
    return per_clip


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize_variant(per_clip: list[dict], normalise) -> dict:
    """One streaming variant's figures over its clips (latencies pooled over every committed word)."""
    latencies = [x for c in per_clip for x in c["word_latencies"]]
    policy_lags = [x for c in per_clip for x in c.get("policy_lags", [])]
    dedicated = [x for c in per_clip for x in c.get("dedicated_latencies", [])]
    dedicated_first = [c["dedicated_first_partial_s"] for c in per_clip if c.get("dedicated_first_partial_s")]
    cpu = [c["cpu_s"] for c in per_clip if "cpu_s" in c]
    firsts = [c["first_partial_s"] for c in per_clip if c["first_partial_s"] is not None]
    with_ref = [c for c in per_clip if c["reference"]]
    rates = [c["acceptance_rate"] for c in per_clip if c["acceptance_rate"] is not None]
    hinted = sum(c["hint_tokens"] for c in per_clip)
    audio_s = sum(c["audio_s"] for c in per_clip)
    return {
        "clips": len(per_clip),
        "audio_s": audio_s,
        "words": len(latencies),
        "first_partial_median_s": statistics.median(firsts) if firsts else None,
        "finalization_p50_s": _percentile(latencies, 50),
        "finalization_p90_s": _percentile(latencies, 90),
        "dedicated_first_partial_median_s": statistics.median(dedicated_first) if dedicated_first else None,
        "dedicated_p50_s": _percentile(dedicated, 50),
        "dedicated_p90_s": _percentile(dedicated, 90),
        "cpu_rtf": sum(cpu) / audio_s if cpu else None,
        "policy_p50_s": _percentile(policy_lags, 50),
        "policy_p90_s": _percentile(policy_lags, 90),
        "rtf": sum(c["compute_s"] for c in per_clip) / audio_s,
        "wer_vs_offline": wer([c["offline"] for c in per_clip], [c["committed"] for c in per_clip], normalise),
        "wer_offline_vs_reference": wer([c["reference"] for c in with_ref], [c["offline"] for c in with_ref],
                                        normalise),
        "wer_stream_vs_reference": wer([c["reference"] for c in with_ref], [c["committed"] for c in with_ref],
                                       normalise),
        "acceptance_rate": statistics.fmean(rates) if rates else None,
        "hint_acceptance": sum(c["hint_accepted"] for c in per_clip) / hinted if hinted else None,
        "finalization_latencies_s": [round(x, 4) for x in latencies],
        "policy_lags_s": [round(x, 4) for x in policy_lags],
        "per_clip": [{k: v for k, v in c.items() if k not in ("word_latencies", "audio_lags", "policy_lags",
                                                               "dedicated_latencies")} for c in per_clip],
    }


def run(args: argparse.Namespace) -> dict:
    from asr_app.wer import english_normalizer

    normalise = english_normalizer()
    pair = load_pair(target=args.target, draft=args.draft, device=args.device, dtype=args.dtype)
    clips = [Path(c) for c in args.clips] if args.clips else DEFAULT_CLIPS
    audios = {c: load_audio(c) for c in clips}
    results: dict = {"modes": {}}
    reuse_choices = {"on": [True], "off": [False], "both": [False, True]}[args.reuse]
    steps = [float(x) for x in str(args.steps).split(",")]
    policies = args.policies.split(",")
    variants = [(mode, reuse, policy, step) for mode in args.modes.split(",") for reuse in reuse_choices
                for policy in policies for step in steps]
    offline_text: dict[str, dict[Path, str]] = {}
    for mode, reuse, policy, step in variants:
        name = (f"{mode}+reuse" if reuse else mode) + (f" {policy}" if len(policies) > 1 else "") + (
            f" step {step:g}" if len(steps) > 1 else "")
        decoder = SpeculativeDecoder(pair, DecodingOptions(mode=mode))
        decoder.decode([audios[clips[0]][:16000]])  # warm-up: first-call allocations are not streaming latency
        options = StreamingOptions(step_s=step, reuse_hypothesis=reuse, policy=policy,
                                   word_alignment=args.alignment == "on", edge_s=args.edge)
        per_clip = stream_clips(decoder, clips, audios, options, args, offline_text.setdefault(mode, {}), name)
        results["modes"][name] = {"mode": mode, "reuse_hypothesis": reuse, "policy": policy, "step_s": step,
                                  **summarize_variant(per_clip, normalise)}
    return results


def table(results: dict, step: str) -> str:
    head = ("mode", "words", "first partial s", "final p50 s", "final p90 s", "RTF",
            "dedicated: first/p50/p90 s", "CPU RTF", "policy p50/p90 s", "WER vs offline",
            "WER stream/ref", "WER offline/ref", "accept", "hint kept")
    rows = [head]
    for mode, r in results["modes"].items():
        def f(x, d=2):
            return "-" if x is None else f"{x:.{d}f}"
        rows.append((mode, str(r["words"]), f(r["first_partial_median_s"]), f(r["finalization_p50_s"]),
                     f(r["finalization_p90_s"]), f(r["rtf"]),
                     "/".join(f(r[k]) for k in ("dedicated_first_partial_median_s", "dedicated_p50_s", "dedicated_p90_s")),
                     f(r["cpu_rtf"]), f(r["policy_p50_s"]) + "/" + f(r["policy_p90_s"]), f(100 * r["wer_vs_offline"], 1) + "%",
                     f(100 * r["wer_stream_vs_reference"], 1) + "%", f(100 * r["wer_offline_vs_reference"], 1) + "%",
                     f(r["acceptance_rate"]), f(r["hint_acceptance"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    legend = ("first partial / final p50/p90 / RTF: real-time pace on this machine (wall clock); "
              "dedicated: same stream on a virtual clock driven by this process's CPU time (a core to "
              "itself; measured with 1 torch thread only); policy: unpaced, audio-time lag of the commit "
              "policy alone; +reuse: the previous hypothesis of the buffer is offered to the decoder as a "
              "hint (hint kept: share of its tokens kept)")
    return f"streaming, step {step} s, target p90 <= 2.0 s on CPU\n" + "\n".join(lines) + "\n" + legend


def plot(results: dict, step: str, path: Path) -> None:
    """Cumulative distribution of per-word finalization latency per variant, with the 2.0 s CPU target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, r in results["modes"].items():
        lat = np.sort(np.asarray(r["finalization_latencies_s"]))
        if lat.size:
            ax.step(lat, np.arange(1, lat.size + 1) / lat.size, where="post",
                    label=f"{name} (p90 {np.percentile(lat, 90):.2f} s)")
    policy = next((np.sort(np.asarray(r["policy_lags_s"])) for r in results["modes"].values() if r["policy_lags_s"]),
                  None)
    if policy is not None:
        ax.step(policy, np.arange(1, policy.size + 1) / policy.size, where="post", color="grey", linestyle=":",
                label=f"commit policy alone (p90 {np.percentile(policy, 90):.2f} s)")
    ax.axvline(2.0, color="red", linewidth=0.8, label="CPU target: p90 <= 2.0 s")
    ax.axhline(0.9, color="black", linewidth=0.5, linestyle="--")
    meta = results.get("meta", {})
    ax.set_title(f"streaming finalization latency, step {step} s, CPU, {meta.get('torch_threads', '?')} "
                 "torch thread(s)")
    ax.set_xlabel("emission time - word end (s)")
    ax.set_ylabel("fraction of committed words")
    ax.set_xlim(left=0)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="off,exact")
    parser.add_argument("--steps", "--step", dest="steps", default="1.0",
                        help="comma-separated least new audio (s) before a re-decode")
    parser.add_argument("--edge", type=float, default=EDGE_S,
                        help=f"local-agreement's margin before the buffer's end in seconds (default {EDGE_S}; 0: plain "
                             "LocalAgreement-2)")
    parser.add_argument("--policies", default="local-agreement",
                        help="comma-separated commit policies: local-agreement, alignatt")
    parser.add_argument("--alignment", choices=("on", "off"), default="on",
                        help="word times from cross-attention (on) or interpolated in segments (off)")
    parser.add_argument("--reuse", choices=("on", "off", "both"), default="both",
                        help="re-decode with the previous hypothesis as a hint (StreamingOptions.reuse_hypothesis)")
    parser.add_argument("--fast", action="store_true", help="no real-time pacing (latencies then meaningless)")
    parser.add_argument("--realtime-only", action="store_true",
                        help="skip the unpaced pass (commit policy's own latency) and the simulated dedicated-core pass")
    parser.add_argument("--target", default=str(SHARED / "models" / "whisper-tiny.en"))
    parser.add_argument("--draft", default=str(SHARED / "models" / "distil-tiny.en-draft"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="model dtype: auto (fp32 on CPU) | bfloat16 | float16 | float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--clips", nargs="*", help="audio files (default: 4 shared real clips)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench/results/<device>/<date>/stream_bench.json")
    args = parser.parse_args(argv)
    args.out = args.out or result_path("stream_bench", args.device)

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    started = time.perf_counter()
    results = run(args)
    results["meta"] = {
        "steps_s": args.steps, "policies": args.policies, "alignment": args.alignment, "edge_s": args.edge, "realtime": not args.fast, "device": args.device, "dtype": args.dtype, "target": args.target,
        "draft": args.draft, "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
        "torch": torch.__version__, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started, **provenance(args.device),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    text = table(results, args.steps)
    text += (f"\nmachine: {results['meta']['cpu_count']} CPUs, torch threads {results['meta']['torch_threads']}, "
             f"load average before/after {load_before[0]:.1f}/{results['meta']['loadavg_after'][0]:.1f}")
    args.out.with_suffix(".txt").write_text(text + "\n")
    plot(results, args.steps, args.out.with_suffix(".png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
