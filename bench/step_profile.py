"""Where a decoding step's time goes: device kernels of one step, and host work of whole decodes.

    python bench/step_profile.py --shape large-v2 --device cuda                       # kernels per step
    python bench/step_profile.py --shape tiny --device cuda --real-models DIR         # + real decodes

With `--fused-layers` the steps run through fused decoder layers (runtime/fused.py), and on a GPU each
large-v2 product is also timed as a fused launch (the tuner's choice, and the fastest element-wise and
tensor-core tiles it chose from, named) against the unfused kernels it replaces.

1. Random-weight pair of the chosen shape (bench/runtime_bench.py), batch 1, eager steps under the torch
   profiler: per step (target over 1 and g+1 tokens, draft) the kernels by total device time, their
   count and the sum. With CUDA graphs the host launches disappear, but each kernel still costs its
   device time: this sum is what a replay costs.
2. With `--real-models`: the real tiny.en pair on jfk, CUDA graphs, per mode one profiled decode (host
   operators by self CPU time, syncs counted), and the loop's ms/token with gamma fixed at 1..6 next to
   the cost-aware policy's choice (drafts per target call).

Writes bench/results/<device>/<date>/step_profile_<shape>_<device>[_fused].txt (and .json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from report_io import provenance, results_dir
from runtime_bench import decoder_for, interleaved_rows, load_real_pair, random_pair, real_clips
from torch.profiler import ProfilerActivity, profile

from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.decoding.costs import StepTimer


def kernel_table(fn, device: torch.device, rows: int) -> tuple[str, dict]:
    with torch.inference_mode():
        fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof, torch.inference_mode():
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.self_device_time_total for e in events)
    count = sum(e.count for e in events)
    events.sort(key=lambda e: -e.self_device_time_total)
    lines = [f"{count} kernels, {total_us:.0f} us of device time", "| kernel | count | total us | share |",
             "|---|---|---|---|"]
    for e in events[:rows]:
        lines.append(f"| {e.key[:90]} | {e.count} | {e.self_device_time_total:.0f} | "
                     f"{e.self_device_time_total / max(total_us, 1e-9):.1%} |")
    return "\n".join(lines), {"kernels": count, "device_us": total_us}


def step_kernels(args, device, dtype) -> tuple[str, dict]:
    pair = random_pair(args.shape, device, dtype)
    decoder = decoder_for(pair, "off", args.draft_vocab, args.fused_layers)  # eager: the profiler sees every kernel
    timer = StepTimer(decoder, repeats=1)
    out, data = [], {}
    for name, fn in (("target k=1", timer.target_call(1)), (f"target k={args.gamma + 1}",
                     timer.target_call(args.gamma + 1)), ("draft", timer.draft_call())):
        text, figures = kernel_table(fn, device, args.rows)
        out += [f"### {args.shape}: {name} step (eager{', fused layers' if args.fused_layers else ''})", "", text, ""]
        data[name] = figures
    return "\n".join(out), data


GEOMETRIES = ((1024, 4), (1024, 2), (1024, 1), (512, 4), (512, 2), (512, 1), (2048, 1), (2048, 2), (4096, 1))


def verify_section(device, rows: int) -> tuple[str, dict]:
    """The exact verification (B=1, g=5, V=51864, fp16): its kernels, and its graph replay per launch
    geometry (tile width x tiles per program)."""
    import triton.testing
    from verify_bench import graph_replay, make_inputs

    from asr_app.kernels import VerifyRandomness
    from asr_app.kernels.exact import verify_exact_triton

    target, draft, tokens, num_draft = make_inputs(1, 5, 51864, torch.float16, device)
    rnd = VerifyRandomness(torch.rand(1, 6, dtype=torch.float64, device=device))
    text, _ = kernel_table(lambda: verify_exact_triton(target, draft, tokens, num_draft, rnd), device, rows)
    sweep = {}
    for block_v, tiles in GEOMETRIES:
        replay = graph_replay(lambda b=block_v, t=tiles: verify_exact_triton(target, draft, tokens, num_draft, rnd,
                                                                             block_v=b, tiles=t))
        sweep[f"{block_v}x{tiles}"] = 1e3 * triton.testing.do_bench(replay, warmup=25, rep=100, return_mode="median")
    lines = ["### exact verification, B=1 g=5 V=51864 fp16: kernels (eager)", "", text, "",
             "| geometry (tile x tiles) | graph replay us |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in sweep.items()]
    return "\n".join(lines), sweep


# large-v2's decoder matrices (out x in) and what the fused launch does around each product
PRODUCTS = {"qkv 3840x1280 (norm)": (3840, 1280, "norm"), "out-proj 1280x1280 (+ residual)": (1280, 1280, "residual"),
            "fc1 5120x1280 (norm + GELU)": (5120, 1280, "norm-gelu"), "fc2 1280x5120 (+ residual)": (1280, 5120, "residual")}
PRODUCT_CALLS = 20  # back to back in one graph: a replay's gaps are counted, its launch is spread


def product_calls(n: int, k: int, rows: int, kind: str, device, dtype) -> dict:
    """The fused launch (tuned, and with each tile the tuner may choose: "tile: <tile_label>") and the unfused
    kernels it replaces, as functions over the same random tensors."""
    import torch.nn.functional as F

    from asr_app.runtime import fused

    x, w = torch.randn(rows, k, device=device, dtype=dtype), torch.randn(n, k, device=device, dtype=dtype) / 40
    b, stream = torch.randn(n, device=device, dtype=dtype), torch.randn(rows, n, device=device, dtype=dtype)
    g, s = torch.ones(k, device=device, dtype=dtype), torch.zeros(k, device=device, dtype=dtype)
    if kind == "residual":
        def launch(tile=None):
            return lambda: fused.linear(x, w, b, residual=stream, tile=tile)

        unfused = {"unfused": lambda: stream.add_(F.linear(x, w, b))}
    else:
        gelu = "gelu" if kind == "norm-gelu" else None

        def launch(tile=None):
            return lambda: fused.linear(x, w, b, norm=(g, s), activation=gelu, tile=tile)

        unfused = {"unfused": lambda: (F.gelu if gelu else (lambda t: t))(F.linear(F.layer_norm(x, (k,), g, s), w, b)),
                   "cuBLAS product alone": lambda: F.linear(x, w, b)}
    tiles = {f"tile: {tile_label(tile)}": launch(tile) for tile in fused.candidate_tiles(fused.row_bucket(rows))}
    return {"fused": launch(), **tiles, **unfused}


def tile_label(tile) -> str:
    """"tensor cores 16x32x128/4w": the kind of tile, rows x columns x depth, warps."""
    kind = "tensor cores" if tile.kwargs["DOT"] else "element-wise"
    return f"{kind} {tile.kwargs['BLOCK_M']}x{tile.kwargs['BLOCK_N']}x{tile.kwargs['BLOCK_K']}/{tile.num_warps}w"


def products_section(device, dtype) -> tuple[str, dict]:
    """Each large-v2 product as the fused layers launch it (the tuner's choice, and the fastest element-wise
    and tensor-core tiles it had to choose from) against the unfused kernels, replayed from a CUDA graph of
    PRODUCT_CALLS calls: µs per call and the weight's bytes per second."""
    import triton.testing
    from verify_bench import graph_replay

    columns = ["fused (tuned)", "best element-wise tile", "best tensor-core tile", "unfused", "cuBLAS product alone"]
    lines = ["### large-v2 products in a graph: fused launch vs unfused kernels (us per call, weight GB/s)", "",
             "| product | rows | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    data = {}
    for name, (n, k, kind) in PRODUCTS.items():
        for rows in (1, 6):
            times = {}
            for label, fn in product_calls(n, k, rows, kind, device, dtype).items():
                replay = graph_replay(lambda f=fn: [f() for _ in range(PRODUCT_CALLS)])
                times[label] = 1e3 * triton.testing.do_bench(replay, warmup=25, rep=100, return_mode="median") / PRODUCT_CALLS
            best = {f"best {family} tile": min((us, label.removeprefix("tile: ")) for label, us in times.items()
                                               if label.startswith(f"tile: {kind_label}"))
                    for family, kind_label in (("element-wise", "element-wise"), ("tensor-core", "tensor cores"))}
            data[f"{name}, rows {rows}"] = {"us": times, "best tiles": best}
            cells = {"fused (tuned)": (times["fused"], ""), "unfused": (times["unfused"], ""),
                     "cuBLAS product alone": (times.get("cuBLAS product alone"), ""), **best}
            lines.append(f"| {name} | {rows} | " + " | ".join(
                "-" if us is None else f"{us:.1f} ({n * k * dtype.itemsize / us / 1e3:.0f}){' ' + tile if tile else ''}"
                for us, tile in (cells[c] for c in columns)) + " |")
    return "\n".join(lines), data


def host_table(decoder, clip, mode: str, rows: int) -> tuple[str, dict]:
    opts = DecodingOptions(mode=mode)
    decoder.decode(clip, opts)
    device = decoder.pair.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:  # with CUDA: the runtime calls (launches, syncs) as host rows
        result = decoder.decode(clip, opts)[0]
    events = sorted((e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU),
                    key=lambda e: -e.self_cpu_time_total)
    st = result.stats
    syncs = sum(e.count for e in events if "Synchronize" in e.key or e.key == "aten::_local_scalar_dense")
    head = (f"{st.tokens_out} tokens, {st.target_calls} target calls, {st.drafted / max(st.target_calls, 1):.2f} "
            f"drafts per call; host syncs/reads {syncs}")
    lines = [head, "| host operator | count | self CPU us |", "|---|---|---|"]
    lines += [f"| {e.key[:70]} | {e.count} | {e.self_cpu_time_total:.0f} |" for e in events[:rows]]
    return "\n".join(lines), {"tokens": st.tokens_out, "target_calls": st.target_calls, "drafted": st.drafted,
                              "syncs": syncs}


def fixed_gamma_loop(decoder, clips, repeats: int) -> dict:
    """Loop ms/token and tokens per target call per fixed gamma and with the cost policy."""
    configs = {"off": DecodingOptions(mode="off"), "policy": DecodingOptions(mode="exact")}
    configs |= {f"gamma {g}": DecodingOptions(mode="exact", gamma=g) for g in range(1, 7)}
    return interleaved_rows({name: (decoder, opts) for name, opts in configs.items()}, clips, repeats)[0]


def real_section(args, device, dtype) -> tuple[str, dict]:
    pair = load_real_pair(args.real_models, device, dtype)
    decoder = SpeculativeDecoder(pair, runtime=RuntimeOptions(fused_layers=args.fused_layers))
    clips = real_clips()
    out, data = [], {}
    for mode in ("off", "exact"):
        text, figures = host_table(decoder, clips[0], mode, args.rows)
        out += [f"### real tiny.en, jfk, mode {mode}, graphs {decoder.graph_mode}: host operators", "", text, ""]
        data[mode] = figures
    loops = fixed_gamma_loop(decoder, clips, args.repeats)
    out += ["### real tiny.en, 13 clips: loop ms/token by gamma", "", "| gamma | ms/token | tokens/target call |",
            "|---|---|---|"]
    out += [f"| {name} | {r['ms_per_token']:.3f} | {r['tokens_per_target_call']:.2f} |" for name, r in loops.items()]
    data["loops"] = loops
    return "\n".join(out), data


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="large-v2")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--draft-vocab", type=int, default=RuntimeOptions().draft_vocab)
    ap.add_argument("--rows", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--real-models", type=Path, default=None)
    ap.add_argument("--fused-layers", action="store_true", help="profile the steps with fused decoder layers")
    ap.add_argument("--out-dir", type=Path, default=None, help="default: bench/results/<device>/<date>/")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    text, data = step_kernels(args, device, dtype)
    if device.type == "cuda":
        more, data["verify_geometry_us"] = verify_section(device, args.rows)
        text += "\n" + more + "\n"
        if args.fused_layers:
            more, data["products_us"] = products_section(device, dtype)
            text += "\n" + more + "\n"
    if args.real_models:
        more, data["real"] = real_section(args, device, dtype)
        text += "\n" + more
    print(text)
    args.out_dir = args.out_dir or results_dir(args.device)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"step_profile_{args.shape}_{device.type}{'_fused' if args.fused_layers else ''}"
    stem.with_suffix(".txt").write_text(text + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"meta": provenance(args.device), **data}, indent=1))
    print(f"wrote {stem}.txt and .json")


if __name__ == "__main__":
    main()
