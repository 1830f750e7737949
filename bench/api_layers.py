"""Where a served transcription's time goes: the same clips through each layer of the API's path, one at a
time and all at once, in one run.

Layers, outermost last:
  decoder     `SpeculativeDecoder.decode` of the clips' samples (read beforehand), one clip per call, then
              `--batch` clips per call: what batching saves in the decoder alone (batch_bench's figure)
  transcribe  `longform.transcribe(decoder, path)` per clip, one at a time, as asr-transcribe does: reading,
              resampling, features and the window loop around the decoder
  scheduler   the same through the scheduler (`Scheduler.client`, as the API does), one at a time, then
              every clip on its own thread at once: what the queue and the batch sizer make of it
  http        the same through a real asr-serve app with the official `openai` client: the upload, the form,
              the spool file and the event loop on top

Each layer's one-at-a-time time against the layer below shows what that layer adds per request; the
all-at-once rows show where batching's gain is lost (serve_bench gives only the outermost ratio). The scheduler
and http rows record the batches they formed and the sizer's seconds per row. Every text is compared with
`transcribe()`'s.

    python bench/api_layers.py --requests 16 --threads 2 --batch 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import serve_bench
from report_io import device_name, result_path, save_results

from asr_app.audio import load_audio


def timed(fn, rounds: int) -> tuple[float, list]:
    """The median wall time of `rounds` calls of fn, and the last call's result."""
    times, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def decoder_rows(decoder, options, audio: list, batch: int, rounds: int) -> dict:
    """The decoder alone: one clip per call, then `batch` per call (the same options the API decodes with)."""
    one_s, _ = timed(lambda: [decoder.decode([a], options) for a in audio], rounds)
    groups = [audio[i:i + batch] for i in range(0, len(audio), batch)]
    batched_s, _ = timed(lambda: [decoder.decode(g, options) for g in groups], rounds)
    return {"one_s": one_s, "together_s": batched_s, "together": f"batches of {batch}"}


def scheduled_rows(engine, options, paths: list[Path], rounds: int) -> tuple[dict, list[str]]:
    """transcribe() through the scheduler, one at a time and all at once; the batches the second formed."""
    from asr_app.longform import TranscribeOptions, transcribe

    def one(path: Path) -> str:
        client = engine.scheduler.client(options, session=f"bench-{id(path)}-{time.perf_counter_ns()}")
        return transcribe(client, path, TranscribeOptions(decoding=options)).text

    one_s, texts = timed(lambda: [one(p) for p in paths], rounds)
    before = engine.scheduler.metrics()
    with ThreadPoolExecutor(len(paths)) as pool:
        together_s, together = timed(lambda: list(pool.map(one, paths)), rounds)
    return {"one_s": one_s, "together_s": together_s, "together": f"{len(paths)} threads",
            **formed(before, engine.scheduler.metrics())}, texts + together


def http_rows(engine, paths: list[Path], rounds: int) -> tuple[dict, list[str]]:
    """The same through a real asr-serve app and the openai client."""
    import openai
    host, server = serve_bench.start_server(engine)
    api = openai.OpenAI(base_url=f"http://{host}/v1", api_key="none", max_retries=0, timeout=600)

    def send(path: Path) -> str:
        with open(path, "rb") as f:
            return api.audio.transcriptions.create(model="whisper-1", file=f).text

    try:
        send(paths[0])   # the server's first request (imports, the spool folder)
        one_s, texts = timed(lambda: [send(p) for p in paths], rounds)
        before = engine.scheduler.metrics()
        with ThreadPoolExecutor(len(paths)) as pool:
            together_s, together = timed(lambda: list(pool.map(send, paths)), rounds)
    finally:
        server.should_exit = True
    return {"one_s": one_s, "together_s": together_s, "together": f"{len(paths)} clients",
            **formed(before, engine.scheduler.metrics())}, texts + together


def formed(before, after) -> dict:
    """The batches formed between two scheduler metrics, by rows, and the sizer's seconds per row at the end."""
    batches = {k: n - before.rows_per_batch.get(k, 0) for k, n in after.rows_per_batch.items()}
    return {"batches_by_rows": {k: n for k, n in sorted(batches.items()) if n}, "sizer_s_per_row": after.sizer}


def make_engine(decoder, requests: int):
    from asr_app.limits import ServiceLimits
    from asr_app.scheduler import Scheduler
    from asr_app.serve.cli import warm_up
    from asr_app.ui.engine import UiEngine
    limits = ServiceLimits(max_requests=max(requests, ServiceLimits().max_requests))
    engine = UiEngine.from_decoder(decoder, limits=limits).sharing(scheduler=Scheduler(decoder))
    warm_up(engine)   # as asr-serve does (a GPU only)
    return engine


def table(report: dict) -> str:
    rows = report["layers"]
    n = report["requests"]
    lines = [f"{n} real clips ({report['audio_s']:.0f} s of audio), tiny.en + distilled draft, `exact`, "
             f"{report['threads']} threads, {report['device']}; medians of {report['rounds']} round(s); seconds "
             "for all clips", "",
             "| layer | one at a time s | ms per clip | added per clip ms | all at once s | how | at once / one at a time | batches by rows |",
             "|---|---|---|---|---|---|---|---|"]
    below = None
    for name, row in rows.items():
        per = 1000 * row["one_s"] / n
        added = f"{per - below:+.0f}" if below is not None else "-"
        batches = ", ".join(f"{k}: {v}" for k, v in row.get("batches_by_rows", {}).items()) or "-"
        together = (f"{row['together_s']:.2f} | {row['together']} | {row['together_s'] / row['one_s']:.2f}x"
                    if "together_s" in row else "- | - | -")
        lines.append(f"| {name} | {row['one_s']:.2f} | {per:.0f} | {added} | {together} | {batches} |")
        below = per
    lines += ["", f"Texts identical to `transcribe()` in every layer and way: {report['identical']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4, help="clips per call in the decoder layer's batched row")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", type=Path, default=serve_bench.SHARED / "models")
    parser.add_argument("--audio", type=Path, default=None, help="clips with transcripts (default the shared audio)")
    parser.add_argument("--cycle-clips", action="store_true", help="repeat the clips up to --requests")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    from asr_app.decoding import DecodingOptions, SpeculativeDecoder
    from asr_app.longform import TranscribeOptions, transcribe
    from asr_app.models import load_pair
    from asr_app.serve.api import TranscriptionRequest, decoding_options
    torch.set_num_threads(args.threads)
    pair = load_pair(target=str(args.models / "whisper-tiny.en"), draft=str(args.models / "distil-tiny.en-draft"),
                     device=args.device)
    decoder = SpeculativeDecoder(pair, DecodingOptions(mode="exact"))
    paths = serve_bench.repeat([p for p, _ in serve_bench.clip_pool(args.requests, args.audio)], args.requests,
                               args.cycle_clips)
    audio = [load_audio(str(p)) for p in paths]
    engine = make_engine(decoder, len(paths))
    options = decoding_options(engine, TranscriptionRequest("transcribe", "whisper-1", None, None, "json", 0.0,
                                                            (), False, None))
    reference = [transcribe(decoder, p, TranscribeOptions(decoding=options)).text for p in paths]   # warms up too
    layers: dict[str, dict] = {}
    layers["decoder"] = decoder_rows(decoder, options, audio, args.batch, args.rounds)
    one_s, texts = timed(lambda: [transcribe(decoder, p, TranscribeOptions(decoding=options)).text for p in paths],
                         args.rounds)
    layers["transcribe"] = {"one_s": one_s}   # all at once needs a queue: the decoder serves one caller at a time
    layers["scheduler"], scheduled = scheduled_rows(engine, options, paths, args.rounds)
    layers["http"], served = http_rows(engine, paths, args.rounds)
    engine.scheduler.close()
    every = [texts, scheduled[:len(paths)], scheduled[len(paths):], served[:len(paths)], served[len(paths):]]
    report = {"command": " ".join(["python", "bench/api_layers.py", *(argv or sys.argv[1:])]),
              "requests": len(paths), "audio_s": sum(len(a) for a in audio) / 16_000, "threads": args.threads,
              "rounds": args.rounds, "device": device_name(args.device) if args.device.startswith("cuda") else
              serve_bench._cpu(), "layers": layers, "identical": all(t == reference for t in every)}
    out = Path(args.out) if args.out else result_path("api_layers", args.device)
    text = table(report)
    save_results(out, json.loads(json.dumps(report, default=float)), text, device=args.device)
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
