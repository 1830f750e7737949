"""Where every benchmark puts its results: JSON for machines, the same table as Markdown for people."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def save_results(out: Path, data: dict, table: str) -> None:
    """Print `table`, write `data` to `out` (JSON) and `table` beside it (`.md`)."""
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))
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
