"""Scale-out on one machine: `asr-transcribe --engine ray` with 1 and 2 single-thread workers.

The same 20 real clips (jfk, 4 LibriSpeech test-clean, 15 LJSpeech; tiny.en + the bundled draft,
default mode, one torch thread per worker) are transcribed by:

- `local`: the local engine, one process, `--threads 1` (the reference for Ray's overhead);
- `ray x1` / `ray x2`: a local Ray instance with 1 or 2 worker actors.

Throughput is audio seconds / seconds of work: for Ray the tool's own "cluster:" line (from the first
task handed out to the driver's last write; starting and stopping the workers are printed apart), for
`local` its summary line, whose time starts after loading the models. Each configuration runs
`--repeats` times, interleaved; medians are reported.

    python bench/ray_bench.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf
from report_io import result_path, save_results

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CONFIGS = {"local": [], "ray x1": ["--engine", "ray", "--num-workers", "1"],
           "ray x2": ["--engine", "ray", "--num-workers", "2"]}


def clip_folder(shared: Path, work: Path, count: int = 20) -> tuple[Path, float]:
    audio = shared / "audio"
    sources = [audio / "jfk" / "jfk.flac", *sorted((audio / "librispeech").rglob("*.flac")),
               *sorted((audio / "ljspeech" / "wavs").glob("*.wav"))][:count]
    folder = work / "clips"
    folder.mkdir(parents=True, exist_ok=True)
    for src in sources:
        shutil.copy(src, folder / src.name)
    return folder, sum(sf.info(str(p)).duration for p in sources)


def run_once(name: str, folder: Path, work: Path) -> float:
    """Audio-s/s of one run, counted after the models were loaded."""
    out = work / f"out-{name.replace(' ', '')}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "asr_app.cli.transcribe", str(folder), "-o", str(out), "-f", "json", "--quiet",
           "--device", "cpu", "--threads", "1", *CONFIGS[name]]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
    found = re.search(r"in ([\d.]+) s = ([\d.]+) audio-s/s", proc.stderr)
    if found:
        rate = float(found.group(2))
    else:  # local: its summary's time starts after the models loaded
        audio = sum(json.loads(p.read_text())["duration"] for p in out.glob("*.json"))
        rate = audio / float(re.search(r"transcribed, \d+ failed in ([\d.]+) s", proc.stderr).group(1))
    shutil.rmtree(out)
    return rate


def table(rates: dict[str, list[float]]) -> str:
    medians = {k: statistics.median(v) for k, v in rates.items()}
    lines = ["| engine | audio-s/s (median) | runs | vs local | vs ray x1 |", "|---|---|---|---|---|"]
    for name, value in medians.items():
        lines.append(f"| {name} | {value:.1f} | {', '.join(f'{r:.1f}' for r in rates[name])} | "
                     f"{value / medians['local']:.2f}x | {value / medians['ray x1']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--out", type=Path, default=None,
                    help="default: bench/results/<cpu>/<date>/ray_bench.json")
    args = ap.parse_args(argv)
    args.out = args.out or result_path("ray_bench")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder, audio_s = clip_folder(args.shared, work)
        rates: dict[str, list[float]] = {name: [] for name in CONFIGS}
        for repeat in range(args.repeats):
            for name in CONFIGS:
                rates[name].append(run_once(name, folder, work))
                print(f"repeat {repeat + 1}: {name} {rates[name][-1]:.1f} audio-s/s", flush=True)
    text = f"20 clips, {audio_s:.1f} s of audio, 1 torch thread per worker\n\n" + table(rates)
    save_results(args.out, {"audio_s": audio_s, "rates": rates}, text)


if __name__ == "__main__":
    main()
