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
import os
import threading
import time
from typing import Any

from ray import serve

from asr_app.scheduler import SchedulerMetrics
from asr_app.serve.ray_engine import PUBLISH_EVERY_S, _replica_name

MAX_BATCH = 8
WAIT_S = 0.005


class ServeBatchedReplica:
    def __init__(self, model_args: Any, board: Any = None) -> None:
        from asr_app.arguments import decoder_from_args

        self.decoder = decoder_from_args(model_args)
        self.name = _replica_name()
        self.figures = SchedulerMetrics()
        self._lock = threading.Lock()
        if board is not None:
            threading.Thread(target=self._publish, args=(board,), name="asr-metrics-publisher", daemon=True).start()

    async def decode(self, clip, options, prompt, hint, priority: int, session: str):
        outcome = await self._batched((clip, options, prompt, hint))
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=WAIT_S)
    async def _batched(self, rows: list[tuple]) -> list:
        return await asyncio.to_thread(self._decode_rows, rows)

    def _decode_rows(self, rows: list[tuple]) -> list:
        groups: dict[Any, list[int]] = {}
        for i, (_clip, options, prompt, hint) in enumerate(rows):
            groups.setdefault((options, hint is not None, self.decoder.batch_key(options, prompt)), []).append(i)
        outcomes: list = [None] * len(rows)
        for members in groups.values():
            started = time.perf_counter()
            try:
                results = self.decoder.decode([rows[i][0] for i in members], rows[members[0]][1],
                                              prompts=[rows[i][2] for i in members], hints=[rows[i][3] for i in members])
            except Exception as exc:  # noqa: BLE001 - the group's calls get the error
                results = [exc] * len(members)
            self._count(len(members), time.perf_counter() - started, rows, members, results)
            for i, result in zip(members, results):
                outcomes[i] = result
        return outcomes

    def _count(self, size: int, seconds: float, rows, members, results) -> None:
        with self._lock:
            m = self.figures
            m.batches += 1
            m.rows += size
            m.rows_per_batch[size] = m.rows_per_batch.get(size, 0) + 1
            m.busy_s += seconds
            for i, result in zip(members, results):
                if isinstance(result, BaseException):
                    m.failed += 1
                else:
                    m.audio_s += rows[i][0].size / 16_000
                    m.drafted += result.stats.drafted
                    m.accepted += result.stats.accepted

    def _publish(self, board: Any) -> None:
        pid = os.getpid()
        while True:
            time.sleep(PUBLISH_EVERY_S)
            with self._lock:
                snapshot = SchedulerMetrics(**{k: (dict(v) if isinstance(v, dict) else v)
                                               for k, v in vars(self.figures).items()})
            try:
                board.publish.remote(self.name, pid, snapshot)
            except Exception:  # noqa: BLE001 - the board is gone (shutting down)
                return
