"""The decoding runtime on a model of a real Whisper shape with random weights: no checkpoint needed.

Builds a target of the chosen shape (large-v2: d_model 1280, 32 + 32 layers, 20 heads, FFN 5120; or
tiny) with random weights and the English-only vocabulary and special tokens, and a decoder-only draft
made of its decoder layers 0 and last (sharing its encoder), with the draft head reduced to
`--draft-vocab` ids. A random target never emits end-of-text, so every decode runs `--tokens` steps: a
steady throughput test. Reported, batch 1, greedy:

- ms/token of the decoding loop (encoder excluded): transformers `generate` (eager), our `off` eager and
  with CUDA graphs, our `exact` with CUDA graphs (its acceptance is whatever the random draft gets);
- per-step costs: the target step over k = 1 .. g+1 tokens (verification included) and the draft step
  (timed 4 in a row between syncs, as the loop queues a step's drafts, and alone with a sync after it),
  with and without graphs; the verification step alone inside a graph (bench/verify_bench.py's capture);
- the speedup of `exact` over graph-captured `off` projected from the step costs at the tokens per target
  call measured in the same run: target(1) / ((g * draft + target(g+1)) / tokens_per_call), with the real
  tiny.en pair's `exact` at the same gamma where `--real-models` is given (else the random pair's own, which
  says nothing of a real draft; the report names its source), and beside it, labelled a what-if, the same
  formula at the constant 3.96 tokens per call an earlier CPU run measured (bench/decode_bench.py).

With `--fused-layers`, every graph-captured row again with fused decoder layers (runtime/fused.py), in the
same run, so the two are compared under the same machine's speed.

    python bench/runtime_bench.py --shape large-v2 --device cuda          # on a lent GPU
    python bench/runtime_bench.py --shape large-v2 --device cuda --fused-layers
    python bench/runtime_bench.py --shape tiny --device cpu --graphs emulate --tokens 32   # code path check

Results go to bench/results/<device>/<date>/runtime_bench_<shape>_<device>.{json,md,png} (bench/report_io.py).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from report_io import provenance, results_dir
from transformers import (
    GenerationConfig,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
)

from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.decoding.costs import DRAFT_CHAIN, StepTimer
from asr_app.decoding.engine import draft_runtime
from asr_app.models import ModelPair, derive_draft
from asr_app.runtime.vocab import ranked_subset

SHAPES = {
    "tiny": dict(d_model=384, layers=4, heads=6, ffn=1536),
    "base": dict(d_model=512, layers=6, heads=8, ffn=2048),
    "large-v2": dict(d_model=1280, layers=32, heads=20, ffn=5120),
    "toy": dict(d_model=64, layers=2, heads=2, ffn=128),  # for the benches' smoke tests: the code path, cheaply
}
# The English-only vocabulary's special tokens and tiny.en's suppressed tokens (OpenAI's checkpoints).
EOS, SOT, PREV, NO_TIMESTAMPS, VOCAB = 50256, 50257, 50360, 50362, 51864
SUPPRESS = [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93, 357, 366, 438,
            532, 685, 705, 796, 930, 1058, 1220, 1267, 1279, 1303, 1343, 1377, 1391, 1635, 1782, 1875, 2162, 2361,
            2488, 3467, 4008, 4211, 4600, 4808, 5299, 5855, 6329, 7203, 9609, 9959, 10563, 10786, 11420, 11709,
            11907, 13163, 13697, 13700, 14808, 15306, 16410, 16791, 17992, 19203, 19510, 20724, 22305, 22935,
            27007, 30109, 30420, 33409, 34949, 40283, 40493, 40549, 47282, 49146, 50257, 50357, 50358, 50359,
            50360, 50361]
WHAT_IF_TOKENS_PER_CALL = 3.96  # the real tiny.en + distilled draft on a CPU, bench/decode_bench.py (what-if only)


class _NoText:
    """Stands in for the tokenizer: a random model's tokens have no text worth decoding."""

    def decode(self, ids, **_kwargs) -> str:
        return ""

    def convert_ids_to_tokens(self, ids):
        return []


def random_pair(shape: str, device: torch.device, dtype: torch.dtype) -> ModelPair:
    s = SHAPES[shape]
    config = WhisperConfig(
        vocab_size=VOCAB, d_model=s["d_model"], encoder_layers=s["layers"], decoder_layers=s["layers"],
        encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"], encoder_ffn_dim=s["ffn"],
        decoder_ffn_dim=s["ffn"], num_mel_bins=80, max_source_positions=1500, max_target_positions=448,
        decoder_start_token_id=SOT, bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS,
        suppress_tokens=SUPPRESS, begin_suppress_tokens=[220, EOS])
    with torch.device(device):
        target = WhisperForConditionalGeneration(config).to(dtype).eval()
    target.generation_config = GenerationConfig(
        decoder_start_token_id=SOT, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=EOS,
        no_timestamps_token_id=NO_TIMESTAMPS, prev_sot_token_id=PREV, suppress_tokens=SUPPRESS,
        begin_suppress_tokens=[220, EOS], max_initial_timestamp_index=50, is_multilingual=False)
    draft = derive_draft(target, layers=(0, s["layers"] - 1))
    processor = SimpleNamespace(tokenizer=_NoText(), feature_extractor=WhisperFeatureExtractor(feature_size=80))
    return ModelPair(target, draft, processor, device, dtype, True, f"random {shape}", "layers 0 and last")


def decoder_for(pair: ModelPair, graphs: str, draft_vocab: int, fused_layers: bool = False) -> SpeculativeDecoder:
    runtime = RuntimeOptions(draft_vocab=None, cuda_graphs=graphs, fused_layers=fused_layers)
    decoder = SpeculativeDecoder(pair, runtime=runtime)
    if draft_vocab < VOCAB:  # the random pair's tokenizer stand-in cannot be checked against the ranking
        decoder.draft_runtime = draft_runtime(pair.draft, ranked_subset(VOCAB, EOS, draft_vocab), runtime)
    return decoder


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def loop_ms_per_token(decoder: SpeculativeDecoder, features, options: DecodingOptions, repeats: int) -> dict:
    decoder.decode_features(features, options)  # warm-up: captures graphs, measures costs
    times, stats = [], None
    for _ in range(repeats):
        result = decoder.decode_features(features, options)[0]
        stats = result.stats
        times.append((stats.total_s - stats.setup_s - stats.encoder_s) / stats.tokens_out)
    return {"ms_per_token": 1e3 * statistics.median(times), "tokens": stats.tokens_out,
            "tokens_per_target_call": stats.tokens_out / stats.target_calls,
            "acceptance": stats.acceptance_rate if stats.drafted else None,
            "samples_ms_per_token": [1e3 * t for t in times]}


def transformers_ms_per_token(pair: ModelPair, features, tokens: int, repeats: int) -> float:
    """generate() eager, encoder run once outside the timing (as our figures exclude it)."""
    model = pair.target
    with torch.inference_mode():
        encoded = model.get_encoder()(features)
        kwargs = dict(encoder_outputs=encoded, decoder_input_ids=torch.tensor([[SOT, NO_TIMESTAMPS]], device=pair.device),
                      max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, num_beams=1)
        model.generate(**kwargs)
        times = []
        for _ in range(repeats):
            sync(pair.device)
            t0 = time.perf_counter()
            model.generate(**kwargs)
            sync(pair.device)
            times.append((time.perf_counter() - t0) / tokens)
    return 1e3 * statistics.median(times)


def step_table(decoder: SpeculativeDecoder, gamma: int, repeats: int) -> dict:
    timer = StepTimer(decoder, repeats)
    return {"target_ms": {k: 1e3 * timer.target(k) for k in range(1, gamma + 2)},
            "draft_ms": 1e3 * timer.draft(chained=DRAFT_CHAIN), "draft_latency_ms": 1e3 * timer.draft(chained=1)}


def verify_in_graph_us(device: torch.device, dtype: torch.dtype) -> float | None:
    if device.type != "cuda":
        return None
    import triton.testing
    from verify_bench import graphed_fn, make_inputs

    inputs = make_inputs(1, 5, VOCAB, dtype, device)
    replay = graphed_fn("exact", *inputs, torch.Generator(device=device).manual_seed(0))
    return 1e3 * triton.testing.do_bench(replay, warmup=25, rep=100, return_mode="median")


def real_clips() -> list:
    """The 13 real clips of bench/peers_bench.py, from the repository's test data (it travels to a lent GPU)."""
    from asr_app.audio import load_audio

    audio = Path(__file__).resolve().parents[1] / "tests" / "data" / "audio"
    files = [audio / "jfk" / "jfk.flac", *sorted((audio / "librispeech").rglob("*.flac"))]
    files += [audio / "ljspeech" / "wavs" / f"LJ001-{i:04d}.flac" for i in range(1, 9)]
    return [load_audio(f) for f in files]


def load_real_pair(models: Path, device: torch.device, dtype: torch.dtype) -> ModelPair:
    """The real tiny.en pair from a folder holding whisper-tiny.en and distil-tiny.en-draft."""
    from asr_app.models import load_pair

    return load_pair(target=str(models / "whisper-tiny.en"), draft=str(models / "distil-tiny.en-draft"),
                     device=str(device), dtype=dtype)


def interleaved_rows(runs: dict, clips: list, repeats: int) -> tuple[dict, dict]:
    """`runs`: name -> (decoder, DecodingOptions). Every run decodes every clip, `repeats` rounds interleaved
    (clip by clip, run by run, so load changes hit all alike). Per run: the decoding loop's and the whole
    decode's ms/token (sums over clips of per-clip medians), tokens per target call; and per run the last
    round's results."""
    for decoder, opts in runs.values():  # warm-up: graphs captured, step costs measured
        decoder.decode(clips[0], opts)
    loop = {name: [[] for _ in clips] for name in runs}
    whole = {name: [[] for _ in clips] for name in runs}
    results = {name: [None] * len(clips) for name in runs}
    for _ in range(repeats):
        for i, clip in enumerate(clips):
            for name, (decoder, opts) in runs.items():
                r = decoder.decode(clip, opts)[0]
                loop[name][i].append(r.stats.total_s - r.stats.setup_s - r.stats.encoder_s)
                whole[name][i].append(r.stats.total_s)
                results[name][i] = r
    rows = {}
    for name in runs:
        tokens = sum(r.stats.tokens_out for r in results[name])
        calls = sum(r.stats.target_calls for r in results[name])
        rows[name] = {"ms_per_token": 1e3 * sum(statistics.median(t) for t in loop[name]) / tokens,
                      "e2e_ms_per_token": 1e3 * sum(statistics.median(t) for t in whole[name]) / tokens,
                      "tokens": tokens, "tokens_per_target_call": tokens / calls if calls else None,
                      "samples_loop_s": loop[name], "samples_whole_s": whole[name]}  # [clip][repeat]
    return rows, results


def real_rows(models: Path, device: torch.device, dtype: torch.dtype, repeats: int, gamma: int,
              fused_layers: bool = False) -> dict:
    """The real tiny.en pair on the 13 clips, greedy, batch 1, per configuration (interleaved_rows), and
    whether its tokens equal `off`'s; with `fused_layers`, the graph rows with fused layers too. `exact` runs
    with the cost-aware gamma and at the fixed `gamma` the projection assumes (its tokens per call)."""
    pair = load_real_pair(models, device, dtype)
    graphs = "off" if device.type == "cpu" else "auto"
    eager = SpeculativeDecoder(pair, runtime=RuntimeOptions(cuda_graphs="off", fused_layers=False))
    graphed = SpeculativeDecoder(pair, runtime=RuntimeOptions(cuda_graphs=graphs, fused_layers=False))
    configs = {"transformers assisted generate (hf)": (eager, "hf"), "ours off (eager)": (eager, "off"),
               "ours exact (eager)": (eager, "exact"), "ours off (graphs)": (graphed, "off"),
               "ours exact (graphs)": (graphed, "exact"), "ours sigmoid (graphs)": (graphed, "sigmoid")}
    if fused_layers:
        fused = SpeculativeDecoder(pair, runtime=RuntimeOptions(cuda_graphs=graphs, fused_layers=True))
        configs |= {"ours off (graphs, fused layers)": (fused, "off"), "ours exact (graphs, fused layers)": (fused, "exact")}
    runs = {name: (decoder, DecodingOptions(mode=mode)) for name, (decoder, mode) in configs.items()}
    runs[fixed_gamma_row(gamma)] = (graphed, DecodingOptions(mode="exact", gamma=gamma))
    rows, results = interleaved_rows(runs, real_clips(), repeats)
    for name, row in rows.items():
        row["identical_to_off"] = all(a.tokens == b.tokens for a, b in zip(results[name], results["ours off (eager)"]))
    return rows


def per_pass_ms_per_token(row: dict) -> list[float]:
    """The loop's ms/token of each pass over the clips: the per-clip medians hide a first pass that pays for
    captures and compiles (what a user's first decodes pay)."""
    samples = row["samples_loop_s"]  # [clip][pass]
    return [1e3 * sum(clip[i] for clip in samples) / row["tokens"] for i in range(len(samples[0]))]


def fixed_gamma_row(gamma: int) -> str:
    return f"ours exact (graphs, gamma {gamma})"


def measured_tokens_per_call(report: dict, gamma: int) -> tuple[float, str]:
    """Tokens per target call for the projection, measured in this run, and where it came from: the real
    pair's `exact` at `gamma` when the run has it, else the random pair's own `exact` loop."""
    real = (report.get("real_tiny_en") or {}).get(fixed_gamma_row(gamma))
    if real and real["tokens_per_target_call"]:
        return real["tokens_per_target_call"], (f"measured in this run: real tiny.en + distilled draft, `exact` at "
                                                f"gamma {gamma}, 13 clips")
    row = next(row for name, row in report["loops"].items() if name.startswith("ours exact ("))
    return row["tokens_per_target_call"], ("measured in this run on the random-weight pair (no --real-models): "
                                           "its draft's acceptance says nothing of a real draft")


def projection(steps: dict, gamma: int, tokens_per_call: float, source: str) -> dict:
    """`exact` projected from step costs at `tokens_per_call`, against `off`: target(1) / ((g * draft +
    target(g+1)) / tokens_per_call)."""
    per_call = gamma * steps["draft_ms"] + steps["target_ms"][gamma + 1]
    return {"tokens_per_call": tokens_per_call, "source": source, "ms_per_token": per_call / tokens_per_call,
            "speedup_vs_off": steps["target_ms"][1] / (per_call / tokens_per_call),
            "target_wide_over_one": steps["target_ms"][gamma + 1] / steps["target_ms"][1],
            "draft_over_target": steps["draft_ms"] / steps["target_ms"][1]}


def projections(report: dict, gamma: int) -> None:
    """The measured projection (`projection`, `projection_fused`) and the constant-based what-if beside each."""
    tokens_per_call, source = measured_tokens_per_call(report, gamma)
    what_if = f"what-if: the constant {WHAT_IF_TOKENS_PER_CALL} tokens per call of an earlier CPU run, not this one"
    for key, steps in (("projection", "graphs"), ("projection_fused", "graphs, fused layers")):
        if steps in report["steps"]:
            report[key] = projection(report["steps"][steps], gamma, tokens_per_call, source)
            report[f"{key}_what_if"] = projection(report["steps"][steps], gamma, WHAT_IF_TOKENS_PER_CALL, what_if)
        else:
            report[key] = None


def loop_rows(pair: ModelPair, decoders: dict, features, args) -> dict:
    """The decoding loop's ms/token: transformers, then per decoder (name -> SpeculativeDecoder) `off`, and
    `exact` for the graph-captured ones."""
    greedy = DecodingOptions(mode="off", max_new_tokens=args.tokens)
    exact = DecodingOptions(mode="exact", max_new_tokens=args.tokens, gamma=args.gamma)
    rows = {"transformers generate (eager)": {"ms_per_token": transformers_ms_per_token(pair, features, args.tokens,
                                                                                       args.repeats)}}
    for name, decoder in decoders.items():
        rows[f"ours off ({name})"] = loop_ms_per_token(decoder, features, greedy, args.repeats)
        if name != "eager":
            rows[f"ours exact ({name})"] = loop_ms_per_token(decoder, features, exact, args.repeats)
    return rows


def run(args) -> dict:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    pair = random_pair(args.shape, device, dtype)
    build_s = time.perf_counter() - t0
    features = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    graphed = f"{args.graphs} graphs"
    decoders = {"eager": decoder_for(pair, "off", args.draft_vocab), graphed: decoder_for(pair, args.graphs, args.draft_vocab)}
    if args.fused_layers:
        decoders[f"{graphed}, fused layers"] = decoder_for(pair, args.graphs, args.draft_vocab, True)
    loops = loop_rows(pair, decoders, features, args)
    # step tables keyed "graphs", "eager" and "graphs, fused layers" (the report's and the plot's names)
    steps = {name.replace(graphed, "graphs"): step_table(decoder, args.gamma, args.repeats)
             for name, decoder in decoders.items()}
    real = (real_rows(args.real_models, device, dtype, args.repeats, args.gamma, args.fused_layers)
            if args.real_models else None)
    report = {
        "config": {"shape": args.shape, "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                   else platform.processor() or "cpu", "dtype": args.dtype, "graphs": args.graphs,
                   "gamma": args.gamma, "draft_vocab": args.draft_vocab, "tokens": args.tokens,
                   "repeats": args.repeats, "torch": torch.__version__, "build_s": round(build_s, 1),
                   "fused_layers": args.fused_layers,
                   "target_params_M": round(sum(p.numel() for p in pair.target.parameters()) / 1e6, 1)},
        "loops": loops, "steps": steps, "real_tiny_en": real,
        "verify_in_graph_us": verify_in_graph_us(device, dtype),
    }
    projections(report, args.gamma)
    return {"meta": provenance(args.device), **report}


def markdown(report: dict) -> str:
    c, p = report["config"], report["projection"]
    lines = [f"random-weight {c['shape']} pair ({c['target_params_M']} M target parameters), {c['device']}, "
             f"{c['dtype']}, batch 1, greedy, {c['tokens']} tokens per decode", "",
             "| decoding loop | ms/token | tokens/target call | acceptance |", "|---|---|---|---|"]
    for name, row in report["loops"].items():
        tpc = f"{row['tokens_per_target_call']:.2f}" if "tokens_per_target_call" in row else "-"
        acc = f"{row['acceptance']:.3f}" if row.get("acceptance") is not None else "-"
        lines.append(f"| {name} | {row['ms_per_token']:.2f} | {tpc} | {acc} |")
    lines += ["", "| step (ms) | " + " | ".join(f"target k={k}" for k in report["steps"]["graphs"]["target_ms"])
              + " | draft (4 in a row) | draft (alone) |", "|---" * (len(report["steps"]["graphs"]["target_ms"]) + 3) + "|"]
    for mode, s in report["steps"].items():
        lines.append(f"| {mode} | " + " | ".join(f"{v:.3f}" for v in s["target_ms"].values())
                     + f" | {s['draft_ms']:.3f} | {s['draft_latency_ms']:.3f} |")
    v = report["verify_in_graph_us"]
    lines += ["", f"- verification step (exact, B=1, g=5, V=51864) inside a CUDA graph: "
              f"{f'{v:.1f} us' if v is not None else 'n/a (no GPU)'}",
              f"- target step with g+1 tokens / 1 token: {p['target_wide_over_one']:.2f}x; draft step / target step: "
              f"{p['draft_over_target']:.3f}",
              f"- projected `exact` at {p['tokens_per_call']:.2f} tokens per target call ({p['source']}): "
              f"{p['ms_per_token']:.3f} ms/token, {p['speedup_vs_off']:.2f}x graph-captured `off`",
              f"- {report['projection_what_if']['source']}: {report['projection_what_if']['speedup_vs_off']:.2f}x"]
    if report.get("projection_fused"):
        f = report["projection_fused"]
        lines += [f"- with fused layers: target step g+1 / 1 token {f['target_wide_over_one']:.2f}x, draft / target "
                  f"{f['draft_over_target']:.3f}, projected `exact` {f['ms_per_token']:.3f} ms/token, "
                  f"{f['speedup_vs_off']:.2f}x fused `off` (what-if at {WHAT_IF_TOKENS_PER_CALL}: "
                  f"{report['projection_fused_what_if']['speedup_vs_off']:.2f}x)"]
    if report.get("real_tiny_en"):
        lines += ["", f"real tiny.en + distilled draft, 13 clips, {c['device']}, {c['dtype']}, batch 1, greedy", "",
                  "| configuration | loop ms/token | whole decode ms/token | loop, each pass | tokens/target call "
                  "| == off |", "|---|---|---|---|---|---|"]
        for name, row in report["real_tiny_en"].items():
            tpc = f"{row['tokens_per_target_call']:.2f}" if row["tokens_per_target_call"] else "-"
            passes = " / ".join(f"{ms:.2f}" for ms in per_pass_ms_per_token(row))
            lines.append(f"| {name} | {row['ms_per_token']:.2f} | {row['e2e_ms_per_token']:.2f} | {passes} | {tpc} | "
                         f"{row['identical_to_off']} |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for mode, s in report["steps"].items():
        ks = list(s["target_ms"])
        ax.plot(ks, list(s["target_ms"].values()), marker="o", label=f"target step ({mode})")
        ax.axhline(s["draft_ms"], linestyle="--", color=ax.lines[-1].get_color(), label=f"draft step ({mode})")
    c = report["config"]
    ax.set(xlabel="tokens scored in one target step (k)", ylabel="ms", yscale="log",
           title=f"random {c['shape']}, {c['device']}, {c['dtype']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="large-v2")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: float16 on CUDA, float32 on CPU")
    ap.add_argument("--graphs", choices=["auto", "emulate"], default="auto",
                    help="auto: CUDA graphs on a GPU (eager on a CPU); emulate: the static path on a CPU")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--draft-vocab", type=int, default=RuntimeOptions().draft_vocab)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--real-models", type=Path, default=None,
                    help="a folder with whisper-tiny.en and distil-tiny.en-draft: adds the real pair's rows")
    ap.add_argument("--fused-layers", action="store_true",
                    help="also every graph row with fused decoder layers (runtime/fused.py; a GPU, or TRITON_INTERPRET=1)")
    ap.add_argument("--out-dir", type=Path, default=None, help="default: bench/results/<device>/<date>/")
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
    report = run(args)
    text = markdown(report)
    print(text)
    args.out_dir = args.out_dir or results_dir(args.device)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"runtime_bench_{args.shape}_{torch.device(args.device).type}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    stem.with_suffix(".md").write_text(text + "\n")
    plot(report, stem.with_suffix(".png"))
    print(f"wrote {stem}.json, .md and .png")


if __name__ == "__main__":
    main()
