"""Starting and stopping `asr-serve --engine ray`: Ray, Serve's HTTP proxy on --host/--port, the metrics
board, the decoder deployment and the ingress (asr_app/serve/ray_engine.py says what each one is)."""

from __future__ import annotations

import argparse
import math
import os
import signal
import threading
from typing import Any

from asr_app.serve.ray_engine import (
    APP_NAME,
    BOARD_NAME,
    DecoderReplica,
    Ingress,
    MetricsBoard,
    RayServeOptions,
)

QUIET = {"log_level": "WARNING", "enable_access_log": False}   # Serve logs every request at INFO otherwise


def start(args: argparse.Namespace, settings: dict[str, Any], options: RayServeOptions) -> Any:
    """Start (or join) Ray, deploy the service, wait until every replica has loaded; the ingress's handle."""
    import ray
    from ray import serve

    # A local instance gets a CPU slot for every replica's threads even past the core count (the threads
    # then share cores, as the user asked): otherwise Serve would wait forever for slots that never come.
    slots = {} if options.address else {"num_cpus": max(os.cpu_count() or 1, math.ceil(options.cpus_needed))}
    ray.init(address=options.address, include_dashboard=False, logging_level="WARNING",
             namespace="asr-serve", ignore_reinit_error=True, **slots)
    serve.start(http_options={"host": args.host, "port": args.port},
                logging_config=QUIET)
    board = ray.remote(MetricsBoard).options(name=BOARD_NAME, num_cpus=0, get_if_exists=True).remote()
    if options.batching == "serve":
        from asr_app.serve.ray_batching import ServeBatchedReplica as replica_class
    else:
        replica_class = DecoderReplica
    decoder = serve.deployment(
        replica_class, name="DecoderReplica", max_ongoing_requests=options.max_ongoing,
        ray_actor_options={"num_cpus": options.cpus_per_replica, "num_gpus": options.gpus_per_replica},
        health_check_period_s=2.0, graceful_shutdown_timeout_s=5.0, max_constructor_retry_count=2,
        **options.scaling())
    ingress = serve.deployment(
        serve.ingress()(Ingress), name="Ingress", num_replicas=1, max_ongoing_requests=4096,
        ray_actor_options={"num_cpus": 0})
    app = ingress.bind(decoder.bind(args, board), board, args, settings)
    return serve.run(app, name=APP_NAME, route_prefix="/", blocking=False, logging_config=QUIET)


def serve_until_stopped(options: RayServeOptions) -> None:
    """Block until SIGINT or SIGTERM, then take the service down (and the local Ray instance we started)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    finally:
        stop_service(options)


def stop_service(options: RayServeOptions) -> None:
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    try:
        if options.address is None:
            serve.shutdown()
        else:   # a shared cluster: remove our application only
            serve.delete(APP_NAME)
    finally:
        ray.shutdown()
