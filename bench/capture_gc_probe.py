"""Does Python's garbage collector, run inside a CUDA-graph capture, break the capture when it frees an old graph?

The question behind one GPU test failure (docs/serving.md, "A second H200 loan, 2026-11-28, night"): a decode's
first capture failed with "operation failed due to a previous error during capture" at a Triton launch, in a
test that ran after another test's decoder, with its captured graphs, had become garbage. PyTorch no longer
collects before a capture, so a collection can run inside one; runtime/graphs.py now pauses the collector
for the length of every capture (`cyclic_gc_paused`). Each case below runs in its own process and captures a
small step through `StepRunner`, the product's capture path:

- `collect`: no garbage; the step calls gc.collect() while capturing (the collection alone is harmless?);
- `collect-garbage`: an old runner, its graph captured, left in a reference cycle; the step calls gc.collect()
  while capturing, freeing it there (the hypothesis: this breaks the capture);
- `auto-garbage-unpaused`: the same garbage, the collector's thresholds at 1 so it runs at nearly every
  allocation, the pause switched off (the code before the fix);
- `auto-garbage-paused`: the same with the pause, as the product runs (the fix).

    python bench/capture_gc_probe.py --out bench/results/<gpu>/<day>/capture_gc_probe.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import subprocess
import sys
import weakref
from pathlib import Path

from report_io import result_path, save_results

REPO = Path(__file__).resolve().parents[1]
CASES = ("collect", "collect-garbage", "auto-garbage-unpaused", "auto-garbage-paused")


def _step(collect: bool):
    import torch

    def step(*, positions, span, mask, x):
        if collect and torch.cuda.is_current_stream_capturing():
            gc.collect()
        y = x * 2 + positions.float().sum()
        return {"y": torch.relu(y) + 1}
    return step


def _garbage(freed: dict) -> None:
    """An old runner holding a captured graph and its memory pool, reachable only through a cycle."""
    import torch

    from asr_app.runtime.graphs import StepRunner

    old = StepRunner("cuda", 8)
    old.run(("old",), _step(False), {"x": torch.ones(4096, device="cuda")}, 0, 1)
    old.cycle = old

    def note() -> None:
        freed["during_capture"] = torch.cuda.is_current_stream_capturing()
    weakref.finalize(old, note)


def run_case(case: str) -> dict:
    import torch

    from asr_app.runtime import graphs

    freed: dict = {}
    gc.collect()
    if "garbage" in case:
        _garbage(freed)
    if case == "auto-garbage-unpaused":
        graphs.cyclic_gc_paused = contextlib.nullcontext
    if case.startswith("auto"):
        gc.set_threshold(1, 1, 1)
    runner = graphs.StepRunner("cuda", 8)
    x = torch.full((4096,), 3.0, device="cuda")
    error = None
    try:
        out = runner.run(("new",), _step(case.startswith("collect")), {"x": x}, 2, 1)["y"]
        right = bool(torch.equal(out, torch.relu(x * 2 + 2) + 1))
    except Exception as exc:  # the outcome being probed: reported, not raised
        error, right = f"{type(exc).__name__}: {str(exc).splitlines()[0]}", False
    gc.set_threshold(700, 10, 10)
    gc.collect()
    return {"case": case, "captured": error is None, "right": right, "error": error,
            "old_graph_freed": "during capture" if freed.get("during_capture") else
            ("after" if freed else ("n/a" if "garbage" not in case else "never"))}


def table(rows: list[dict]) -> str:
    lines = ["| case | capture | replay right | old graph freed | error |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {'ok' if r['captured'] else 'FAILED'} | {r['right']} | "
                     f"{r['old_graph_freed']} | {r['error'] or ''} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=CASES, help="run one case in this process and print its JSON")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case)))
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("capture_gc_probe: needs a CUDA GPU")
    rows = []
    for case in CASES:
        done = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True, text=True,
                              timeout=300, cwd=REPO)
        last = done.stdout.strip().splitlines()[-1:] or [""]
        try:
            rows.append(json.loads(last[0]))
        except json.JSONDecodeError:
            rows.append({"case": case, "captured": False, "right": False, "old_graph_freed": "?",
                         "error": f"process exited {done.returncode}: {done.stderr.strip()[-300:]}"})
    save_results(args.out or result_path("capture_gc_probe", "cuda"), {"cases": rows}, table(rows), device="cuda")


if __name__ == "__main__":
    main()
