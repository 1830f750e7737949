"""How much a decode slows down while other Python threads keep the interpreter busy, at several thread
switch intervals (`sys.setswitchinterval`).

Every PyTorch call releases the interpreter lock and takes it back when it returns. While another thread
runs pure Python, taking it back waits until that thread hands it over: at the latest after the switch
interval (5 ms by default). A decode makes hundreds of short calls per token, so a server whose other
threads parse frames, align words and build JSON can make the decoder wait far longer than it computes.
This probe decodes one real clip on one thread, alone and beside `--busy` threads that spin in Python,
at each interval asked for, and prints the median decode time and its ratio to the decode alone.

    python bench/gil_probe.py --intervals-ms 0.1 0.5 5 --busy 1 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from report_io import device_name, result_path, save_results
from serve_bench import SHARED, tiny_pair_decoder

REPO = Path(__file__).resolve().parents[1]


def spin(stop: threading.Event) -> None:
    """Pure Python until told to stop: the interpreter lock is held except when the interval forces a switch."""
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i * i


def timed_decodes(decoder, audio, repeats: int, busy: int, interval_s: float) -> dict:
    """Median seconds of `repeats` decodes of `audio` with `busy` spinning threads, at switch interval `interval_s`."""
    sys.setswitchinterval(interval_s)
    stop = threading.Event()
    threads = [threading.Thread(target=spin, args=(stop,), daemon=True) for _ in range(busy)]
    for t in threads:
        t.start()
    times, calls = [], 0
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            result = decoder.decode([audio])[0]
            times.append(time.perf_counter() - started)
            calls = result.stats.target_calls
    finally:
        stop.set()
        for t in threads:
            t.join()
    return {"interval_ms": 1000 * interval_s, "busy_threads": busy, "median_s": statistics.median(times),
            "times_s": times, "target_calls": calls}


def table(report: dict) -> str:
    lines = [f"One decode of {report['clip']} ({report['clip_s']:.1f} s), tiny.en + distilled draft, `exact`, "
             f"{report['threads']} torch thread(s), {report['device']}, beside threads spinning in Python; "
             f"medians of {report['repeats']}", "",
             "| switch interval ms | spinning threads | decode ms | x alone at this interval |", "|---|---|---|---|"]
    alone = {r["interval_ms"]: r["median_s"] for r in report["rows"] if r["busy_threads"] == 0}
    for r in report["rows"]:
        lines.append(f"| {r['interval_ms']:g} | {r['busy_threads']} | {1000 * r['median_s']:.0f} | "
                     f"{r['median_s'] / alone[r['interval_ms']]:.1f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals-ms", type=float, nargs="+", default=[0.1, 0.5, 5.0])
    parser.add_argument("--busy", type=int, default=1, help="threads spinning in Python beside the decode")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (leave a core to the spinning ones)")
    parser.add_argument("--models", type=Path, default=SHARED / "models")
    parser.add_argument("--clip", type=Path, default=REPO / "tests/data/audio/jfk/jfk.flac")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    from asr_app.audio import load_audio
    torch.set_num_threads(args.threads)
    decoder = tiny_pair_decoder(args.models, args.device)
    audio = load_audio(str(args.clip))
    default = sys.getswitchinterval()
    for _ in range(2):
        decoder.decode([audio])   # warm-up (and, on a GPU, the captures)
    rows = []
    try:
        for interval in sorted(args.intervals_ms):   # the long waits last: they take longest
            for busy in (0, args.busy):
                rows.append(timed_decodes(decoder, audio, args.repeats, busy, interval / 1000))
                print(f"interval {interval:g} ms, {busy} spinning: {1000 * rows[-1]['median_s']:.0f} ms", flush=True)
    finally:
        sys.setswitchinterval(default)
    report = {"command": " ".join(["python", "bench/gil_probe.py", *(argv or sys.argv[1:])]),
              "clip": args.clip.name, "clip_s": len(audio) / 16_000, "threads": args.threads, "repeats": args.repeats,
              "device": device_name(args.device), "rows": rows}
    out = Path(args.out) if args.out else result_path("gil_probe", args.device)
    text = table(report)
    save_results(out, json.loads(json.dumps(report)), text, device=args.device)
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
