"""Short-clip transcription on the CPU, side by side with the peers on the same tiny.en weights.

13 real clips (jfk, 4 LibriSpeech test-clean, LJ001-0001..0008; 82.5 s), each one 30 s window, greedy,
no timestamps, English, batch 1. Each repeat runs every engine over all clips, engine by engine, in an
order rotated from repeat to repeat, so load changes hit all alike. Engines:

- `transformers`: `WhisperForConditionalGeneration.generate` (the same checkpoint our loader builds);
- `faster-whisper fp32` / `int8`: faster-whisper (CTranslate2) on the offline extra's tiny.en;
- ours `off` (target only) and `exact <K> <dtype>` (speculative, the distilled draft with a K-token head, 0 =
  the whole vocabulary, its matrices in `dtype`: `RuntimeOptions.draft_matmul_dtype`; greedy
  verification), through `SpeculativeDecoder.decode`, feature extraction included as for the others; with
  `--unpacked` also both on the models' own (not oneDNN-packed) weights and with PyTorch's own attention
  in the encoder.

Every engine's process runs with glibc's malloc set to keep freed memory (`runtime.allocator`, what our
decoder does by default), so that no engine is measured with an allocator setting the others lack;
`--default-allocator` runs all of them, ours included, with glibc's defaults instead.

Per engine: RTFx (audio seconds / median compute seconds, summed over clips), and for ours also the
decoding loop alone (total minus feature extraction and encoder, from the decoder's own statistics).
Transcripts are scored against the references (WER after Whisper's English normaliser).

    python bench/peers_bench.py --repeats 5 --threads 2 --draft-vocab 32768 16384 0 --draft-dtype int8 bfloat16 --unpacked
    python bench/peers_bench.py --repeats 5 --threads 2 --default-allocator --out bench/results/peers_bench_default_malloc.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from report_io import cpu_facts, describe_cpu, provenance, result_path

from asr_app.audio import load_audio
from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.decoding.options import DRAFT_MATMUL_DTYPES
from asr_app.models import load_pair
from asr_app.models.defaults import offline_model_dir
from asr_app.runtime.allocator import keep_freed_memory
from asr_app.wer import corpus_wer, english_normalizer, spelling_map_from_dir

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def clips(shared: Path) -> list[tuple[str, np.ndarray, str]]:
    """(name, 16 kHz mono audio, reference transcript) for the 13 clips."""
    audio = shared / "audio"
    out = [("jfk", load_audio(audio / "jfk" / "jfk.flac"), (audio / "jfk" / "jfk.txt").read_text().strip())]
    for trans in sorted((audio / "librispeech").rglob("*.trans.txt")):
        for line in trans.read_text().splitlines():
            key, text = line.split(" ", 1)
            out.append((key, load_audio(trans.parent / f"{key}.flac"), text))
    lj = dict(line.split("|", 1) for line in (audio / "ljspeech" / "metadata.csv").read_text().splitlines())
    for i in range(1, 9):
        key = f"LJ001-{i:04d}"
        out.append((key, load_audio(audio / "ljspeech" / "wavs" / f"{key}.wav"), lj[key]))
    return out


def transformers_engine(pair):
    processor, model = pair.processor, pair.target

    def run(audio):
        feats = processor.feature_extractor(audio, sampling_rate=16_000, return_tensors="pt").input_features
        with torch.inference_mode():
            ids = model.generate(feats, do_sample=False, num_beams=1, return_timestamps=False)
        return processor.tokenizer.decode(ids[0], skip_special_tokens=True).strip(), None
    return run


def faster_whisper_engine(model_dir: Path, compute_type: str, threads: int):
    from faster_whisper import WhisperModel

    model = WhisperModel(str(model_dir), device="cpu", compute_type=compute_type, cpu_threads=threads)

    def run(audio):
        segments, _ = model.transcribe(audio, beam_size=1, language="en", without_timestamps=True,
                                       temperature=0.0, condition_on_previous_text=False, vad_filter=False)
        return " ".join(s.text.strip() for s in segments), None
    return run


def our_engine(decoder: SpeculativeDecoder, mode: str):
    options = DecodingOptions(mode=mode)

    def run(audio):
        result = decoder.decode(audio, options)[0]
        return result.text, result.stats
    return run


def build_engine(name: str, shared: Path, threads: int, keep_freed: bool = True):
    """One engine by name: 'transformers', 'faster-whisper fp32|int8', 'ours off', 'ours exact <K> <dtype>',
    the last two with ' unpacked' appended for the models' own weights."""
    models = shared / "models"
    if name.startswith("faster-whisper"):
        return faster_whisper_engine(offline_model_dir(), name.split()[-1].replace("fp32", "float32"), threads)
    pair = load_pair(target=str(models / "whisper-tiny.en"), draft=str(models / "distil-tiny.en-draft"), device="cpu")
    if name == "transformers":
        return transformers_engine(pair)
    packed = not name.endswith(" unpacked")
    name = name.removesuffix(" unpacked")
    settings = dict(packed_weights=packed, keep_freed_memory=keep_freed)
    if name == "ours off":
        return our_engine(SpeculativeDecoder(pair, runtime=RuntimeOptions(**settings)), "off")
    size, dtype = name.split()[-2:]
    runtime = RuntimeOptions(draft_vocab=int(size) or None, draft_matmul_dtype=dtype, **settings)
    return our_engine(SpeculativeDecoder(pair, runtime=runtime), "exact")


def child(name: str, shared: Path, threads: int, keep_freed: bool) -> dict:
    """Run one engine once over every clip (after a warm-up clip), in this process only."""
    torch.set_num_threads(threads)
    if keep_freed:
        keep_freed_memory()
    data = clips(shared)
    run = build_engine(name, shared, threads, keep_freed)
    run(data[0][1])
    out = {"times": [], "loops": [], "texts": [], "stats": []}
    for _, audio, _ in data:
        t0 = time.perf_counter()
        text, st = run(audio)
        out["times"].append(time.perf_counter() - t0)
        out["texts"].append(text)
        if st is not None:
            out["loops"].append(st.total_s - st.setup_s - st.encoder_s)
            out["stats"].append([st.tokens_out, st.target_calls, st.drafted, st.accepted])
    return out


def measure(names: list[str], shared: Path, threads: int, repeats: int, keep_freed: bool) -> dict:
    """Every engine in a process of its own (engines sharing a process were measured to slow each other:
    CTranslate2's thread pool next to torch's), repeat by repeat in a rotated order so that load changes on
    the machine hit all alike; per clip the median over repeats."""
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            proc = subprocess.run([sys.executable, __file__, "--child", name, "--threads", str(threads),
                                   "--shared", str(shared), *([] if keep_freed else ["--default-allocator"])],
                                  capture_output=True, text=True, check=True)
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"  repeat {r + 1}/{repeats}: {name}", file=sys.stderr, flush=True)
    data = clips(shared)
    audio_s = sum(len(a) for _, a, _ in data) / 16_000
    normalise = english_normalizer(spelling_map_from_dir(shared / "models" / "whisper-tiny.en"))
    refs = [normalise(r) for _, _, r in data]
    out = {}
    for name, rs in runs.items():
        total = sum(statistics.median(r["times"][i] for r in rs) for i in range(len(data)))
        row = {"rtfx": audio_s / total, "total_s": total,
               "wer": corpus_wer(refs, [normalise(t) for t in rs[-1]["texts"]]).wer, "texts": rs[-1]["texts"]}
        if rs[0]["loops"]:
            row["loop_s"] = sum(statistics.median(r["loops"][i] for r in rs) for i in range(len(data)))
            tokens, calls, drafted, accepted = (sum(s[k] for s in rs[-1]["stats"]) for k in range(4))
            row.update(tokens=tokens, target_calls=calls, acceptance=accepted / drafted if drafted else None)
        out[name] = row
    return {"audio_s": audio_s, "engines": out}


def table(report: dict) -> str:
    rows = report["engines"]
    off = rows.get("ours off")
    lines = [describe_cpu(report.get("config", {}).get("cpu", {})), "", "| engine | RTFx | vs faster-whisper int8 | decoding loop (s) | loop vs ours off | tokens/target call "
             "| acceptance | WER |", "|---|---|---|---|---|---|---|---|"]
    fw = rows.get("faster-whisper int8")
    for name, r in rows.items():
        vs_fw = f"{r['rtfx'] / fw['rtfx']:.2f}x" if fw else "-"
        loop = f"{r['loop_s']:.3f}" if "loop_s" in r else "-"
        vs_off = f"{off['loop_s'] / r['loop_s']:.2f}x" if off and "loop_s" in r else "-"
        tpc = f"{r['tokens'] / r['target_calls']:.2f}" if "tokens" in r else "-"
        acc = f"{r['acceptance']:.3f}" if r.get("acceptance") is not None else "-"
        lines.append(f"| {name} | {r['rtfx']:.1f} | {vs_fw} | {loop} | {vs_off} | {tpc} | {acc} | "
                     f"{100 * r['wer']:.1f}% |")
    return "\n".join(lines)


def plot(report: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["engines"]
    names = list(rows)
    fig, ax = plt.subplots(figsize=(8, 3.2))
    bars = ax.barh(names, [rows[n]["rtfx"] for n in names], color=["#999"] * 3 + ["#4c72b0"] * (len(names) - 3))
    ax.bar_label(bars, fmt="%.1f")
    ax.invert_yaxis()
    ax.set(xlabel="RTFx (audio seconds per compute second, higher is faster)", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-vocab", type=int, nargs="+", default=[RuntimeOptions().draft_vocab],
                    help="draft head sizes to run `exact` with (0 = the whole vocabulary)")
    ap.add_argument("--draft-dtype", nargs="+", default=[RuntimeOptions().draft_matmul_dtype],
                    choices=DRAFT_MATMUL_DTYPES, help="draft matrix precisions to run `exact` with")
    ap.add_argument("--unpacked", action="store_true",
                    help="also run ours off / exact on the models' own weights (RuntimeOptions(packed_weights=False))")
    ap.add_argument("--default-allocator", action="store_true",
                    help="run every engine with glibc malloc's default settings (ours with keep_freed_memory=False)")
    ap.add_argument("--out", type=Path, default=None, help="default: bench/results/<cpu>/<date>/peers_bench.json")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.shared, args.threads, not args.default_allocator)))
        return
    names = ["transformers", "faster-whisper fp32", "faster-whisper int8", "ours off",
             *(f"ours exact {size} {dtype}" for dtype in args.draft_dtype for size in args.draft_vocab)]
    if args.unpacked:
        names += ["ours off unpacked", f"ours exact {args.draft_vocab[0]} {args.draft_dtype[0]} unpacked"]
    allocator = "glibc defaults" if args.default_allocator else "freed memory kept"
    print(f"13 clips, {args.repeats} repeats, {args.threads} threads, one process per engine and repeat, "
          f"malloc: {allocator}", flush=True)
    cpu = cpu_facts(args.threads)  # before the engines run, on an idle process
    report = measure(names, args.shared, args.threads, args.repeats, not args.default_allocator)
    report["config"] = {"repeats": args.repeats, "threads": args.threads, "malloc": allocator,
                        "torch": torch.__version__, "cpu": cpu}
    print(table(report))
    args.out = args.out or result_path("peers_bench")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": provenance(), **report}, indent=1))
    (args.out.with_suffix(".md")).write_text(table(report) + "\n")
    plot(report, args.out.with_suffix(".png"), f"tiny.en on {args.threads} CPU threads, 13 clips, malloc: {allocator}")
    print(f"wrote {args.out}, {args.out.with_suffix('.md')} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
