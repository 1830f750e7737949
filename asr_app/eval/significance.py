"""Paired tests between two decoding modes over the same (clip, temperature, seed) items.

Three views, because the items are not independent (the seeds of one clip share its audio):
- Wilcoxon signed-rank over the per-item differences (scipy): does one mode make fewer errors on
  the same item? Cheap and robust to the skewed error counts of short clips.
- a bootstrap over clips (whole clips resampled with every seed they hold): a 95% interval for the
  corpus-WER difference that respects the clustering, which the Wilcoxon test does not.
- a sign-flip permutation test over seeds (`seed_permutation_pvalue`): each seed's corpus figure (WER,
  acceptance) for one mode against the other's. The only valid test where one seed gave every clip the same
  random stream (studies run before `decoding.seeds.derive_seed`): the clips of one seed are then not
  independent, the seeds are.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import wilcoxon

BOOTSTRAP_DRAWS = 2000


def wilcoxon_pvalue(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p of the signed-rank test on a - b; 1.0 when every difference is zero (nothing to test),
    None with fewer than 2 pairs."""
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if diff.size < 2:
        return None
    if not np.any(diff != 0):
        return 1.0
    return float(wilcoxon(diff, zero_method="wilcox", alternative="two-sided").pvalue)


def clip_bootstrap_ratio(numerators: np.ndarray, denominators: np.ndarray, draws: int = BOOTSTRAP_DRAWS,
                         seed: int = 0) -> tuple[float, float] | None:
    """95% percentile interval of sum(numerators) / sum(denominators) when whole clips are resampled.

    numerators, denominators: per clip (shape [clips], or [clips, k] for k ratios at once, sharing the
    resampling). A difference of two WERs over the same references is one ratio: (errors_a - errors_b) /
    words. None with fewer than 2 clips.
    """
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    clips = num.shape[0]
    if clips < 2:
        return None
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(clips, np.full(clips, 1.0 / clips), size=draws).astype(np.float64)  # [draws, clips]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = (weights @ num) / (weights @ den)
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return None
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def seed_permutation_pvalue(a: Sequence[float], b: Sequence[float], draws: int = 20_000, seed: int = 0) -> float | None:
    """Two-sided p that the mean of the paired per-seed differences a - b is zero: every sign flip of the
    differences enumerated up to 16 seeds (2^16 patterns; the smallest p is then 2 / 2^n), a fixed random
    sample of `draws` patterns beyond (smallest p 1 / (draws + 1)). None with fewer than 2 seeds."""
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n = diff.size
    if n < 2:
        return None
    exhaustive = n <= 16
    if exhaustive:
        signs = 1.0 - 2.0 * ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1)
    else:
        signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(draws, n))
    hits = int(np.sum(np.abs(signs @ diff) / n >= abs(diff.mean()) - 1e-12))
    # a sample of the patterns: the observed one counts too, so p is never 0
    return hits / len(signs) if exhaustive else (hits + 1) / (draws + 1)
