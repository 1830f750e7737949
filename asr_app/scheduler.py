"""One queue per device: every decode request (a live re-decode, a file's window, an API call) becomes a
row of a shared batch, decoded by one worker thread through the one `SpeculativeDecoder`.

Front ends never lock the model. They hold a `ScheduledDecoder` (the `Decoder` interface,
decoding/protocol.py) whose `decode` submits one request per clip and waits for the results; the
pipelines above it (streaming, long-form) do not know they share a device.

How the worker picks a batch (docs/serving.md):
- priority first: live re-decodes before file and API windows (a person is waiting on each word);
- fairness: one request per session per round; a session's further requests wait until every other
  session with work has had one;
- compatibility: rows of one batch share their decoding options (mode, temperature, language, task,
  timestamps, word timing), the length of their prompts (the decoder's caches have one length) and
  whether they carry a hint; the rest wait for a later batch;
- size: the number of rows whose measured time per row is lowest on this device (`BatchSizer`); a size is
  tried only while the sizes below it kept paying, so a batch is never kept larger than its measured
  break-even. Each kind of work has its own sizer (`cost_class`: live or file, mode, encoder context,
  hints): a live re-decode costs a fraction of a file's window, and one sizer for both would compare a
  size measured on the one with a size measured on the other. On a 2-core CPU this settles on small batches (the encoder over a 30 s window dominates);
  on a GPU, where a one-row step leaves the device idle, on large ones;
- gathering: while file rows are still arriving and fewer are ready than batching pays for, the worker
  waits up to `gather_s` for more (`Scheduler._gather`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from asr_app.batch_sizer import BatchSizer
from asr_app.decoding.hints import as_hint
from asr_app.decoding.options import SPECULATIVE_MODES, DecodingOptions, DecodingResult, DecodingStats
from asr_app.decoding.seeds import batch_options
from asr_app.decoding.workspaces import keep_workspaces, workspace_stats
from asr_app.scheduler_metrics import BatchSample, RecentLatencies, SchedulerMetrics

log = logging.getLogger(__name__)

LIVE = 0   # priorities: lower is served first
FILE = 1
PRIORITY_NAMES = {LIVE: "live", FILE: "file"}


class SchedulerBusy(RuntimeError):
    """The queue is full: the caller should say "busy" rather than wait."""


class ClientGone(ConnectionAbortedError):
    """The caller of a request went away (its `cancelled` event was set): its queued rows are dropped."""


class SchedulerClosed(RuntimeError):
    """The scheduler was shut down; no more requests are taken."""


@dataclass(frozen=True)
class SchedulerOptions:
    max_rows: int | None = None     # largest batch tried; None: 8 on a CPU, 32 on a GPU
    max_queue: int = 512            # waiting requests beyond this are refused with SchedulerBusy
    sizer_memory: float = 0.2       # weight of a new measurement in a size's running cost
    sizer_retry_after: int = 64     # batches after which a size judged dearer is measured once more
    latency_window: int = 2048      # recent request latencies kept for the metrics
    idle_trim_s: float | None = 2.0  # idle this long after work: freed memory goes back to the system (None: never)
    gather_s: float | None = 0.05   # longest a batch of file rows waits for more that are arriving (None: never)


class _Choice(NamedTuple):
    """What a batch's size was chosen from: its cost class, the rows ready, the sizer's costs per size."""

    kind: str
    ready: int
    costs: dict[int, float]


@dataclass(eq=False)   # compared by identity: a request holds arrays
class _Request:
    clip: np.ndarray
    options: DecodingOptions
    prompt: Any
    hint: Sequence[int] | None
    priority: int
    session: str
    future: Future
    key: Any = None                 # rows with equal keys can share a lock-step batch
    submitted: float = field(default_factory=time.monotonic)
    order: int = 0


class Scheduler:
    """Owns the decoder: one worker thread decodes the queued requests in batches (see the module doc)."""

    def __init__(self, decoder, options: SchedulerOptions = SchedulerOptions()) -> None:
        self.decoder = decoder
        self.options = options
        cuda = getattr(getattr(decoder.pair, "device", None), "type", "cpu") == "cuda"
        self._max_rows = options.max_rows or (32 if cuda else 8)
        # room for every batch size it forms, with drafts and without: none is recaptured in turn
        keep_workspaces(decoder, 2 * len(BatchSizer(self._max_rows).sizes))
        self._sizers: dict[str, BatchSizer] = {}   # cost class -> its sizer
        self._queue: list[_Request] = []
        self._cond = threading.Condition()
        self._order = itertools.count()
        self._served: dict[str, int] = {}   # session -> round it was last served in
        self._round = 0
        self._held = 0
        self._closed = False
        self._metrics = SchedulerMetrics()
        self._untrimmed = False   # work was done since memory was last given back
        # the last two file requests: when each came, and whether the one before it was still waiting then
        self._file_arrivals: deque[tuple[float, bool]] = deque(maxlen=2)
        self._last_file: weakref.ref[Future] | None = None   # weak: a result and its traceback are the caller's
        self._latencies = RecentLatencies(options.latency_window, PRIORITY_NAMES.values())
        self._worker = threading.Thread(target=self._run, name="asr-scheduler", daemon=True)
        self._worker.start()

    # -- the callers' side -------------------------------------------------------------------
    @property
    def pair(self):
        return self.decoder.pair

    def submit(self, clip: np.ndarray, options: DecodingOptions, prompt: Any = None,
               hint: Sequence[int] | None = None, *, priority: int = FILE, session: str = "") -> Future:
        """Queue one clip (16 kHz mono float32, at most 30 s); the future holds its DecodingResult."""
        future: Future = Future()
        hint = as_hint(hint)
        key = (batch_options(options), hint is not None, self._rows_key(options, prompt))
        with self._cond:
            if self._closed:
                raise SchedulerClosed("the decoder is shutting down")
            if len(self._queue) >= self.options.max_queue:
                raise SchedulerBusy(f"the decoder has {len(self._queue)} requests waiting; try again shortly")
            self._queue.append(_Request(clip, options, prompt, hint, priority, session, future, key,
                                        order=next(self._order)))
            if priority == FILE:
                earlier = self._last_file() if self._last_file is not None else None
                overlapped = earlier is not None and not earlier.done()   # a future nobody holds was done with
                self._file_arrivals.append((time.monotonic(), overlapped))
                self._last_file = weakref.ref(future)
            self._cond.notify_all()
        return future

    def _rows_key(self, options: DecodingOptions, prompt: Any) -> Any:
        """What else rows must share to run in one lock-step batch: the decoder's say (prompts of one length;
        rows that differ are decoded one group after the other, which only delays the first group)."""
        batch_key = getattr(self.decoder, "batch_key", None)
        return batch_key(options, prompt) if batch_key is not None else None

    def client(self, options: DecodingOptions | None = None, *, priority: int = FILE, session: str = "",
               timeout_s: float | None = None, cancelled: threading.Event | None = None) -> ScheduledDecoder:
        return ScheduledDecoder(self, options or self.decoder.options, priority, session, timeout_s, cancelled)

    def cancel(self, future: Future) -> bool:
        """Drop a request that has not started (a caller that gave up); False once it is decoding."""
        with self._cond:
            for request in self._queue:
                if request.future is future:
                    self._queue.remove(request)
                    future.cancel()
                    return True
        return False

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the worker from starting new batches (tests: "the model is busy elsewhere")."""
        with self._cond:
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()

    def warm_up(self, clip: np.ndarray, options: Sequence[DecodingOptions]) -> int:
        """Before serving, where steps are captured (a GPU): decode `clip` in a batch of every size this
        scheduler forms with each of `options`, so the first requests at a size with those options do not wait
        while its workspace is made and its steps captured (about 0.5 s a row on an H100's first batch of two).
        A size that fails (out of memory) ends it: batches stay below that size. Returns the decodes made: none
        where steps run eagerly (a CPU)."""
        if getattr(self.decoder, "graph_mode", "eager") == "eager":
            return 0
        # a workspace per (size, drafts or not): warm only the sizes a bound the user fixed has room for
        per_size = len({opts.mode in SPECULATIVE_MODES for opts in options}) or 1
        sizes = BatchSizer(self._max_rows).sizes[: workspace_stats(self.decoder).max_workspaces // per_size]
        with self._cond:   # checked and held at once: the worker starts nothing while this thread decodes
            if self._queue or self._metrics.batches:
                raise RuntimeError("warm_up() is for a scheduler that has not served yet")
            self._held += 1
        made = 0
        try:
            for size in sizes:
                try:
                    for opts in options:
                        self.decoder.decode([clip] * size, opts)
                        made += 1
                except RuntimeError as exc:   # CUDA out of memory, most likely: serve with the sizes that fit
                    log.warning("warm-up stopped at %d rows (%s): batches stay below it", size, exc)
                    self._max_rows = max(1, size // 2)
                    break
        finally:
            stats = workspace_stats(self.decoder)
            with self._cond:
                self._metrics.note_workspaces(stats)
                self._held -= 1
                self._cond.notify_all()
        return made

    def metrics(self) -> SchedulerMetrics:
        with self._cond:   # a copy: every figure as kept, the mutable ones copied, the queue read now
            count, total = self._latencies.totals()
            return dataclasses.replace(
                self._metrics, queue_depth=len(self._queue), rows_per_batch=dict(self._metrics.rows_per_batch),
                choices=self._metrics.copy_choices(), samples=list(self._metrics.samples),
                latencies=self._latencies.snapshot(), latency_count=count, latency_sum=total,
                sizer={kind: sizer.snapshot() for kind, sizer in sorted(self._sizers.items())})

    def sizer(self, kind: str) -> BatchSizer:
        """The batch sizer of one cost class (`cost_class`), made on first use."""
        with self._cond:   # a re-entrant lock: the worker already holds it where it calls this
            if kind not in self._sizers:
                self._sizers[kind] = BatchSizer(self._max_rows, self.options.sizer_memory,
                                                   retry_after=self.options.sizer_retry_after)
            return self._sizers[kind]

    def close(self, timeout: float | None = 10.0) -> None:
        """Refuse new requests, fail the waiting ones, let the running batch finish."""
        with self._cond:
            self._closed = True
            waiting, self._queue = self._queue, []
            self._cond.notify_all()
        for request in waiting:
            request.future.set_exception(SchedulerClosed("the decoder is shutting down"))
        self._worker.join(timeout)

    # -- the worker ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch: list[_Request] = []
            choice = _Choice("", 0, {})
            try:
                with self._cond:
                    idle = self.options.idle_trim_s if self._untrimmed else None
                    if not self._cond.wait_for(lambda: self._closed or (self._queue and not self._held), idle):
                        self._untrimmed = False   # idle since the last batch: trim once, outside the lock
                    elif self._closed:
                        return
                    else:
                        self._gather()
                        self._drop_cancelled()
                        if not self._queue or self._held or self._closed:   # changed while it waited
                            continue
                        batch, choice = self._take_batch()
                        self._untrimmed = True
                if not batch:
                    self._give_back_memory()
                    continue
                self._decode(batch, choice)
            except Exception as exc:  # noqa: BLE001 - the worker must outlive any one batch
                log.exception("scheduler: a batch failed outside the decoder")
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)

    def _give_back_memory(self) -> None:
        """The resident size would otherwise stay at the largest batch's working set (glibc keeps freed
        memory); only after `idle_trim_s` without work, so a busy server never pays for it."""
        from asr_app.runtime.allocator import release_freed_memory
        if release_freed_memory():
            with self._cond:
                self._metrics.trims += 1

    def _gather(self) -> None:
        """Called under the lock. File rows are still arriving (two came within `gather_s`, the later one within
        `gather_s` of now and while the earlier still waited: not one caller's requests in turn) and fewer are
        ready than batching has paid for on this device: wait up to `gather_s` for more. The worker idles
        meanwhile, which leaves the CPU to the threads still reading those uploads; a lone request, live
        rows, and a device where batching does not pay never wait."""
        window = self.options.gather_s
        began, waited = time.monotonic(), False
        while window and not self._closed and not self._held and self._queue:
            compatible = self._candidates()
            now = time.monotonic()
            stop = min(began + window, self._arriving_until(window))
            wanted = self.sizer(cost_class(compatible[0])).choose(2 * len(compatible), retry=False) > len(compatible)
            if compatible[0].priority != FILE or not wanted or stop <= now:
                break
            self._cond.wait(stop - now)
            waited = True
        if waited:
            self._metrics.gathers += 1
            self._metrics.gather_s += time.monotonic() - began

    def _arriving_until(self, window: float) -> float:
        """Until when file rows count as still arriving (see `_gather`); 0 when they do not."""
        if len(self._file_arrivals) < 2:
            return 0.0
        (first, _), (last, overlapped) = self._file_arrivals
        # Callers at once: the later request came while the one before it still waited for its result. A caller
        # that sends its requests in turn, each once the one before is answered (one file's windows, or an API
        # client's requests, each its own session), never overlaps itself, however close together they come
        # (a cancelled request counts as answered). Several clips in one call do overlap. And where
        # requests come further apart than a decode takes, waiting for more would only idle the device.
        return last + window if last - first <= window and overlapped else 0.0

    def _drop_cancelled(self) -> None:
        """Called under the lock: requests whose callers cancelled their futures leave the queue before a
        batch is sized, so the batch keeps the size chosen (a workspace per size, docs/serving.md)."""
        self._queue = [r for r in self._queue if not r.future.cancelled()]

    def _candidates(self) -> list[_Request]:
        """Called under the lock: the requests that can join the next batch, its head first."""
        def rank(r: _Request) -> tuple:
            # Sessions served in an earlier round come first; within a round, priority then arrival.
            return (r.priority, self._served.get(r.session, -1), r.order)

        ordered = sorted(self._queue, key=rank)
        head = ordered[0]
        compatible, sessions = [], set()
        for request in ordered:
            if request.key != head.key or request.priority != head.priority:
                continue
            if request.session in sessions and request.session:
                continue   # one row per session per batch: the others get theirs first
            compatible.append(request)
            sessions.add(request.session)
        return compatible

    def _take_batch(self) -> tuple[list[_Request], _Choice]:
        """Called under the lock: the next batch, removed from the queue (see the module doc), and what its size
        was chosen from."""
        compatible = self._candidates()
        head = compatible[0]
        kind = cost_class(head)
        sizer = self.sizer(kind)
        batch = compatible[: sizer.choose(len(compatible))]
        self._metrics.note_choice(kind, len(compatible), len(batch), 2 * self._max_rows)
        for request in batch:
            self._queue.remove(request)
            self._served[request.session] = self._round
        self._round += 1
        if len(self._served) > 4 * self.options.max_queue:   # forget sessions long gone (bounded memory)
            live = {r.session for r in self._queue}
            self._served = {s: k for s, k in self._served.items() if s in live}
        return batch, _Choice(kind, len(compatible), sizer.snapshot())

    def _decode(self, batch: list[_Request], choice: _Choice) -> None:
        batch = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not batch:
            return
        before = workspace_stats(self.decoder)
        started, cpu_started = time.perf_counter(), time.thread_time()
        outcomes, together = self._outcomes(batch)
        elapsed, cpu_s = time.perf_counter() - started, time.thread_time() - cpu_started
        now = time.monotonic()
        after = workspace_stats(self.decoder)
        # One-time work (captures) is left out of the batch's cost only while nothing was dropped: what comes
        # back after a drop is captured again, a cost of batching at these sizes the sizer must see.
        one_time_s = _one_time_s(outcomes) if before is None or after.dropped == before.dropped else 0.0
        with self._cond:   # metrics() copies the sizers' costs under this lock
            self._metrics.note_workspaces(after)
            loop_s = None   # a batch redone row by row after a failure says nothing of what a batch costs
            if together:
                loop_s, steps = _loop_figures(outcomes)
                self.sizer(cost_class(batch[0])).record(len(batch), max(0.0, elapsed - one_time_s), loop_s, steps)
            self._metrics.count_batch([r.clip for r in batch], outcomes, elapsed)
            self._metrics.note_sample(self._sample(batch, outcomes, choice, elapsed, cpu_s, one_time_s, loop_s))
            for request in batch:
                self._latencies.record(PRIORITY_NAMES[request.priority], now - request.submitted)
        for request, outcome in zip(batch, outcomes):
            if isinstance(outcome, BaseException):
                request.future.set_exception(outcome)
            else:
                request.future.set_result(outcome)

    def _sample(self, batch: list[_Request], outcomes: list, choice: _Choice, elapsed: float, cpu_s: float,
                one_time_s: float, loop_s: float | None) -> BatchSample:
        """Called under the lock, after `count_batch`: the batch's sample (SchedulerMetrics.samples)."""
        decode_s, encoder_s, calls = _sample_figures(outcomes)
        return BatchSample(batch=self._metrics.batches, kind=choice.kind, ready=choice.ready, rows=len(batch),
                           costs=choice.costs, wall_s=elapsed, cpu_s=cpu_s, one_time_s=one_time_s,
                           decode_s=decode_s, encoder_s=encoder_s, loop_s=loop_s, target_calls=calls)

    def _outcomes(self, batch: list[_Request]) -> tuple[list[DecodingResult | BaseException], bool]:
        """Results of the batch in one decode; if it fails, row by row, so a bad row fails alone. The flag:
        whether they came from one decode of the whole batch."""
        options = batch[0].options
        try:
            return list(self.decoder.decode([r.clip for r in batch], options, prompts=[r.prompt for r in batch],
                                            hints=[r.hint for r in batch])), True
        except Exception as exc:  # noqa: BLE001 - retried per row below
            if len(batch) == 1:
                log.info("decode failed: %s: %s", type(exc).__name__, exc)
                return [exc], False
        outcomes: list[DecodingResult | BaseException] = []
        for r in batch:
            try:
                outcomes.append(self.decoder.decode([r.clip], options, prompts=[r.prompt], hints=[r.hint])[0])
            except Exception as exc:  # noqa: BLE001
                outcomes.append(exc)
        return outcomes, False


def cost_class(request: _Request) -> str:
    """What a row's cost depends on beyond its audio, as the batch sizers tell work apart: live or file
    (a re-decode of a few seconds against a whole window), the mode (drafts or none), an encoder over the
    buffer's own frames (`encoder_context_s`), and hints (a re-decode that re-proposes its last words)."""
    options = request.options
    parts = [PRIORITY_NAMES.get(request.priority, str(request.priority)), options.mode]
    if options.encoder_context_s is not None:
        parts.append("context")
    if request.hint is not None:
        parts.append("hint")
    return " ".join(parts)


def _sample_figures(outcomes: list[DecodingResult | BaseException]) -> tuple[float, float, int]:
    """(decoder total s, encoder s, most target calls) of one batch's rows (zeros where none decoded)."""
    results = [o.stats for o in outcomes if isinstance(o, DecodingResult)]
    return (max((r.total_s for r in results), default=0.0), max((r.encoder_s for r in results), default=0.0),
            max((r.target_calls for r in results), default=0))


def _loop_figures(outcomes: list[DecodingResult | BaseException]) -> tuple[float | None, int | None]:
    """The token loop's seconds in one decode of a batch (its rows report the same figure) and the steps its
    rows made (their tokens, the end included; a row that wrote nothing still took one step). None where
    the rows' figures are not one decode's: a failed row, or a row whose shortened decode was done again
    (`context_retries`), whose figures add those of every decode it took."""
    results = [o for o in outcomes if isinstance(o, DecodingResult)]
    if len(results) != len(outcomes) or not results or any(r.stats.context_retries for r in results):
        return None, None
    return results[0].stats.loop_s, sum(max(r.stats.tokens_out, 1) for r in results)


def _one_time_s(outcomes: list[DecodingResult | BaseException]) -> float:
    """What one decode of a batch spent on work it does once per shape (cost timing, graph captures): not a
    per-row cost. Every row of one decode reports the same figure."""
    return max((o.stats.setup_s for o in outcomes if isinstance(o, DecodingResult)), default=0.0)


CANCEL_POLL_S = 0.2   # how often a waiting request looks at its `cancelled` event


class ScheduledDecoder:
    """A caller's view of the scheduler with its own options (the `Decoder` interface): `decode` queues one
    request per clip and waits for them, at most `timeout_s` per call. `cancelled`: set when the caller's own
    client went away (a server's); a waiting call then drops its rows and raises `ClientGone`, and no further
    call queues any. `usage` sums this caller's decodes (a running total: bounded)."""

    def __init__(self, scheduler: Scheduler, options: DecodingOptions, priority: int, session: str,
                 timeout_s: float | None, cancelled: threading.Event | None = None) -> None:
        self.scheduler = scheduler
        self._options = options
        self.priority = priority
        self.session = session
        self.timeout_s = timeout_s
        self.cancelled = cancelled
        self.usage: DecodingStats | None = None

    @property
    def pair(self):
        return self.scheduler.pair

    @property
    def options(self) -> DecodingOptions:
        return self._options

    def decode(self, audio, options: DecodingOptions | None = None, prompts=None, hints=None) -> list[DecodingResult]:
        if isinstance(audio, np.ndarray) and audio.ndim != 1:
            raise ValueError(f"expected mono samples of shape (N,) or a list of clips, got an array of shape "
                             f"{tuple(audio.shape)}; downmix and resample first (asr_app.audio.prepare_audio)")
        clips = [audio] if isinstance(audio, np.ndarray) else list(audio)
        if not clips:
            raise ValueError("no audio given: pass one clip or a non-empty list of clips")
        prompts = prompts if prompts is not None else [None] * len(clips)
        hints = hints if hints is not None else [None] * len(clips)
        if len(prompts) != len(clips) or len(hints) != len(clips):
            raise ValueError(f"got {len(prompts)} prompts and {len(hints)} hints for {len(clips)} clips")
        opts = options or self._options
        self._check_cancelled()
        futures = [self.scheduler.submit(np.asarray(clip, dtype=np.float32), opts, p, h, priority=self.priority,
                                         session=self.session)
                   for clip, p, h in zip(clips, prompts, hints)]
        # One deadline for the whole call, and a call that fails takes its queued rows with it: nobody will
        # read them, so they must not take decoder time from others.
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        try:
            results = [self._wait(f, deadline) for f in futures]
        except BaseException:
            for future in futures:
                self.scheduler.cancel(future)
            raise
        parts = ([self.usage] if self.usage is not None else []) + [r.stats for r in results]
        self.usage = DecodingStats.total(parts)
        return results

    def _wait(self, future: Future, deadline: float | None) -> DecodingResult:
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self.cancelled is not None:
                remaining = CANCEL_POLL_S if remaining is None else min(remaining, CANCEL_POLL_S)
            try:
                return future.result(remaining)
            except TimeoutError:
                if future.done():   # it finished after all, or the decode itself raised a TimeoutError: its outcome
                    return future.result()
            self._check_cancelled()
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no decoder time within {self.timeout_s:g} s (the server is overloaded)") from None

    def _check_cancelled(self) -> None:
        if self.cancelled is not None and self.cancelled.is_set():
            raise ClientGone("the client went away")
