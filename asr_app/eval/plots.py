"""PNG plots: WER vs latency per mode, verification time per step vs gamma, acceptance-rate histogram."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from asr_app.eval.runner import EvalRun  # noqa: E402

PLOT_FILES = {
    "wer_vs_latency": "wer_vs_latency.png",
    "verify_time_vs_gamma": "verify_time_vs_gamma.png",
    "acceptance_histogram": "acceptance_histogram.png",
}


def write_plots(run: EvalRun, out_dir: Path) -> dict[str, str]:
    """Write the three plots; returns {name: file name relative to out_dir}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, draw in (("wer_vs_latency", _wer_vs_latency), ("verify_time_vs_gamma", _verify_vs_gamma),
                       ("acceptance_histogram", _acceptance_hist)):
        fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=100)
        try:
            draw(run, ax)
            fig.tight_layout()
            fig.savefig(out_dir / PLOT_FILES[name])
            written[name] = PLOT_FILES[name]
        finally:
            plt.close(fig)
    return written


def _wer_vs_latency(run: EvalRun, ax) -> None:
    for s in run.summaries:
        if s.wer.wer is None:
            continue
        y = 100 * s.wer.wer
        (line,) = ax.plot([s.latency_mean_s], [y], "o", label=s.label)
        ax.hlines(y, s.latency_p50_s, s.latency_p90_s, colors=line.get_color(), alpha=0.6)
        ax.annotate(s.label, (s.latency_mean_s, 100 * s.wer.wer), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("latency per utterance, mean (bars: p50..p90) [s]")
    ax.set_ylabel("WER [%]")
    wers = [100 * s.wer.wer for s in run.summaries if s.wer.wer is not None]
    if wers and max(wers) > 100:
        # A runaway mode (WER in the hundreds) would flatten the others onto the axis.
        ax.set_yscale("symlog", linthresh=10)
    ax.set_title("WER vs latency per mode")
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize="small")


def _verify_vs_gamma(run: EvalRun, ax) -> None:
    for spec in run.specs:
        per_gamma: dict[int, list[float]] = defaultdict(list)
        for r in run.records:
            m = r.runs.get(spec.label)
            for gamma, seconds in (m.verify_steps if m else []):
                per_gamma[gamma].append(seconds)
        if not per_gamma:
            continue
        gammas = sorted(per_gamma)
        ax.plot(gammas, [1e3 * float(np.median(per_gamma[g])) for g in gammas], marker="o", label=spec.label)
    ax.set_xlabel("gamma (draft tokens verified in the step)")
    ax.set_ylabel("verification time per step, median [ms]")
    ax.set_title("Verification-step time vs gamma")
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no profiled verification steps", ha="center", va="center", transform=ax.transAxes)


def _acceptance_hist(run: EvalRun, ax) -> None:
    bins = np.linspace(0.0, 1.0, 11)
    series, labels = [], []
    for spec in run.specs:
        rates = [r.runs[spec.label].stats.get("acceptance_rate") for r in run.records
                 if r.error is None and spec.label in r.runs and r.runs[spec.label].stats.get("drafted")]
        rates = [x for x in rates if x is not None]
        if rates:
            series.append(rates)
            labels.append(f"{spec.label} (n={len(rates)})")
    if series:
        # Side-by-side bars: identical modes (greedy) would hide each other if overlaid.
        ax.hist(series, bins=bins, label=labels)
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no drafted tokens", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("acceptance rate per utterance (accepted / drafted)")
    ax.set_ylabel("utterances")
    ax.set_title("Acceptance-rate histogram")
