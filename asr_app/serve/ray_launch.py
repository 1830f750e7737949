"""Starting and stopping `asr-serve --engine ray`: Ray, Serve's HTTP proxy on --host/--port, the metrics
board, the decoder deployment and the ingress (asr_app/serve/ray_engine.py says what each one is)."""

from __future__ import annotations

import argparse
import math
import os
import signal
import threading
from collections.abc import Iterable
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


class ServeConflict(RuntimeError):
    """The cluster's Serve cannot take this service as asked; nothing was deployed (and nothing of the
    cluster's may be removed on the way out)."""


def start(args: argparse.Namespace, settings: dict[str, Any], options: RayServeOptions) -> Any:
    """Start (or join) Ray, deploy the service, wait until every replica has loaded; the ingress's handle."""
    import ray
    from ray import serve

    # A local instance gets a CPU slot for every replica's threads even past the core count (the threads
    # then share cores, as the user asked): otherwise Serve would wait forever for slots that never come.
    slots = {} if options.address else {"num_cpus": max(os.cpu_count() or 1, math.ceil(options.cpus_needed))}
    # Without --address, a Ray instance of our own ("local"): Ray would otherwise join a cluster that RAY_ADDRESS
    # or an earlier `ray start` names, and on the way out we would shut down that cluster's Serve.
    ray.init(address=options.address or "local", include_dashboard=False, logging_level="WARNING",
             namespace="asr-serve", ignore_reinit_error=True, **slots)
    serve.start(http_options={"host": args.host, "port": args.port},
                logging_config=QUIET)
    # Serve already running on a shared cluster keeps its own proxy address (Ray only logs that ours is
    # ignored), and a second deployment named APP_NAME would silently replace the one running there.
    problem = (http_conflict(args.host, args.port, running_http_address())
               or app_conflict(serve.status().applications))
    if problem:
        raise ServeConflict(problem)
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


def running_http_address() -> tuple[str, int] | None:
    """Where the cluster's Serve proxy really listens, or None when that cannot be read (a private API of
    Ray's: its absence in another version must not stop the service)."""
    try:
        from ray.serve.context import _get_global_client

        config = _get_global_client().http_config
        return str(config.host), int(config.port)
    except Exception:  # noqa: BLE001 - unknown: nothing to compare
        return None


def http_conflict(host: str, port: int, running: tuple[str, int] | None) -> str | None:
    """One line when Serve listens elsewhere than --host/--port asked, or None."""
    if running is None or running == (host, port):
        return None
    where = f"http://{running[0]}:{running[1]}"
    return (f"Ray Serve already runs on this cluster and listens on {where}, not on http://{host}:{port}; "
            f"give --host {running[0]} --port {running[1]}, or use another cluster")


def app_conflict(applications: Iterable[str]) -> str | None:
    """One line when an application named APP_NAME already runs on the cluster's Serve, or None."""
    if APP_NAME not in applications:
        return None
    return (f"Ray Serve on this cluster already runs an application named {APP_NAME!r} (another asr-serve?), "
            f"which deploying would replace; stop it (its asr-serve, or `serve delete {APP_NAME}`) or use "
            "another cluster")


def disconnect() -> None:
    """Leave the cluster without removing anything of it (after a ServeConflict)."""
    import ray

    ray.shutdown()


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
