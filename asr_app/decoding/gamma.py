"""How many tokens the draft proposes per step.

Three policies with one interface (`next(budget)` before a step, `update(drafted, accepted)` after it, or
`update_rows(drafted, accepted per row)` after a step of a ragged batch, decoding/ragged.py):

- fixed: always the same gamma;
- heuristic: transformers' assisted-generation schedule (start at 5, +2 when every draft was accepted,
  else -1, at least 1);
- cost: the gamma that maximises expected tokens per second (docs/runtime.md). With a per-draft
  acceptance probability a, a step that drafts g tokens yields (1 - a^(g+1)) / (1 - a) tokens on average
  (Leviathan et al. 2023) and costs g draft steps plus one target step over g+1 tokens. The step costs are
  measured once per decoder (costs.py); a is learned from the accepted prefix lengths within the decode,
  starting from a prior: what the draft achieved over the decoder's recent decodes (`memory`), or a fixed
  prior where none is kept. Where drafting does not pay (a slow draft, or poor acceptance) it chooses
  gamma 0 and decodes target-only, with a probe step now and then in case acceptance has come back.
"""

from __future__ import annotations

from dataclasses import dataclass


class GammaPolicy:
    """Fixed gamma, or transformers' heuristic: start at 5, +2 when every draft was accepted, else -1 (min 1)."""

    START = 5

    def __init__(self, fixed: int | None = None) -> None:
        self.fixed = fixed
        self.current = fixed if fixed is not None else self.START

    @property
    def max_gamma(self) -> int | None:
        """The most drafts a step may take: the fixed gamma; None where the schedule has no bound."""
        return self.fixed

    def next(self, cap: int) -> int:
        """Gamma for the coming step, capped by what the length budget allows (may be 0)."""
        return max(0, min(self.current, cap))

    def update(self, gamma: int, accepted: int) -> None:
        if self.fixed is not None or gamma == 0:
            return
        self.current = self.current + 2 if accepted == gamma else max(1, self.current - 1)

    def update_rows(self, gamma: int, accepted: list[int]) -> None:
        """After a step whose rows each kept their own drafts (decoding/ragged.py): one move of the schedule,
        by the rows' mean (a move per row would swing it B times a step)."""
        self.update(gamma, round(sum(accepted) / len(accepted)))


@dataclass(frozen=True)
class StepCosts:
    """Seconds per step: one draft step, and a target step over k tokens = target + (k - 1) * per_token, or
    `widths[k - 1]` where the target step was timed at that width. With captured steps every width is timed
    (costs.py), since a GPU's cost is not linear in k: one launch-bound step, then a jump where the product
    leaves its one-row kernel, then flat (docs/runtime.md)."""

    draft: float
    target: float
    per_token: float
    widths: tuple[float, ...] = ()

    def step(self, gamma: int) -> float:
        if gamma < len(self.widths):
            return gamma * self.draft + self.widths[gamma]
        return gamma * self.draft + self.target + gamma * self.per_token


class AcceptanceEstimate:
    """The probability that the draft's next token is accepted, from accepted prefix lengths: a step that
    drafted g and accepted n < g saw n successes and one failure (n = g: g successes). Old steps fade."""

    PRIOR = 0.8

    def __init__(self, prior: float = PRIOR, weight: float = 10.0, decay: float = 0.98) -> None:
        self.successes, self.failures = prior * weight, (1 - prior) * weight
        self.decay = decay

    @property
    def value(self) -> float:
        return self.successes / (self.successes + self.failures)

    def update(self, drafted: int, accepted: int) -> None:
        self.successes = self.successes * self.decay + accepted
        self.failures = self.failures * self.decay + (1 if accepted < drafted else 0)


class AcceptanceMemory:
    """What a decoder keeps across its decodes for the cost policy: an acceptance estimate that fades more
    slowly than a decode's own (over a few hundred drafting steps, dozens of short clips), so it follows the
    pair and the audio, not one clip; and the target-only steps since the last draft. That count must
    outlive a decode: a short clip has fewer steps than the probe interval, so where the remembered
    acceptance has fallen too low to draft, per-decode counts would never probe and it would never recover."""

    def __init__(self) -> None:
        self.estimate = AcceptanceEstimate(decay=0.995)
        self.idle = 0

    @property
    def value(self) -> float:
        return self.estimate.value


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens a step yields on average: the accepted prefix plus the target's own token."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


class CostAwareGamma:
    """The gamma with the most expected tokens per second of step cost (see the module docstring)."""

    MAX_GAMMA = 12
    PROBE_EVERY = 16  # after this many target-only steps, draft one token to re-measure acceptance
    max_gamma = MAX_GAMMA

    def __init__(self, costs: StepCosts, acceptance: AcceptanceEstimate,
                 memory: AcceptanceMemory | None = None) -> None:
        """`memory`: what the decoder keeps across decodes (the next decode starts from its value, since a
        short clip has too few steps to learn the pair's acceptance alone); None: this policy's own."""
        self.costs, self.acceptance = costs, acceptance
        self.memory = memory if memory is not None else AcceptanceMemory()

    def best(self, cap: int) -> int:
        alpha = self.acceptance.value
        rates = [expected_tokens(alpha, g) / self.costs.step(g) for g in range(min(self.MAX_GAMMA, cap) + 1)]
        return max(range(len(rates)), key=rates.__getitem__)

    def next(self, cap: int) -> int:
        gamma = self.best(max(0, cap))
        if gamma == 0 and cap > 0:
            self.memory.idle += 1
            if self.memory.idle >= self.PROBE_EVERY:
                self.memory.idle = 0
                return 1
        return gamma

    def update(self, gamma: int, accepted: int) -> None:
        if gamma > 0:
            self.acceptance.update(gamma, accepted)
            self.memory.estimate.update(gamma, accepted)

    def update_rows(self, gamma: int, accepted: list[int]) -> None:
        """After a step whose rows each kept their own drafts (decoding/ragged.py): each row's prefix is an
        observation of the per-draft acceptance."""
        for count in accepted:
            self.update(gamma, count)
