"""Load and faults: a real `asr-serve` (subprocess, loopback) under --clients clients for --minutes, mixing
live streams at real-time pace, uploads, clients that disconnect mid-stream and clients that send bad
audio (a WAV claiming 1 Hz, NaN samples, a truncated FLAC, 3 h of silence at 8 kHz, 500 MB of noise).

At the end it checks what the serving issue asks: zero 5xx, zero leaked sessions, threads or temporary
files, RSS growth (after warm-up) at most 100 MB, and every good request's text right (uploads: equal to
the offline transcript at T = 0; streams: WER against the clip's transcript within 1 point of the same
clip streamed alone before the load). Writes JSON (bench/results/cpu/<date>/serve_load.json).

    python bench/serve_load.py --minutes 10 --clients 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from serve_bench import CHUNK_S, clip_pool, load_clips  # noqa: E402

SHARED = Path(os.environ.get("ASR_SHARED_DIR", REPO.parent / "shared"))


def start(port: int, tmp: Path, threads: int, extra: list[str] = ()) -> subprocess.Popen:
    models = SHARED / "models"
    cmd = [sys.executable, "-m", "asr_app.serve.cli", "--target", str(models / "whisper-tiny.en"),
           "--draft", str(models / "distil-tiny.en-draft"), "--device", "cpu", "--threads", str(threads),
           "--port", str(port), "--no-ui", "--max-sessions", "16", *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, TMPDIR=str(tmp)), stdout=open(tmp / "server.log", "w"),
                            stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("asr-serve did not start")


def proc_status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            fields[key] = int(value.split()[0])
    return fields


def thread_names(pid: int) -> dict[str, int]:
    """The server's threads by name (torch's, uvicorn's worker pool, live sessions' workers, ...)."""
    names: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines if not ln.startswith("#")}


def bad_bodies(folder: Path) -> dict[str, object]:
    """Bad uploads: small ones in memory, the large ones written to disk once (sent from the file, never
    held whole by the client)."""
    def wav(samples, rate, subtype="PCM_16") -> bytes:
        out = io.BytesIO()
        sf.write(out, samples, rate, format="WAV", subtype=subtype)
        return out.getvalue()

    flac = (SHARED / "audio" / "jfk" / "jfk.flac").read_bytes()
    silence = folder / "silence_3h.wav"
    with sf.SoundFile(str(silence), "w", 8000, 1, "PCM_16") as f:
        block = np.zeros(8000 * 60, np.int16)
        for _ in range(180):
            f.write(block)
    noise = folder / "noise_500mb.wav"
    rng = np.random.default_rng(0)
    with noise.open("wb") as f:
        for _ in range(500):
            f.write(rng.integers(0, 255, 1_000_000, dtype=np.uint8).tobytes())
    return {
        "one_hz.wav": wav(np.zeros(16, np.float32), 1),
        "nan.wav": wav(np.full(16000, np.nan, np.float32), 16000, "FLOAT"),
        "truncated.flac": flac[: len(flac) // 3],
        "silence_3h.wav": silence,
        "noise_500mb.wav": noise,
    }


class Load:
    def __init__(self, url: str, clips, expected_upload: dict[str, str], alone_wer: list[float], seed: int,
                 folder: Path):
        self.url, self.clips, self.expected, self.alone_wer = url, clips, expected_upload, alone_wer
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.problems: list[str] = []
        self.bad_bodies = bad_bodies(folder)

    def note(self, key: str, problem: str | None = None) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            if problem:
                self.problems.append(problem)

    def client(self, deadline: float, index: int) -> None:
        rng = random.Random(index)
        while time.monotonic() < deadline:
            action = rng.choices(["stream", "upload", "disconnect", "bad"], [4, 3, 1, 2])[0]
            try:
                getattr(self, action)(rng)
            except Exception as exc:  # noqa: BLE001 - a client's failure is a finding, reported
                self.note(f"{action}_exception", f"{action}: {type(exc).__name__}: {exc}")

    def stream(self, rng, disconnect: bool = False) -> None:
        from asr_app.wer import word_error_rate
        k = rng.randrange(len(self.clips))
        pcm, text = self.clips[k]
        result = asyncio.run(_stream(self.url, pcm, disconnect))
        if disconnect:
            self.note("disconnect")
            return
        if result is None:
            self.note("stream_busy")   # a full house said so at the door: allowed, not a failure
            return
        wer = word_error_rate(text, result)
        self.note("stream", None if wer <= self.alone_wer[k] + 0.01 else
                  f"stream of clip {k}: WER {wer:.3f} vs {self.alone_wer[k]:.3f} alone: {result!r}")

    def disconnect(self, rng) -> None:
        self.stream(rng, disconnect=True)

    def upload(self, rng) -> None:
        name = rng.choice(sorted(self.expected))
        with open(name, "rb") as f:
            r = httpx.post(self.url + "/v1/audio/transcriptions", files={"file": (Path(name).name, f)},
                           data={"model": "whisper-1"}, timeout=600)
        if r.status_code == 503:
            self.note("upload_busy")
            return
        ok = r.status_code == 200 and r.json()["text"] == self.expected[name]
        self.note("upload", None if ok else f"upload {Path(name).name}: {r.status_code} {r.text[:200]}")

    def bad(self, rng) -> None:
        name = rng.choice(sorted(self.bad_bodies))
        body = self.bad_bodies[name]
        try:
            if isinstance(body, Path):
                with body.open("rb") as f:
                    r = httpx.post(self.url + "/v1/audio/transcriptions", files={"file": (name, f)},
                                   data={"model": "whisper-1"}, timeout=600)
            else:
                r = httpx.post(self.url + "/v1/audio/transcriptions", files={"file": (name, body)},
                               data={"model": "whisper-1"}, timeout=600)
        except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
            self.note(f"bad_{name}_cut_off")   # refused while it was being sent (the server closed the body)
            return
        self.note(f"bad_{name}_{r.status_code}",
                  None if 400 <= r.status_code < 500 else f"{name}: {r.status_code} {r.text[:200]}")


async def _stream(url: str, pcm: np.ndarray, disconnect: bool) -> str | None:
    from websockets.asyncio.client import connect
    step = int(16_000 * CHUNK_S)
    async with connect(url.replace("http", "ws") + "/v1/live?sample_rate=16000") as ws:
        if json.loads(await ws.recv())["kind"] != "ready":
            return None
        t0 = time.monotonic()
        chunks = list(range(0, len(pcm), step))
        cut = len(chunks) // 2 if disconnect else len(chunks)
        for k, i in enumerate(chunks[:cut]):
            await asyncio.sleep(max(0.0, t0 + (k + 1) * CHUNK_S - time.monotonic()))
            await ws.send(pcm[i:i + step].tobytes())
        if disconnect:
            return None      # leave without a stop: the server must free the session
        await ws.send(json.dumps({"type": "stop"}))
        text = None
        async for message in ws:
            event = json.loads(message)
            if event["kind"] == "done":
                text = event["text"]
        return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="pass ARG to asr-serve (repeatable), e.g. --server-arg=--default-allocator")
    parser.add_argument("--idle-s", type=float, default=5.0,
                        help="seconds to wait after the load before the last RSS/threads reading")
    parser.add_argument("--name", default="serve_load", help="result file name (default serve_load)")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="serve_load_"))
    proc = start(args.port, tmp, args.threads, args.server_arg)
    url = f"http://127.0.0.1:{args.port}"
    try:
        report = run(url, proc, tmp, args)
    finally:
        proc.terminate()
        proc.wait(30)
    log = (tmp / "server.log").read_text()
    report["server_tracebacks"] = log.count("Traceback")
    report["onednn_kernels"] = onednn_kernels(log)
    report["cpu_kernel_cache"] = server_kernel_cache(log)
    report["command"] = "python bench/serve_load.py " + " ".join(argv or sys.argv[1:])
    from report_io import result_path, save_results
    out = result_path(args.name)
    save_results(out, report, load_table(report))
    print(f"problems: {len(report['problems'])}", *report["problems"][:20], sep="\n  ")
    print(f"wrote {out}")
    return 0


def server_kernel_cache(log: str) -> str | None:
    """The kernel-cache bound the server's startup line names (asr_app/kernel_cache.py): what the server set
    itself, which the bench's own environment does not show."""
    found = re.search(r"CPU kernel cache ([^;\n]+)", log)
    return found.group(1) if found else None


def onednn_kernels(log: str) -> dict | None:
    """Kernels oneDNN compiled (cache misses: their count and seconds) and found in its cache, from the lines
    it writes when the server runs with ONEDNN_VERBOSE=profile_create; None without them."""
    compiled, compile_ms = 0, 0.0
    for line in log.splitlines():
        if ",create:cache_miss," in line:
            compiled += 1
            with contextlib.suppress(ValueError):   # a line cut short (the server killed) adds no time
                compile_ms += float(line.rsplit(",", 1)[1])
    hits = log.count(",create:cache_hit,")
    if not compiled and not hits:
        return None
    return {"compiled": compiled, "compile_s": compile_ms / 1000, "found": hits}


def load_table(report: dict) -> str:
    """What the load and faults run found, against what the serving issue asks."""
    counts = report["counts"]
    good = {k: v for k, v in counts.items() if k in ("stream", "upload", "disconnect", "stream_busy", "upload_busy")}
    bad = {k: v for k, v in counts.items() if k.startswith("bad_")}
    failures = {k: v for k, v in counts.items() if k.endswith("_exception")}
    rows = [("clients x minutes", f"{report['clients']} x {report['minutes']:g}"),
            ("requests by kind", ", ".join(f"{k} {v}" for k, v in sorted(good.items()))),
            ("bad inputs and their answers", ", ".join(f"{k[4:]} {v}" for k, v in sorted(bad.items()))),
            ("client exceptions", ", ".join(f"{k} {v}" for k, v in sorted(failures.items())) or "none"),
            ("HTTP 5xx (ask: 0)", f"{report['http_5xx']:.0f}"),
            ("live sessions / queue left after (ask: 0)", f"{report['live_sessions_after']} / "
                                                          f"{report['queue_depth_after']}"),
            ("server threads before / after", f"{report['threads_before']} / {report['threads_after']}"),
            ("temporary folders left (ask: none)", ", ".join(report["temp_folders_left"]) or "none"),
            ("RSS after warm-up / end / peak, MB (ask: growth <= 100)",
             f"{report['rss_before_mb']:.0f} / {report['rss_after_mb']:.0f} / {report['rss_peak_mb']:.0f}"),
            ("tracebacks in the server log", str(report["server_tracebacks"])),
            ("the server's CPU kernel cache", str(report.get("cpu_kernel_cache"))),
            *([("kernels compiled / compile s / found in the cache (ONEDNN_VERBOSE)",
                f"{kernels['compiled']} / {kernels['compile_s']:.1f} / {kernels['found']}")]
              if (kernels := report.get("onednn_kernels")) else []),
            ("requests whose text was not right", str(len(report["problems"]) - sum(failures.values())))]
    return "| check | result |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)


def run(url: str, proc: subprocess.Popen, tmp: Path, args) -> dict:
    from asr_app.wer import word_error_rate
    clips = load_clips(8)
    uploads = [str(p) for p, _ in clip_pool(12)[8:12]]
    expected = {}
    for name in uploads:   # the offline answer at T = 0, through the same server before the load
        with open(name, "rb") as f:
            expected[name] = httpx.post(url + "/v1/audio/transcriptions", files={"file": f},
                                        data={"model": "whisper-1"}, timeout=600).json()["text"]
    alone = [asyncio.run(_stream(url, pcm, False)) for pcm, _ in clips]
    alone_wer = [word_error_rate(text, got) for (_, text), got in zip(clips, alone)]
    time.sleep(2)
    before = proc_status(proc.pid)
    load = Load(url, clips, expected, alone_wer, seed=0, folder=Path(tempfile.mkdtemp(prefix="serve_load_bad_")))
    deadline = time.monotonic() + args.minutes * 60
    threads = [threading.Thread(target=load.client, args=(deadline, i)) for i in range(args.clients)]
    peak = dict(before)
    names_before = thread_names(proc.pid)
    started = time.monotonic()
    timeline = [{"t_s": 0.0, "rss_mb": before["VmRSS"] / 1024, "threads": before["Threads"]}]

    def sample() -> dict:   # the server's status now, into the timeline and the peak
        now = proc_status(proc.pid)
        peak.update({k: max(peak[k], now[k]) for k in now})
        timeline.append({"t_s": round(time.monotonic() - started, 1), "rss_mb": now["VmRSS"] / 1024,
                         "threads": now["Threads"]})
        return now

    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(5)
        sample()
    # Idle: sessions left without a stop finish their last decode, idle workers exit, the scheduler trims.
    # Sampled every 5 s too, so the timeline shows when memory went back.
    idle_until = time.monotonic() + args.idle_s
    while True:
        time.sleep(max(0.0, min(5.0, idle_until - time.monotonic())))
        after = sample()
        if time.monotonic() >= idle_until:
            break
    health = json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())
    m = metrics(url)
    leftover = sorted(p.name for p in tmp.iterdir() if p.name.startswith("asr_serve_"))
    return {"minutes": args.minutes, "clients": args.clients, "counts": load.counts,
            "http_5xx": m.get('asr_http_responses_total{status="5xx"}', 0.0),
            "http_4xx": m.get('asr_http_responses_total{status="4xx"}', 0.0),
            "live_sessions_after": health["live_sessions"], "queue_depth_after": health["queue_depth"],
            "threads_before": before["Threads"], "threads_after": after["Threads"],
            "rss_before_mb": before["VmRSS"] / 1024, "rss_after_mb": after["VmRSS"] / 1024,
            "rss_peak_mb": peak["VmRSS"] / 1024, "temp_folders_left": leftover, "timeline": timeline,
            "thread_names_before": names_before, "thread_names_after": thread_names(proc.pid),
            "server_args": args.server_arg, "idle_s": args.idle_s,
            "batches_by_rows": {k: v for k, v in m.items() if k.startswith("asr_batches_by_rows")},
            "memory_trims": m.get("asr_memory_trims_total", 0.0),
            "problems": load.problems}


if __name__ == "__main__":
    sys.exit(main())
