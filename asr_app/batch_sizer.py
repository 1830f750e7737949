"""How many rows to decode together: `BatchSizer` measures the time per row of each batch size on this device
and picks the size that serves rows soonest (asr_app/scheduler.py asks it before every batch; docs/serving.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _SizeCost:
    """Running costs of one batch size: seconds per row outside the token loop (features, encoder), and loop
    seconds per decoding step of a row (an output token, or its end)."""
    fixed: float
    per_step: float


class BatchSizer:
    """Chooses how many rows to decode together from the time per row it has measured per batch size.

    Sizes are powers of two up to `max_rows`. A size that was never measured is tried only when half of
    it was measured cheaper per row than every smaller size (batching still paid off below it);
    otherwise the measured size with the lowest time per row wins, a larger one only when it is
    `margin` cheaper per row than the best smaller one (every row of a batch waits for the whole batch).
    Where at least twice the size's rows are waiting, `backlog_margin` is enough: those rows wait for
    the batches before theirs anyway, so what serves them soonest is the lowest cost per row.
    So a device where batching does not pay (a CPU, for short re-decodes) settles on one row, never on a
    slower larger batch.

    A row's cost depends on its content (a 5 s clip writes a third of a 30 s one's tokens), and each size
    is measured on different rows. Where the decoder says how long its token loop took and how many
    steps its rows made, a size's cost is kept as seconds per row outside the loop plus loop seconds per
    step, and sizes are compared at the same number of steps per row (the running mean over every batch):
    the comparison is then between sizes, not between the clips that happened to land in them.

    A measurement ages: once `retry_after` batches have been recorded since a measured size last ran, the
    size is stale, and where it can be formed and is not the best it runs once more, its new cost replacing
    the old outright; one such retry at most in `retry_after` batches, however many sizes are stale. A size
    judged on a few batches in a passing state of the device (a slow spell, other threads busy) is thus
    judged again, at the price of at most one batch in `retry_after`; an H200 run judged two rows on three
    batches and formed no more over 834 (docs/serving.md).

    The first `warmup` batches of each size are not counted: a size's first batch carries one-time work
    the decoder cannot all report (new workspaces, kernels tuned for the new shape, graphs captured on
    first use), and a size judged on it would never be tried again (an H100 run stayed at one row for good
    that way: docs/serving.md). The decoder's own report of such work (`setup_s`) is left out of every batch.
    """

    def __init__(self, max_rows: int, memory: float = 0.2, margin: float = 0.1, warmup: int = 1,
                 backlog_margin: float = 0.03, retry_after: int = 64) -> None:
        if max_rows < 1 or retry_after < 1:
            raise ValueError(f"max_rows and retry_after must be >= 1, got {max_rows}, {retry_after}")
        self.sizes = [s for s in (1 << k for k in range(12)) if s <= max_rows]
        self.memory = memory
        self.margin = margin
        self.backlog_margin = backlog_margin
        self.warmup = warmup
        self.costs: dict[int, _SizeCost] = {}   # batch size -> its running costs
        self.steps_per_row: float | None = None  # running mean over every counted batch
        self.seen: dict[int, int] = {}     # batch size -> batches recorded, warm-up ones included
        self.retry_after = retry_after
        self.recorded = 0                  # batches recorded, every size
        self.last_run: dict[int, int] = {}  # batch size -> `recorded` after its latest batch
        self.last_retry = 0                # `recorded` after the latest batch of a stale size

    @property
    def cost(self) -> dict[int, float]:
        """Seconds per row of each measured size, at the running mean of steps per row."""
        steps = self.steps_per_row or 0.0
        return {size: c.fixed + steps * c.per_step for size, c in self.costs.items()}

    def choose(self, ready: int, retry: bool = True) -> int:
        """The batch size for `ready` compatible requests (at least 1, at most `ready`); `retry`: a stale size
        may be chosen (see the class doc; False where the answer only decides whether to wait for rows)."""
        usable = [s for s in self.sizes if s <= max(1, ready)]
        cost = self.cost
        for size in usable:
            if size not in cost:
                if size == 1 or self._paid(cost, size // 2, self._margin(size, ready)):
                    return size   # batching paid up to half this size: measure this one
                break
        best = 1
        for size in usable:   # a larger batch must beat the best smaller one clearly: its rows wait longer
            if size in cost and cost[size] < cost.get(best, float("inf")) * (1 - self._margin(size, ready)):
                best = size
        if not retry or self.recorded - self.last_retry < self.retry_after:
            return best
        stale = [s for s in usable if s != best and s in cost and self._stale(s)]
        return min(stale, key=lambda s: (self.last_run[s], s)) if stale else best

    def _stale(self, size: int) -> bool:
        return self.recorded - self.last_run.get(size, self.recorded) >= self.retry_after

    def _margin(self, size: int, ready: int) -> float:
        return self.backlog_margin if ready >= 2 * size else self.margin

    @staticmethod
    def _paid(cost: dict[int, float], size: int, margin: float) -> bool:
        """Whether `size` was measured `margin` cheaper per row than every smaller size."""
        return size in cost and all(cost[size] < c * (1 - margin) for smaller, c in cost.items() if smaller < size)

    def record(self, rows: int, seconds: float, loop_s: float | None = None, steps: int | None = None) -> None:
        """One batch of `rows` took `seconds`; of them `loop_s` in the token loop, for `steps` row steps in
        all (where the decoder reports them; else the batch counts as seconds per row alone)."""
        size = max(s for s in self.sizes if s <= rows) if rows >= 1 else 1
        stale = self._stale(size)
        cost = self.cost
        self.recorded += 1
        self.last_run[size] = self.recorded
        if stale and size in cost and cost[size] > min(cost.values()):   # a retry (the best back after a gap is not)
            self.last_retry = self.recorded
        self.seen[size] = self.seen.get(size, 0) + 1
        if self.seen[size] <= self.warmup:
            return
        split = loop_s is not None and steps is not None and steps > 0 and 0 <= loop_s <= seconds
        new = (_SizeCost((seconds - loop_s) / rows, loop_s / steps) if split
               else _SizeCost(seconds / rows, 0.0))
        if split:
            self.steps_per_row = self._mix(self.steps_per_row, steps / rows)
        old = None if stale else self.costs.get(size)   # a stale cost describes a device state long gone
        self.costs[size] = new if old is None else _SizeCost(self._mix(old.fixed, new.fixed),
                                                             self._mix(old.per_step, new.per_step))

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.memory) * old + self.memory * new

    def snapshot(self) -> dict[int, float]:
        return dict(sorted(self.cost.items()))
