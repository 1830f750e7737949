"""One random stream per decode: seeds for the decodes of a larger job, derived from the job's seed.

A decode at T > 0 draws every random number from a generator seeded with `DecodingOptions.seed`. A job
that makes many decodes with one seed (a file's 30 s windows, a window's fallback retries, a study's
clips) would give each of them the same stream: the same uniforms at the same step of every window
and every clip. Their outcomes are then correlated (a stream that accepts many drafts does so on every
clip), and a statistical test that treats the clips as independent samples is wrong (docs/eval.md,
"Seeds shared across clips"). `derive_seed` gives each decode its own stream, still reproducible from
the job's seed and the decode's place in the job.
"""

from __future__ import annotations

import dataclasses
import hashlib

from asr_app.decoding.options import DecodingOptions

_SEED_BITS = 63  # torch.Generator.manual_seed takes any non-negative int below 2**64


def derive_seed(seed: int, *place: object) -> int:
    """A seed for the decode at `place` (e.g. a clip id, a window index, a retry) of a job seeded `seed`:
    stable across processes and Python versions (a hash of the repr, not Python's salted `hash`)."""
    # str() of each part: repr would tell 5 from numpy.int64(5) (and change with numpy's version)
    digest = hashlib.blake2b(repr((int(seed), *map(str, place))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - _SEED_BITS)


def reseeded(options: DecodingOptions, *place: object) -> DecodingOptions:
    """`options` with the decode at `place` drawing from its own stream (`derive_seed`). Greedy decodes
    draw nothing and keep their options unchanged (equal options can share a scheduler batch)."""
    if options.temperature == 0:
        return options
    return dataclasses.replace(options, seed=derive_seed(options.seed, *place))


def batch_options(options: DecodingOptions) -> DecodingOptions:
    """What decodes must share to run as rows of one batch: every option but the seed. The rows of one call
    draw from one generator anyway (row b takes row b of each draw), so a batch decodes with its first
    request's seed, and a sampled request is reproducible from its seed only when it decodes alone."""
    return dataclasses.replace(options, seed=0) if options.seed != 0 else options
