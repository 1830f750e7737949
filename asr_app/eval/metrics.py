"""Per-utterance records and their aggregation into one summary per mode."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from asr_app.wer import WerResult, corpus_wer


@dataclass
class ModeRun:
    """One utterance decoded by one mode."""

    tokens: list[int]
    hypothesis: str
    hypothesis_normalized: str
    seconds: float                         # wall time of the decode call (no profiler attached)
    stats: dict                            # DecodingStats as a dict
    verify_profiled_s: float | None = None  # summed profiler time of the verification ranges
    verify_profiled_calls: int = 0
    verify_steps: list[tuple[int, float]] = field(default_factory=list)  # (gamma, seconds) per step
    peak_memory_bytes: int | None = None
    profiled_same_tokens: bool | None = None  # the profiled decode produced the timed decode's tokens


@dataclass
class UtteranceRecord:
    id: str
    reference: str
    reference_normalized: str
    source: str
    duration_s: float | None = None
    error: str | None = None                # why the utterance was excluded (corrupt audio, too long)
    runs: dict[str, ModeRun] = field(default_factory=dict)  # by mode label

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ModeSummary:
    label: str                  # "baseline", "exact", "sigmoid", "sigmoid@1e+03", ...
    mode: str                   # the decoder mode behind the label
    temperature: float
    alpha: float
    beta: float
    utterances: int
    wer: WerResult
    latency_mean_s: float
    latency_p50_s: float
    latency_p90_s: float
    audio_s: float
    compute_s: float
    rtfx: float                 # audio seconds / compute seconds
    verify_profiled_s: float | None
    verify_clock: str | None
    verify_delta_pct: float | None  # (t - t_baseline) / t_baseline * 100; negative = less time
    verify_steps: int
    verify_ms_per_token: float | None  # profiled verify time / output tokens (modes emit different lengths)
    drafted: int
    accepted: int
    acceptance_rate: float | None
    mean_accepted_per_step: float | None
    target_calls_per_token: float | None
    tokens_out: int
    equal_to_baseline: float | None  # fraction of utterances whose tokens equal baseline's
    peak_memory_bytes: int | None
    peak_memory_kind: str

    def to_dict(self) -> dict:
        out = asdict(self)
        out["wer"] = self.wer.to_dict()
        return out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def summarize_mode(
    label: str,
    options: object,
    records: list[UtteranceRecord],
    memory_kind: str,
    verify_clock: str | None,
    baseline_label: str | None = "baseline",
) -> ModeSummary:
    """Aggregate one mode over the utterances that every mode decoded (failed ones are excluded)."""
    used = [r for r in records if r.error is None and label in r.runs]
    runs = [r.runs[label] for r in used]
    wer = corpus_wer([r.reference_normalized for r in used], [m.hypothesis_normalized for m in runs])
    latencies = [m.seconds for m in runs]
    audio_s = float(sum(r.duration_s or 0.0 for r in used))
    compute_s = float(sum(latencies))
    stat = lambda key: [int(m.stats.get(key, 0) or 0) for m in runs]  # noqa: E731
    drafted, accepted = sum(stat("drafted")), sum(stat("accepted"))
    target_calls, tokens_out = sum(stat("target_calls")), sum(stat("tokens_out"))
    # Mean accepted per step: per-utterance means weighted by that utterance's target calls (≈ steps).
    weights = stat("target_calls")
    per_step = [float(m.stats.get("mean_accepted_per_step", 0.0) or 0.0) for m in runs]
    # Target-only decoding drafts nothing: "accepted per step" does not apply (n/a, not 0).
    mean_per_step = float(np.average(per_step, weights=weights)) if drafted and sum(weights) > 0 else None
    profiled = [m.verify_profiled_s for m in runs if m.verify_profiled_s is not None]
    verify_s = float(sum(profiled)) if profiled and len(profiled) == len(runs) else None
    equal = None
    if baseline_label is not None and label != baseline_label:
        pairs = [(m, r.runs.get(baseline_label)) for m, r in zip(runs, used)]
        pairs = [(m, b) for m, b in pairs if b is not None]
        equal = sum(m.tokens == b.tokens for m, b in pairs) / len(pairs) if pairs else None
    elif label == baseline_label:
        equal = 1.0 if runs else None
    peaks = [m.peak_memory_bytes for m in runs if m.peak_memory_bytes is not None]
    return ModeSummary(
        label=label,
        mode=getattr(options, "mode", label),
        temperature=float(getattr(options, "temperature", float("nan"))),
        alpha=float(getattr(options, "alpha", float("nan"))),
        beta=float(getattr(options, "beta", float("nan"))),
        utterances=len(used),
        wer=wer,
        latency_mean_s=float(np.mean(latencies)) if latencies else float("nan"),
        latency_p50_s=percentile(latencies, 50),
        latency_p90_s=percentile(latencies, 90),
        audio_s=audio_s,
        compute_s=compute_s,
        rtfx=audio_s / compute_s if compute_s > 0 else float("nan"),
        verify_profiled_s=verify_s,
        verify_clock=verify_clock if verify_s is not None else None,
        verify_delta_pct=None,
        verify_steps=sum(m.verify_profiled_calls for m in runs),
        verify_ms_per_token=1e3 * verify_s / tokens_out if verify_s is not None and tokens_out else None,
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_accepted_per_step=mean_per_step,
        target_calls_per_token=target_calls / tokens_out if tokens_out else None,
        tokens_out=tokens_out,
        equal_to_baseline=equal,
        peak_memory_bytes=max(peaks) if peaks else None,
        peak_memory_kind=memory_kind,
    )


def add_verify_deltas(summaries: list[ModeSummary], baseline_label: str = "baseline") -> None:
    """Fill `verify_delta_pct` of every mode relative to the baseline's profiled verification time."""
    base = next((s for s in summaries if s.label == baseline_label), None)
    if base is None or not base.verify_profiled_s:
        return
    for s in summaries:
        if s.verify_profiled_s is not None and s.verify_clock == base.verify_clock:
            s.verify_delta_pct = (s.verify_profiled_s - base.verify_profiled_s) / base.verify_profiled_s * 100.0
