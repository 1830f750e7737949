"""`asr-serve --engine ray`: the same service on Ray Serve (docs/scale.md, "The live service on Ray Serve").

Two deployments:
- `DecoderReplica` (N replicas, or autoscaled between bounds): each loads the model pair once and owns one
  `Scheduler`, the same one the one-process server runs. A replica accepts many requests at once (a high
  `max_ongoing_requests`), so the rows of every session that reach it meet in its queue and are batched
  there by their compatibility keys, priorities and fairness: things Ray Serve's `@serve.batch` cannot
  see (it batches calls of one signature by arrival only).
- `Ingress` (one replica): the very FastAPI app of `asr-serve` (API, WebSocket, web app). Its engine's
  scheduler is a `RemoteScheduler`, which sends each row to the decoder deployment. A live session's
  streaming state (buffer, committed words, policy) stays here, where its WebSocket is held; only
  stateless re-decodes travel. A row whose replica died before answering is sent again (to a live
  replica: Serve routes around the dead one and starts a new one). At T = 0 a decode is a function of its
  row, so the stream goes on as if nothing happened; nothing was committed from the lost answer.

Replicas publish their scheduler's figures to a `MetricsBoard` actor every second; `/metrics` and
`/health` read the sum over replicas, fetched at most once a second (they need no key: a client hammering
them costs no Ray round trip per call).

A row not answered within `call_timeout_s` (a replica that hangs yet passes its health checks) is cancelled
on its replica and answered as busy; a row whose caller gave up (a request past its timeout) is cancelled
on its replica too, so it stops taking decoder time there.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asr_app.decoding.options import DecodingOptions, DecodingResult
from asr_app.kernel_cache import bound_kernel_cache, kernel_cache_problem
from asr_app.scheduler import FILE, ScheduledDecoder, SchedulerBusy, SchedulerClosed
from asr_app.scheduler_metrics import SchedulerMetrics

log = logging.getLogger(__name__)

INSTALL_LINE = 'pip install "ray[serve]>=2.40"   (or, in a checkout: pip install -e ".[serve-ray]")'
APP_NAME = "asr"
BOARD_NAME = "asr-serve-metrics"
PUBLISH_EVERY_S = 1.0
FRESH_S = 5.0          # a replica silent for longer is gone: its queue no longer counts (its totals do)
BOARD_FRESH_S = 1.0    # the ingress reuses the board's figures this long (replicas publish once a second)
BOARD_WAIT_S = 2.0     # a board slower than this is not waited for: the last figures are served, with their age
CALL_TIMEOUT_S = 300.0  # a row unanswered this long is its replica's failure (the ingress passes its request timeout)


def ray_serve_problem() -> str | None:
    """Why `--engine ray` cannot run here (one line with the install command), or None."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as exc:
        return f"--engine ray needs Ray Serve, which is not installed here ({exc}). Install it: {INSTALL_LINE}"
    return None


@dataclass(frozen=True)
class RayServeOptions:
    """How the decoder deployment is laid out (asr-serve's --address/--replicas/... options)."""

    address: str | None = None        # None: start a local Ray instance; "auto" or ray://host:port: join one
    replicas: int = 1
    min_replicas: int | None = None   # both bounds given: autoscaled on the replicas' queue depth
    max_replicas: int | None = None
    gpus_per_replica: float = 0.0
    cpus_per_replica: float = 1.0
    target_queue: int = 4             # autoscaling aims at this many requests waiting or decoding per replica
    max_ongoing: int = 256            # requests one replica holds at once (its scheduler batches them)
    retries: int = 5                  # sends of one row before its replica's loss is the caller's error
    batching: str = "scheduler"       # how a replica batches: the serving scheduler, or Serve's @serve.batch

    @property
    def cpus_needed(self) -> float:
        """CPU slots the decoder replicas reserve at their most."""
        return self.cpus_per_replica * (self.max_replicas if self.max_replicas is not None else self.replicas)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {self.replicas}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("give both --min-replicas and --max-replicas (autoscaling), or neither")
        if self.min_replicas is not None and not (0 <= self.min_replicas <= self.max_replicas and self.max_replicas >= 1):
            raise ValueError(f"need 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1, got "
                             f"{self.min_replicas} and {self.max_replicas}")
        if self.batching not in ("scheduler", "serve"):
            raise ValueError(f"--replica-batching must be scheduler or serve, got {self.batching!r}")
        if self.gpus_per_replica < 0 or self.cpus_per_replica < 0:
            raise ValueError("--gpus-per-replica and the threads per replica must not be negative")

    def scaling(self) -> dict[str, Any]:
        """The decoder deployment's replica count or autoscaling config."""
        if self.min_replicas is None:
            return {"num_replicas": self.replicas}
        return {"autoscaling_config": {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                                       "initial_replicas": max(self.min_replicas, 1),
                                       "target_ongoing_requests": self.target_queue,
                                       "upscale_delay_s": 5.0, "downscale_delay_s": 60.0}}


# -- figures from every replica -----------------------------------------------------------------

class MetricsBoard:
    """A Ray actor: the last figures each decoder replica published (bounded: the newest 64 replicas)."""

    def __init__(self) -> None:
        self._boards: dict[str, tuple[float, int, SchedulerMetrics]] = {}
        self._retired = SchedulerMetrics()   # the totals of replicas dropped from the board

    def publish(self, replica: str, pid: int, metrics: SchedulerMetrics) -> None:
        self._boards[replica] = (time.time(), pid, metrics)
        if len(self._boards) > 64:
            oldest = min(self._boards, key=lambda k: self._boards[k][0])
            _seen, _pid, gone = self._boards.pop(oldest)
            self._retired = merge_metrics({"a": (0.0, 0, self._retired), "b": (0.0, 0, gone)}, time.time())
            self._retired.latencies = {}
            self._retired.samples = []   # a replica gone: its batches say nothing of the live ones

    def snapshot(self) -> dict[str, tuple[float, int, SchedulerMetrics]]:
        return {**self._boards, "retired": (0.0, 0, self._retired)}   # never fresh: no queue, no pid


# SchedulerMetrics' totals, summed over every replica that ever published
SUMMED = ("batches", "rows", "failed", "busy_s", "audio_s", "drafted", "accepted", "trims", "gathers", "gather_s",
          "workspace_evictions", "graph_evictions", "graph_captures", "graph_capture_s")


def merge_metrics(boards: dict[str, tuple[float, int, SchedulerMetrics]], now: float) -> SchedulerMetrics:
    """The sum over replicas: totals from every replica that ever published; queues and what is held now
    (workspaces and their rows) from the live ones."""
    total = SchedulerMetrics(samples=[])   # a list: each replica's latest samples, all of them
    for seen, _pid, m in boards.values():
        if now - seen <= FRESH_S:
            total.queue_depth += m.queue_depth
            total.workspaces += m.workspaces
            total.workspace_rows += m.workspace_rows
        for name in SUMMED:
            setattr(total, name, getattr(total, name) + getattr(m, name))
        for size, count in m.rows_per_batch.items():
            total.rows_per_batch[size] = total.rows_per_batch.get(size, 0) + count
        total.add_choices(m.choices)
        total.samples.extend(m.samples)   # each replica's latest (their `batch` numbers are each replica's own)
        for name, values in m.latencies.items():
            total.latencies.setdefault(name, []).extend(values)
        for name, count in m.latency_count.items():
            total.latency_count[name] = total.latency_count.get(name, 0) + count
            total.latency_sum[name] = total.latency_sum.get(name, 0.0) + m.latency_sum.get(name, 0.0)
    return total


# -- the decoder deployment's body ----------------------------------------------------------------

class DecoderReplica:
    """One replica: the model pair loaded once, one scheduler batching every row that reaches it."""

    def __init__(self, model_args: argparse.Namespace, board: Any = None) -> None:
        from asr_app.scheduler import Scheduler

        self.scheduler = Scheduler(replica_decoder(model_args))
        if board is not None:
            publish_metrics(board, self.scheduler.metrics)

    async def decode(self, clip: np.ndarray, options: DecodingOptions, prompt: Any, hint: Sequence[int] | None,
                     priority: int, session: str) -> DecodingResult:
        future = self.scheduler.submit(clip, options, prompt, hint, priority=priority, session=session)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # The ingress cancelled the call (its caller gave up, or the row timed out): Serve cancels this
            # task, and the row leaves the queue so it takes no batch slot (a batch already running finishes).
            self.scheduler.cancel(future)
            raise

    def metrics(self) -> SchedulerMetrics:
        return self.scheduler.metrics()



def replica_decoder(model_args: argparse.Namespace):
    """A replica's model pair, loaded once the kernel-cache bound is set in the replica's own process
    (asr_app/kernel_cache.py): from --cpu-kernel-cache, else the environment the replica runs in (its node's
    and the job's runtime_env), else the service's default, as asr-serve decides for its own process."""
    from asr_app.arguments import decoder_from_args

    entries = getattr(model_args, "cpu_kernel_cache", None)
    if (problem := kernel_cache_problem(entries)) is not None:
        raise ValueError(problem)
    log.info("CPU kernel cache %s", bound_kernel_cache(entries))
    return decoder_from_args(model_args)


PUBLISHED_SAMPLES = 64   # batch samples a replica sends the board each time


def publish_metrics(board: Any, figures: Callable[[], SchedulerMetrics]) -> None:
    """Send this replica's `figures()` to the board every PUBLISH_EVERY_S, from a daemon thread (it ends with
    the replica's process, or when the board is gone)."""
    name, pid = _replica_name(), os.getpid()

    def publish() -> None:
        while True:
            time.sleep(PUBLISH_EVERY_S)
            try:
                now = figures()   # the latest batches' samples only: the board is sent these every second
                board.publish.remote(name, pid, dataclasses.replace(now, samples=list(now.samples)[-PUBLISHED_SAMPLES:]))
            except Exception:  # noqa: BLE001 - the board is gone (shutting down): stop publishing
                return

    threading.Thread(target=publish, name="asr-metrics-publisher", daemon=True).start()


def _replica_name() -> str:
    try:
        from ray import serve
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a Serve replica (tests): the process is the replica
        return f"pid-{os.getpid()}"


# -- the ingress's side ----------------------------------------------------------------------------

@dataclass
class _Flight:
    """One row's call to the decoder deployment: the response to cancel when its caller gives up."""

    response: Any = None
    cancelled: bool = False


@dataclass
class RemoteScheduler:
    """What the front ends need of a `Scheduler` (`submit`, `cancel`, `client`, `metrics`, `close`, `pair`),
    with the decoding done by the decoder deployment. Each row is one call; a call whose replica died is
    made again, up to `retries` times."""

    handle: Any                     # DeploymentHandle of DecoderReplica
    pair: Any                       # the ingress's copy of the pair: tokenizer, configs, names
    default_options: DecodingOptions
    board: Any = None
    retries: int = 5
    max_queue: int = 512
    retry_wait_s: float = 0.5
    call_timeout_s: float = CALL_TIMEOUT_S
    board_fresh_s: float = BOARD_FRESH_S
    board_wait_s: float = BOARD_WAIT_S
    clock: Callable[[], float] = time.monotonic
    resent: int = 0                 # rows sent again after their replica died
    _pool: ThreadPoolExecutor = field(init=False, repr=False)
    _waiting: int = field(default=0, init=False, repr=False)
    _flights: dict[Future, _Flight] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)
    _figures: SchedulerMetrics | None = field(default=None, init=False, repr=False)   # the board's, merged
    _figures_at: float | None = field(default=None, init=False, repr=False)           # when they were fetched
    _board_tried_at: float | None = field(default=None, init=False, repr=False)
    _board_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        # One waiting thread per row in flight, up to the queue bound: a row never waits here behind
        # another (priorities are the replicas' schedulers' business).
        self._pool = ThreadPoolExecutor(max_workers=self.max_queue, thread_name_prefix="asr-remote-row")

    def submit(self, clip: np.ndarray, options: DecodingOptions, prompt: Any = None,
               hint: Sequence[int] | None = None, *, priority: int = FILE, session: str = "") -> Future:
        flight = _Flight()
        with self._lock:
            if self._closed:
                raise SchedulerClosed("the decoder is shutting down")
            if self._waiting >= self.max_queue:
                raise SchedulerBusy(f"the decoders have {self._waiting} requests waiting; try again shortly")
            self._waiting += 1
            future = self._pool.submit(self._call, flight, clip, options, prompt, hint, priority, session)
            self._flights[future] = flight
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future) -> None:
        with self._lock:
            self._waiting -= 1
            self._flights.pop(future, None)

    def _call(self, flight: _Flight, clip, options, prompt, hint, priority, session) -> DecodingResult:
        lost, attempt = _replica_loss_errors(), 1
        while True:
            response = self._send(flight, clip, options, prompt, hint, priority, session)
            try:
                return response.result(timeout_s=self.call_timeout_s)
            except lost as exc:
                if attempt == self.retries:   # the service's outage, answered as busy (503), not a bad request
                    raise SchedulerBusy(f"a decoder replica was lost {attempt} times in a row") from exc
                with self._lock:
                    self.resent += 1
                log.warning("a decoder replica was lost (%s); sending the row again", type(exc).__name__)
                time.sleep(self.retry_wait_s * attempt)
                attempt += 1
            except TimeoutError as exc:
                if _raised_by_replica(exc):   # the decode's own error, passed on as it is
                    raise
                # A replica that hangs yet passes its health checks: stop the row there, and answer busy
                # (503) rather than hold this thread (and the caller) for ever.
                response.cancel()
                raise SchedulerBusy(f"a decoder replica did not answer within {self.call_timeout_s:g} s") from exc

    def _send(self, flight: _Flight, *row) -> Any:
        """One call for the row, recorded in its flight so `cancel` can reach it; none once it was cancelled."""
        if flight.cancelled:
            raise CancelledError("the caller gave up on this row")
        response = self.handle.decode.remote(*row)
        with self._lock:
            flight.response, cancelled = response, flight.cancelled
        if cancelled:   # cancelled while the call was being made: `cancel` did not see this response
            response.cancel()
        return response

    def cancel(self, future: Future) -> bool:
        """Drop a row whose caller gave up: before its call, the call is never made; during it, the call is
        cancelled on its replica (best effort: a batch already decoding there finishes). False once done."""
        if future.cancel():
            return True
        with self._lock:
            flight = self._flights.get(future)
            if flight is None:
                return False
            flight.cancelled = True
            response = flight.response
        if response is not None:
            response.cancel()
        return True

    def client(self, options: DecodingOptions | None = None, *, priority: int = FILE, session: str = "",
               timeout_s: float | None = None, cancelled: threading.Event | None = None) -> ScheduledDecoder:
        return ScheduledDecoder(self, options or self.default_options, priority, session, timeout_s, cancelled)

    def metrics(self) -> SchedulerMetrics:
        figures = self._board_figures()
        merged = SchedulerMetrics() if figures is None else dataclasses.replace(figures)
        merged.queue_depth = max(merged.queue_depth, self._waiting)   # rows on their way count as queued
        merged.resent = self.resent
        return merged

    @property
    def figures_age_s(self) -> float | None:
        """Seconds since the replicas' figures were fetched from the board (None: it has not answered yet)."""
        return None if self._figures_at is None else self.clock() - self._figures_at

    def _board_figures(self) -> SchedulerMetrics | None:
        """The replicas' figures summed, fetched from the board at most once per `board_fresh_s`: /health
        and /metrics need no key, so a client calling them in a loop must not cost a Ray round trip each."""
        if self.board is None or self._tried_recently():
            return self._figures
        # One caller fetches; the others serve the figures there are meanwhile (none yet: they wait for it).
        if not self._board_lock.acquire(blocking=self._figures is None):
            return self._figures
        try:
            if not self._tried_recently():
                self._fetch_board()
            return self._figures
        finally:
            self._board_lock.release()

    def _tried_recently(self) -> bool:
        return self._board_tried_at is not None and self.clock() - self._board_tried_at < self.board_fresh_s

    def _fetch_board(self) -> None:
        import ray

        failing = self._board_tried_at is not None and self._board_tried_at != self._figures_at
        self._board_tried_at = self.clock()
        try:
            boards = ray.get(self.board.snapshot.remote(), timeout=self.board_wait_s)
        except Exception as exc:  # noqa: BLE001 - slow or gone: the figures are served as they were
            if not failing:   # said once per spell, not on every call
                age = "none yet" if self.figures_age_s is None else f"{self.figures_age_s:.1f} s old"
                log.warning("the metrics board did not answer within %g s (%s); serving the last figures (%s)",
                            self.board_wait_s, type(exc).__name__, age)
            return
        self._figures = merge_metrics(boards, time.time())
        self._figures_at = self._board_tried_at

    def close(self, timeout: float | None = 10.0) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)


def _raised_by_replica(exc: BaseException) -> bool:
    """Whether an error came from the decode on the replica (Ray wraps those), not from waiting for it."""
    from ray import exceptions as rx
    return isinstance(exc, rx.RayTaskError)


def _replica_loss_errors() -> tuple[type[BaseException], ...]:
    """The errors a call raises when its replica died or could not be reached (not the decode's own errors)."""
    from ray import exceptions as rx
    names = ("ActorDiedError", "ActorUnavailableError", "RayActorError", "WorkerCrashedError", "NodeDiedError")
    return tuple(getattr(rx, n) for n in names if hasattr(rx, n))


class Ingress:
    """The ingress deployment's body: asr-serve's FastAPI app over a `RemoteScheduler`."""

    def __init__(self, decoder_handle: Any, board: Any, model_args: argparse.Namespace, settings: dict) -> None:
        from asr_app.arguments import decoder_from_args
        from asr_app.streaming import StreamingOptions
        from asr_app.ui.engine import UiEngine

        local_args = copy.copy(model_args)
        local_args.device, local_args.dtype = "cpu", "auto"   # tokenizer and configs only: never on a GPU
        decoder = decoder_from_args(local_args)
        # A row's call may take as long as a request may wait (live rows have no bound of their own).
        remote = RemoteScheduler(decoder_handle, decoder.pair, decoder.options, board,
                                 retries=settings.get("retries", 5),
                                 call_timeout_s=settings["limits"].request_timeout_s)
        self.engine = UiEngine(pair=decoder.pair, base_options=decoder.options, decoder=decoder, scheduler=remote,
                               limits=settings["limits"], schedule=settings.get("schedule", ()),
                               live_encoder_context_s=settings.get("live_encoder_context_s"),
                               streaming=settings.get("streaming") or StreamingOptions())
        self.settings = settings

    def __serve_build_asgi_app__(self):
        from asr_app.serve.app import build_app
        return build_app(self.engine, self.settings["access"], mount_ui=self.settings.get("mount_ui", True))
