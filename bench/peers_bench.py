"""Short-clip transcription on the CPU, side by side with the peers on the same tiny.en weights.

13 real clips (jfk, 4 LibriSpeech test-clean, LJ001-0001..0008; 82.5 s), each one 30 s window, greedy,
no timestamps, English, batch 1. Engines, interleaved clip by clip so load changes hit all alike:

- `transformers`: `WhisperForConditionalGeneration.generate` (the same checkpoint our loader builds);
- `faster-whisper fp32` / `int8`: faster-whisper (CTranslate2) on the offline extra's tiny.en;
- ours `off` (target only) and `exact` (speculative, the distilled draft; greedy verification), through
  `SpeculativeDecoder.decode`, feature extraction included as for the others.

Per engine: RTFx (audio seconds / median compute seconds, summed over clips), and for ours also the
decoding loop alone (total minus feature extraction and encoder, from the decoder's own statistics).
Transcripts are scored against the references (WER after Whisper's English normaliser).

    python bench/peers_bench.py --repeats 5 --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from asr_app.audio import load_audio
from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.models import load_pair
from asr_app.models.defaults import offline_model_dir
from asr_app.wer import corpus_wer, english_normalizer, spelling_map_from_dir

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
RESULTS = REPO / "bench" / "results"


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


def measure(engines: dict, data, repeats: int) -> dict:
    times = {name: [[] for _ in data] for name in engines}
    loop_times = {name: [[] for _ in data] for name in engines}
    texts, stats = {}, {}
    for run in engines.values():  # warm-up
        run(data[0][1])
    for _ in range(repeats):
        for i, (_, audio, _) in enumerate(data):
            for name, run in engines.items():
                t0 = time.perf_counter()
                text, st = run(audio)
                times[name][i].append(time.perf_counter() - t0)
                texts.setdefault(name, [None] * len(data))[i] = text
                if st is not None:
                    loop_times[name][i].append(st.total_s - st.encoder_s)
                    stats.setdefault(name, [None] * len(data))[i] = st
    audio_s = sum(len(a) for _, a, _ in data) / 16_000
    normalise = english_normalizer(spelling_map_from_dir(SHARED / "models" / "whisper-tiny.en"))
    refs = [normalise(r) for _, _, r in data]
    out = {}
    for name in engines:
        total = sum(statistics.median(t) for t in times[name])
        row = {"rtfx": audio_s / total, "total_s": total, "wer": corpus_wer(refs, [normalise(t) for t in texts[name]]).wer,
               "per_clip_median_s": [statistics.median(t) for t in times[name]], "texts": texts[name]}
        if name in stats:
            st = stats[name]
            row["loop_s"] = sum(statistics.median(t) for t in loop_times[name])
            row["encoder_s"] = total - row["loop_s"]
            row["tokens"] = sum(s.tokens_out for s in st)
            row["target_calls"] = sum(s.target_calls for s in st)
            drafted = sum(s.drafted for s in st)
            row["acceptance"] = sum(s.accepted for s in st) / drafted if drafted else None
        out[name] = row
    return {"audio_s": audio_s, "engines": out}


def table(report: dict) -> str:
    rows = report["engines"]
    off = rows.get("ours off")
    lines = ["| engine | RTFx | vs faster-whisper int8 | decoding loop (s) | loop vs ours off | tokens/target call "
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
    ap.add_argument("--out", type=Path, default=RESULTS / "peers_bench.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = clips(args.shared)
    models = args.shared / "models"
    pair = load_pair(target=str(models / "whisper-tiny.en"), draft=str(models / "distil-tiny.en-draft"), device="cpu")
    ct2 = offline_model_dir()
    engines = {"transformers": transformers_engine(pair)}
    if ct2 is not None:
        engines["faster-whisper fp32"] = faster_whisper_engine(ct2, "float32", args.threads)
        engines["faster-whisper int8"] = faster_whisper_engine(ct2, "int8", args.threads)
    ours = SpeculativeDecoder(pair)
    engines["ours off"] = our_engine(ours, "off")
    for size in args.draft_vocab:
        runtime = RuntimeOptions(draft_vocab=size or None)
        label = f"ours exact (draft head {size or 'full'})"
        engines[label] = our_engine(SpeculativeDecoder(pair, runtime=runtime), "exact")
    print(f"{len(data)} clips, {sum(len(a) for _, a, _ in data) / 16_000:.1f} s of audio, {args.repeats} repeats, "
          f"{args.threads} threads", flush=True)
    report = measure(engines, data, args.repeats)
    report["config"] = {"repeats": args.repeats, "threads": args.threads, "clips": [n for n, _, _ in data],
                        "torch": torch.__version__, "machine": platform.processor() or platform.machine()}
    print(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    (args.out.with_suffix(".md")).write_text(table(report) + "\n")
    plot(report, args.out.with_suffix(".png"), f"tiny.en on {args.threads} CPU threads, 13 clips")
    print(f"wrote {args.out}, {args.out.with_suffix('.md')} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
