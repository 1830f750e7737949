"""The alternative way for a decoder replica to batch (`asr-serve --engine ray --replica-batching serve`):
Ray Serve's own `@serve.batch` instead of the serving scheduler (docs/scale.md compares the two).

`@serve.batch` hands the method the calls that arrived within a short wait, up to a size, in arrival order.
It does not know which rows can run in one lock-step batch, so the rows are grouped here by what must be
equal (options, prompt length, a hint or none) and each group is decoded in turn; it has no priorities
(live rows wait behind file windows) and no per-session fairness. Imported only when chosen: it needs Ray
Serve at import time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

from ray import serve

from asr_app.decoding.hints import as_hint
from asr_app.decoding.seeds import batch_options
from asr_app.decoding.workspaces import keep_workspaces, workspace_stats
from asr_app.scheduler import PRIORITY_NAMES, SchedulerOptions
from asr_app.scheduler_metrics import RecentLatencies, SchedulerMetrics
from asr_app.serve.ray_engine import publish_metrics, replica_decoder

MAX_BATCH = 8
WAIT_S = 0.005


class ServeBatchedReplica:
    def __init__(self, model_args: Any, board: Any = None) -> None:
        self.decoder = replica_decoder(model_args)
        keep_workspaces(self.decoder, 2 * MAX_BATCH)   # Serve's batches: any size up to MAX_BATCH, drafts or not
        self._start_figures()
        if board is not None:
            publish_metrics(board, self.snapshot)

    def _start_figures(self) -> None:
        """The figures the serving scheduler keeps, kept here too, so /metrics reads the same either way."""
        self.figures = SchedulerMetrics()
        self._lock = threading.Lock()
        self._in_flight = 0   # rows waiting for or in a batch (the scheduler's queue depth counts waiting rows only)
        self._latencies = RecentLatencies(SchedulerOptions().latency_window, PRIORITY_NAMES.values())

    async def decode(self, clip, options, prompt, hint, priority: int, session: str):
        started = time.monotonic()
        with self._lock:
            self._in_flight += 1
        try:
            outcome = await self._batched((clip, options, prompt, as_hint(hint)))   # [] is no hint, as the scheduler reads it
        finally:
            with self._lock:
                self._in_flight -= 1
        with self._lock:   # waiting plus decoding, failed rows too, as the scheduler counts a row's latency
            self._latencies.record(PRIORITY_NAMES[priority], time.monotonic() - started)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=WAIT_S)
    async def _batched(self, rows: list[tuple]) -> list:
        return await asyncio.to_thread(self._decode_rows, rows)

    def _decode_rows(self, rows: list[tuple]) -> list:
        groups: dict[Any, list[int]] = {}
        for i, (_clip, options, prompt, hint) in enumerate(rows):
            key = (batch_options(options), hint is not None, self.decoder.batch_key(options, prompt))
            groups.setdefault(key, []).append(i)
        outcomes: list = [None] * len(rows)
        for members in groups.values():
            started = time.perf_counter()
            try:
                results = self.decoder.decode([rows[i][0] for i in members], rows[members[0]][1],
                                              prompts=[rows[i][2] for i in members], hints=[rows[i][3] for i in members])
            except Exception as exc:  # noqa: BLE001 - the group's calls get the error
                results = [exc] * len(members)
            stats = workspace_stats(self.decoder)
            with self._lock:
                self.figures.count_batch([rows[i][0] for i in members], results, time.perf_counter() - started)
                self.figures.note_workspaces(stats)
            for i, result in zip(members, results):
                outcomes[i] = result
        return outcomes

    def snapshot(self) -> SchedulerMetrics:
        with self._lock:
            count, total = self._latencies.totals()
            return dataclasses.replace(self.figures, rows_per_batch=dict(self.figures.rows_per_batch),
                                       queue_depth=self._in_flight, latencies=self._latencies.snapshot(),
                                       latency_count=count, latency_sum=total, sizer={})
