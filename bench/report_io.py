"""Where every benchmark puts its results: JSON for machines, the same table as Markdown for people.

The convention (committed, so every figure in the docs can be traced to the run that produced it):
`bench/results/<device>/<date>/<bench>.json`, `<device>` the CPU's model or the GPU's name as a folder name,
`<date>` the UTC day of the run. Each JSON holds a `meta` record (`provenance`): the device, the versions
of Python and the libraries that ran, the repository's commit, the command line. tools/docs_tables.py
builds the tables in docs/ from these files, and a test fails when one no longer matches them."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
VERSIONED = ("torch", "transformers", "numpy", "triton", "ctranslate2", "faster-whisper")
# Settings read from the environment that change a run's speed or memory (docs/serving.md, "Load and faults"):
# recorded when set, so a result says which it ran with (a server a bench starts inherits them)
RECORDED_ENVIRONMENT = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY", "ONEDNN_MAX_CPU_ISA",
                        "MALLOC_ARENA_MAX", "OMP_NUM_THREADS", "LD_PRELOAD")


def device_name(device: str = "cpu") -> str:
    """The GPU's name for a CUDA device, else the CPU's model name with its family and model numbers (a VM may
    show only 'AMD EPYC': the numbers tell Zen 3 from Zen 4), else the processor."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        first = cpuinfo.read_text().split("\n\n")[0].splitlines()
        fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first)}
        if "model name" in fields:
            return f"{fields['model name']} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    return platform.processor() or platform.machine() or "cpu"


def folder_name(name: str) -> str:
    """'AMD EPYC 9R14 96-Core Processor' -> 'amd-epyc-9r14-96-core-processor'."""
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-") or "device"


def results_dir(device: str = "cpu", day: str | None = None) -> Path:
    """bench/results/<device>/<day>/ (today, UTC, unless `day` is given)."""
    day = day or datetime.datetime.now(datetime.UTC).date().isoformat()
    return RESULTS / folder_name(device_name(device)) / day


def result_path(bench: str, device: str = "cpu") -> Path:
    return results_dir(device) / f"{bench}.json"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _commit() -> str | None:
    """HEAD, with "+changes" where tracked files differ from it (a result of uncommitted code says so)."""
    head = _git("rev-parse", "HEAD")
    if not head:
        return None
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}+changes" if changed else head


def provenance(device: str = "cpu") -> dict:
    """Where a result came from: device, UTC time, command line, commit, versions and environment settings."""
    versions = {"python": platform.python_version()}
    for package in VERSIONED:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return {"device": device_name(device), "device_kind": "cuda" if str(device).startswith("cuda") else "cpu",
            "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": shlex.join(["python", *sys.argv]), "commit": _commit(), "versions": versions,
            "platform": platform.platform(),
            "environment": {name: os.environ[name] for name in RECORDED_ENVIRONMENT if name in os.environ}}


def save_results(out: Path, data: dict, table: str, device: str = "cpu") -> None:
    """Print `table`, write `data` with its `meta` record (`provenance`) to `out` (JSON) and `table` beside it
    (`.md`)."""
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": provenance(device), **data}, indent=2) + "\n")
    out.with_suffix(".md").write_text(table + "\n")


def cpu_facts(threads: int) -> dict:
    """What CPU a result came from: its name and family/model (Linux), and the fp32 rate of one encoder-shaped
    product (1500 x 384 x 1536) through the runtime's own packed path on `threads` threads, measured now.
    CPU figures are only comparable between machines of the same kind; this says which kind it was."""
    import platform
    import time

    import torch

    from asr_app.runtime.ops import linear, pack

    facts = {"processor": platform.processor() or platform.machine()}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        first_cpu = cpuinfo.read_text().split("\n\n")[0].splitlines()
        fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first_cpu)}
        facts.update({name: fields[name] for name in ("model name", "cpu family", "model") if name in fields})
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x, weight = torch.randn(1500, 384), pack(torch.randn(1536, 384))
        linear(x, weight)
        times = []
        for _ in range(21):
            start = time.perf_counter()
            linear(x, weight)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)  # one slow call on a shared VM says little
    finally:
        torch.set_num_threads(before)
    facts["fp32 GFLOP/s"] = round(2 * 1500 * 384 * 1536 / seconds / 1e9)
    return facts


def describe_cpu(facts: dict) -> str:
    """One line naming the CPU of `cpu_facts` (keys a machine lacks show as '?')."""
    return (f"CPU: {facts.get('model name', facts.get('processor', '?'))} (family {facts.get('cpu family', '?')}, "
            f"model {facts.get('model', '?')}), {facts.get('fp32 GFLOP/s', '?')} GFLOP/s fp32 in one packed product")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def batch_table(report: dict) -> str:
    """bench/batch_bench.py's table (its .md, and the docs' tables made by tools/docs_tables.py)."""
    c = report["config"]
    before, after = c["loadavg_before_after"]
    lines = [f"{c['workload']}, {report['meta']['device']}, {c['threads']} threads, {c['repeats']} round(s), medians; "
             f"load average {before:.1f} before, {after:.1f} after", "",
             "| mode | B | wall s | tokens/s | RTFx | x `off` | loop share | tokens/target call | == off |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['mode']} | {r['batch']} | {r['median_s']:.2f} | {r['tokens_per_s']:.1f} | "
                     f"{_fmt(r['rtfx'], '.1f')} | {_fmt(r['speedup_vs_off'], '.2f')} | {_fmt(r['loop_share'], '.2f')} | "
                     f"{_fmt(r['tokens_per_target_call'], '.2f')} | {_fmt(r['identical_to_off'], '')} |")
    return "\n".join(lines)


# tools/docs_tables.py: the table of a result file, by the bench that wrote it (its file name's start). A bench
# without one here is shown as the .md it wrote beside the JSON in the same run.
TABLES = {"batch_bench": batch_table}
