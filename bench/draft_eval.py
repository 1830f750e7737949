"""A finished draft on held-out audio, without training: asr-distill's in-decoder evaluation on its own.

    python bench/draft_eval.py --target openai/whisper-base --draft bundled --audio /work/ml/heldout \
        --languages detect given --threads 2

For each draft given (several: compared in one run, each setting's drafts measured one after another) and
each way of choosing the decoding language (`detect`: the target detects it per clip, as a user's
file decodes without `--language`; `given`: each clip in its folder's language, as `--language xx`
decodes), in one run: greedy `exact` identical to `off`, `exact`'s end-to-end speed over `off` (timed
clip by clip, alternating), the token loop's own speed-up and the ceiling, tokens per target call at fixed
gammas, and acceptance and speed per language. Writes bench/results/<device>/<day>/<name>.json and .md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asr_app.decoding.options import ENCODER_MATMUL_DTYPES  # noqa: E402
from bench.report_io import cpu_facts, describe_cpu, result_path, save_results  # noqa: E402


def _ints(value: str) -> tuple[int, ...]:
    return tuple(int(v) for v in value.split(",") if v.strip())


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="openai/whisper-base")
    p.add_argument("--draft", nargs="+", default=["bundled"],
                   help="bundled (the draft shipped for the target) or a folder; several: each measured in every "
                        "setting, one after another, on the same clips")
    p.add_argument("--audio", nargs="+", type=Path, required=True, help="held-out audio (language folders)")
    p.add_argument("--languages", nargs="+", choices=("detect", "given"), default=["detect", "given"])
    p.add_argument("--task", choices=("transcribe", "translate"), default="transcribe",
                   help="translate: the clips decoded into English (a multilingual target)")
    p.add_argument("--gammas", type=_ints, default=(1, 3, 5))
    p.add_argument("--max-clips", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=224, help="as asr-distill's teacher pass")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--encoder-matmul-dtype", nargs="+", choices=ENCODER_MATMUL_DTYPES, default=["same"],
                   help="the target encoder's products (RuntimeOptions.encoder_matmul_dtype); several: each measured")
    p.add_argument("--name", default="draft_eval", help="the result file's name")
    p.add_argument("--out", type=Path, default=None,
                   help="the result's JSON path (default bench/results/<device>/<day>/<name>.json)")
    return p.parse_args(argv)


def _row(how: str, d: dict) -> str:
    calls = ", ".join(f"{g}: {v:.2f}" for g, v in d["tokens_per_call"].items())
    return (f"| {how} | {d['identical']}/{d['clips']} | {d['speedup']:.2f}x | {d['loop_speedup']:.2f}x | "
            f"{d['ceiling']:.2f}x | {d['off_s']:.1f} / {d['exact_s']:.1f} | {calls} |")


def _language_rows(how: str, d: dict) -> list[str]:
    rows = []
    for language, r in d["by_language"].items():
        heard = r.get("detected_as")
        detected = ", ".join(f"{k} {n}" for k, n in sorted(heard.items())) if heard else language
        acceptance = "-" if r["acceptance"] is None else f"{100 * r['acceptance']:.1f}%"
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        rows.append(f"| {how} | {language} | {r['clips']} | {acceptance} | {r['tokens_per_call']:.2f} | {speedup} "
                    f"| {detected} |")
    return rows


def table(result: dict) -> str:
    runs = result["runs"]
    task = " translated into English" if result.get("task") == "translate" else ""
    drafts = result.get("drafts") or [result["draft"]]
    named = " and ".join(f"`{d}`" for d in drafts)
    lines = [f"{result['target']} + draft{'s' if len(drafts) > 1 else ''} {named}, greedy, {result['clips']} held-out clips{task} "
             f"({result['minutes']:.1f} min), {result['threads']} threads; {result['cpu']}", "",
             "| decoding language | exact == off | exact / off, end to end | in the loop | ceiling | off / exact s "
             "| tokens per target call (gamma) |", "|---|---|---|---|---|---|---|"]
    lines += [_row(how, d) for how, d in runs.items()]
    lines += ["", "| decoding language | folder | clips | acceptance | tokens per call | exact / off | decoded as |",
              "|---|---|---|---|---|---|---|"]
    for how, d in runs.items():
        lines += _language_rows(how, d)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    from asr_app.decoding.options import RuntimeOptions
    from asr_app.distill.data import ClipReader, inventory
    from asr_app.distill.evaluate import decoder_figures, in_decoder
    from asr_app.distill.options import EvalOptions
    from asr_app.distill.pipeline import load_draft
    from asr_app.models.loading import load_pair

    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    pair = load_pair(target=args.target, draft=None, device="cpu")
    drafts = {spec: load_draft(spec, pair) for spec in args.draft}   # each checked before any decode
    clips = inventory(args.audio, role="held-out").clips[: args.max_clips]
    read = ClipReader()
    audio = [read(c) for c in clips]
    names = [f"{c.path.name}#{c.window}" for c in clips]
    runs = {}
    for dtype in args.encoder_matmul_dtype:
        for how in args.languages:
            setting = how if dtype == "same" else f"{how}, {dtype} encoder"
            options = EvalOptions(gammas=args.gammas, language=how, task=args.task)
            for spec, draft in drafts.items():
                key = f"{spec}: {setting}" if len(drafts) > 1 else setting
                found = in_decoder(pair, draft, audio, names, options, args.max_new_tokens,
                                   RuntimeOptions(encoder_matmul_dtype=dtype),
                                   languages=[c.folder_language for c in clips], draft_name=spec)
                runs[key] = decoder_figures(found)
                print(f"{key}: exact/off {found.speedup:.2f}x, identical {found.identical}/{found.clips}", flush=True)
    result = {"target": args.target, "draft": ", ".join(args.draft), "drafts": list(args.draft), "task": args.task,
              "clips": len(clips), "threads": args.threads,
              "minutes": sum(c.seconds for c in clips) / 60, "cpu": describe_cpu(cpu_facts(args.threads)),
              "runs": runs, "seconds": round(time.perf_counter() - began, 1)}
    save_results(args.out or result_path(args.name), result, table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
