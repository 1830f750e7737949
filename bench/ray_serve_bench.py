"""What Ray Serve costs, and what a replica's death costs: `asr-serve --engine ray` against the one-process
`asr-serve`, both real servers on loopback (subprocesses), same run.

1. Latency: N live streams at real-time pace over the WebSocket (serve_bench.one_stream: 0.5 s PCM16 frames;
   latency of a word = arrival of its commit - the moment its end was spoken), against
   - `local`: `asr-serve --threads <2 x per-replica threads>` (one scheduler, one pair);
   - `ray`: `asr-serve --engine ray --replicas 2 --threads <per-replica threads>`.
   p50/p90/max over all words of all streams, and each stream's WER against the clip's human transcript.
2. A replica killed: on the `ray` server, N live streams (each frame decoded before the next is sent: the
   `flush` command, so the text does not depend on timing) and --uploads uploads at once, first calm, then
   again with SIGKILL sent to a decoder replica seen busy. Every stream's committed text and every upload's
   text must equal the calm run's; zero 5xx; rows sent again (asr_rows_resent_total).

    python bench/ray_serve_bench.py --streams 8 --uploads 16 --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from serve_bench import clip_pool, load_clips, run_streams, summarise  # noqa: E402

SHARED = Path(os.environ.get("ASR_SHARED_DIR", REPO.parent / "shared"))
REPLICA_TITLE = b"ServeReplica:asr:DecoderReplica"
FRAME = 8000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(engine: str, threads: int, folder: Path) -> tuple[subprocess.Popen, str]:
    models, port = SHARED / "models", free_port()
    cmd = [sys.executable, "-m", "asr_app.serve.cli", "--target", str(models / "whisper-tiny.en"),
           "--draft", str(models / "distil-tiny.en-draft"), "--device", "cpu", "--port", str(port), "--no-ui",
           "--max-sessions", "32"]
    if engine.startswith("ray"):
        cmd += ["--engine", "ray", "--replicas", "2", "--threads", str(threads)]
        cmd += ["--replica-batching", "serve"] if engine == "ray-serve-batch" else []
    else:
        cmd += ["--threads", str(2 * threads)]
    log = open(folder / f"{engine}.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1"))
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                tail = (folder / f"{engine}.log").read_text()[-2000:]
                raise RuntimeError(f"asr-serve --engine {engine} exited: {tail}") from None
            time.sleep(0.5)
    raise RuntimeError(f"asr-serve --engine {engine} did not start")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines if not ln.startswith("#")}


# -- 2. the kill ---------------------------------------------------------------------------------

async def lockstep_stream(url: str, pcm: np.ndarray) -> str:
    from websockets.asyncio.client import connect
    async with connect(url.replace("http://", "ws://") + "/v1/live?sample_rate=16000&mode=exact&temperature=0") as ws:
        await ws.recv()
        for i in range(0, len(pcm), FRAME):
            await ws.send(pcm[i:i + FRAME].tobytes())
            await ws.send(json.dumps({"type": "flush"}))
            while json.loads(await ws.recv())["kind"] != "flushed":
                pass
        await ws.send(json.dumps({"type": "stop"}))
        async for message in ws:
            event = json.loads(message)
            if event["kind"] == "done":
                return event["text"]
    return ""


def upload(url: str, path: Path) -> tuple[int, str]:
    with open(path, "rb") as f:
        response = httpx.post(url + "/v1/audio/transcriptions", files={"file": (path.name, f)},
                              data={"model": "whisper-1", "temperature": "0"}, timeout=600)
    return response.status_code, response.json().get("text", response.text) if response.status_code == 200 \
        else response.text


def replica_pids() -> list[int]:
    """Process ids of the running decoder replicas (Ray names each replica's process after it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and REPLICA_TITLE in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue   # the process ended while we looked
    return sorted(pids)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def kill_a_busy_replica(pids: list[int], wait_s: float, timeout_s: float = 20.0) -> int | None:
    """After `wait_s`, SIGKILL the first replica seen decoding (over half a CPU in 0.1 s), so the kill hits
    rows in flight rather than an idle process; its pid, or None if none was seen busy within `timeout_s`."""
    time.sleep(wait_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        start = {pid: cpu_ticks(pid) for pid in pids}
        time.sleep(0.1)
        for pid in pids:
            if cpu_ticks(pid) - start[pid] >= 5:   # 5 ticks of 10 ms
                os.kill(pid, signal.SIGKILL)
                return pid
    return None


def load_run(url: str, clips, uploads: list[Path], kill_after_s: float | None) -> dict:
    started = time.monotonic()
    with ThreadPoolExecutor(len(uploads) + 1) as pool:
        killer = pool.submit(kill_a_busy_replica, replica_pids(), kill_after_s) if kill_after_s is not None else None

        async def streams():
            return await asyncio.gather(*(lockstep_stream(url, pcm) for pcm, _ in clips))
        answers = [pool.submit(upload, url, path) for path in uploads]
        texts = asyncio.run(streams())
        results = [a.result() for a in answers]
        kill = {"killed_pid": killer.result(), "at_s": kill_after_s} if killer else {}
    return {"streams": texts, "uploads": [text for _, text in results], "statuses": [s for s, _ in results],
            "wall_s": time.monotonic() - started, **kill}


def bench_kill(url: str, clips, uploads: list[Path], kill_after_s: float) -> dict:
    calm = load_run(url, clips, uploads, None)
    resent_before = metrics(url)["asr_rows_resent_total"]
    killed = load_run(url, clips, uploads, kill_after_s)
    time.sleep(1.5)
    after = metrics(url)
    return {
        "calm": calm, "killed": killed,
        "streams_equal": sum(a == b for a, b in zip(calm["streams"], killed["streams"])),
        "uploads_equal": sum(a == b for a, b in zip(calm["uploads"], killed["uploads"])),
        "uploads_answered": len(killed["statuses"]),
        "non_200": [s for s in calm["statuses"] + killed["statuses"] if s != 200],
        "http_5xx": after.get('asr_http_responses_total{status="5xx"}', 0.0),
        "rows_resent": after["asr_rows_resent_total"] - resent_before,
    }


def table(report: dict) -> str:
    lat = report["latency"]
    rows = ["| engine | streams | words | p50 s | p90 s | max s | mean WER |", "|---|---|---|---|---|---|---|"]
    for engine, r in lat.items():
        rows.append(f"| {engine} | {report['streams']} | {r['words']} | {r['p50_s']:.2f} | {r['p90_s']:.2f} | "
                    f"{r['max_s']:.2f} | {100 * np.mean(r['wer']):.1f} |")
    ratios = report["p90_ratio"] if isinstance(report["p90_ratio"], dict) else {"ray": report["p90_ratio"]}
    rows.append("\n" + ", ".join(f"{engine} p90 / local p90: {ratio:.2f}" for engine, ratio in ratios.items()
                                 if engine != "local") + " (asked: within 1.15)")
    k = report.get("kill")
    if k:
        rows.append(f"\nReplica killed (pid {k['killed']['killed_pid']}) during {report['streams']} streams + "
                    f"{len(k['killed']['uploads'])} uploads: streams equal to the calm run {k['streams_equal']}/"
                    f"{report['streams']}, uploads equal {k['uploads_equal']}/{len(k['killed']['uploads'])}, "
                    f"answered {k['uploads_answered']}, non-200 {len(k['non_200'])}, 5xx {k['http_5xx']:.0f}, "
                    f"rows sent again {k['rows_resent']:.0f}; wall {k['calm']['wall_s']:.1f} s calm, "
                    f"{k['killed']['wall_s']:.1f} s with the kill")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--uploads", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica (local gets twice)")
    parser.add_argument("--kill-after", type=float, default=3.0, help="seconds into the load before the kill")
    parser.add_argument("--engines", default="local,ray",
                        help="local, ray (replicas batch with the scheduler), ray-serve-batch (with @serve.batch)")
    parser.add_argument("--no-kill", action="store_true", help="skip the replica-kill part")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    clips = load_clips(args.streams)
    uploads = [path for path, _ in clip_pool(args.uploads + args.streams)][-args.uploads:]
    report = {"command": " ".join(["python", "bench/ray_serve_bench.py", *(argv or sys.argv[1:])]),
              "streams": args.streams, "threads_per_replica": args.threads, "latency": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines.split(","):
            proc, url = start(engine, args.threads, Path(tmp))
            try:
                run_streams(url.removeprefix("http://"), clips[:1])   # warm-up: costs measured, caches built
                results = run_streams(url.removeprefix("http://"), clips)
                report["latency"][engine] = summarise(results, [t for _, t in clips], None)
                print(engine, {k: v for k, v in report["latency"][engine].items() if k != "wer"}, flush=True)
                if engine == "ray" and not args.no_kill:
                    report["kill"] = bench_kill(url, clips, uploads, args.kill_after)
            finally:
                stop(proc)
    local = report["latency"].get("local", {}).get("p90_s")
    report["p90_ratio"] = {engine: r["p90_s"] / local for engine, r in report["latency"].items() if local}
    from report_io import result_path, save_results
    out = Path(args.out) if args.out else result_path("ray_serve_bench")
    save_results(out, json.loads(json.dumps(report, default=float)), table(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
