"""The decoder states a decoder keeps between decodes where its steps are captured: one workspace per (batch
size, drafts or not), refilled in place (captured steps read those very tensors), the least recently used
dropped, with its graphs, beyond a bound.

A dropped workspace is paid for again in full when its batch size comes back: new caches and a capture of
every step shape it decodes. A server whose scheduler forms batches of six sizes through a pool of four
recaptures in turn (seen on an H200, 2026-11-27: docs/serving.md), so the scheduler raises the bound to the
sizes it can form (`keep`), and the pool counts what it dropped and recaptured (`stats`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from asr_app.decoding.steps import Workspace

Key = tuple[int, bool]   # (batch size, drafts or not)


@dataclass(frozen=True)
class WorkspaceStats:
    """The pool now and since it was made: graph figures include the workspaces it dropped."""

    workspaces: int        # held now
    max_workspaces: int
    rows: int              # batch rows the held workspaces have room for
    evictions: int         # workspaces dropped to make room
    captures: int          # step graphs captured
    graph_evictions: int   # step graphs dropped inside a workspace (RuntimeOptions.max_graphs)
    capture_s: float       # seconds spent capturing


class WorkspacePool(Mapping[Key, Workspace]):
    """Workspaces by key in least-recently-used order (the first is the next to go)."""

    def __init__(self, max_workspaces: int) -> None:
        if max_workspaces < 1:
            raise ValueError(f"max_workspaces must be >= 1, got {max_workspaces}")
        self.max_workspaces = max_workspaces
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
        """Hold at least `count` workspaces before dropping one (never lowers the bound)."""
        self.max_workspaces = max(self.max_workspaces, count)

    def use(self, key: Key) -> Workspace | None:
        """The workspace under `key`, now the most recently used, or None."""
        ws = self._held.pop(key, None)
        if ws is not None:
            self._held[key] = ws
        return ws

    def add(self, key: Key, ws: Workspace) -> Workspace:
        """Hold `ws` under `key`, dropping the least recently used workspace if the pool is full."""
        if key not in self._held and len(self._held) >= self.max_workspaces:
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
