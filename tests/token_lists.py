"""Comparing a decode's whole token list with a reference decode, against the target's own logits.

Two greedy decodes of the same audio may part where the target's two best tokens are nearly tied (fp16
sums in another order, another kernel): from there on they continue from different prefixes, so the
reference says nothing about the rest. Then every later token is checked against the target's own choice
after that decode's own prefix: a decode may leave the target's best token only at a near tie, anywhere in
the list, and every such place is reported. tests/test_gpu.py uses this on the GPU's decodes;
tests/test_token_lists.py checks it on crafted logits on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Divergence:
    position: int     # index in the token list (len(list) = where the decode stopped: its end of text)
    token: int        # what the decode emitted there (eos for its end)
    preferred: int    # the reference's token while the two lists agree up to here, else the target's best
    gap: float        # logit(preferred) - logit(token), after the decode's own prefix, Whisper's rules applied
    against: str      # "reference" or "target"

    def describe(self) -> str:
        what = "the reference has" if self.against == "reference" else "the target prefers"
        return f"token {self.position}: {self.token} where {what} {self.preferred}, logit gap {self.gap:.3f}"


def divergences(got: list[int], expected: list[int], logits_along: Callable[[list[int]], torch.Tensor], eos: int,
                got_ended: bool = True, expected_ended: bool = True) -> list[Divergence]:
    """Every place `got` leaves the reference `expected` (while they share a prefix) or, once they parted,
    the target's best token. `logits_along(path)` gives the target's logits after each prefix of `path`
    ([len(path) + 1, vocab], rules applied: forbidden tokens at -inf). A list that ended (not cut by the
    token budget) chose end-of-text after its last token; that choice is checked too."""
    chosen = list(got) + ([eos] if got_ended else [])
    reference = list(expected) + ([eos] if expected_ended else [])
    logits = logits_along(list(got)).float()
    found: list[Divergence] = []
    same_path = True
    for position, token in enumerate(chosen):
        row = logits[position]
        if same_path and position < len(reference):
            preferred, against = reference[position], "reference"
        else:
            preferred, against = int(row.argmax()), "target"
        if token != preferred:
            found.append(Divergence(position, token, preferred, float(row[preferred] - row[token]), against))
            same_path = False
    return found


def check_same_or_near_ties(got: list[int], expected: list[int], logits_along, eos: int, margin: float,
                            what: str, may_differ: bool = True, got_ended: bool = True,
                            expected_ended: bool = True) -> list[Divergence]:
    """Assert `got` is `expected`, or parts from it (and later from the target's own choice) only at near ties:
    each divergence is printed, and every one must be within `margin` (`may_differ` False: none allowed)."""
    found = divergences(got, expected, logits_along, eos, got_ended, expected_ended)
    for d in found:
        print(f"{what}: {d.describe()}")
    assert not found or may_differ, f"{what}: {len(found)} divergence(s) where none may be: " + \
        "; ".join(d.describe() for d in found)
    wide = [d for d in found if not abs(d.gap) < margin]
    assert not wide, f"{what}: beyond the near-tie margin {margin}: " + "; ".join(d.describe() for d in wide)
    return found
