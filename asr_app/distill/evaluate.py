"""How good a draft is for its target, on held-out audio the training never saw.

Two views: teacher-forced (does the draft's argmax agree with the target's greedy token along the target's
own transcript; KL and cross-entropy as in training), and in the decoder itself (tokens per target call at
fixed gammas, greedy `exact` identical to `off`, and `exact`'s end-to-end speed against `off`).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from asr_app.decoding.engine import SpeculativeDecoder
from asr_app.decoding.options import DecodingOptions, DecodingStats, RuntimeOptions, loop_seconds
from asr_app.distill.batching import collate
from asr_app.distill.cache import LabelInfo
from asr_app.distill.loss import distill_loss, student_logits
from asr_app.distill.options import EvalOptions
from asr_app.models.loading import ModelPair, check_pair


@dataclass
class TeacherForced:
    positions: int
    agreement: float
    kl: float
    ce: float


@dataclass
class TimeSplit:
    """Where a mode's decodes spent their time, summed over the clips (from each decode's own stats)."""
    encoder_s: float
    setup_s: float    # one-time work: step-cost timing, graph captures
    draft_s: float    # draft and target steps as the loop times them: on a GPU, their launches only
    target_s: float   # (the device's time is waited for when a step's results are read)
    total_s: float

    @classmethod
    def of(cls, results: Sequence) -> TimeSplit:
        stats = DecodingStats.total([r.stats for r in results])
        return cls(stats.encoder_s, stats.setup_s, stats.draft_s, stats.target_s + stats.verify_s, stats.total_s)

    @property
    def loop_s(self) -> float:
        """The token loop (language detection included), the only part a draft can shorten: each decode's
        synchronised total less its encoder and one-time work, so it holds the device's time on a GPU too."""
        return loop_seconds(self.total_s, self.setup_s, self.encoder_s)


@dataclass
class InDecoder:
    clips: int
    tokens_per_call: dict[int, float]       # gamma -> output tokens per target call
    acceptance: dict[int, float | None]     # gamma -> accepted drafts / drafted
    identical: int                          # clips whose greedy exact output equals off's
    mismatched: list[str] = field(default_factory=list)
    off_s: float | None = None              # wall time of off over the clips (cost-aware exact beside it)
    exact_s: float | None = None
    by_language: dict[str, dict] = field(default_factory=dict)
    off_split: TimeSplit | None = None      # the timed runs' time split (with off_s and exact_s)
    exact_split: TimeSplit | None = None

    @property
    def speedup(self) -> float | None:
        return self.off_s / self.exact_s if self.off_s and self.exact_s else None

    @property
    def loop_speedup(self) -> float | None:
        """`exact` against `off` in the token loop alone (drafts, target steps, verification)."""
        if not (self.off_split and self.exact_split and self.exact_split.loop_s):
            return None
        return self.off_split.loop_s / self.exact_split.loop_s

    @property
    def ceiling(self) -> float | None:
        """The end-to-end speed-up a draft could give at most here: `off` with its token loop taking no time.
        The encoder, features and the rest cost both modes alike, so a perfect draft cannot beat this."""
        if not (self.off_s and self.off_split):
            return None
        rest = self.off_s - self.off_split.loop_s
        return self.off_s / rest if rest > 0 else None


@torch.no_grad()
def teacher_forced(student, examples: Sequence[LabelInfo], load: Callable, head: torch.Tensor,
                   to_head: torch.Tensor, suppress: torch.Tensor | None, view: str, device: torch.device,
                   batch_size: int = 16) -> TeacherForced:
    """Agreement, KL and cross-entropy over every predicted position of `examples`, position-weighted."""
    was_training = student.training
    student.eval()
    agreed = positions = 0
    kl = ce = 0.0
    ordered = sorted(examples, key=lambda e: e.length)
    for start in range(0, len(ordered), batch_size):
        batch = collate(ordered[start : start + batch_size], load, to_head, view, device)
        parts = distill_loss(student_logits(student, batch, head), batch, 1.0, 1.0, suppress)
        agreed, positions = agreed + parts.agreed, positions + parts.positions
        kl, ce = kl + parts.kl * parts.positions, ce + parts.ce * parts.positions
    student.train(was_training)
    n = max(positions, 1)
    return TeacherForced(positions, agreed / n, kl / n, ce / n)


def _decode_all(decoder: SpeculativeDecoder, clips: Sequence[np.ndarray], options: Sequence[DecodingOptions]) -> list:
    """Each clip alone (batch 1, as a user's file is decoded), with its own options."""
    return [decoder.decode(clip, o)[0] for clip, o in zip(clips, options)]


def _timed_pairs(decoder: SpeculativeDecoder, clips: Sequence[np.ndarray], first: Sequence[DecodingOptions],
                 second: Sequence[DecodingOptions]) -> tuple[list, list, float, float]:
    """Both option sets (one per clip) clip by clip, alternating, so that a machine whose load changes during
    the run slows both alike; (first's results, second's, first's seconds, second's)."""
    results: tuple[list, list] = ([], [])
    seconds = [0.0, 0.0]
    for clip, *pair in zip(clips, first, second):
        for i, options in enumerate(pair):
            began = time.perf_counter()
            results[i].append(decoder.decode(clip, options)[0])
            seconds[i] += time.perf_counter() - began
    return results[0], results[1], seconds[0], seconds[1]


def _clip_options(base: DecodingOptions, languages: Sequence[str | None], given: bool) -> list[DecodingOptions]:
    """`base` per clip: in the clip's own language where `given` and known (a user's `--language xx`), else
    as `base` says (detected, on a multilingual target)."""
    return [dataclasses.replace(base, language=language) if given and language else base for language in languages]


def in_decoder(pair: ModelPair, draft, clips: Sequence[np.ndarray], names: Sequence[str], options: EvalOptions,
               max_new_tokens: int = 224, runtime: RuntimeOptions = RuntimeOptions(),
               languages: Sequence[str | None] | None = None,
               draft_name: str = "the distilled draft") -> InDecoder:
    """The draft in the project's decoder beside `pair.target` (its encoder shared), greedy, with the
    teacher pass's token limit. The clips decode in the language the target detects, as a user's do, or
    with `options.language` "given" in `languages` (their folders' languages) where known; the per-language
    figures group them by `languages` where given. `draft_name` names the draft in an error: the new draft
    and a baseline are measured alike."""
    check_pair(pair.target, draft, pair.target_name, draft_name)
    with_draft = ModelPair(pair.target, draft, pair.processor, pair.device, pair.dtype, True, pair.target_name,
                           draft_name)
    decoder = SpeculativeDecoder(with_draft, DecodingOptions(mode="off"), runtime)
    multilingual = bool(getattr(pair.target.generation_config, "is_multilingual", False))
    languages = list(languages or [None] * len(clips))
    base = _clip_options(DecodingOptions(mode="off", language=None if multilingual else "en",
                                         timestamps=options.timestamps, task=options.task,
                                         max_new_tokens=max_new_tokens),
                         languages, multilingual and options.language == "given")
    exact = [dataclasses.replace(o, mode="exact") for o in base]
    decoder.decode(clips[0], base[0]), decoder.decode(clips[0], exact[0])  # warm-up: first-use costs are not timed
    off, auto, off_s, exact_s = _timed_pairs(decoder, clips, base, exact)
    splits = (TimeSplit.of(off), TimeSplit.of(auto)) if options.speed else (None, None)
    mismatched = [name for name, a, b in zip(names, off, auto) if a.tokens != b.tokens]
    tokens, acceptance = {}, {}
    for gamma in options.gammas:
        results = _decode_all(decoder, clips, [dataclasses.replace(o, gamma=gamma) for o in exact])
        stats = DecodingStats.total([r.stats for r in results])
        tokens[gamma] = stats.tokens_out / max(stats.target_calls, 1)
        acceptance[gamma] = stats.acceptance_rate
        mismatched += [f"{name} (gamma {gamma})" for name, a, b in zip(names, off, results) if a.tokens != b.tokens]
    return InDecoder(len(clips), tokens, acceptance, len(clips) - len({m.split(" (")[0] for m in mismatched}),
                     mismatched, off_s if options.speed else None, exact_s if options.speed else None,
                     _by_language(off, auto, languages), *splits)


def decoder_figures(decoder: InDecoder) -> dict:
    """The card's record of `decoder`: its fields and the ratios derived from them."""
    return {**dataclasses.asdict(decoder), "speedup": decoder.speedup, "loop_speedup": decoder.loop_speedup,
            "ceiling": decoder.ceiling, "off_loop_s": decoder.off_split.loop_s if decoder.off_split else None}


def _by_language(off, exact, languages: Sequence[str | None]) -> dict[str, dict]:
    """Per language (the one given for a clip, else the detected one): clips, the cost-aware exact run's
    acceptance and tokens per target call, `exact`'s speed-up over `off` (their decodes' own seconds, where
    timed), and the languages the target detected where they differ."""
    groups: dict[str, list] = {}
    for a, b, given in zip(off, exact, languages):
        groups.setdefault(given or a.language or "?", []).append((a.language or "?", a.stats, b.stats))
    out = {}
    for language, rows in sorted(groups.items()):
        total = DecodingStats.total([stats for _, _, stats in rows])
        off_s = sum(stats.total_s for _, stats, _ in rows)
        out[language] = {"clips": len(rows), "acceptance": total.acceptance_rate,
                         "tokens_per_call": total.tokens_out / max(total.target_calls, 1),
                         "speedup": off_s / total.total_s if off_s and total.total_s else None}
        detected = collections.Counter(found for found, _, _ in rows)
        if set(detected) != {language}:
            out[language]["detected_as"] = dict(detected)
    return out
