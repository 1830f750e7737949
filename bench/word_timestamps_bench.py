"""Word timestamps against transformers' on real clips, and what computing them costs.

For every clip (jfk, 4 LibriSpeech test-clean, the LJSpeech clips; tiny.en + the distilled draft,
greedy, mode exact): our words (`DecodingOptions(word_timestamps=True)`) and transformers' word
timestamps from `pipeline(..., return_timestamps="word")` on the same checkpoint. Words are matched
on their normalised text in order; reported per clip and overall: matched words, the mean and p90 of
|start difference| and |end difference|, and the decode time with and without word timestamps
(median of `--repeats`).

    python bench/word_timestamps_bench.py --repeats 3
"""

from __future__ import annotations

import argparse
import difflib
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from report_io import result_path, save_results

from asr_app.audio import load_audio
from asr_app.decoding import DecodingOptions, SpeculativeDecoder
from asr_app.models import load_pair

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def clips(shared: Path) -> dict[str, Path]:
    audio = shared / "audio"
    out = {"jfk": audio / "jfk" / "jfk.flac"}
    out |= {p.stem: p for p in sorted((audio / "librispeech").rglob("*.flac"))}
    out |= {p.stem: p for p in sorted((audio / "ljspeech" / "wavs").glob("*.wav"))}
    return out


def norm(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum() or c == "'")


def matched(ours: list[tuple[str, float, float]], theirs: list[tuple[str, float, float]]) -> list[tuple]:
    a, b = [norm(w) for w, *_ in ours], [norm(w) for w, *_ in theirs]
    pairs = []
    for block in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks():
        pairs += [(ours[block.a + k], theirs[block.b + k]) for k in range(block.size)]
    return pairs


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--out", type=Path, default=None,
                    help="default: bench/results/<cpu>/<date>/word_timestamps_bench.json")
    args = ap.parse_args(argv)
    args.out = args.out or result_path("word_timestamps_bench")
    torch.set_num_threads(args.threads)
    from transformers import pipeline

    target, draft = args.shared / "models" / "whisper-tiny.en", args.shared / "models" / "distil-tiny.en-draft"
    decoder = SpeculativeDecoder(load_pair(target=str(target), draft=str(draft), device="cpu"))
    pipe = pipeline("automatic-speech-recognition", model=str(target), device="cpu")
    plain, words = DecodingOptions(mode="exact"), DecodingOptions(mode="exact", word_timestamps=True)
    rows, all_pairs, counts = [], [], 0
    for name, path in clips(args.shared).items():
        audio = load_audio(path)
        result = decoder.decode(audio, words)[0]
        ours = [(w.word, w.start, w.end) for s in result.segments for w in s.words]
        theirs = [(c["text"], c["timestamp"][0], c["timestamp"][1] or c["timestamp"][0])
                  for c in pipe(audio.copy(), return_timestamps="word")["chunks"]]
        pairs = matched(ours, theirs)
        all_pairs += pairs
        counts += len(ours)
        starts = [abs(o[1] - t[1]) for o, t in pairs]
        rows.append({"clip": name, "words": len(ours), "matched": len(pairs),
                     "start_mad_ms": 1000 * float(np.mean(starts)) if starts else None,
                     "without_s": timed(lambda a=audio: decoder.decode(a, plain), args.repeats),
                     "with_s": timed(lambda a=audio: decoder.decode(a, words), args.repeats)})
    starts = np.array([abs(o[1] - t[1]) for o, t in all_pairs])
    ends = np.array([abs(o[2] - t[2]) for o, t in all_pairs])
    without, with_words = sum(r["without_s"] for r in rows), sum(r["with_s"] for r in rows)
    summary = {"clips": len(rows), "words": counts, "matched": len(all_pairs),
               "start_mad_ms": 1000 * float(starts.mean()), "start_p90_ms": 1000 * float(np.percentile(starts, 90)),
               "end_mad_ms": 1000 * float(ends.mean()), "end_p90_ms": 1000 * float(np.percentile(ends, 90)),
               "clips_over_60ms": sum(1 for r in rows if r["start_mad_ms"] is not None and r["start_mad_ms"] > 60),
               "decode_s_without": without, "decode_s_with": with_words, "overhead": with_words / without - 1}
    text = "\n".join([
        f"{summary['clips']} clips, {summary['words']} words, {summary['matched']} matched with transformers'",
        "",
        "| | mean | p90 |", "|---|---|---|",
        f"| word start difference (ms) | {summary['start_mad_ms']:.1f} | {summary['start_p90_ms']:.1f} |",
        f"| word end difference (ms) | {summary['end_mad_ms']:.1f} | {summary['end_p90_ms']:.1f} |",
        "",
        f"clips with a mean start difference over 60 ms: {summary['clips_over_60ms']}",
        f"decode time over all clips: {without:.2f} s without, {with_words:.2f} s with word timestamps "
        f"(+{100 * summary['overhead']:.0f}%)",
    ])
    save_results(args.out, {"summary": summary, "clips": rows}, text)


if __name__ == "__main__":
    main()
