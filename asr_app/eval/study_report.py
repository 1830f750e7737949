"""The sampling study's figures: per-mode summaries, paired comparisons, JSON, Markdown and a plot."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from asr_app.eval.significance import clip_bootstrap_ratio, seed_permutation_pvalue, wilcoxon_pvalue  # noqa: E402
from asr_app.eval.study import StudyItem, StudyRun  # noqa: E402

STUDY_FILES = {"json": "study.json", "items": "study_items.jsonl", "markdown": "study.md", "plot": "study.png"}


@dataclass
class ModeFigures:
    """One mode at one temperature, over every (clip, seed) item."""

    label: str
    mode: str
    temperature: float
    alpha: float | None
    beta: float | None
    items: int
    clips: int
    wer: float | None               # corpus WER against the study's reference
    wer_ci: tuple[float, float] | None  # 95%, clips resampled
    text_wer: float | None          # against the transcripts, over the items whose clip has one
    text_items: int
    acceptance: float | None        # accepted / drafted
    tokens_per_call: float | None   # output tokens per target call
    verify_ms_per_call: float | None
    verify_us_per_token: float | None
    verify_calls: int


@dataclass
class Comparison:
    """`label` against `against` at one temperature, paired over the items both decoded."""

    temperature: float
    label: str
    against: str
    pairs: int
    delta_wer: float | None             # WER(label) - WER(against), a fraction
    delta_wer_ci: tuple[float, float] | None
    wer_pvalue: float | None            # Wilcoxon signed-rank over per-item error counts
    verify_ratio: float | None          # verify ms per call, label / against
    verify_pvalue: float | None         # Wilcoxon over per-item verify ms per call
    # sign-flip permutation over seeds of each seed's corpus WER / acceptance (significance.seed_permutation_pvalue)
    seed_wer_pvalue: float | None = None
    seed_acceptance_pvalue: float | None = None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _by(items: list[StudyItem]) -> dict[tuple[float, str], list[StudyItem]]:
    groups: dict[tuple[float, str], list[StudyItem]] = defaultdict(list)
    for it in items:
        groups[(it.temperature, it.label)].append(it)
    return groups


def _per_clip(items: list[StudyItem], clips: list[str], key) -> np.ndarray:
    sums = dict.fromkeys(clips, 0.0)
    for it in items:
        sums[it.clip] += key(it)
    return np.array([sums[c] for c in clips], dtype=np.float64)


def mode_figures(run: StudyRun) -> list[ModeFigures]:
    options = {s.label: s.options for s in run.specs}
    out = []
    for (temperature, label), items in sorted(_by(run.items).items(), key=lambda kv: (kv[0][0], _order(run, kv[0][1]))):
        clips = sorted({it.clip for it in items})
        errors = _per_clip(items, clips, lambda it: it.errors)
        words = _per_clip(items, clips, lambda it: it.ref_words)
        texted = [it for it in items if it.text_words]
        timed = [it for it in items if it.verify_s is not None]
        verify_s, calls = sum(it.verify_s for it in timed), sum(it.verify_calls for it in timed)
        opts = options.get(label)
        sigmoid = opts is not None and opts.mode == "sigmoid"
        out.append(ModeFigures(
            label=label, mode=opts.mode if opts else label, temperature=temperature,
            alpha=opts.alpha if sigmoid else None, beta=opts.beta if sigmoid else None,
            items=len(items), clips=len(clips), wer=_ratio(errors.sum(), words.sum()),
            wer_ci=clip_bootstrap_ratio(errors, words),
            text_wer=_ratio(sum(it.text_errors for it in texted), sum(it.text_words for it in texted)),
            text_items=len(texted),
            acceptance=_ratio(sum(it.accepted for it in items), sum(it.drafted for it in items)),
            tokens_per_call=_ratio(sum(it.tokens_out for it in items), sum(it.target_calls for it in items)),
            verify_ms_per_call=1e3 * verify_s / calls if calls else None,
            verify_us_per_token=1e6 * verify_s / sum(it.tokens_out for it in timed) if timed else None,
            verify_calls=calls,
        ))
    return out


def _order(run: StudyRun, label: str) -> int:
    labels = [s.label for s in run.specs]
    return labels.index(label) if label in labels else len(labels)


def compare(run: StudyRun, label: str, against: str, temperature: float) -> Comparison:
    groups = _by(run.items)
    mine = {(it.clip, it.seed): it for it in groups.get((temperature, label), [])}
    theirs = {(it.clip, it.seed): it for it in groups.get((temperature, against), [])}
    keys = sorted(mine.keys() & theirs.keys())
    a, b = [mine[k] for k in keys], [theirs[k] for k in keys]
    clips = sorted({k[0] for k in keys})
    diff = _per_clip(a, clips, lambda it: it.errors) - _per_clip(b, clips, lambda it: it.errors)
    words = _per_clip(a, clips, lambda it: it.ref_words)
    timed = [(x, y) for x, y in zip(a, b) if x.verify_calls and y.verify_calls]
    per_call = lambda it: it.verify_s / it.verify_calls  # noqa: E731
    verify_ratio = None
    if timed:
        mine_ms = sum(x.verify_s for x, _ in timed) / sum(x.verify_calls for x, _ in timed)
        their_ms = sum(y.verify_s for _, y in timed) / sum(y.verify_calls for _, y in timed)
        verify_ratio = _ratio(mine_ms, their_ms)
    return Comparison(
        temperature=temperature, label=label, against=against, pairs=len(keys),
        delta_wer=_ratio(diff.sum(), words.sum()), delta_wer_ci=clip_bootstrap_ratio(diff, words),
        wer_pvalue=wilcoxon_pvalue([x.errors for x in a], [y.errors for y in b]),
        verify_ratio=verify_ratio,
        verify_pvalue=wilcoxon_pvalue([per_call(x) for x, _ in timed], [per_call(y) for _, y in timed]),
        seed_wer_pvalue=_seed_pvalue(a, b, lambda it: it.errors, lambda it: it.ref_words),
        seed_acceptance_pvalue=_seed_pvalue(a, b, lambda it: it.accepted, lambda it: it.drafted),
    )


def _seed_pvalue(a: list[StudyItem], b: list[StudyItem], num, den) -> float | None:
    """Per seed, sum(num) / sum(den) over its clips for both modes (paired items), then the sign-flip test;
    None where a seed has no denominator in either mode (e.g. acceptance of a mode without drafts)."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])  # seed -> num_a, den_a, num_b, den_b
    for x, y in zip(a, b):
        row = sums[x.seed]
        row[0] += num(x); row[1] += den(x); row[2] += num(y); row[3] += den(y)  # noqa: E702
    if any(not row[1] or not row[3] for row in sums.values()):
        return None
    rows = [sums[s] for s in sorted(sums)]
    return seed_permutation_pvalue([r[0] / r[1] for r in rows], [r[2] / r[3] for r in rows])


def comparisons(run: StudyRun, against: str = "exact") -> list[Comparison]:
    """Every mode against `against` (exact: the distribution the others are measured by) at every temperature."""
    labels = [s.label for s in run.specs]
    if against not in labels:
        return []
    return [compare(run, label, against, t) for t in run.temperatures for label in labels if label != against]


def write_study(run: StudyRun, meta: dict, out_dir: Path) -> dict[str, Path]:
    """study.json (figures, comparisons, clips, metadata), study_items.jsonl, study.md and study.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures, comps = mode_figures(run), comparisons(run)
    paths = {k: out_dir / v for k, v in STUDY_FILES.items()}
    data = {
        "meta": meta, "temperatures": run.temperatures, "seeds": run.seeds, "wer_reference": run.reference,
        "verify_clock": run.verify_clock, "encoder_reuses": run.encoder_reuses, "seed_streams": run.seed_streams,
        "modes": [{"label": s.label, "mode": s.options.mode, "alpha": s.options.alpha, "beta": s.options.beta}
                  for s in run.specs],
        "clips": [asdict(c) for c in run.clips],
        "figures": [asdict(f) for f in figures], "comparisons": [asdict(c) for c in comps],
    }
    paths["json"].write_text(json.dumps(data, indent=1, default=_jsonable) + "\n", encoding="utf-8")
    with paths["items"].open("w", encoding="utf-8") as fh:
        for it in run.items:
            fh.write(json.dumps(asdict(it), default=_jsonable) + "\n")
    plot_study(figures, comps, paths["plot"])
    paths["markdown"].write_text(study_markdown(run, figures, comps, meta) + "\n", encoding="utf-8")
    return paths


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}"


def _p(p: float | None) -> str:
    return "n/a" if p is None else ("<1e-4" if p < 1e-4 else f"{p:.3g}")


def study_markdown(run: StudyRun, figures: list[ModeFigures], comps: list[Comparison], meta: dict) -> str:
    used = [c for c in run.clips if c.error is None]
    ref = "each clip's greedy transcript (target alone, T = 0)" if run.reference == "greedy" else "the transcripts"
    lines = [
        f"{len(used)} clips x {len(run.seeds)} seeds ({run.seeds[0]}-{run.seeds[-1]}) per temperature; WER against "
        f"{ref}; 95% intervals resample whole clips; p: Wilcoxon signed-rank over (clip, seed) pairs against "
        f"exact; p (seeds): sign-flip permutation over the seeds' corpus figures; verify time: "
        f"{'process CPU time' if run.verify_clock == 'process-cpu' else 'wall time (CUDA)'} "
        f"of the verify calls. Command: `{meta.get('command', '')}`", ""]
    if run.seed_streams == "shared":
        lines += ["**Seed streams shared across clips**: this study ran before each clip had its own random stream; "
                  "seed s gave every clip the same one, so the clips of one seed are not independent and the "
                  "(clip, seed) p and the clip intervals understate the noise. Only p (seeds) is valid.", ""]
    comp = {(c.temperature, c.label): c for c in comps}
    head = ["T", "mode", "WER % [95% CI]", "Δ WER vs exact, points [95% CI]", "p", "WER vs text %",
            "acceptance %", "p (seeds): WER, acceptance", "tokens / target call", "verify ms / step", "verify vs exact",
            "p (verify)", "verify µs / token"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in figures:
        c = comp.get((f.temperature, f.label))
        ci = f" [{_pct(f.wer_ci[0])}, {_pct(f.wer_ci[1])}]" if f.wer_ci else ""
        dci = f" [{100 * c.delta_wer_ci[0]:+.1f}, {100 * c.delta_wer_ci[1]:+.1f}]" if c and c.delta_wer_ci else ""
        delta = f"{100 * c.delta_wer:+.1f}{dci}" if c and c.delta_wer is not None else "-"
        ratio = f"{c.verify_ratio:.2f}x" if c and c.verify_ratio is not None else "-"
        name = f.label + (f" (α={f.alpha:g}, β={f.beta:g})" if f.alpha is not None else "")
        lines.append("| " + " | ".join([
            f"{f.temperature:g}", name, _pct(f.wer) + ci, delta, _p(c.wer_pvalue) if c else "-", _pct(f.text_wer),
            _pct(f.acceptance), f"{_p(c.seed_wer_pvalue)}, {_p(c.seed_acceptance_pvalue)}" if c else "-",
            "n/a" if f.tokens_per_call is None else f"{f.tokens_per_call:.2f}",
            "n/a" if f.verify_ms_per_call is None else f"{f.verify_ms_per_call:.3f}", ratio,
            _p(c.verify_pvalue) if c else "-",
            "n/a" if f.verify_us_per_token is None else f"{f.verify_us_per_token:.0f}"]) + " |")
    left_out = [c for c in run.clips if c.error is not None]
    if left_out:
        lines += ["", f"{len(left_out)} clip(s) left out: " + "; ".join(f"{c.id} ({c.error})" for c in left_out)]
    return "\n".join(lines)


def _sigmoid_scale(f: ModeFigures) -> float | None:
    return (f.beta - f.alpha) / 2 if f.alpha is not None and f.beta is not None else None


def plot_study(figures: list[ModeFigures], comps: list[Comparison], path: Path) -> None:
    """Four panels: WER per mode and temperature (95% CI); sigmoid's WER and acceptance against its scale
    s = (beta - alpha) / 2 with exact's as lines; verification time per step per mode."""
    temps = sorted({f.temperature for f in figures})
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5), dpi=100)
    try:
        _wer_bars(axes[0, 0], figures, temps)
        _sweep(axes[0, 1], figures, temps, "wer", "WER (%)")
        _sweep(axes[1, 0], figures, temps, "acceptance", "acceptance (%)")
        _verify_bars(axes[1, 1], figures, temps)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def _labels(figures: list[ModeFigures]) -> list[str]:
    return list(dict.fromkeys(f.label for f in figures))


def _wer_bars(ax, figures, temps) -> None:
    labels = _labels(figures)
    width = 0.8 / max(1, len(temps))
    for k, t in enumerate(temps):
        by = {f.label: f for f in figures if f.temperature == t}
        xs = np.arange(len(labels)) + k * width
        wer = [100 * (by[lab].wer or 0) if lab in by else np.nan for lab in labels]
        err = [[100 * ((by[lab].wer or 0) - by[lab].wer_ci[0]) if lab in by and by[lab].wer_ci else 0 for lab in labels],
               [100 * (by[lab].wer_ci[1] - (by[lab].wer or 0)) if lab in by and by[lab].wer_ci else 0 for lab in labels]]
        ax.bar(xs, wer, width, yerr=err, capsize=2, label=f"T = {t:g}")
    ax.set_xticks(np.arange(len(labels)) + width * (len(temps) - 1) / 2, labels, rotation=30, ha="right")
    ax.set_ylabel("WER (%), 95% CI over clips")
    ax.set_title("WER per mode")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)


def _sweep(ax, figures, temps, attr: str, ylabel: str) -> None:
    for t in temps:
        points = sorted((_sigmoid_scale(f), getattr(f, attr)) for f in figures
                        if f.temperature == t and _sigmoid_scale(f) is not None and getattr(f, attr) is not None)
        if points:
            line, = ax.plot([p[0] for p in points], [100 * p[1] for p in points], "o-", label=f"sigmoid, T = {t:g}")
            exact = next((f for f in figures if f.temperature == t and f.label == "exact"), None)
            if exact is not None and getattr(exact, attr) is not None:
                ax.axhline(100 * getattr(exact, attr), color=line.get_color(), ls="--", label=f"exact, T = {t:g}")
    ax.set_xscale("log")
    ax.set_xlabel("sigmoid scale s (alpha = -s, beta = s)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"sigmoid sweep: {ylabel.split(' ')[0]}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def _verify_bars(ax, figures, temps) -> None:
    labels = [lab for lab in _labels(figures) if any(f.label == lab and f.verify_ms_per_call for f in figures)]
    width = 0.8 / max(1, len(temps))
    for k, t in enumerate(temps):
        by = {f.label: f for f in figures if f.temperature == t}
        ax.bar(np.arange(len(labels)) + k * width,
               [by[lab].verify_ms_per_call if lab in by and by[lab].verify_ms_per_call else np.nan for lab in labels],
               width, label=f"T = {t:g}")
    ax.set_xticks(np.arange(len(labels)) + width * (len(temps) - 1) / 2, labels, rotation=30, ha="right")
    ax.set_ylabel("verification ms per step")
    ax.set_title("verification time per step")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
