"""Does freeing an old CUDA graph inside a capture break the capture? And is the collector paused there?

The question behind one GPU test failure (docs/serving.md, "A second H200 loan, 2026-11-28, night"): a decode's
first capture failed with "operation failed due to a previous error during capture" at a Triton launch, in a
test that ran after another test's decoder, with its captured graphs, had become garbage. PyTorch no longer
collects before a capture, so an automatic collection can run inside one; runtime/graphs.py now pauses the
collector for the length of every capture (`cyclic_gc_paused`). Each case below runs in its own process and
captures a small step through `StepRunner`, the product's capture path:

- `collect`: no garbage; the step calls gc.collect() while capturing (is a collection alone harmless?);
- `collect-garbage`: an old runner, its graph captured, left in a reference cycle; the step calls gc.collect()
  while capturing, which frees it there (the suspected failure; an explicit collection is not paused);
- `free-inside`: the same old runner held by one list, which the step empties while capturing (freed by its
  reference count, no collector involved);
- `paused`: no garbage; the step records whether the collector is enabled while capturing (the guard).

    python bench/capture_gc_probe.py --out bench/results/<gpu>/<day>/capture_gc_probe.json
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import weakref
from pathlib import Path

from report_io import result_path, save_results

REPO = Path(__file__).resolve().parents[1]
CASES = ("collect", "collect-garbage", "free-inside", "paused")
CASE_TIMEOUT_S = 25   # a case is seconds; the gpu_check stage has 120 for all four


def _step(case: str, held: list, seen: list):
    import torch

    def step(*, positions, span, mask, x):
        if torch.cuda.is_current_stream_capturing():
            seen.append(gc.isenabled())
            if case.startswith("collect"):
                gc.collect()
            elif case == "free-inside":
                held.clear()
        y = x * 2 + positions.float().sum()
        return {"y": torch.relu(y) + 1}
    return step


def _old_runner(freed: dict, phase: list):
    """A runner holding a captured graph and its memory pool; notes when and where it is freed."""
    import torch

    from asr_app.runtime.graphs import StepRunner

    old = StepRunner("cuda", 8)
    old.run(("old",), _step("none", [], []), {"x": torch.ones(4096, device="cuda")}, 0, 1)

    def note() -> None:
        freed["at"] = "during capture" if torch.cuda.is_current_stream_capturing() else phase[0]
    weakref.finalize(old, note)
    return old


def run_case(case: str) -> dict:
    import torch

    from asr_app.runtime import graphs

    freed: dict = {}
    phase = ["before the capture"]
    held: list = []
    gc.collect()
    if case == "collect-garbage":
        old = _old_runner(freed, phase)
        old.cycle = old   # only a collection frees it
        del old
    elif case == "free-inside":
        held.append(_old_runner(freed, phase))
    seen: list = []
    runner = graphs.StepRunner("cuda", 8)
    x = torch.full((4096,), 3.0, device="cuda")
    error = None
    try:
        phase[0] = "in the step's run"
        out = runner.run(("new",), _step(case, held, seen), {"x": x}, 2, 1)["y"]
        right = bool(torch.equal(out, torch.relu(x * 2 + 2) + 1))
    except Exception as exc:  # the outcome being probed: reported, not raised
        error, right = f"{type(exc).__name__}: {str(exc).splitlines()[0]}", False
    phase[0] = "after the capture"
    held.clear()
    gc.collect()
    return {"case": case, "captured": error is None, "right": right, "error": error,
            "collector_enabled_in_capture": seen[0] if seen else None,
            "old_graph_freed": freed.get("at", "never") if case in ("collect-garbage", "free-inside") else "n/a"}


def table(rows: list[dict]) -> str:
    lines = ["| case | capture | replay right | collector on in the capture | old graph freed | error |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {'ok' if r['captured'] else 'FAILED'} | {r['right']} | "
                     f"{r.get('collector_enabled_in_capture')} | {r['old_graph_freed']} | {r['error'] or ''} |")
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
        try:
            done = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True, text=True,
                                  timeout=CASE_TIMEOUT_S, cwd=REPO)
        except subprocess.TimeoutExpired:
            rows.append({"case": case, "captured": False, "right": False, "old_graph_freed": "?",
                         "error": f"no answer within {CASE_TIMEOUT_S} s"})
            continue
        last = done.stdout.strip().splitlines()[-1:] or [""]
        try:
            rows.append(json.loads(last[0]))
        except json.JSONDecodeError:
            rows.append({"case": case, "captured": False, "right": False, "old_graph_freed": "?",
                         "error": f"process exited {done.returncode}: {done.stderr.strip()[-300:]}"})
    save_results(args.out or result_path("capture_gc_probe", "cuda"), {"cases": rows}, table(rows), device="cuda")


if __name__ == "__main__":
    main()
