"""Benchmark one verification step: transformers' ``_speculative_sampling`` vs our modes.

    python bench/verify_bench.py                 # full grid, results under bench/results/
    python bench/verify_bench.py --quick         # B=1, g in {1, 5, 20}, V=51864 only
    python bench/verify_bench.py --out-dir DIR --batch 1 4 --gamma 5 --vocab 51864 --dtype float32

On CUDA the Triton kernels are timed with ``triton.testing.do_bench`` (median of many runs, the L2
cache flushed between runs) and the floor is printed: the time of an empty Triton launch times the
number of launches, and bytes read / measured copy bandwidth. On CPU our modes run their PyTorch
implementations (that is what ``verify`` dispatches to there) and are timed with
``torch.utils.benchmark`` (blocked_autorange, median; the lowest median of --rounds interleaved
rounds, because a shared machine's load comes in bursts). transformers' function is batch-1 only, so
for B > 1 the anchor is one call per row, which is what assisted generation would have to do.
The ratio column is anchor time / mode time (> 1: faster than transformers).

On CUDA each of our modes is timed twice: launched as the decoding loop launched it before the runtime
(`verify(...)`: argument checks, allocations, three Triton launches from Python), and replayed from a
CUDA graph that captured the same call with its random numbers drawn beforehand (`<mode>@graph`), which
is how the decoding runtime runs it now. The difference is the host-side launch cost.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from report_io import provenance, results_dir

from asr_app.kernels import VerifyRandomness, verify
from asr_app.kernels.baseline import transformers_speculative_sampling
from asr_app.kernels.triton_support import tl, triton

IMPLS = ("transformers", "baseline", "exact", "sigmoid", "greedy")
GRAPHED = ("exact", "sigmoid", "greedy")
DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}
LAUNCHES = {"exact": 3, "sigmoid": 2, "greedy": 2}


@dataclass
class Row:
    impl: str
    backend: str
    batch: int
    gamma: int
    vocab: int
    dtype: str
    median_us: float
    speedup_vs_transformers: float | None = None


def make_inputs(batch, gamma, vocab, dtype, device, seed=0):
    """Logits shaped like a Whisper step: draft close to the target, so acceptance is mixed."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    target = torch.randn(batch, gamma + 1, vocab, generator=gen) * 3.0
    draft = target[:, :gamma] + torch.randn(batch, gamma, vocab, generator=gen)
    tokens = torch.multinomial(torch.softmax(draft.reshape(-1, vocab), -1), 1, generator=gen).reshape(batch, gamma)
    num_draft = torch.full((batch,), gamma, dtype=torch.int64)
    to = dict(device=device)
    return target.to(dtype=dtype, **to), draft.to(dtype=dtype, **to), tokens.to(**to), num_draft.to(**to)


def step_fn(impl, target, draft, tokens, num_draft, generator):
    if impl == "transformers":
        prompt_and_drafts = torch.cat([tokens[:, :1], tokens], dim=1)
        rows = [(prompt_and_drafts[b : b + 1], draft[b : b + 1], target[b : b + 1]) for b in range(target.shape[0])]
        gamma = tokens.shape[1]

        def run():
            for ids, cand, new in rows:
                transformers_speculative_sampling(ids, cand, gamma, new)
        return run
    mode = impl
    alpha, beta = -1e3, 1e3
    return lambda: verify(target, draft, tokens, num_draft, mode, 1.0, alpha, beta, generator)


def graphed_fn(mode, target, draft, tokens, num_draft, generator):
    """The same verification captured in a CUDA graph (uniforms drawn into a static tensor first, as the
    decoding runtime does), returned as its replay."""
    uniforms = torch.rand((target.shape[0], target.shape[1]), dtype=torch.float64, device=target.device,
                          generator=generator)

    def call():
        return verify(target, draft, tokens, num_draft, mode, 1.0, -1e3, 1e3,
                      randomness=VerifyRandomness(uniforms), check_values=False)

    return graph_replay(call)


def graph_replay(fn):
    """fn captured in a CUDA graph, returned as its replay. Two warm-up calls on a side stream first (they
    compile the Triton kernels outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


@triton.jit
def _empty_kernel(x_ptr, BLOCK: tl.constexpr):
    pass


def time_us(fn, device, min_run_time, clock="wall"):
    if device.type == "cuda":
        import triton.testing

        return 1000.0 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    import torch.utils.benchmark as benchmark

    fn()  # warm-up
    timer = time.thread_time if clock == "thread" else time.perf_counter
    measurement = benchmark.Timer("fn()", globals={"fn": fn}, timer=timer).blocked_autorange(min_run_time=min_run_time)
    return measurement.median * 1e6


def time_impls(fns: dict, device, min_run_time, rounds, clock) -> dict:
    """Median per implementation; with rounds > 1 the implementations take turns and each keeps its
    lowest median, so a burst of load from other processes does not land on one of them only."""
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], time_us(fn, device, min_run_time, clock))
    return best


def steady_malloc() -> bool:
    """Keep freed multi-MB blocks in the heap (glibc mallopt) instead of returning them to the OS.

    By default glibc gives large freed blocks back and the next step's tensors page-fault them in
    again, which made e.g. one softmax over [11, 51864] floats cost 660 us or 240 us depending on
    the allocation history. Applied to every implementation alike; --malloc default turns it off.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 * 2**20)) and bool(libc.mallopt(m_trim_threshold, 2**30))
    except (OSError, AttributeError):
        return False


def floors(device, clock="wall"):
    """Empty-launch time (CUDA only) and copy bandwidth in bytes/s."""
    big = torch.empty(64 * 2**20, dtype=torch.float32, device=device)
    copy_us = min(time_us(lambda: big.clone(), device, 0.2, clock) for _ in range(3))
    bandwidth = 2 * big.numel() * 4 / (copy_us * 1e-6)  # read + write
    empty_us = None
    if device.type == "cuda":  # a module-level kernel: Triton resolves `tl` from the module's globals
        empty_us = time_us(lambda: _empty_kernel[(1,)](big, BLOCK=1), device, 0)
    return empty_us, bandwidth


def bytes_read(impl, batch, gamma, vocab, itemsize):
    """Logit bytes a mode must read (lower bound): exact all rows + the sampled row, sigmoid one row,
    greedy the target rows; baseline/transformers read everything at least twice (softmax)."""
    if impl == "exact":
        return batch * (2 * gamma + 1 + 2) * vocab * itemsize
    if impl == "sigmoid":
        return batch * 2 * vocab * itemsize
    if impl == "greedy":
        return batch * (gamma + 1) * vocab * itemsize
    return batch * (2 * gamma + 1) * vocab * itemsize


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=None, help="default: bench/results/<device>/<date>/")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--gamma", type=int, nargs="+", default=[1, 3, 5, 10, 20])
    parser.add_argument("--vocab", type=int, nargs="+", default=[51864, 51866])
    parser.add_argument("--dtype", nargs="+", default=["float16", "float32"], choices=sorted(DTYPES))
    parser.add_argument("--impl", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--min-run-time", type=float, default=0.2, help="seconds per CPU measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per configuration (min median)")
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall",
                        help="CPU only: 'thread' counts this thread's CPU time (needs --threads 1), so time "
                             "spent descheduled on a shared machine is not counted")
    parser.add_argument("--malloc", choices=["steady", "default"], default="steady",
                        help="CPU: 'steady' keeps freed blocks in glibc's heap (see steady_malloc)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="B=1, g in {1,5,20}, V=51864 only")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.gamma, args.vocab = [1], [1, 5, 20], [51864]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "thread" and torch.get_num_threads() != 1:
        parser.error("--clock thread measures one thread's CPU time: add --threads 1")
    return args


def measure_config(args, device, floors_: tuple, dtype_name: str, vocab: int, batch: int, gamma: int) -> list[Row]:
    """Every implementation on one (dtype, V, B, g), timed interleaved; one printed line each."""
    empty_us, bandwidth = floors_
    backend = "triton" if device.type == "cuda" else "torch"
    inputs = make_inputs(batch, gamma, vocab, DTYPES[dtype_name], device)
    generator = torch.Generator(device=device).manual_seed(0)
    fns = {impl: step_fn(impl, *inputs, generator) for impl in args.impl}
    if device.type == "cuda":
        fns |= {f"{m}@graph": graphed_fn(m, *inputs, generator) for m in GRAPHED if m in args.impl}
    timings = time_impls(fns, device, args.min_run_time, args.rounds, args.clock)
    rows, anchor = [], None
    for impl in fns:  # transformers first: the anchor of the others' ratio
        us = timings[impl]
        impl_backend = ("torch" if impl in ("transformers", "baseline") else backend) + \
            ("+graph" if impl.endswith("@graph") else "")
        row = Row(impl, impl_backend, batch, gamma, vocab, dtype_name, round(us, 2))
        if impl == "transformers":
            anchor = us
        elif anchor is not None:
            row.speedup_vs_transformers = round(anchor / us, 3)
        rows.append(row)
        base = impl.removesuffix("@graph")
        floor = bytes_read(base, batch, gamma, vocab, DTYPES[dtype_name].itemsize) / bandwidth * 1e6
        if empty_us is not None and LAUNCHES.get(base):
            floor = max(floor, LAUNCHES[base] * empty_us)
        ratio = f"{row.speedup_vs_transformers:8.2f}" if row.speedup_vs_transformers else f"{'-':>8s}"
        print(f"{impl:13s} {batch:3d} {gamma:3d} {vocab:6d} {dtype_name:8s} {us:11.1f} {ratio} {floor:9.1f}", flush=True)
    return rows


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    malloc_tuned = device.type == "cpu" and args.malloc == "steady" and steady_malloc()
    empty_us, bandwidth = floors(device, args.clock)
    rows: list[Row] = []
    started = time.time()
    print(f"{'impl':13s} {'B':>3s} {'g':>3s} {'V':>6s} {'dtype':8s} {'median us':>11s} {'x vs HF':>8s} {'floor us':>9s}")
    for dtype_name, vocab, batch, gamma in itertools.product(args.dtype, args.vocab, args.batch, args.gamma):
        rows += measure_config(args, device, (empty_us, bandwidth), dtype_name, vocab, batch, gamma)
    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "backend_for_modes": "triton" if device.type == "cuda" else "torch",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "timer": ("triton.testing.do_bench median" if device.type == "cuda" else "torch.utils.benchmark median")
        + f", lowest of {args.rounds} interleaved rounds"
        + (", per-thread CPU time (time.thread_time)" if args.clock == "thread" and device.type != "cuda" else ""),
        "empty_triton_launch_us": empty_us,
        "copy_bandwidth_GBps": round(bandwidth / 1e9, 2),
        "glibc_malloc_tuned": malloc_tuned,
        "wall_s": round(time.time() - started, 1),
        **provenance(args.device),
    }
    print(f"\nfloor: empty Triton launch = {empty_us if empty_us is not None else 'n/a (no GPU)'} us; "
          f"copy bandwidth = {bandwidth / 1e9:.1f} GB/s (floor column = bytes read / bandwidth"
          f"{', or launches x empty launch if larger' if empty_us else ''})")
    summarise_target(rows)
    args.out_dir = args.out_dir or results_dir(args.device)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"verify_bench_{device.type}"
    (args.out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    plot(rows, args.out_dir / f"{stem}.png", meta)
    print(f"wrote {args.out_dir / (stem + '.json')} and {args.out_dir / (stem + '.png')}")


def summarise_target(rows):
    for r in rows:
        if r.impl in ("exact", "exact@graph") and (r.batch, r.gamma, r.vocab) == (1, 5, 51864):
            print(f"target check: {r.impl} ({r.backend}) at B=1 g=5 V=51864 {r.dtype}: {r.median_us} us, "
                  f"{r.speedup_vs_transformers}x transformers' _speculative_sampling")


def plot(rows, path, meta):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r.batch, r.vocab, r.dtype) for r in rows})
    cols = min(3, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    for ax, (batch, vocab, dtype) in zip(axes.flat, panels):
        for impl in (*IMPLS, *(f"{m}@graph" for m in GRAPHED)):
            pts = sorted((r.gamma, r.median_us) for r in rows
                         if (r.impl, r.batch, r.vocab, r.dtype) == (impl, batch, vocab, dtype))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set(title=f"B={batch} V={vocab} {dtype}", xlabel="g (drafted tokens)", ylabel="median us", yscale="log")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"verification step, {meta['device']} ({meta['backend_for_modes']} for our modes)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
