"""Batch transcription on a Ray cluster: the same long-form code path in long-lived worker actors.

Each worker is a Ray actor that builds its decoder once (`make_decoder`, CPU or GPU) and transcribes
the tasks it is handed with `longform.transcribe_many` (up to `batch_size` files per task, decoded
together). The driver keeps up to two tasks queued at each worker, yields every file's outcome as its
task returns and leaves writing to the caller, so outputs are written once, by one process, with the same
atomic writers as a local run.

Every failure ends as an outcome of the files it concerns, never as the batch's end:
- a worker that dies (killed, out of memory, node lost) has its tasks put back at the front of the queue
  for another worker and is replaced; a task whose worker died `max_attempts` times fails with the reason;
- a worker that runs out of memory inside a task (a failed allocation) has the task put back as one task
  per file (a batch may be what did not fit), each failing after `max_attempts` tries;
- any other error raised by a task fails its file (a task of several files is first split, so the others
  still get their transcript);
- a worker that holds one task longer than its time bound (`file_timeout_s` per file plus
  `timeout_per_audio_s` per second of audio) is taken as stuck: it is stopped and replaced, and its tasks
  move to the other workers (the stuck one counted as a try).
Inputs are paths every node can read (a shared filesystem): docs/scale.md.
"""

from __future__ import annotations

import math
import os
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INSTALL_HINT = 'pip install "asr-app[cluster]"'
TASKS_AHEAD = 2  # tasks handed to a worker at once: it never waits for the driver between two
FILE_TIMEOUT_S = 600.0      # a file may take this long on a worker (plus TIMEOUT_PER_AUDIO_S per audio second)
TIMEOUT_PER_AUDIO_S = 4.0   # ... so a long file is not taken for a stuck worker (4x slower than real time)
POLL_S = 5.0                # the longest the driver waits before looking at the time bounds again


class ClusterError(RuntimeError):
    """The cluster cannot run the job: Ray missing or unreachable, or the workers cannot load the models."""


@dataclass(frozen=True)
class ClusterOptions:
    address: str | None = None    # None: start a local Ray instance here (and stop it afterwards)
    num_workers: int = 2
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    max_attempts: int = 3         # a task whose worker died (or ran out of memory, or got stuck) this often fails
    file_timeout_s: float = FILE_TIMEOUT_S          # time bound of a task: this per file ...
    timeout_per_audio_s: float = TIMEOUT_PER_AUDIO_S  # ... plus this per second of its audio

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"--num-workers must be >= 1, got {self.num_workers}")
        if self.gpus_per_worker < 0 or self.cpus_per_worker <= 0:
            raise ValueError("--gpus-per-worker must be >= 0 and CPUs per worker > 0")
        if not self.file_timeout_s > 0 or self.timeout_per_audio_s < 0 or self.max_attempts < 1:
            raise ValueError("--file-timeout must be > 0 (and the per-audio-second bound and attempts positive)")


def ray_device_problem(device: str, gpus: float, flag: str, holder: str) -> str | None:
    """Why `--device` cannot work in a Ray actor reserving `gpus` GPUs (given by `flag`), or None. An actor
    sees only the GPUs it reserved, as cuda:0 onwards: a CUDA device needs a reservation and a reservation
    needs a device that uses it. Both front ends on Ray say it before anything loads, not inside an actor."""
    kind, _, index = device.partition(":")
    if kind == "cuda" and gpus <= 0:
        return f"--device {device} with --engine ray needs {flag} > 0: a {holder} sees only the GPUs it reserves"
    if kind == "cuda" and index.isdigit() and int(index) >= math.ceil(gpus):
        return (f"--device {device}: a {holder} reserving {gpus:g} GPU(s) sees them as cuda:0 to "
                f"cuda:{math.ceil(gpus) - 1}; give --device cuda")
    if device == "cpu" and gpus > 0:
        return f"{flag} reserves GPUs that --device cpu {holder}s would never use"
    return None


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
    timeouts: int = 0         # workers stopped because a task passed its time bound
    task_errors: int = 0      # tasks that raised (out-of-memory ones included)
    startup_s: float = 0.0    # connecting and loading the models in every worker
    work_s: float = 0.0       # from the first task handed out to the last outcome taken by the driver
    shutdown_s: float = 0.0   # stopping the workers (and the local Ray instance, when we started it)


@dataclass(frozen=True)
class _Task:
    items: tuple[tuple[Any, str], ...]   # (key, path)
    attempts: int = 0
    audio_s: float = 0.0                 # the files' audio, for the time bound


@dataclass
class _Slot:
    """One worker place: its actor, the tasks handed to it (in the order it runs them), and since when its
    first task may have been running."""
    actor: Any
    tasks: deque = field(default_factory=deque)   # object refs
    since: float = 0.0
    starting: Any = None     # the ready() ref of an actor still loading its models


class TranscribeWorker:
    """The actor (wrapped by `ray.remote` at run time, so importing this module needs no Ray)."""

    def __init__(self, make_decoder: Callable[[], Any], make_options: Callable[[Any], Any], threads: int,
                 transcribe: Callable | None = None) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.decoder = make_decoder()
        self.options = make_options(self.decoder)
        self.transcribe = transcribe
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
        for key, outcome in (self.transcribe or transcribe_many)(self.decoder, list(items), self.options):
            # Exceptions are sent back as their message: their classes need not unpickle on the driver.
            outcomes.append((key, _Failure(str(outcome)) if isinstance(outcome, Exception) else outcome))
        return self.name, outcomes, time.perf_counter() - started


@dataclass(frozen=True)
class _Failure:
    message: str


class RayTranscriber:
    """Workers on a Ray cluster, for one batch: `with RayTranscriber(...) as t: for key, outcome in t.run(...)`."""

    def __init__(self, make_decoder: Callable[[], Any], make_options: Callable[[Any], Any],
                 cluster: ClusterOptions = ClusterOptions(), transcribe: Callable | None = None) -> None:
        """`transcribe(decoder, items, options)`: what each worker runs its tasks with (the tests' stand-in;
        default `longform.transcribe_many`)."""
        self.ray = import_ray()
        self.cluster = cluster
        self.report = ClusterReport()
        self._started_ray = False
        self._actor_class = self.ray.remote(num_cpus=cluster.cpus_per_worker,
                                            num_gpus=cluster.gpus_per_worker)(TranscribeWorker)
        self._factory = (make_decoder, make_options, max(1, int(cluster.cpus_per_worker)), transcribe)
        started = time.perf_counter()
        self._connect()
        self.slots = [_Slot(self._new_actor()) for _ in range(cluster.num_workers)]
        self._wait_ready()
        self.report.startup_s = time.perf_counter() - started

    @property
    def actors(self) -> list:
        return [slot.actor for slot in self.slots if slot.actor is not None]

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
            # "local": an instance of our own, not a cluster that RAY_ADDRESS or an earlier `ray start` names
            ray.init(address=self.cluster.address or "local", **kwargs)
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
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.slots = []
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
    def run(self, items: Sequence[tuple[Any, str | Path]], batch_size: int = 1,
            durations: dict[Any, float] | None = None) -> Iterator[tuple[Any, Any]]:
        """Yield (key, Transcript or Exception) for every item, in completion order.

        Each worker holds up to `TASKS_AHEAD` tasks, so it starts the next one while the driver is still
        writing the outputs of the last. `durations` (seconds of audio per key; read from the files'
        headers when not given) set each task's time bound."""
        started = time.perf_counter()
        size = max(1, batch_size)
        flat = [(key, str(path)) for key, path in items]
        seconds = durations if durations is not None else {key: _audio_seconds(path) for key, path in flat}
        self._queue = deque(self._task(flat[i : i + size], 0, seconds) for i in range(0, len(flat), size))
        self._seconds = seconds
        self._running: dict[Any, tuple[_Slot, _Task]] = {}
        while self._queue or self._running:
            self._fill()
            if not self._running and not any(slot.starting is not None for slot in self.slots):
                yield from self._fail_queue("no worker is left to run it")
                break
            waiting = list(self._running) + [slot.starting for slot in self.slots if slot.starting is not None]
            done, _ = self.ray.wait(waiting, num_returns=1, timeout=self._poll_s())
            if not done:
                yield from self._stop_stuck_workers()
                continue
            yield from self._take(done[0])
        # Reached when the driver asks for more after the last outcome: its writing is counted too.
        self.report.work_s = time.perf_counter() - started

    def _task(self, items, attempts: int, seconds: dict) -> _Task:
        return _Task(tuple(items), attempts, sum(seconds.get(key, 0.0) for key, _ in items))

    def _bound(self, task: _Task) -> float:
        return len(task.items) * self.cluster.file_timeout_s + self.cluster.timeout_per_audio_s * task.audio_s

    def _fill(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            while self._queue and slot.actor is not None and slot.starting is None and len(slot.tasks) < TASKS_AHEAD:
                task = self._queue.popleft()
                ref = slot.actor.run.remote(task.items)
                if not slot.tasks:
                    slot.since = now
                slot.tasks.append(ref)
                self._running[ref] = (slot, task)

    def _poll_s(self) -> float:
        """Until the first running task passes its time bound (at most POLL_S)."""
        now, wait = time.monotonic(), POLL_S
        for slot in self.slots:
            if slot.tasks:
                wait = min(wait, slot.since + self._bound(self._running[slot.tasks[0]][1]) - now)
        return max(0.01, wait)

    def _take(self, ref) -> Iterator[tuple[Any, Any]]:
        """One finished ref: a worker that finished loading, or a task's outcomes (or its failure)."""
        starting = next((slot for slot in self.slots if slot.starting == ref), None)
        if starting is not None:
            self._started(starting, ref)
            return
        slot, task = self._running[ref]
        ray = self.ray
        try:
            name, outcomes, busy = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError,
                ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
            # The worker is gone (Ray's memory monitor kills a worker with OutOfMemoryError): its tasks move.
            split = isinstance(exc, ray.exceptions.OutOfMemoryError) or _is_memory(exc)
            yield from self._lose_worker(slot, f"its worker died ({_cause(exc)})", split=split)
            return
        except Exception as exc:  # noqa: BLE001 - the task raised: its files fail or go again, not the batch
            self._finished(slot, ref)
            self.report.task_errors += 1
            yield from self._task_failed(task, getattr(exc, "cause", None) or exc)
            return
        self._finished(slot, ref)
        self._fill()
        yield from self._delivered(task, name, outcomes, busy)

    def _finished(self, slot: _Slot, ref) -> None:
        del self._running[ref]
        slot.tasks.remove(ref)
        slot.since = time.monotonic()  # its next task starts now

    def _started(self, slot: _Slot, ref) -> None:
        """A replacement worker finished loading the models (its slot takes tasks again), or could not."""
        slot.starting = None
        try:
            self.ray.get(ref)
        except Exception:  # noqa: BLE001 - the models no longer load there: the slot stays empty
            self.ray.kill(slot.actor, no_restart=True)
            slot.actor = None

    def _task_failed(self, task: _Task, cause: BaseException) -> Iterator[tuple[Any, Any]]:
        """A task raised `cause`: out of memory -> its files again, one task each; else the error is its
        files' (a task of several files is split first, so only the file that raises fails)."""
        if isinstance(cause, MemoryError) or _is_memory(cause):
            yield from self._retry(task, f"out of memory ({_cause(cause)})", split=True)
        elif len(task.items) > 1:
            self._queue.extendleft(reversed([self._task([item], task.attempts, self._seconds) for item in task.items]))
        else:
            yield from self._fail(task, f"{type(cause).__name__}: {_cause(cause)}")

    def _lose_worker(self, slot: _Slot, reason: str, split: bool = False) -> Iterator:
        """The worker of `slot` is dead or stuck: stop it, start another, put its tasks back (the one it was
        running, the first, counted as a try; the ones waiting behind it as they were)."""
        task, *others = [self._running.pop(ref)[1] for ref in slot.tasks]
        slot.tasks.clear()
        self.report.workers_lost += 1
        self.report.tasks_retried += len(others)
        self._queue.extendleft(reversed(others))
        self.ray.kill(slot.actor, no_restart=True)
        slot.actor = self._new_actor()
        slot.starting = slot.actor.ready.remote()
        yield from self._retry(task, reason, split=split)

    def _retry(self, task: _Task, reason: str, split: bool = False) -> Iterator[tuple[Any, Any]]:
        attempts = task.attempts + 1
        if attempts >= self.cluster.max_attempts:
            yield from self._fail(task, f"{reason}; gave up after {attempts} tries")
            return
        self.report.tasks_retried += 1
        parts = [[item] for item in task.items] if split else [list(task.items)]
        # The front of the queue: the next free worker takes it; nothing lost, nothing twice.
        self._queue.extendleft(reversed([self._task(part, attempts, self._seconds) for part in parts]))

    def _stop_stuck_workers(self) -> Iterator[tuple[Any, Any]]:
        now = time.monotonic()
        for slot in self.slots:
            if slot.tasks:
                task = self._running[slot.tasks[0]][1]
                bound = self._bound(task)
                if now - slot.since > bound:
                    self.report.timeouts += 1
                    yield from self._lose_worker(slot, f"its worker was stuck (no result in {bound:.0f} s)")

    def _fail(self, task: _Task, reason: str) -> Iterator[tuple[Any, Exception]]:
        for key, path in task.items:
            yield key, RuntimeError(f"{path}: {reason}")

    def _fail_queue(self, reason: str) -> Iterator[tuple[Any, Exception]]:
        while self._queue:
            yield from self._fail(self._queue.popleft(), reason)

    def _delivered(self, task: _Task, name: str, outcomes, busy: float) -> Iterator[tuple[Any, Any]]:
        """The outcomes of a task; a file that ran out of memory goes again alone (another worker may have the
        memory free), up to `max_attempts` tries."""
        report = self.report.workers.setdefault(name, WorkerReport(name))
        report.busy_s += busy
        paths = dict(task.items)
        for key, outcome in outcomes:
            if isinstance(outcome, _Failure) and _is_memory(outcome.message) and key in paths:
                yield from self._retry(_Task(((key, paths[key]),), task.attempts, self._seconds.get(key, 0.0)),
                                       outcome.message.removeprefix(f"{paths[key]}: "))
                continue
            if isinstance(outcome, _Failure):
                yield key, RuntimeError(outcome.message)
                continue
            report.files += 1
            report.audio_s += outcome.duration
            yield key, outcome


def _is_memory(exc: BaseException) -> bool:
    """An out-of-memory error by its text (torch's CUDA and CPU allocators, Ray's memory monitor)."""
    return bool(re.search(r"out of memory|(can't|cannot) allocate memory|\bOOM\b|memory pressure", str(exc),
                          re.IGNORECASE))


def _audio_seconds(path: str) -> float:
    """The audio's length from the file's header (0 when unreadable: the worker reports that)."""
    try:
        import soundfile

        return float(soundfile.info(path).duration)
    except Exception:  # noqa: BLE001
        return 0.0


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
             + (f"; {report.workers_lost} worker(s) lost ({report.timeouts} stuck), {report.task_errors} task "
                f"error(s), {report.tasks_retried} task(s) retried"
                if report.workers_lost or report.task_errors or report.tasks_retried else "")]
    for w in sorted(report.workers.values(), key=lambda w: w.worker):
        rate = w.audio_s / w.busy_s if w.busy_s > 0 else 0.0
        lines.append(f"  {w.worker}: {w.files} file(s), {w.audio_s:.1f} s audio, {rate:.1f} audio-s/s while busy")
    return lines
