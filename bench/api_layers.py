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

The all-at-once rows show where batching's gain is lost (serve_bench gives only the outermost ratio); the
scheduler and http rows record the batches they formed, what each batch size was chosen from, and the sizer's
seconds per row. The layers run one after another, so their one-at-a-time times also hold whatever the machine
did meanwhile (a VM's speed drifts): what the scheduler adds to one request is measured apart, each clip
through `transcribe()` directly and through the scheduler in turn, the order alternating, as the median of
the differences. Every text is compared with `transcribe()`'s.

    python bench/api_layers.py --requests 16 --threads 2 --batch 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import serve_bench
from report_io import device_name, result_path, save_results


@dataclass
class Timed:
    """Seconds of each round of one way of sending the clips, and each round's texts."""
    seconds: list[float] = field(default_factory=list)
    texts: list[list[str]] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)


def timed(fn, rounds: int) -> Timed:
    """`rounds` calls of fn (each returns the clips' texts), timed."""
    out = Timed()
    for _ in range(rounds):
        started = time.perf_counter()
        texts = fn()
        out.seconds.append(time.perf_counter() - started)
        out.texts.append(texts)
    return out


def layer_row(one: Timed, together: Timed | None = None, how: str = "", batches: dict | None = None) -> dict:
    row = {"one_s": one.median_s, "one_rounds_s": one.seconds}
    if together is not None:
        row |= {"together_s": together.median_s, "together_rounds_s": together.seconds, "together": how}
    return row | (batches or {})


def decoder_layer(decoder, options, audio: list, batch: int, rounds: int) -> tuple[dict, list[list[str]]]:
    """The decoder alone: one clip per call, then `batch` per call (the options the API decodes with)."""
    groups = [audio[i:i + batch] for i in range(0, len(audio), batch)]
    one = timed(lambda: [r.text for a in audio for r in decoder.decode([a], options)], rounds)
    together = timed(lambda: [r.text for g in groups for r in decoder.decode(g, options)], rounds)
    return layer_row(one, together, f"batches of {batch}"), one.texts + together.texts


def both_ways(engine, send, paths: list[Path], rounds: int, how: str) -> tuple[dict, list[list[str]]]:
    """`send` (a clip's path -> its text, through `engine`) on every clip one at a time, then on all at once,
    each `rounds` times; the batches the second formed."""
    alone = timed(lambda: [send(p) for p in paths], rounds)
    before = engine.scheduler.metrics()
    with ThreadPoolExecutor(len(paths)) as pool:
        together = timed(lambda: list(pool.map(send, paths)), rounds)
    row = layer_row(alone, together, how, batches_formed(before, engine.scheduler.metrics()))
    return row, alone.texts + together.texts


def scheduler_layer(engine, options, paths: list[Path], rounds: int) -> tuple[dict, list[list[str]]]:
    """transcribe() through the scheduler, one at a time and all at once, each clip its own caller."""
    from asr_app.longform import TranscribeOptions, transcribe

    def one(path: Path) -> str:
        client = engine.scheduler.client(options, session=f"bench-{id(path)}-{time.perf_counter_ns()}")
        return transcribe(client, path, TranscribeOptions(decoding=options)).text

    return both_ways(engine, one, paths, rounds, f"{len(paths)} threads")


def http_layer(engine, paths: list[Path], rounds: int) -> tuple[dict, list[list[str]]]:
    """The same through a real asr-serve app and the openai client."""
    with serve_bench.api_sender(engine) as send:
        send(paths[0])   # the server's first request (imports, the spool folder)
        return both_ways(engine, send, paths, rounds, f"{len(paths)} clients")


def scheduler_added(engine, decoder, options, paths: list[Path], rounds: int) -> dict:
    """What the scheduler adds to one request: each clip through `transcribe()` directly and through the
    scheduler in turn, which first alternating, so the machine's drift falls on both alike."""
    from asr_app.longform import TranscribeOptions, transcribe
    differences = []
    for r in range(rounds):
        for i, path in enumerate(paths):
            seconds = {}
            for way in (("direct", "scheduled") if (i + r) % 2 == 0 else ("scheduled", "direct")):
                caller = decoder if way == "direct" else engine.scheduler.client(options, session=f"pair-{r}-{i}")
                started = time.perf_counter()
                transcribe(caller, path, TranscribeOptions(decoding=options))
                seconds[way] = time.perf_counter() - started
            differences.append(seconds["scheduled"] - seconds["direct"])
    if not differences:
        raise ValueError("no clips to pair")
    quartiles = statistics.quantiles(differences, n=4, method="inclusive") if len(differences) > 1 else differences * 3
    return {"pairs": len(differences), "median_s": statistics.median(differences), "quartiles_s": quartiles}


def batches_formed(before, after) -> dict:
    """The batches formed between two scheduler metrics, by rows, and the sizer's seconds per row at the end."""
    return {"batches_by_rows": after.batches_since(before), "sizer_s_per_row": after.sizer,
            "choices": after.choices_since(before),   # kind -> rows ready -> rows taken -> batches
            **serve_bench.batch_samples(after.samples_since(before))}


make_engine = serve_bench.api_engine   # each layer's own scheduler starts with a sizer that has measured nothing


def with_engine(decoder, requests: int, layer, *args):
    """layer(engine, *args) on an engine of its own, closed after."""
    engine = make_engine(decoder, requests)
    try:
        return layer(engine, *args)
    finally:
        engine.scheduler.close()


def table(report: dict) -> str:
    rows = report["layers"]
    n = report["requests"]
    lines = [f"{n} real clips ({report['audio_s']:.0f} s of audio), tiny.en + distilled draft, `exact`, "
             f"{report['threads']} threads, {report['device']}; medians of {report['rounds']} round(s); seconds "
             "for all clips", "",
             "| layer | one at a time s | ms per clip | all at once s | how | at once / one at a time | batches by rows |",
             "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        per = 1000 * row["one_s"] / n
        batches = ", ".join(f"{k}: {v}" for k, v in row.get("batches_by_rows", {}).items()) or "-"
        together = (f"{row['together_s']:.2f} | {row['together']} | {row['together_s'] / row['one_s']:.2f}x"
                    if "together_s" in row else "- | - | -")
        lines.append(f"| {name} | {row['one_s']:.2f} | {per:.0f} | {together} | {batches} |")
    paired = report.get("scheduler_added")
    if paired:
        lines += ["", f"One request through the scheduler against `transcribe()` directly, clip by clip in alternating "
                  f"order ({paired['pairs']} pairs): median {1000 * paired['median_s']:+.0f} ms, quartiles "
                  + " / ".join(f"{1000 * q:+.0f}" for q in paired["quartiles_s"]) + " ms."]
    same = report["identical"]
    lines += ["", "Every round's texts, one at a time and all at once, identical to `transcribe()`'s: "
              + ", ".join(f"{name} {'yes' if ok else 'NO'}" for name, ok in same.items())
              + ". The layers run in this order on one decoder; the scheduler and http layers each start a"
              " scheduler of their own."]
    return "\n".join(lines)


def clips(count: int, root: Path | None, cycle: bool) -> tuple[list[Path], list]:
    """Up to `count` real clips of at most 30 s (the decoder layer decodes each in one call), and their samples."""
    from asr_app.audio import load_audio
    pool = [p for p, _ in serve_bench.clip_pool(10 * count, root)]
    paths, audio = [], []
    for path in pool:
        samples = load_audio(str(path))
        if len(samples) <= 30 * 16_000:
            paths.append(path)
            audio.append(samples)
        if len(paths) == count:
            break
    return serve_bench.repeat(paths, count, cycle), serve_bench.repeat(audio, count, cycle)


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

    from asr_app.longform import TranscribeOptions, transcribe
    from asr_app.serve.api import TranscriptionRequest, decoding_options
    from asr_app.ui.engine import UiEngine
    torch.set_num_threads(args.threads)
    decoder = serve_bench.tiny_pair_decoder(args.models, args.device)
    paths, audio = clips(args.requests, args.audio, args.cycle_clips)
    options = decoding_options(UiEngine.from_decoder(decoder), TranscriptionRequest(
        "transcribe", "whisper-1", None, None, "json", 0.0, (), False, None))
    reference = [transcribe(decoder, p, TranscribeOptions(decoding=options)).text for p in paths]   # warms up too
    layers, texts = {}, {}
    layers["decoder"], texts["decoder"] = decoder_layer(decoder, options, audio, args.batch, args.rounds)
    direct = timed(lambda: [transcribe(decoder, p, TranscribeOptions(decoding=options)).text for p in paths],
                   args.rounds)
    layers["transcribe"], texts["transcribe"] = layer_row(direct), direct.texts   # all at once needs a queue
    layers["scheduler"], texts["scheduler"] = with_engine(decoder, len(paths), scheduler_layer, options, paths,
                                                          args.rounds)
    layers["http"], texts["http"] = with_engine(decoder, len(paths), http_layer, paths, args.rounds)
    added = with_engine(decoder, len(paths), lambda engine: scheduler_added(engine, decoder, options, paths,
                                                                              args.rounds))
    report = {"command": " ".join(["python", "bench/api_layers.py", *(argv or sys.argv[1:])]),
              "requests": len(paths), "audio_s": sum(len(a) for a in audio) / 16_000, "threads": args.threads,
              "rounds": args.rounds, "device": device_name(args.device), "layers": layers,
              "identical": {name: all(t == reference for t in rounds) for name, rounds in texts.items()},
              "scheduler_added": added}
    out = Path(args.out) if args.out else result_path("api_layers", args.device)
    text = table(report)
    save_results(out, json.loads(json.dumps(report, default=float)), text, device=args.device)
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
