"""The encoder's products in bf16 against fp32 on a CPU (`--encoder-matmul-dtype bfloat16`): speed and words.

One real pair (default tiny.en + its distilled draft), two decoders that differ only in
`RuntimeOptions.encoder_matmul_dtype`. Every clip is transcribed (greedy, `--mode`, long-form) by both,
alternating, `--repeats` times; reported:

- the encoder alone, ms per 30 s window, batches of 1 and 4 (median of `--repeats` x 5 calls);
- end to end: the sum over clips of each clip's median seconds, and the ratio bf16 / fp32;
- WER against the human transcripts (the clips that have them), and of the bf16 texts against the fp32 ones
  over every clip: how many words bf16 rounding of the encoder changed;
- greedy `exact` identical to `off` with the bf16 encoder (every mode sees the same encoder);
- with `--whole-bf16 N`, the pair loaded in bf16 (`--dtype bfloat16`) on N clips: what that flag costs on a CPU.

    python bench/encoder_dtype_bench.py --threads 2 --repeats 3

Results: bench/results/<device>/<date>/encoder_dtype_bench.{json,md} (bench/report_io.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from report_io import cpu_facts, describe_cpu, result_path, save_results

SHARED = Path(__file__).resolve().parents[2] / "shared"
SETTINGS = ("same", "bfloat16")


def clips_with_text(root: Path, limit: int | None) -> list[tuple[Path, str | None]]:
    """Clips with human transcripts first (LibriSpeech, LJSpeech, JFK, via serve_bench's pool), then the
    test-other clips, which have none."""
    sys.path.insert(0, str(Path(__file__).parent))
    from serve_bench import clip_pool

    pool: list[tuple[Path, str | None]] = list(clip_pool(10_000, root))
    pool += [(p, None) for p in sorted((root / "librispeech-test-other-audio").rglob("*.flac"))]
    return pool[:limit] if limit else pool


def encoder_ms(decoder, features: torch.Tensor, calls: int) -> float:
    """Median ms per window of the target's encoder over `features` [B, mels, frames]."""
    with torch.inference_mode():
        decoder.target_encoder(features)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            decoder.target_encoder(features)
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times) / features.shape[0]


def transcribe_all(decoders: dict, clips: list[Path], repeats: int, mode: str) -> tuple[dict, dict]:
    """Each clip by each decoder, alternating, `repeats` times: median seconds per clip, and the texts."""
    from tqdm import tqdm

    from asr_app.longform import transcribe

    options = greedy(mode)
    seconds = {name: [[] for _ in clips] for name in decoders}
    texts: dict[str, list[str]] = {name: [""] * len(clips) for name in decoders}
    with tqdm(total=repeats * len(clips), unit="clip", desc="clips", file=sys.stderr) as bar:
        for _ in range(repeats):
            for i, clip in enumerate(clips):
                for name, decoder in decoders.items():
                    start = time.perf_counter()
                    texts[name][i] = transcribe(decoder, str(clip), options).text
                    seconds[name][i].append(time.perf_counter() - start)
                bar.update(1)
    return {name: [statistics.median(s) for s in per_clip] for name, per_clip in seconds.items()}, texts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, default=SHARED / "models",
                    help="folder with whisper-tiny.en and distil-tiny.en-draft")
    ap.add_argument("--audio", type=Path, default=SHARED / "audio")
    ap.add_argument("--max-clips", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mode", default="exact", choices=("off", "exact", "sigmoid", "baseline"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--whole-bf16", type=int, default=0, metavar="N",
                    help="also time the pair loaded in bf16 (--dtype bfloat16) on the first N clips")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from asr_app.decoding import RuntimeOptions, SpeculativeDecoder
    from asr_app.models import load_pair
    from asr_app.runtime.ops import onednn_packing_works

    if not onednn_packing_works(torch.bfloat16):
        print("this CPU or torch build has no oneDNN bf16 products: both settings would run fp32", file=sys.stderr)
        return 2
    target, draft = str(args.models / "whisper-tiny.en"), str(args.models / "distil-tiny.en-draft")
    pair = load_pair(target=target, draft=draft, device="cpu", dtype=torch.float32)
    decoders = {s: SpeculativeDecoder(pair, runtime=RuntimeOptions(encoder_matmul_dtype=s)) for s in SETTINGS}
    pool = clips_with_text(args.audio, args.max_clips)
    clips, references = [p for p, _ in pool], [t for _, t in pool]
    report = {"threads": args.threads, "mode": args.mode, "repeats": args.repeats, "clips": len(clips),
              "cpu": cpu_facts(args.threads), "encoder_ms": encoder_table(decoders, clips[0], args.repeats)}
    seconds, texts = transcribe_all(decoders, clips, args.repeats, args.mode)
    report["seconds"] = {name: sum(s) for name, s in seconds.items()}
    report["ratio"] = report["seconds"]["bfloat16"] / report["seconds"]["same"]
    report["words"] = word_figures(pair, texts, references)
    report["exact_equals_off"] = identity(decoders["bfloat16"], clips[: min(len(clips), 16)])
    report["per_clip"] = [{"clip": c.name, "seconds": {n: seconds[n][i] for n in SETTINGS},
                           "texts": {n: texts[n][i] for n in SETTINGS}, "reference": references[i]}
                          for i, c in enumerate(clips)]
    if args.whole_bf16:
        report["whole_bf16"] = whole_bf16(target, draft, clips[: args.whole_bf16], seconds["same"], args.mode)
    out = args.out or result_path("encoder_dtype_bench")
    save_results(out, report, table(report))
    print(f"wrote {out}")
    return 0


def encoder_table(decoders: dict, clip: Path, repeats: int) -> dict:
    from asr_app.audio import load_audio

    audio = load_audio(clip)[: 30 * 16_000]
    extractor = next(iter(decoders.values())).feature_extractor
    out = {}
    for batch in (1, 4):
        feats = extractor([audio] * batch, sampling_rate=16_000, return_tensors="pt").input_features
        out[str(batch)] = {name: encoder_ms(d, feats, 5 * repeats) for name, d in decoders.items()}
    return out


def word_figures(pair, texts: dict, references: list[str | None]) -> dict:
    """Corpus WER against the human transcripts where there are any, and of bf16 against fp32 everywhere."""
    from asr_app.wer import corpus_wer, normalizer_for_tokenizer

    normalize, _ = normalizer_for_tokenizer(pair.processor.tokenizer)
    known = [i for i, r in enumerate(references) if r]
    out = {"clips_with_transcripts": len(known)}
    for name in SETTINGS:
        result = corpus_wer([normalize(references[i]) for i in known], [normalize(texts[name][i]) for i in known])
        out[f"wer_{name}"] = result.wer
    fp32, bf16 = [normalize(t) for t in texts["same"]], [normalize(t) for t in texts["bfloat16"]]
    out["wer_bf16_vs_fp32"] = corpus_wer(fp32, bf16).wer
    out["texts_changed"] = sum(a != b for a, b in zip(fp32, bf16))
    return out


def greedy(mode: str):
    from asr_app.decoding import DecodingOptions
    from asr_app.longform import TranscribeOptions

    return TranscribeOptions(decoding=DecodingOptions(mode=mode, temperature=0.0, timestamps=True))


def identity(decoder, clips: list[Path]) -> bool:
    from asr_app.longform import transcribe

    return all(transcribe(decoder, str(c), greedy("off")).text == transcribe(decoder, str(c), greedy("exact")).text
               for c in clips)


def whole_bf16(target: str, draft: str, clips: list[Path], fp32_seconds: list[float], mode: str) -> dict:
    """The pair loaded in bf16 (`--dtype bfloat16`) on `clips`, once each, against the fp32 medians."""
    from asr_app.decoding import SpeculativeDecoder
    from asr_app.longform import transcribe
    from asr_app.models import load_pair

    decoder = SpeculativeDecoder(load_pair(target=target, draft=draft, device="cpu", dtype=torch.bfloat16))
    transcribe(decoder, str(clips[0]))
    start = time.perf_counter()
    for clip in clips:
        transcribe(decoder, str(clip), greedy(mode))
    seconds = time.perf_counter() - start
    return {"clips": len(clips), "seconds": seconds, "ratio": seconds / sum(fp32_seconds[: len(clips)])}


def table(report: dict) -> str:
    words, enc = report["words"], report["encoder_ms"]
    lines = [f"tiny.en + distilled draft, `{report['mode']}`, greedy, {report['clips']} real clips, "
             f"{report['threads']} threads, medians of {report['repeats']}; {describe_cpu(report['cpu'])}", "",
             "| encoder products | encoder ms/window (B=1) | (B=4) | end to end s | x fp32 | WER (human, "
             f"{words['clips_with_transcripts']} clips) |", "|---|---|---|---|---|---|"]
    for name, label in (("same", "fp32"), ("bfloat16", "bf16")):
        lines.append(f"| {label} | {enc['1'][name]:.0f} | {enc['4'][name]:.0f} | {report['seconds'][name]:.1f} | "
                     f"{report['seconds'][name] / report['seconds']['same']:.2f} | {100 * words[f'wer_{name}']:.2f}% |")
    lines += ["", f"bf16 texts against fp32 texts: WER {100 * words['wer_bf16_vs_fp32']:.2f}%, "
              f"{words['texts_changed']} of {report['clips']} texts changed; `exact` == `off` with the bf16 encoder: "
              f"{report['exact_equals_off']}"]
    if "whole_bf16" in report:
        w = report["whole_bf16"]
        lines.append(f"The pair loaded in bf16 (`--dtype bfloat16`), {w['clips']} clips: {w['seconds']:.1f} s, "
                     f"{w['ratio']:.2f}x the fp32 pair's time")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
