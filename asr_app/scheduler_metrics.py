"""What the scheduler reports (/metrics, the benches): counters of batches, rows, time and drafts, the
decoder's workspace figures, and recent request latencies per kind of request."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from asr_app.decoding.workspaces import WorkspaceStats


class RecentLatencies:
    """The latest request latencies per kind of request ("live", "file"), a bounded window each (what
    /metrics reports). Not locked: its owner records and reads it under its own lock."""

    def __init__(self, window: int, kinds: Iterable[str]) -> None:
        self._by_kind = {kind: deque(maxlen=window) for kind in kinds}
        self._count = dict.fromkeys(self._by_kind, 0)     # every request ever, for counters that only grow
        self._sum = dict.fromkeys(self._by_kind, 0.0)

    def record(self, kind: str, seconds: float) -> None:
        self._by_kind[kind].append(seconds)
        self._count[kind] += 1
        self._sum[kind] += seconds

    def snapshot(self) -> dict[str, list[float]]:
        return {kind: list(values) for kind, values in self._by_kind.items()}

    def totals(self) -> tuple[dict[str, int], dict[str, float]]:
        """(requests, their summed seconds) per kind, since the start."""
        return dict(self._count), dict(self._sum)


SAMPLES_KEPT = 512   # the latest batches' samples (SchedulerMetrics.samples)


@dataclass(frozen=True)
class BatchSample:
    """One decoded batch as the scheduler timed it: what its size was chosen from and where its time went. The
    benches save the latest ones, so that a run on another device says why a batch size won or lost."""

    batch: int                 # its number since the start (SchedulerMetrics.batches after it)
    kind: str                  # its cost class (scheduler.cost_class)
    ready: int                 # rows that could have joined it
    rows: int
    costs: dict[int, float]    # the sizer's seconds per row by batch size when it chose
    wall_s: float              # the whole batch, one-time work included
    # The worker thread's CPU time over it: the rest of wall_s it waited, for other threads (the interpreter
    # lock) or a device that blocks. A CUDA sync may spin, so on a GPU device waits can count as CPU time too.
    cpu_s: float
    one_time_s: float          # left out of what the sizer recorded (graph captures, cost timing)
    decode_s: float            # the decoder's own total (features and word timing are outside it)
    encoder_s: float
    loop_s: float | None       # None where the rows' figures are not one decode's
    target_calls: int          # the most any row made


@dataclass
class SchedulerMetrics:
    """What /metrics and the benches read (a consistent copy, see `Scheduler.metrics`)."""

    queue_depth: int = 0
    batches: int = 0
    rows: int = 0
    rows_per_batch: dict[int, int] = field(default_factory=dict)   # batch size -> batches of that size
    failed: int = 0
    busy_s: float = 0.0
    audio_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    latencies: dict[str, list[float]] = field(default_factory=dict)  # priority name -> recent seconds
    latency_count: dict[str, int] = field(default_factory=dict)    # priority name -> requests since the start
    latency_sum: dict[str, float] = field(default_factory=dict)    # ... and their summed seconds
    sizer: dict[str, dict[int, float]] = field(default_factory=dict)   # cost class -> batch size -> s per row
    # cost class -> rows that could have joined the batch -> rows the sizer took -> batches: what each batch size
    # was chosen from (ready counts above the largest batch's twice are counted there: the dict stays small)
    choices: dict[str, dict[int, dict[int, int]]] = field(default_factory=dict)
    # The latest batches': a bounded deque where the scheduler notes them, a list in copies and Ray's sums.
    samples: deque[BatchSample] | list[BatchSample] = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))
    resent: int = 0      # rows sent again after the decoder replica holding them was lost (--engine ray)
    trims: int = 0       # times freed memory was given back to the system after an idle spell
    gathers: int = 0     # batches that waited for more file rows arriving (SchedulerOptions.gather_s)
    gather_s: float = 0.0  # the time they waited, in all
    # Where steps are captured (a GPU): workspaces held and the rows they have room for, workspaces and graphs
    # dropped to make room, graph captures made (decoding/workspaces.py)
    workspaces: int = 0
    workspace_rows: int = 0
    workspace_evictions: int = 0
    graph_evictions: int = 0
    graph_captures: int = 0
    graph_capture_s: float = 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def note_workspaces(self, stats: WorkspaceStats | None) -> None:
        """The decoder's workspace figures after a batch (None: a decoder without workspaces)."""
        if stats is not None:
            self.workspaces, self.workspace_rows = stats.workspaces, stats.rows
            self.workspace_evictions, self.graph_evictions = stats.evictions, stats.graph_evictions
            self.graph_captures, self.graph_capture_s = stats.captures, stats.capture_s

    def note_choice(self, kind: str, ready: int, rows: int, cap: int) -> None:
        """A batch of `rows` taken where `ready` rows of cost class `kind` could have joined it (at most `cap`)."""
        taken = self.choices.setdefault(kind, {}).setdefault(min(ready, cap), {})
        taken[rows] = taken.get(rows, 0) + 1

    def note_sample(self, sample: BatchSample) -> None:
        self.samples.append(sample)   # a deque: the oldest falls out

    def samples_since(self, before: SchedulerMetrics) -> list[BatchSample]:
        """The samples of the batches decoded after `before` was copied (those still kept)."""
        return [s for s in self.samples if s.batch > before.batches]

    def copy_choices(self) -> dict[str, dict[int, dict[int, int]]]:
        return {kind: {ready: dict(taken) for ready, taken in by_ready.items()} for kind, by_ready in self.choices.items()}

    def add_choices(self, choices: dict[str, dict[int, dict[int, int]]]) -> None:
        """Adds `choices` (another replica's, or another run's) to these."""
        for kind, by_ready in choices.items():
            for ready, taken in by_ready.items():
                mine = self.choices.setdefault(kind, {}).setdefault(ready, {})
                for rows, count in taken.items():
                    mine[rows] = mine.get(rows, 0) + count

    def batches_since(self, before: SchedulerMetrics) -> dict[int, int]:
        """The batches decoded after `before` was copied, by rows (sizes with none left out)."""
        grown = {rows: n - before.rows_per_batch.get(rows, 0) for rows, n in sorted(self.rows_per_batch.items())}
        return {rows: n for rows, n in grown.items() if n}

    def choices_since(self, before: SchedulerMetrics) -> dict[str, dict[int, dict[int, int]]]:
        """The choices made after `before` was copied (every count that grew)."""
        grown: dict[str, dict[int, dict[int, int]]] = {}
        for kind, by_ready in self.choices.items():
            for ready, taken in by_ready.items():
                for rows, count in taken.items():
                    new = count - before.choices.get(kind, {}).get(ready, {}).get(rows, 0)
                    if new:
                        grown.setdefault(kind, {}).setdefault(ready, {})[rows] = new
        return grown

    def count_batch(self, clips: Sequence[np.ndarray], outcomes: Sequence, seconds: float) -> None:
        """One decoded batch: its rows, time, and each row's audio and drafts (or its failure)."""
        self.batches += 1
        self.rows += len(clips)
        self.rows_per_batch[len(clips)] = self.rows_per_batch.get(len(clips), 0) + 1
        self.busy_s += seconds
        for clip, outcome in zip(clips, outcomes):
            if isinstance(outcome, BaseException):
                self.failed += 1
                continue
            self.audio_s += clip.size / 16_000
            self.drafted += outcome.stats.drafted
            self.accepted += outcome.stats.accepted


def summarise_samples(samples: Iterable[BatchSample]) -> dict[str, dict[int, dict[str, float]]]:
    """Per cost class and batch size: batches, and the medians of seconds per row, of the worker's CPU share of
    the wall time, and of the decoder's share of it (what a run's samples say at a glance)."""
    groups: dict[str, dict[int, list[BatchSample]]] = {}
    for sample in samples:
        groups.setdefault(sample.kind, {}).setdefault(sample.rows, []).append(sample)

    median = statistics.median
    return {kind: {rows: {"batches": len(group),
                          "s_per_row": median([(g.wall_s - g.one_time_s) / g.rows for g in group]),
                          "cpu_share": median([g.cpu_s / g.wall_s for g in group if g.wall_s > 0] or [0.0]),
                          "decoder_share": median([g.decode_s / g.wall_s for g in group if g.wall_s > 0] or [0.0])}
                   for rows, group in sorted(by_rows.items())}
            for kind, by_rows in sorted(groups.items())}
