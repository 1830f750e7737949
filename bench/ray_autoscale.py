"""Autoscaling of `asr-serve --engine ray --min-replicas 1 --max-replicas 2`: a real server on loopback, 12
clients sending uploads back to back for --load-s seconds, then idle. Samples every 5 s the decoder
replicas running (their processes) and the queue depth /metrics reports; writes the timeline (JSON, and a
table beside it). Serve adds a replica when the requests per replica stay above the target (4) for 5 s
and removes one after 60 s below it.

    python bench/ray_autoscale.py --load-s 45 --idle-s 120
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from ray_serve_bench import SHARED, free_port, metrics, replica_pids, stop, upload  # noqa: E402
from serve_bench import clip_pool  # noqa: E402


def start(folder: Path) -> tuple[subprocess.Popen, str]:
    models, port = SHARED / "models", free_port()
    cmd = [sys.executable, "-m", "asr_app.serve.cli", "--target", str(models / "whisper-tiny.en"),
           "--draft", str(models / "distil-tiny.en-draft"), "--device", "cpu", "--threads", "1", "--port",
           str(port), "--no-ui", "--engine", "ray", "--min-replicas", "1", "--max-replicas", "2"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=open(folder / "server.log", "w"), stderr=subprocess.STDOUT,
                            env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1"))
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError((folder / "server.log").read_text()[-2000:]) from None
            time.sleep(0.5)


def timeline(url: str, phase: str, seconds: float, until_one: bool = False) -> list[dict]:
    samples, started = [], time.monotonic()
    while time.monotonic() - started < seconds:
        replicas = len(replica_pids())
        samples.append({"phase": phase, "t_s": round(time.monotonic() - started, 1), "replicas": replicas,
                        "queue_depth": metrics(url)["asr_queue_depth"]})
        print(samples[-1], flush=True)
        if until_one and replicas == 1:
            break
        time.sleep(5)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load-s", type=float, default=45.0)
    parser.add_argument("--idle-s", type=float, default=120.0)
    parser.add_argument("--clients", type=int, default=12)
    args = parser.parse_args(argv)
    paths = [p for p, _ in clip_pool(16)]
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start(Path(tmp))
        try:
            done, statuses = threading.Event(), []

            def client(i: int) -> None:
                while not done.is_set():
                    statuses.append(upload(url, paths[i % len(paths)])[0])

            clients = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            for c in clients:
                c.start()
            samples = timeline(url, "load", args.load_s)
            done.set()
            for c in clients:
                c.join()
            samples += timeline(url, "idle", args.idle_s, until_one=True)
        finally:
            stop(proc)
    up = next((s["t_s"] for s in samples if s["phase"] == "load" and s["replicas"] == 2), None)
    down = next((s["t_s"] for s in samples if s["phase"] == "idle" and s["replicas"] == 1), None)
    report = {"command": " ".join(["python", "bench/ray_autoscale.py", *(argv or sys.argv[1:])]),
              "clients": args.clients, "samples": samples, "second_replica_at_s": up, "back_to_one_at_s": down,
              "uploads": len(statuses), "non_200": sum(s != 200 for s in statuses)}
    table = (f"{args.clients} clients uploading for {args.load_s:.0f} s, then idle: a second decoder replica "
             f"running {up} s into the load, back to one {down} s after it; {len(statuses)} uploads, "
             f"{report['non_200']} not answered 200.")
    from report_io import result_path, save_results
    out = result_path("ray_autoscale")
    save_results(out, report, table)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
