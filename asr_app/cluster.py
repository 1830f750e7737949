"""Batch transcription on a Ray cluster: the same long-form code path in long-lived worker actors.

Each worker is a Ray actor that builds its decoder once (`make_decoder`, CPU or GPU) and transcribes
the tasks it is handed with `longform.transcribe_many` (up to `batch_size` files per task, decoded
together). The driver keeps up to two tasks queued at each worker, yields every file's outcome as its
task returns and leaves writing to the caller, so outputs are written once, by one process, with the same
atomic writers as a local run. A worker that dies (killed, out of memory, node lost) takes its task
back into the queue for another worker, and a replacement actor is started; a task whose workers
died `max_attempts` times fails with that reason. Inputs are paths every node can read (a shared
filesystem): docs/scale.md.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INSTALL_HINT = 'pip install "asr-app[cluster]"'
TASKS_AHEAD = 2  # tasks handed to a worker at once: it never waits for the driver between two


class ClusterError(RuntimeError):
    """The cluster cannot run the job: Ray missing or unreachable, or the workers cannot load the models."""


@dataclass(frozen=True)
class ClusterOptions:
    address: str | None = None    # None: start a local Ray instance here (and stop it afterwards)
    num_workers: int = 2
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    max_attempts: int = 3         # a task whose worker died this many times fails

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"--num-workers must be >= 1, got {self.num_workers}")
        if self.gpus_per_worker < 0 or self.cpus_per_worker <= 0:
            raise ValueError("--gpus-per-worker must be >= 0 and CPUs per worker > 0")


@dataclass
class WorkerReport:
    """What one worker process did: files, audio seconds and seconds spent transcribing."""
    worker: str
    files: int = 0
    audio_s: float = 0.0
    busy_s: float = 0.0


@dataclass
class ClusterReport:
    workers: dict[str, WorkerReport] = field(default_factory=dict)
    workers_lost: int = 0
    tasks_retried: int = 0
    startup_s: float = 0.0    # connecting and loading the models in every worker
    work_s: float = 0.0       # from the first task handed out to the last outcome taken by the driver
    shutdown_s: float = 0.0   # stopping the workers (and the local Ray instance, when we started it)


@dataclass(frozen=True)
class _Task:
    items: tuple[tuple[Any, str], ...]   # (key, path)
    attempts: int = 0


class TranscribeWorker:
    """The actor (wrapped by `ray.remote` at run time, so importing this module needs no Ray)."""

    def __init__(self, make_decoder: Callable[[], Any], make_options: Callable[[Any], Any], threads: int) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.decoder = make_decoder()
        self.options = make_options(self.decoder)
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def ready(self) -> str:
        return self.name

    def pid(self) -> int:
        return os.getpid()

    def run(self, items: Sequence[tuple[Any, str]]) -> tuple[str, list[tuple[Any, Any]], float]:
        """(worker name, [(key, Transcript or error message)], busy seconds) for one task."""
        from asr_app.longform import transcribe_many

        started = time.perf_counter()
        outcomes = []
        for key, outcome in transcribe_many(self.decoder, list(items), self.options):
            # Exceptions are sent back as their message: their classes need not unpickle on the driver.
            outcomes.append((key, _Failure(str(outcome)) if isinstance(outcome, Exception) else outcome))
        return self.name, outcomes, time.perf_counter() - started


@dataclass(frozen=True)
class _Failure:
    message: str


class RayTranscriber:
    """Workers on a Ray cluster, for one batch: `with RayTranscriber(...) as t: for key, outcome in t.run(...)`."""

    def __init__(self, make_decoder: Callable[[], Any], make_options: Callable[[Any], Any],
                 cluster: ClusterOptions = ClusterOptions()) -> None:
        self.ray = import_ray()
        self.cluster = cluster
        self.report = ClusterReport()
        self._started_ray = False
        self._actor_class = self.ray.remote(num_cpus=cluster.cpus_per_worker,
                                            num_gpus=cluster.gpus_per_worker)(TranscribeWorker)
        self._factory = (make_decoder, make_options, max(1, int(cluster.cpus_per_worker)))
        started = time.perf_counter()
        self._connect()
        self.actors = [self._new_actor() for _ in range(cluster.num_workers)]
        self._wait_ready()
        self.report.startup_s = time.perf_counter() - started

    # ------------------------------------------------------------------ setup and teardown
    def _connect(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        if self.cluster.address is None:
            # A local instance with a slot for every worker (and no more: one thread each by default).
            kwargs["num_cpus"] = max(1, int(self.cluster.num_workers * self.cluster.cpus_per_worker))
            kwargs["num_gpus"] = int(-(-self.cluster.num_workers * self.cluster.gpus_per_worker // 1))
        try:
            ray.init(address=self.cluster.address, **kwargs)
        except Exception as exc:  # noqa: BLE001 - Ray raises several kinds; one line for the user
            raise ClusterError(f"cannot connect to Ray at {self.cluster.address or 'a new local instance'}: "
                               f"{exc}") from exc
        self._started_ray = True

    def _new_actor(self):
        return self._actor_class.remote(*self._factory)

    def _wait_ready(self) -> None:
        try:
            self.ray.get([actor.ready.remote() for actor in self.actors])
        except Exception as exc:  # noqa: BLE001
            self.close()
            raise ClusterError(f"the workers could not load the models: {_cause(exc)}") from exc

    def close(self) -> None:
        started = time.perf_counter()
        for actor in getattr(self, "actors", []):
            self.ray.kill(actor, no_restart=True)
        self.actors = []
        if self._started_ray and self.ray.is_initialized():
            self.ray.shutdown()
        self.report.shutdown_s += time.perf_counter() - started

    def __enter__(self) -> RayTranscriber:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pids(self) -> list[int]:
        """The workers' process ids (on this node for a local instance)."""
        return self.ray.get([actor.pid.remote() for actor in self.actors])

    # ------------------------------------------------------------------ the batch
    def run(self, items: Sequence[tuple[Any, str | Path]], batch_size: int = 1) -> Iterator[tuple[Any, Any]]:
        """Yield (key, Transcript or Exception) for every item, in completion order.

        Each worker holds up to `TASKS_AHEAD` tasks, so it starts the next one while the driver is still
        writing the outputs of the last."""
        started = time.perf_counter()
        size = max(1, batch_size)
        flat = [(key, str(path)) for key, path in items]
        queue = deque(_Task(tuple(flat[i : i + size])) for i in range(0, len(flat), size))
        load = [0] * len(self.actors)
        running: dict[Any, tuple[int, Any, _Task]] = {}

        def fill() -> None:
            for slot, actor in enumerate(self.actors):
                while queue and load[slot] < TASKS_AHEAD:
                    task = queue.popleft()
                    running[actor.run.remote(task.items)] = (slot, actor, task)
                    load[slot] += 1

        while queue or running:
            fill()
            [ref], _ = self.ray.wait(list(running), num_returns=1)
            slot, actor, task = running.pop(ref)
            if actor is self.actors[slot]:
                load[slot] -= 1
            try:
                name, outcomes, busy = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as exc:
                if actor is self.actors[slot]:  # its other tasks fail too; replace it once
                    self._replace(slot)
                    load[slot] = 0
                yield from self._requeue(task, queue, exc)
                continue
            fill()
            yield from self._delivered(name, outcomes, busy)
        # Reached when the driver asks for more after the last outcome: its writing is counted too.
        self.report.work_s = time.perf_counter() - started

    def _replace(self, slot: int) -> None:
        """A new actor in place of a dead one."""
        self.report.workers_lost += 1
        self.ray.kill(self.actors[slot], no_restart=True)
        self.actors[slot] = self._new_actor()

    def _requeue(self, task: _Task, queue: deque, exc: Exception) -> Iterator[tuple[Any, Exception]]:
        attempts = task.attempts + 1
        if attempts < self.cluster.max_attempts:
            self.report.tasks_retried += 1
            queue.appendleft(_Task(task.items, attempts))  # next free worker: nothing lost, nothing twice
            return
        for key, path in task.items:
            yield key, RuntimeError(f"{path}: its worker died {attempts} times ({_cause(exc)})")

    def _delivered(self, name: str, outcomes, busy: float) -> Iterator[tuple[Any, Any]]:
        report = self.report.workers.setdefault(name, WorkerReport(name))
        report.busy_s += busy
        for key, outcome in outcomes:
            if isinstance(outcome, _Failure):
                yield key, RuntimeError(outcome.message)
                continue
            report.files += 1
            report.audio_s += outcome.duration
            yield key, outcome


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ClusterError(f"--engine ray needs Ray: {INSTALL_HINT}") from exc
    return ray


def _cause(exc: Exception) -> str:
    """The first line of Ray's error text, which starts with the remote cause."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def summary_lines(report: ClusterReport, wall_s: float) -> list[str]:
    """Files, audio hours, wall time and audio-s/s overall and per worker. The rate counts the time while
    the workers were up and had work (starting and stopping them are reported on their own, as the local
    engine's rate leaves out loading the models); `wall_s` stands in where no batch ran to its end."""
    files = sum(w.files for w in report.workers.values())
    audio = sum(w.audio_s for w in report.workers.values())
    working = max(1e-9, report.work_s or wall_s - report.startup_s - report.shutdown_s)
    lines = [f"cluster: {files} file(s), {audio / 3600:.3f} h of audio in {working:.1f} s = {audio / working:.1f} "
             f"audio-s/s over {len(report.workers)} worker process(es), after {report.startup_s:.1f} s to start them"
             f", {report.shutdown_s:.1f} s to stop them"
             + (f"; {report.workers_lost} worker(s) lost, {report.tasks_retried} task(s) retried"
                if report.workers_lost else "")]
    for w in sorted(report.workers.values(), key=lambda w: w.worker):
        rate = w.audio_s / w.busy_s if w.busy_s > 0 else 0.0
        lines.append(f"  {w.worker}: {w.files} file(s), {w.audio_s:.1f} s audio, {rate:.1f} audio-s/s while busy")
    return lines
