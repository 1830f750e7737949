"""`asr-serve`: the speech service (OpenAI-compatible API, live WebSocket, web app) in one process."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from asr_app.arguments import add_model_args, check_args_or_report, load_decoder_or_report
from asr_app.kernel_cache import add_kernel_cache_arg, bound_kernel_cache, kernel_cache_problem
from asr_app.limits import ServiceLimits


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asr-serve",
        description="Serve speech recognition to many clients at once: POST /v1/audio/transcriptions (OpenAI's "
                    "API), live audio on the WebSocket /v1/live, the web app at /, /health and /metrics. Every "
                    "decode goes through one scheduler that batches the requests of all clients.")
    add_model_args(parser)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--api-key", default=os.environ.get("ASR_SERVE_API_KEY") or None,
                        help="key clients must send as 'Authorization: Bearer KEY' (required unless --host is "
                             "loopback; default: $ASR_SERVE_API_KEY)")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="allow browser pages from ORIGIN to call the API (repeatable; off by default)")
    parser.add_argument("--max-sessions", type=int, default=16, help="live sessions at once (default 16)")
    parser.add_argument("--max-requests", type=int, default=32,
                        help="API transcriptions at once; the next one is answered 503, busy (default 32)")
    parser.add_argument("--max-upload-mb", type=float, default=200.0, help="largest upload in MB (default 200)")
    parser.add_argument("--max-upload-minutes", type=float, default=120.0,
                        help="longest upload in minutes of audio, read from its header (default 120)")
    parser.add_argument("--max-chunk-seconds", type=float, default=10.0,
                        help="longest live chunk in seconds (default 10)")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds each window of an API request may wait for and use the decoder (default "
                             "600); a request whose client disconnects is cancelled")
    parser.add_argument("--live-encoder-context", type=float, default=None, metavar="S",
                        help="live re-decodes run the encoder over their buffer plus S seconds instead of a 30 s "
                             "window (less work per re-decode on a CPU; a decode that loops is redone over the "
                             "whole window; docs/serving.md). Default: the whole window")
    parser.add_argument("--live-settle", type=float, default=None, metavar="S",
                        help="when the server falls behind and a live re-decode takes seconds of new audio at once, "
                             "commit the words new to it that end S seconds before the buffer's end without waiting "
                             "for a second decode (1.5 is the value measured; sooner words under load; docs/serving.md). "
                             "Default: off, every word waits for two decodes that agree")
    add_kernel_cache_arg(parser)
    parser.add_argument("--no-ui", action="store_true", help="serve the API only, without the web app at /")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="on a GPU, skip decoding the bundled sample at every batch size before serving (the "
                             "first requests at each size then wait for its CUDA graphs to be captured); "
                             "--engine local only")
    scale = parser.add_argument_group("scaling out (docs/scale.md)")
    scale.add_argument("--engine", choices=("local", "ray"), default="local",
                       help="local: one process, one model pair (default); ray: on Ray Serve, the decoder as "
                            "replicas that each load the pair and batch the rows that reach them")
    scale.add_argument("--address", default=None,
                       help="with --engine ray: join this Ray cluster (auto, or ray://host:port) instead of "
                            "starting a local one")
    scale.add_argument("--replicas", type=int, default=1, help="with --engine ray: decoder replicas (default 1)")
    scale.add_argument("--min-replicas", type=int, default=None,
                       help="with --engine ray: autoscale the decoder replicas between this and --max-replicas "
                            "on their queue depth")
    scale.add_argument("--max-replicas", type=int, default=None, help="with --engine ray: see --min-replicas")
    scale.add_argument("--gpus-per-replica", type=float, default=0.0,
                       help="with --engine ray: GPUs each decoder replica reserves (fractions share a GPU)")
    scale.add_argument("--replica-batching", choices=("scheduler", "serve"), default="scheduler",
                       help="with --engine ray: how a decoder replica batches the rows reaching it: the serving "
                            "scheduler (live first, fair, grouped by what can share a batch; default) or Ray "
                            "Serve's @serve.batch (arrival order); docs/scale.md compares them")
    return parser


def ray_options_from_args(args: argparse.Namespace):
    from asr_app.serve.ray_engine import RayServeOptions

    if args.engine != "ray":
        scaled = [f"--{name.replace('_', '-')}" for name in ("address", "min_replicas", "max_replicas")
                  if getattr(args, name) is not None]
        scaled += ["--replicas"] * (args.replicas != 1) + ["--gpus-per-replica"] * (args.gpus_per_replica != 0)
        scaled += ["--replica-batching"] * (args.replica_batching != "scheduler")
        if scaled:
            raise ValueError(f"{', '.join(scaled)} only apply with --engine ray")
        return None
    if args.no_warm_up:   # the replicas load their pair and decode as requests come; none warms up
        raise ValueError("--no-warm-up applies to --engine local (Ray replicas do not warm up)")
    if args.replicas != 1 and (args.min_replicas is not None or args.max_replicas is not None):
        raise ValueError("--replicas fixes the number of decoder replicas and --min-replicas/--max-replicas "
                         "autoscale it: give one or the other")
    _check_replica_device(args.device, args.gpus_per_replica)
    return RayServeOptions(address=args.address, replicas=args.replicas, min_replicas=args.min_replicas,
                           max_replicas=args.max_replicas, gpus_per_replica=args.gpus_per_replica,
                           cpus_per_replica=float(args.threads or 1), batching=args.replica_batching)


def _check_replica_device(device: str, gpus_per_replica: float) -> None:
    """Refused here, not found out inside a replica (asr_app/cluster.py says why; asr-transcribe's Ray
    workers are checked the same way)."""
    from asr_app.cluster import ray_device_problem

    if (problem := ray_device_problem(device, gpus_per_replica, "--gpus-per-replica", "replica")) is not None:
        raise ValueError(problem)


def live_streaming_options(settle_s: float | None):
    """Every live session's StreamingOptions: the defaults, with --live-settle."""
    from asr_app.streaming import StreamingOptions
    try:
        return StreamingOptions(settle_s=settle_s)
    except ValueError as exc:
        raise ValueError(f"--live-settle: {exc}") from None


def limits_from_args(args: argparse.Namespace) -> ServiceLimits:
    return ServiceLimits(max_sessions=args.max_sessions, max_requests=args.max_requests,
                         max_upload_mb=args.max_upload_mb,
                         max_upload_s=args.max_upload_minutes * 60, max_chunk_s=args.max_chunk_seconds,
                         request_timeout_s=args.request_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    # Light imports only until the arguments are checked: the web app (gradio) and the decoder (torch,
    # transformers) take seconds to import, and an `--engine ray` driver never builds either.
    from asr_app import ports
    from asr_app.decoding.options import UI_MODES
    from asr_app.serve.security import AccessSettings, check_binding

    if args.engine == "ray":
        from asr_app.serve.ray_engine import ray_serve_problem
        if (missing := ray_serve_problem()) is not None:
            print(f"asr-serve: error: {missing}", file=sys.stderr)
            return 2
    try:
        if args.mode not in UI_MODES:  # a request or live session leaving its mode out would get another one
            raise ValueError(f"--mode {args.mode} is not offered by the service "
                             f"(choose from {', '.join(UI_MODES)})")
        limits = limits_from_args(args)
        ray_options = ray_options_from_args(args)
        if args.live_encoder_context is not None and not 0 <= args.live_encoder_context <= 30:
            raise ValueError(f"--live-encoder-context must lie in [0, 30] seconds, got {args.live_encoder_context}")
        if (problem := kernel_cache_problem(args.cpu_kernel_cache)) is not None:
            raise ValueError(problem)
        streaming = live_streaming_options(args.live_settle)
    except ValueError as exc:
        print(f"asr-serve: error: {exc}", file=sys.stderr)
        return 2
    problem = check_binding(args.host, args.api_key) or ports.port_problem(args.host, args.port)
    if problem or not check_args_or_report(args, "asr-serve"):
        if problem:
            print(f"asr-serve: error: {problem}", file=sys.stderr)
        return 2
    schedule = tuple(args.temperature) if len(args.temperature) > 1 else ()
    access = AccessSettings(api_key=args.api_key, cors_origins=tuple(args.cors_origin))
    if ray_options is not None:   # the replicas load the models and set the bound in their own processes
        return serve_on_ray(args, ray_options, {"limits": limits, "access": access, "schedule": schedule,
                                                "live_encoder_context_s": args.live_encoder_context,
                                                "streaming": streaming,
                                                "mount_ui": not args.no_ui, "retries": ray_options.retries})
    kernel_cache = bound_kernel_cache(args.cpu_kernel_cache)   # before any kernel: the models load next
    decoder = load_decoder_or_report(args, "asr-serve")
    if decoder is None:
        return 2
    import uvicorn

    from asr_app.serve.app import build_app
    from asr_app.ui.engine import UiEngine

    engine = UiEngine.from_decoder(decoder, streaming, limits=limits).sharing(schedule=schedule,
                                                                   live_encoder_context_s=args.live_encoder_context)
    if not args.no_warm_up:
        warm_up(engine)
    app = build_app(engine, access, mount_ui=not args.no_ui)
    print(f"models loaded: {engine.describe()}{kernel_cache.startup_note(decoder.pair.device.type)}; serving on "
          f"http://{args.host}:{args.port}", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=10)
    finally:
        engine.scheduler.close()
        demo = getattr(getattr(app, "state", None), "gradio_demo", None)
        if demo is not None:
            from asr_app.ui.app import clear_upload_cache

            clear_upload_cache(demo)
    return 0


def warm_up(engine) -> None:
    """Where steps are captured (a GPU), capture every batch size's common steps before the first request:
    the bundled sample in the options a request leaving every field out gets (the service's mode and first
    temperature, with timestamps, as API windows and live re-decodes run). Nothing on a CPU."""
    if getattr(engine.scheduler.decoder, "graph_mode", "eager") == "eager":
        return
    import time
    from pathlib import Path

    from asr_app.audio import load_audio

    base = engine.base_options
    mode = base.mode if base.mode in engine.modes else engine.modes[0]   # no draft: "off"
    options = engine.options(mode, base.temperature, base.language or "auto", timestamps=True)
    started = time.perf_counter()
    sample = load_audio(Path(__file__).resolve().parents[1] / "samples" / "sample.flac")
    made = engine.scheduler.warm_up(sample, [options])
    print(f"warmed up: {made} batch sizes decoded in {time.perf_counter() - started:.1f} s", flush=True)


def serve_on_ray(args: argparse.Namespace, options, settings: dict) -> int:
    from asr_app.serve import ray_launch

    try:
        ray_launch.start(args, settings, options)
    except ray_launch.ServeConflict as exc:   # nothing deployed: the cluster's applications stay as they are
        print(f"asr-serve: error: {exc}", file=sys.stderr)
        ray_launch.disconnect()
        return 2
    except Exception as exc:  # noqa: BLE001 - a replica that cannot load its models, a cluster out of reach
        print(f"asr-serve: error: the service did not start on Ray Serve: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        ray_launch.stop_service(options)
        return 2
    scaling = (f"{options.min_replicas}-{options.max_replicas} decoder replicas (autoscaled)"
               if options.min_replicas is not None else f"{options.replicas} decoder replica(s)")
    print(f"models loaded on Ray Serve ({scaling}); serving on http://{args.host}:{args.port}", flush=True)
    ray_launch.serve_until_stopped(options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
