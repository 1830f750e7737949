"""Serving benchmark: N live streams at real-time pace over the WebSocket of a real `asr-serve` app, the
scheduler against the old one-lock engine in the same run, plus concurrent API requests.

Streams: each of N clients plays a different real clip as 0.5 s PCM16 frames at real-time pace (frame k
is sent once its audio has "been spoken", at t0 + (k + 1) * 0.5 s), then sends stop. For every committed
word, latency = arrival of the commit event - (t0 + the word's end in the audio); p50/p90/max over all
words of all streams. Each clip is also streamed alone (N = 1) per engine, and every stream's WER (against
the clip's human transcript) is compared with its alone run, and with the clip transcribed whole
(`transcribe()`, as asr-transcribe does).

Engines: `scheduler` (asr_app.scheduler, what asr-serve runs), `scheduler+context` (the same, live
re-decodes encoding their buffer plus --context seconds: `asr-serve --live-encoder-context`) and `lock`
(the engine before the scheduler: every session's decode calls the one SpeculativeDecoder under one
global lock, as ui/engine.py did).

Long sessions (--stream-seconds S): each stream joins consecutive clips of the pool (0.5 s of silence
between them) until it lasts S seconds, so that a session speaks past the streaming buffer's trim point
(15 s) and its re-decodes carry its committed text as their prompt, as a person talking for a while does.

API: --api-requests clips sent at once to /v1/audio/transcriptions (scheduler engine), wall time against
the same clips sent one at a time, and the texts compared with asr-transcribe's (longform.transcribe).

    python bench/serve_bench.py --streams 1,2,4,8 --threads 2 --api-requests 16 --context 3
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from asr_app.decoding.options import ENCODER_MATMUL_DTYPES
from asr_app.kernel_cache import add_kernel_cache_arg, kernel_cache_bound, kernel_cache_problem

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
SHARED = Path(os.environ.get("ASR_SHARED_DIR", REPO.parent / "shared"))
CHUNK_S = 0.5


def clip_pool(count: int, root: Path | None = None) -> list[tuple[Path, str]]:
    """Real clips with human transcripts under `root` (default the shared audio): LibriSpeech (*.trans.txt),
    LJSpeech (metadata.csv, .wav or .flac, over 4 s) and JFK (jfk/jfk.txt); at most `count`."""
    root = root or SHARED / "audio"
    pool = []
    for trans in sorted((root / "librispeech").rglob("*.trans.txt")):
        for line in trans.read_text().splitlines():
            key, text = line.split(" ", 1)
            pool.append((trans.parent / f"{key}.flac", text))
    lj = root / "ljspeech"
    lines = (lj / "metadata.csv").read_text().splitlines() if (lj / "metadata.csv").exists() else []
    for key, *fields in (line.split("|") for line in lines if "|" in line):
        path = next((p for p in (lj / "wavs" / f"{key}.wav", lj / "wavs" / f"{key}.flac") if p.exists()), None)
        if path is not None and sf.info(str(path)).duration > 4:
            pool.append((path, fields[-1]))
    if (root / "jfk" / "jfk.txt").exists() and (root / "jfk" / "jfk.flac").exists():
        pool.append((root / "jfk" / "jfk.flac", (root / "jfk" / "jfk.txt").read_text().strip()))
    return pool[:count]


def repeat(items: list, count: int, cycle: bool = True) -> list:
    """`items` repeated up to `count` (the test clips that travel to a GPU machine are fewer than its
    streams); without `cycle`, as they are."""
    return [items[i % len(items)] for i in range(count)] if cycle and items else items


class LockScheduler:
    """The engine before the scheduler: each caller decodes directly, under one lock for everyone."""

    def __init__(self, decoder) -> None:
        from asr_app.scheduler_metrics import SchedulerMetrics
        self.decoder, self.lock, self._metrics = decoder, threading.Lock(), SchedulerMetrics

    @property
    def pair(self):
        return self.decoder.pair

    def client(self, options=None, *, priority=1, session="", timeout_s=None):
        return LockedDecoder(self, options or self.decoder.options)

    def metrics(self):
        return self._metrics()

    def close(self, timeout=None) -> None:
        pass


class LockedDecoder:
    def __init__(self, owner: LockScheduler, options) -> None:
        self.owner, self._options, self.usage = owner, options, None

    pair = property(lambda self: self.owner.pair)
    options = property(lambda self: self._options)

    def decode(self, audio, options=None, prompts=None, hints=None):
        from asr_app.decoding.options import DecodingStats
        with self.owner.lock:
            results = self.owner.decoder.decode(audio, options or self._options, prompts, hints)
        self.usage = DecodingStats.total(([self.usage] if self.usage else []) + [r.stats for r in results])
        return results


def start_server(engine) -> tuple[str, object]:
    import uvicorn

    from asr_app.serve.app import build_app
    from asr_app.serve.security import AccessSettings
    app = build_app(engine, AccessSettings(), mount_ui=False)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", ws_max_size=1 << 22)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"127.0.0.1:{port}", server


async def one_stream(host: str, pcm: np.ndarray) -> dict:
    from websockets.asyncio.client import connect
    step = int(16_000 * CHUNK_S)
    words, text = [], ""
    async with connect(f"ws://{host}/v1/live?sample_rate=16000&mode=exact") as ws:
        ready = json.loads(await ws.recv())
        assert ready["kind"] == "ready", ready
        t0 = time.monotonic()

        async def send() -> None:
            for k, i in enumerate(range(0, len(pcm), step)):
                await asyncio.sleep(max(0.0, t0 + (k + 1) * CHUNK_S - time.monotonic()))
                await ws.send(pcm[i:i + step].tobytes())
            await ws.send(json.dumps({"type": "stop"}))

        sender = asyncio.create_task(send())
        async for message in ws:
            event, now = json.loads(message), time.monotonic()
            if event["kind"] == "commit":
                words += [now - (t0 + w["end"]) for w in event["words"]]
            elif event["kind"] == "done":
                text = event["text"]
        await sender
    return {"latencies": words, "text": text}


def run_streams(host: str, clips: list[tuple[np.ndarray, str]]) -> list[dict]:
    async def everyone():
        return await asyncio.gather(*(one_stream(host, pcm) for pcm, _ in clips))
    return asyncio.run(everyone())


def summarise(results: list[dict], references: list[str], alone_wer: list[float] | None,
              offline_wer: list[float] | None = None) -> dict:
    from asr_app.wer import word_error_rate
    lat = sorted(x for r in results for x in r["latencies"])
    wers = [word_error_rate(ref, r["text"]) for r, ref in zip(results, references)]
    out = {"words": len(lat), "p50_s": _q(lat, 0.5), "p90_s": _q(lat, 0.9), "max_s": lat[-1] if lat else None,
           "wer": wers}
    if alone_wer is not None:
        out["wer_minus_alone_max"] = max(w - a for w, a in zip(wers, alone_wer))
    if offline_wer is not None:
        out["wer_minus_offline_max"] = max(w - o for w, o in zip(wers, offline_wer))
    return out


def offline_wers(decoder, clips: list[tuple[np.ndarray, str]]) -> list[float]:
    """Each clip's WER transcribed whole (`transcribe()`, what asr-transcribe writes), not streamed: what a
    stream's text is compared with besides the same clip streamed alone, whose text depends on the moments
    of its re-decodes too."""
    from asr_app.longform import transcribe
    from asr_app.wer import word_error_rate
    return [word_error_rate(text, transcribe(decoder, pcm.astype(np.float32) / 32767).text) for pcm, text in clips]


def _q(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def load_clips(count: int, root: Path | None = None, stream_s: float | None = None) -> list[tuple[np.ndarray, str]]:
    """`count` clips as PCM16 with their transcripts; with `stream_s`, `count` streams of consecutive clips
    joined to at least that long (fewer where the pool runs out: `bench_streams` says so)."""
    if stream_s is None:
        return read_clips(clip_pool(count, root))
    return join_clips(read_clips(clip_pool(10_000, root)), count, stream_s)


def join_clips(clips: list[tuple[np.ndarray, str]], count: int, stream_s: float) -> list[tuple[np.ndarray, str]]:
    """Consecutive clips joined, 0.5 s of silence between them, into at most `count` streams of at least
    `stream_s` seconds each."""
    gap = np.zeros(8_000, dtype="<i2")
    streams, pcm, texts = [], [], []
    for audio, text in clips:
        pcm, texts = pcm + ([gap] if pcm else []) + [audio], texts + [text]
        if sum(len(a) for a in pcm) >= stream_s * 16_000:
            streams.append((np.concatenate(pcm), " ".join(texts)))
            pcm, texts = [], []
            if len(streams) == count:
                break
    return streams


def read_clips(pool: list[tuple[Path, str]]) -> list[tuple[np.ndarray, str]]:
    out = []
    for path, text in pool:
        audio, rate = sf.read(str(path), dtype="float32")
        audio = audio.mean(axis=1) if audio.ndim == 2 else audio
        audio = soxr.resample(audio, rate, 16_000) if rate != 16_000 else audio
        out.append(((np.clip(audio, -1, 1) * 32767).astype("<i2"), text))
    return out


ENGINES = ("lock", "scheduler", "scheduler+context", "scheduler+context+prompt")
PROMPT_TOKENS = 32   # the "+prompt" engines: live prompts cut to this many tokens, so sessions share a batch


def make_engine(name: str, decoder, streaming, context_s: float, sessions: int):
    from dataclasses import replace

    from asr_app.limits import ServiceLimits
    from asr_app.scheduler import Scheduler
    from asr_app.serve.cli import warm_up
    from asr_app.ui.engine import UiEngine
    scheduler = LockScheduler(decoder) if name == "lock" else Scheduler(decoder)
    context = context_s if "+context" in name else None
    if "+prompt" in name:
        streaming = replace(streaming, prompt_tokens=PROMPT_TOKENS)
    limits = ServiceLimits(max_sessions=max(sessions, ServiceLimits().max_sessions))
    engine = UiEngine.from_decoder(decoder, streaming, limits).sharing(scheduler=scheduler,
                                                                       live_encoder_context_s=context)
    if name != "lock":
        warm_up(engine)   # as asr-serve does before serving (a GPU only; nothing on a CPU)
    return engine


def bench_streams(decoder, streaming, counts: list[int], engines: list[str], context_s: float,
                  root: Path | None = None, cycle: bool = False, stream_s: float | None = None) -> dict:
    from asr_app.wer import word_error_rate
    clips = load_clips(max(counts), root, stream_s)
    if stream_s is not None and (not clips or len(clips) < max(counts) and not cycle):
        raise SystemExit(f"serve_bench: the clips make {len(clips)} streams of {stream_s:g} s, not "
                         f"{max(counts)} (--cycle-clips repeats them)")
    distinct = len(clips)   # a repeated clip is streamed alone once
    clips = repeat(clips, max(counts), cycle)
    offline_wer = repeat(offline_wers(decoder, clips[:distinct]), len(clips))
    report: dict = {"clips_s": [round(len(p) / 16_000, 2) for p, _ in clips], "context_s": context_s,
                    "distinct_clips": distinct, "offline_wer": offline_wer, "stream_seconds": stream_s,
                    "trim_s": streaming.trim_s, "settle_s": streaming.settle_s}
    for name in engines:
        engine = make_engine(name, decoder, streaming, context_s, max(counts))
        host, server = start_server(engine)
        alone = [run_streams(host, [clip])[0] for clip in clips[:distinct]]
        alone = repeat(alone, len(clips))
        alone_wer = [word_error_rate(text, r["text"]) for r, (_, text) in zip(alone, clips)]
        alone_lat = summarise(alone[:distinct], [t for _, t in clips[:distinct]], None)
        print(f"{name:18s} each clip alone: p90 {alone_lat['p90_s']:.2f} s, "
              f"mean WER {np.mean(alone_wer[:distinct]):.3f}",
              flush=True)
        rows = {}
        for n in counts:
            before, started = engine.scheduler.metrics(), time.monotonic()
            results = run_streams(host, clips[:n])
            after, wall = engine.scheduler.metrics(), time.monotonic() - started
            rows[n] = summarise(results, [t for _, t in clips[:n]], alone_wer[:n], offline_wer[:n])
            rows[n]["graphs"] = graph_figures(after, before)   # made while N streamed
            rows[n]["worker"] = worker_figures(after, before, wall)
            rows[n]["texts"] = [r["text"] for r in results]   # what a WER jump lost, to read afterwards
            print(f"{name:18s} N={n}: p50 {rows[n]['p50_s']:.2f} s, p90 {rows[n]['p90_s']:.2f} s, "
                  f"max {rows[n]['max_s']:.2f} s, WER-alone max {rows[n]['wer_minus_alone_max']:+.3f}, "
                  f"WER-offline max {rows[n]['wer_minus_offline_max']:+.3f}; {worker_line(rows[n]['worker'])}",
                  flush=True)
        metrics = engine.scheduler.metrics()
        report[name] = {"alone_wer": alone_wer, "alone": alone_lat, "streams": rows,
                        "alone_texts": [r["text"] for r in alone[:distinct]],
                        "batches_by_rows": metrics.rows_per_batch, "sizer_s_per_row": metrics.sizer,
                        "choices": metrics.choices,   # kind -> rows ready -> rows taken -> batches
                        **batch_samples(metrics.samples),   # the latest batches: why each size won
                        "graphs": graph_figures(metrics)}   # the whole run: warm-up and clips alone too
        server.should_exit = True
        engine.scheduler.close()
    return report


def batch_samples(samples) -> dict:
    """Scheduler batch samples (SchedulerMetrics.samples) as a report saves them, with their summary per kind of
    work and batch size."""
    from asr_app.scheduler_metrics import summarise_samples

    return {"sample_summary": summarise_samples(samples), "batch_samples": [dataclasses.asdict(s) for s in samples]}


def worker_figures(after, before, wall_s: float) -> dict:
    """What the scheduler's worker did while N streamed (scheduler metrics before and after): the share of the
    time it was decoding (near 1: the worker is the bottleneck, and latency is queueing behind it; well below:
    the time goes elsewhere), its batches and rows, and the live re-decodes' seconds from asking to answer
    (queue and decode; the most recent ones, as many as the metrics keep)."""
    asked = after.latency_count.get("live", 0) - before.latency_count.get("live", 0)
    recent = sorted(after.latencies.get("live", [])[-asked:]) if asked > 0 else []
    return {"wall_s": wall_s, "busy_share": (after.busy_s - before.busy_s) / wall_s if wall_s > 0 else None,
            "batches": after.batches - before.batches, "rows": after.rows - before.rows, "live_redecodes": asked,
            "redecode_p50_s": _q(recent, 0.5), "redecode_p90_s": _q(recent, 0.9)}


def worker_line(worker: dict) -> str:
    share, p50, p90 = worker["busy_share"], worker["redecode_p50_s"], worker["redecode_p90_s"]
    return (f"worker busy {share:.0%}, {worker['rows']} rows in {worker['batches']} batches, re-decodes asked to "
            f"answered p50 {p50:.2f} s, p90 {p90:.2f} s" if share is not None and p50 is not None
            else "worker: no re-decodes")


def graph_figures(after, before=None) -> dict:
    """Where steps are captured (a GPU): workspaces held at the end, and the workspaces and graphs dropped,
    graphs captured and their seconds between `before` and `after` (scheduler metrics; since the start
    without `before`). All zero on a CPU."""
    def made(name: str) -> float:
        return getattr(after, name) - (getattr(before, name) if before is not None else 0)

    return {"workspaces": after.workspaces, "workspace_evictions": made("workspace_evictions"),
            "graph_evictions": made("graph_evictions"), "captures": made("graph_captures"),
            "capture_s": made("graph_capture_s")}


def tiny_pair_decoder(models: Path, device: str = "cpu", runtime=None):
    """`exact` decoding with the real tiny.en pair of a folder holding whisper-tiny.en and distil-tiny.en-draft."""
    from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
    from asr_app.models import load_pair
    pair = load_pair(target=str(models / "whisper-tiny.en"), draft=str(models / "distil-tiny.en-draft"), device=device)
    return SpeculativeDecoder(pair, DecodingOptions(mode="exact"), runtime or RuntimeOptions())


def api_engine(decoder, requests: int):
    """An engine with a scheduler of its own, warmed up as asr-serve does (a GPU only), that lets in `requests`
    transcriptions at once: a 503 from --max-requests would end a run, not time it."""
    from asr_app.limits import ServiceLimits
    from asr_app.scheduler import Scheduler
    from asr_app.serve.cli import warm_up
    from asr_app.ui.engine import UiEngine
    limits = ServiceLimits(max_requests=max(requests, ServiceLimits().max_requests))
    engine = UiEngine.from_decoder(decoder, limits=limits).sharing(scheduler=Scheduler(decoder))
    warm_up(engine)
    return engine


@contextmanager
def api_sender(engine) -> Iterator[Callable[[Path], str]]:
    """A real asr-serve app on loopback over `engine`, and a function that sends one file to its
    /v1/audio/transcriptions with the official openai client and returns the text; both closed after."""
    import openai
    host, server = start_server(engine)
    api = openai.OpenAI(base_url=f"http://{host}/v1", api_key="none", max_retries=0, timeout=600)

    def send(path: Path) -> str:
        with open(path, "rb") as f:
            return api.audio.transcriptions.create(model="whisper-1", file=f).text

    try:
        yield send
    finally:
        api.close()
        server.should_exit = True


def bench_api(decoder, count: int, root: Path | None = None, cycle: bool = False, rounds: int = 1) -> dict:
    """`count` clips sent one at a time, then all at once, `rounds` times alternately (a VM whose speed
    drifts slows both alike); medians, the ratio of the medians, and each round's ratio."""
    paths = repeat([p for p, _ in clip_pool(count, root)], count, cycle)
    engine = api_engine(decoder, count)
    try:
        with api_sender(engine) as send:
            return api_rounds(engine, decoder, send, paths, rounds)
    finally:
        engine.scheduler.close()


def api_rounds(engine, decoder, send: Callable[[Path], str], paths: list[Path], rounds: int) -> dict:
    """bench_api's rounds through `send` (api_sender's, over `engine`), then the texts against transcribe()'s."""
    from asr_app.longform import transcribe
    from asr_app.scheduler_metrics import SchedulerMetrics

    send(paths[0])  # warm-up
    start = engine.scheduler.metrics()
    seq_times, conc_times, rounds_texts = [], [], []
    batches: collections.Counter = collections.Counter()   # the concurrent rounds' batches, by rows
    gathers, gather_s = 0, 0.0
    choices = SchedulerMetrics()   # the concurrent rounds' sizer choices, summed (its `choices` only)
    samples = []                   # ... and their batches' samples
    for _ in range(rounds):
        started = time.perf_counter()
        sequential = [send(p) for p in paths]
        seq_times.append(time.perf_counter() - started)
        before = engine.scheduler.metrics()
        started = time.perf_counter()
        with ThreadPoolExecutor(len(paths)) as pool:
            together = list(pool.map(send, paths))
        conc_times.append(time.perf_counter() - started)
        after = engine.scheduler.metrics()
        batches.update(after.batches_since(before))
        gathers, gather_s = gathers + after.gathers - before.gathers, gather_s + after.gather_s - before.gather_s
        choices.add_choices(after.choices_since(before))
        samples += after.samples_since(before)
        rounds_texts += [sequential, together]
    sequential_s, concurrent_s = statistics.median(seq_times), statistics.median(conc_times)
    offline = [transcribe(decoder, str(p)).text for p in paths]
    batches = {k: n for k, n in sorted(batches.items()) if n}
    row = {"requests": len(paths), "rounds": rounds, "sequential_s": sequential_s, "concurrent_s": concurrent_s,
           "ratio": concurrent_s / sequential_s, "identical_to_transcribe": all(texts == offline for texts in rounds_texts),
           "differ_from_transcribe": text_differences(paths, offline, rounds_texts),
           "batches_by_rows": batches, "sizer_s_per_row": after.sizer, "sequential_rounds_s": seq_times,
           "concurrent_rounds_s": conc_times, "round_ratios": [c / s for c, s in zip(conc_times, seq_times)],
           "gathers": gathers, "gather_s": gather_s, "graphs": graph_figures(after, start),   # every round's
           "choices": choices.choices, **batch_samples(samples)}
    print(f"API x{len(paths)}: one at a time {sequential_s:.1f} s, together {concurrent_s:.1f} s "
          f"({row['ratio']:.2f}x; rounds {', '.join(f'{r:.2f}' for r in row['round_ratios'])}); identical to "
          f"transcribe(): {row['identical_to_transcribe']}; batches {batches}")
    return row


def text_differences(paths: list[Path], offline: list[str], rounds_texts: list[list[str]]) -> list[dict]:
    """Each API answer unlike `transcribe()`'s text for its clip: which round (even: one at a time, odd: all at
    once), which request, and both texts, so a mismatch can be told from a batch effect by reading it."""
    return [{"round": r // 2 + 1, "together": bool(r % 2), "request": i, "clip": paths[i].name,
             "transcribe": want, "api": got}
            for r, texts in enumerate(rounds_texts) for i, (got, want) in enumerate(zip(texts, offline)) if got != want]


def streams_table(report: dict) -> str:
    """Final-word latency of N live streams per engine (p50 / p90 / worst, seconds), WER, and the API row."""
    settings = changed_settings(report)
    if "streams" not in report:  # --streams 0: the API only
        return "".join(f"{n[0].upper()}{n[1:]}. " for n in settings) + api_line(report["api"])
    streams = report["streams"]
    engines = [e for e in ENGINES if e in streams]
    counts = sorted({int(n) for e in engines for n in streams[e]["streams"]})
    clips = len(streams["clips_s"])
    distinct = streams.get("distinct_clips", clips)
    repeated = f" ({distinct} distinct, repeated)" if distinct < clips else ""
    if streams.get("stream_seconds"):
        repeated += f" (consecutive real clips joined, 0.5 s apart, to {streams['stream_seconds']:g} s or more)"
    where = report.get("device", "cpu")
    where = report.get("cpu", "") if where == "cpu" else f"{where}, host {report.get('cpu', '')}"
    # runs before 2026-11-26 did not transcribe the clips whole: their tables keep seven columns
    offline = (" worst WER - whole clip |", "---|") if "offline_wer" in streams else ("", "")
    kind = "streams" if streams.get("stream_seconds") else "clips"
    lines = [f"tiny.en + distilled draft, `exact`, {report['threads']} threads, {clips} real {kind}{repeated} "
             f"({sum(streams['clips_s']):.0f} s) streamed at real-time pace over the WebSocket; encoder context "
             f"{streams['context_s']:g} s for `scheduler+context`; {where}"
             + "".join(f"; {n}" for n in settings),
             "",
             "| engine | N | p50 s | p90 s | worst s | mean WER | worst WER - alone |" + offline[0],
             "|---|---|---|---|---|---|---|" + offline[1]]
    for engine in engines:
        rows = streams[engine]["streams"]
        for n in counts:
            row = rows.get(str(n)) or rows.get(n)
            lines.append(f"| {engine} | {n} | {row['p50_s']:.2f} | {row['p90_s']:.2f} | {row['max_s']:.2f} | "
                         f"{100 * sum(row['wer']) / len(row['wer']):.1f}% | {100 * row['wer_minus_alone_max']:+.1f} |"
                         + (f" {100 * row['wer_minus_offline_max']:+.1f} |" if offline[0] else ""))
    lines += [f"\n{engine}: {captured(streams[engine].get('graphs'))[2:]}" for engine in engines
              if captured(streams[engine].get("graphs"))]
    worker = [f"{engine} N = {n}: {worker_line(row['worker'])}" for engine in engines
              for n, row in ((n, streams[engine]["streams"].get(str(n)) or streams[engine]["streams"].get(n))
                             for n in counts) if row and row.get("worker") and row["worker"]["live_redecodes"]]
    if worker:
        lines += ["", "While the streams ran (the scheduler's metrics):", *(f"- {line}" for line in worker)]
    if report.get("api"):
        lines += ["", api_line(report["api"])]
    return "\n".join(lines)


def changed_settings(report: dict) -> list[str]:
    """A phrase for each setting the run changed from its default: bf16 encoder products, the switch interval,
    the kernel cache, the live buffers' trim point, the commit policy's settling."""
    from asr_app.streaming import StreamingOptions
    notes = []
    if report.get("encoder_matmul_dtype") == "bfloat16":
        notes.append("encoder products in bf16 (`--encoder-matmul-dtype bfloat16`)")
    interval = report.get("switch_interval_ms")
    if interval is not None and abs(interval - 5.0) > 1e-9:
        notes.append(f"thread switch interval {interval:g} ms (`--switch-interval-ms`; Python's own 5 ms)")
    cache = report.get("cpu_kernel_cache")
    if cache is not None and not cache.endswith("(default)"):
        notes.append(f"CPU kernel cache {cache}")
    trim = report.get("streams", {}).get("trim_s")
    if trim is not None and trim != StreamingOptions().trim_s:
        notes.append(f"buffers trimmed past {trim:g} s (`--trim-seconds {trim:g}`)")
    settle = report.get("streams", {}).get("settle_s")
    if settle is not None:
        notes.append(f"words new to a hypothesis committed from it {settle:g} s before the buffer's end "
                     f"(`--settle-seconds {settle:g}`)")
    return notes


def api_line(api: dict) -> str:
    """The API row: all at once against one at a time, texts against `transcribe()`, batches formed."""
    rounds = api.get("rounds", 1)
    medians = f", medians of {rounds} alternating rounds" if rounds > 1 else ""
    each = f" (each round: {', '.join(f'{r:.2f}x' for r in api['round_ratios'])})" if rounds > 1 else ""
    differ = api.get("differ_from_transcribe")
    unlike = f" ({len(differ)} answers unlike it)" if differ else ""
    return (f"API: {api['requests']} requests at once {api['concurrent_s']:.1f} s, one at a time "
            f"{api['sequential_s']:.1f} s{medians} (**{api['ratio']:.2f}x**){each}; texts identical to "
            f"`transcribe()`: {api['identical_to_transcribe']}{unlike}; batches by rows "
            f"{ {int(k): n for k, n in api['batches_by_rows'].items()} }{captured(api.get('graphs'))}")


def captured(graphs: dict | None) -> str:
    """CUDA graph figures where there were any (older runs did not record them; a CPU captures none)."""
    if not graphs or not graphs["captures"]:
        return ""
    return (f"; graphs captured {graphs['captures']} ({graphs['capture_s']:.1f} s), workspaces dropped "
            f"{graphs['workspace_evictions']}, graphs dropped {graphs.get('graph_evictions', 0)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--api-requests", type=int, default=16)
    parser.add_argument("--api-rounds", type=int, default=1, choices=range(1, 101), metavar="1..100",
                        help="one-at-a-time and all-at-once runs, alternating")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"any of {', '.join(ENGINES)}")
    parser.add_argument("--context", type=float, default=3.0, help="seconds of encoder context (+context engine)")
    parser.add_argument("--models", type=Path, default=SHARED / "models",
                        help="folder with whisper-tiny.en and distil-tiny.en-draft")
    parser.add_argument("--audio", type=Path, default=None,
                        help="clips with transcripts (default the shared audio; tests/data/audio travels to a GPU)")
    parser.add_argument("--cycle-clips", action="store_true", help="repeat the clips up to the largest N")
    parser.add_argument("--trim-seconds", type=float, default=None, metavar="S",
                        help="StreamingOptions.trim_s of every live session (default its own, 15)")
    parser.add_argument("--settle-seconds", type=float, default=None, metavar="S",
                        help="StreamingOptions.settle_s of every live session: after a large step, words new to a "
                             "hypothesis are committed from it once they end S s before the buffer's end (default off)")
    parser.add_argument("--stream-seconds", type=float, default=None, metavar="S",
                        help="long sessions: each stream joins consecutive clips until it lasts S seconds (with "
                             "--cycle-clips, copies of a stream start together with the same audio: easy to batch)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--encoder-matmul-dtype", default="same", choices=ENCODER_MATMUL_DTYPES,
                        help="RuntimeOptions.encoder_matmul_dtype of the decoder every engine shares")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="the interpreter's thread switch interval (sys.setswitchinterval; Python's own: 5)")
    add_kernel_cache_arg(parser)   # as asr-serve's, and with its default
    parser.add_argument("--out", default=None, help="JSON report (default bench/results/<device>/<date>/serve_bench.json)")
    args = parser.parse_args(argv)
    if (problem := kernel_cache_problem(args.cpu_kernel_cache)) is not None:
        parser.error(problem)
    if args.trim_seconds is not None and not 0 < args.trim_seconds <= 30:
        parser.error(f"--trim-seconds must lie in (0, 30], got {args.trim_seconds:g}")
    if args.settle_seconds is not None:
        from asr_app.streaming import StreamingOptions
        try:
            StreamingOptions(settle_s=args.settle_seconds)
        except ValueError as exc:
            parser.error(f"--settle-seconds: {exc}")
    default_interval = sys.getswitchinterval()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    # the bound as asr-serve sets it, before the models' first kernel (in a process where oneDNN already ran,
    # a test's, it changes nothing, and the report names the setting, not what oneDNN uses)
    try:
        with kernel_cache_bound(args.cpu_kernel_cache) as bound:
            args.kernel_cache = str(bound)
            return run(args, argv)
    finally:
        sys.setswitchinterval(default_interval)   # main() is also called in-process (tests)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    import torch

    from asr_app.decoding import RuntimeOptions
    from asr_app.streaming import StreamingOptions
    torch.set_num_threads(args.threads)
    decoder = tiny_pair_decoder(args.models, args.device, RuntimeOptions(encoder_matmul_dtype=args.encoder_matmul_dtype))
    counts = [int(n) for n in args.streams.split(",") if int(n)]  # --streams 0: the API only
    from report_io import device_name, result_path, save_results
    report = {"command": " ".join(["python", "bench/serve_bench.py", *(argv or sys.argv[1:])]),
              "threads": args.threads, "date": time.strftime("%Y-%m-%d"), "cpu": _cpu(),
              "encoder_matmul_dtype": args.encoder_matmul_dtype, "switch_interval_ms": 1000 * sys.getswitchinterval(),
              "cpu_kernel_cache": args.kernel_cache,
              "device": device_name(args.device) if args.device.startswith("cuda") else "cpu"}
    out = Path(args.out) if args.out else result_path("serve_bench", args.device)

    def save() -> None:   # after each part: a part that fails later loses nothing of the one before
        save_results(out, json.loads(json.dumps(report, default=float)), streams_table(report), device=args.device)
        print(f"wrote {out}", flush=True)

    if counts:
        changed = {"trim_s": args.trim_seconds, "settle_s": args.settle_seconds}
        streaming = StreamingOptions(**{name: value for name, value in changed.items() if value is not None})
        report["streams"] = bench_streams(decoder, streaming, counts, args.engines.split(","),
                                          args.context, args.audio, args.cycle_clips, args.stream_seconds)
        save()
    if args.api_requests:
        report["api"] = bench_api(decoder, args.api_requests, args.audio, args.cycle_clips, args.api_rounds)
        save()
    return 0


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
