"""How many tokens the draft proposes per step."""

from __future__ import annotations


class GammaPolicy:
    """Fixed gamma, or transformers' heuristic: start at 5, +2 when every draft was accepted, else -1 (min 1)."""

    START = 5

    def __init__(self, fixed: int | None = None) -> None:
        self.fixed = fixed
        self.current = fixed if fixed is not None else self.START

    def next(self, cap: int) -> int:
        """Gamma for the coming step, capped by what the length budget allows (may be 0)."""
        return max(0, min(self.current, cap))

    def update(self, gamma: int, accepted: int) -> None:
        if self.fixed is not None or gamma == 0:
            return
        self.current = self.current + 2 if accepted == gamma else max(1, self.current - 1)
