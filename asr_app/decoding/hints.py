"""Where a hint (expected output tokens) continues the output decoded so far.

A hint is usually the previous decode of a streaming buffer that has since grown. The new output mostly
repeats it, but not always token for token: Whisper flips a word's case or a comma between two decodes
("Printing, in" / "printing in") or moves a timestamp by 20 ms, and then agrees with the hint again. So
after a mismatch the tracker looks for the last output tokens in the hint near the position where they
were expected (the lookup of prompt-lookup decoding, Saxena 2023) and proposes what follows them there.

Proposals only affect speed: the decoder verifies them like any draft (engine.py).
"""

from __future__ import annotations

from collections.abc import Sequence


def as_hint(hint: Sequence[int] | None) -> Sequence[int] | None:
    """The hint a decoder works with: an empty one is none. (A front end that counted `[]` as a hint batched it
    with hinted rows, and lock-step hint steps, which need a proposal on every row, were then turned off.)"""
    return hint if hint is not None and len(hint) else None


class HintTracker:
    """Per row: the hint, and the hint index that should match the row's next output token (None: lost)."""

    MAX_STEPS = 8  # hint steps per decode: the first, then at most 7 after realignments
    MAX_NGRAM = 2  # the longest output suffix looked up (then shorter ones)
    WINDOW = 8     # a match must lie within this many tokens of where the output should be in the hint

    def __init__(self, hints: Sequence[Sequence[int]]) -> None:
        self.hints = [list(h) for h in hints]
        self.cursor: list[int | None] = [0] * len(self.hints)
        self.expected = [0] * len(self.hints)  # hint index of the next output token if nothing shifted
        self.tails: list[list[int]] = [[] for _ in self.hints]  # the last MAX_NGRAM output tokens

    def proposals(self) -> list[list[int]]:
        """Per row: the hint tokens that would come next (empty when the row's hint is lost or used up)."""
        return [h[c:] if c is not None else [] for h, c in zip(self.hints, self.cursor)]

    def advance(self, row: int, tokens: Sequence[int]) -> None:
        """Record the tokens the row kept this step and realign its hint."""
        hint = self.hints[row]
        for token in tokens:
            cursor = self.cursor[row]
            if cursor is not None and cursor < len(hint) and hint[cursor] == token:
                self.cursor[row] = cursor + 1
            else:
                self.cursor[row] = None
            self.expected[row] = (self.cursor[row] if self.cursor[row] is not None
                                  else self.expected[row] + 1)
        self.tails[row] = (self.tails[row] + list(tokens))[-self.MAX_NGRAM:]
        if self.cursor[row] is None:
            self.cursor[row] = self._lookup(row)

    def _lookup(self, row: int) -> int | None:
        hint, tail, expected = self.hints[row], self.tails[row], self.expected[row]
        for n in range(len(tail), 0, -1):
            suffix = tail[-n:]
            # where the suffix would end in the hint: near the expected place, with a token after it
            window = range(max(n, expected - self.WINDOW), min(len(hint) - 1, expected + self.WINDOW) + 1)
            near = [e for e in window if hint[e - n : e] == suffix]
            if near:
                best = min(near, key=lambda e: abs(e - expected))
                self.expected[row] = best
                return best
        return None

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Rows `rows` (indices into the current rows) stay in the batch; the others finished."""
        self.hints = [self.hints[i] for i in rows]
        self.cursor = [self.cursor[i] for i in rows]
        self.expected = [self.expected[i] for i in rows]
        self.tails = [self.tails[i] for i in rows]
