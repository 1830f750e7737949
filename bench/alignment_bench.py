"""What word timing costs a batch of live re-decodes: its rows aligned one by one (a pass of the target and a time
warp per row, what the decoder did before 2026-11-28, here through the same functions given one row at a time)
against all at once (`alignment.add_batch_word_timestamps`: one pass, one warp of every row's matrix). On a CPU
the words must be the same (checked); on a GPU rows whose words differ are counted.

Word timing runs on the scheduler's worker thread after every batch of live rows; the time warp is host work
even where the model is on a GPU, so there it is part of every re-decode's serial cost (docs/serving.md,
"A third H200 loan"). Rows: real speech buffers of 3-8 s, as live sessions send, without word
probabilities (streaming asks for none).

    python bench/alignment_bench.py --batches 1 4 8 16 --threads 2
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from features_bench import median_ms, speech
from report_io import device_name, result_path, save_results
from serve_bench import SHARED, tiny_pair_decoder


def buffers(count: int) -> list[np.ndarray]:
    """`count` live buffers of 3-8 s cut from real speech at different places."""
    audio = speech(120.0)
    lengths = [3.0, 5.5, 8.0, 4.0, 6.5, 7.0, 3.5, 5.0]
    return [audio[int(16_000 * 7 * k) :][: int(16_000 * lengths[k % len(lengths)])] for k in range(count)]


def words_of(segment_lists) -> list[list[tuple]]:
    return [[(w.word, w.start, w.end) for s in segments for w in s.words] for segments in segment_lists]


def measure(decoder, batch: int, repeats: int, device: str) -> dict:
    import torch

    from asr_app.decoding.alignment import add_batch_word_timestamps, add_word_timestamps
    clips = buffers(batch)
    options = dataclasses.replace(decoder.options, word_timestamps=False)
    results = decoder.decode(clips, options)
    windows = [c.size / 16_000 for c in clips]
    runtime = decoder.target_runtime
    with torch.inference_mode():
        feats = decoder._features(clips, options, windows).to(decoder.pair.device, decoder.pair.dtype)
        hidden = decoder.target.get_encoder()(feats).last_hidden_state
        state = runtime.new_state(hidden, positions=1)
    cross = (state.cross_k, state.cross_v)
    sot = decoder._alignment_sot(decoder.prompt_for(options))
    eos, heads, tokenizer = decoder.eos, decoder.alignment_heads, decoder.tokenizer

    def one_by_one():
        segment_lists = [copy.deepcopy(r.segments) for r in results]
        with torch.inference_mode():
            for r, segments in enumerate(segment_lists):
                add_word_timestamps(segments, runtime, hidden[r : r + 1], sot, eos, windows[r], heads, tokenizer,
                                    False, (cross[0][:, r : r + 1], cross[1][:, r : r + 1]))
        return segment_lists

    def together():
        segment_lists = [copy.deepcopy(r.segments) for r in results]
        with torch.inference_mode():
            add_batch_word_timestamps(segment_lists, runtime, hidden, [sot] * batch, eos, windows, heads,
                                      tokenizer, False, cross)
        return segment_lists

    alone, batched = words_of(one_by_one()), words_of(together())
    differing = sum(a != b for a, b in zip(alone, batched))
    # On a CPU in fp32 the words are the same (tests/test_word_timestamps.py); on a GPU a batch's fp16 products
    # may round otherwise than a row's alone: counted, not fatal, so a scarce GPU run keeps its timings.
    if differing and not device.startswith("cuda"):
        raise AssertionError(f"the batch's words differ from its rows' alone at {batch} rows")
    sync = torch.cuda.synchronize if device.startswith("cuda") else None
    timings = {name: median_ms(fn, repeats, sync) for name, fn in (("one_by_one", one_by_one), ("together", together))}
    tokens = sum(len(s.tokens) for r in results for s in r.segments)
    return {"rows": batch, "tokens": tokens, "one_by_one_ms": timings["one_by_one"], "together_ms": timings["together"],
            "ratio": timings["together"] / timings["one_by_one"], "rows_with_other_words": differing}


def table(report: dict) -> str:
    lines = [f"Word timing of a batch of live buffers (real speech, 3-8 s), tiny.en, {report['threads']} torch "
             f"thread(s), {report['device']}; medians of {report['repeats']}; rows one by one through the same "
             "functions, one row per call", "",
             "| rows | text tokens | one by one ms | together ms | ms per row together | together / one by one | "
             "rows whose words differ |", "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['rows']} | {r['tokens']} | {r['one_by_one_ms']:.1f} | {r['together_ms']:.1f} | "
                     f"{r['together_ms'] / r['rows']:.1f} | {r['ratio']:.2f}x | {r.get('rows_with_other_words', 0)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", type=Path, default=SHARED / "models")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    decoder = tiny_pair_decoder(args.models, args.device)
    rows = []
    for batch in args.batches:
        rows.append(measure(decoder, batch, args.repeats, args.device))
        r = rows[-1]
        print(f"{batch} rows: one by one {r['one_by_one_ms']:.1f} ms, together {r['together_ms']:.1f} ms", flush=True)
    report = {"command": " ".join(["python", "bench/alignment_bench.py", *(argv or sys.argv[1:])]),
              "threads": args.threads, "repeats": args.repeats, "device": device_name(args.device), "rows": rows}
    out = Path(args.out) if args.out else result_path("alignment_bench", args.device)
    text = table(report)
    save_results(out, json.loads(json.dumps(report)), text, device=args.device)
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
