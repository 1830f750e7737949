"""The decoder states a decoder keeps between decodes where its steps are captured: one workspace per (batch
size, drafts or not), refilled in place (captured steps read those very tensors), the least recently used
dropped, with its graphs, beyond a bound.

A dropped workspace is paid for again in full when its batch size comes back: new caches and a capture of
every step shape it decodes. A scheduler that forms batches of six sizes through a pool of four would
recapture in turn (the likely cause of an H200 run's slow batched serving, 2026-11-27: docs/serving.md), so
the scheduler raises the bound to the sizes it can form (`keep_workspaces`) unless the user fixed it, and the
pool counts what it dropped and captured (`stats`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # the scheduler reads these figures without loading torch
    from asr_app.decoding.steps import Workspace

log = logging.getLogger(__name__)

Key = tuple[int, bool]   # (batch size, drafts or not)
DEFAULT_WORKSPACES = 4   # RuntimeOptions.max_workspaces=None before a scheduler asks for more


@dataclass(frozen=True)
class WorkspaceStats:
    """The pool now and since it was made: graph figures include the workspaces it dropped."""

    workspaces: int        # held now
    max_workspaces: int
    rows: int              # batch rows the held workspaces have room for (their caches' size)
    evictions: int         # workspaces dropped to make room
    captures: int          # step graphs captured
    graph_evictions: int   # step graphs dropped inside a workspace (RuntimeOptions.max_graphs)
    capture_s: float       # seconds spent capturing

    @property
    def dropped(self) -> int:
        """Workspaces and graphs dropped: what comes back from either is captured again."""
        return self.evictions + self.graph_evictions


class WorkspacePool(Mapping[Key, "Workspace"]):
    """Workspaces by key in least-recently-used order (the first is the next to go)."""

    def __init__(self, max_workspaces: int | None = None) -> None:
        """`max_workspaces`: a fixed bound; None: DEFAULT_WORKSPACES, which `keep` may raise."""
        if max_workspaces is not None and max_workspaces < 1:
            raise ValueError(f"max_workspaces must be >= 1, got {max_workspaces}")
        self.fixed = max_workspaces is not None
        self.max_workspaces = max_workspaces or DEFAULT_WORKSPACES
        self._held: dict[Key, Workspace] = {}
        self._evictions = 0
        self._retired = (0, 0, 0.0)   # captures, graph evictions, capture seconds of dropped workspaces

    def __getitem__(self, key: Key) -> Workspace:
        return self._held[key]

    def __iter__(self) -> Iterator[Key]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def keep(self, count: int) -> None:
        """Hold at least `count` workspaces before dropping one; never lowers the bound, and leaves a bound the
        user set alone (on a large model a workspace of 32 rows holds gigabytes of caches)."""
        if self.fixed:
            if count > self.max_workspaces:
                log.info("keeping %d workspaces as set, not the %d asked for", self.max_workspaces, count)
            return
        if count > self.max_workspaces:
            log.info("keeping up to %d workspaces (batch sizes with drafts and without)", count)
        self.max_workspaces = max(self.max_workspaces, count)

    def use(self, key: Key) -> Workspace | None:
        """The workspace under `key`, now the most recently used, or None."""
        ws = self._held.pop(key, None)
        if ws is not None:
            self._held[key] = ws
        return ws

    def add(self, key: Key, ws: Workspace) -> Workspace:
        """Hold `ws` under a new `key`, dropping the least recently used workspace if the pool is full."""
        if key in self._held:
            raise ValueError(f"a workspace for {key} is held already: use() it")
        if len(self._held) >= self.max_workspaces:
            dropped = self._held.pop(next(iter(self._held))).runner.stats()
            captures, graph_evictions, capture_s = self._retired
            self._retired = (captures + dropped.captures, graph_evictions + dropped.evictions,
                             capture_s + dropped.capture_s)
            self._evictions += 1
        self._held[key] = ws
        return ws

    def stats(self) -> WorkspaceStats:
        captures, graph_evictions, capture_s = self._retired
        for ws in self._held.values():
            s = ws.runner.stats()
            captures, graph_evictions, capture_s = (captures + s.captures, graph_evictions + s.evictions,
                                                    capture_s + s.capture_s)
        return WorkspaceStats(len(self._held), self.max_workspaces, sum(batch for batch, _ in self._held),
                              self._evictions, captures, graph_evictions, capture_s)


def keep_workspaces(decoder: Any, count: int) -> None:
    """Ask `decoder` (a SpeculativeDecoder, or any decoder without workspaces) to keep `count` of them."""
    keep = getattr(decoder, "keep_workspaces", None)
    if keep is not None:
        keep(count)


def workspace_stats(decoder: Any) -> WorkspaceStats | None:
    """`decoder`'s workspace figures, read on the thread that decodes; None for a decoder without them."""
    stats = getattr(decoder, "workspace_stats", None)
    return stats() if stats is not None else None
