"""Writers: per-utterance JSONL, summary.json and report.md (tables shaped like the paper's 1 and 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from asr_app.eval.profiling import CPU_CLOCK
from asr_app.eval.runner import EvalRun
from asr_app.fileio import write_atomic


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def _clean(value: object) -> object:
    """JSON has no NaN/inf: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_utterances_jsonl(run: EvalRun, path: Path) -> None:
    lines = [json.dumps(_clean(r.to_dict()), ensure_ascii=False) for r in run.records]
    _atomic_write(path, "\n".join(lines) + "\n")


def summary_dict(run: EvalRun, meta: dict) -> dict:
    empty = [r.id for r in run.records if r.error is None and not r.reference_normalized.strip()]
    return _clean({
        **meta,
        "modes": [s.label for s in run.specs],
        "utterances_total": len(run.records),
        "utterances_evaluated": len(run.records) - len(run.failures),
        "utterances_excluded": len(run.failures),
        "excluded": [{"id": r.id, "source": r.source, "reason": r.error} for r in run.failures],
        "empty_references": empty,
        "warmup_utterances": run.warmup_utterances,
        "profile": run.profile,
        "verify_clock": run.verify_clock,
        "peak_memory_kind": run.memory_kind,
        "notes": run.notes,
        "summaries": {s.label: s.to_dict() for s in run.summaries},
    })


def write_summary_json(run: EvalRun, meta: dict, path: Path) -> dict:
    summary = summary_dict(run, meta)
    _atomic_write(path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


def _pct(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}"


def _delta(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1f}%"


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.0f}"


def table1(run: EvalRun, meta: dict) -> str:
    """The paper's Table 1 shape: WER per mode and Δ% profiling time of exact and sigmoid vs baseline."""
    by = {s.label: s for s in run.summaries}
    cols = [m for m in ("baseline", "exact", "sigmoid") if m in by]
    head = ["Dataset", "Target / draft"] + [f"WER {m} (%)" for m in cols]
    head += [f"Δ% profiling time {m}" for m in cols if m != "baseline" and "baseline" in by]
    evaluated = len(run.records) - len(run.failures)
    row = [f"{meta.get('dataset_label', '')} ({evaluated} utt.)", f"{_short(meta.get('target'))} / {_short(meta.get('draft'))}"]
    row += [_pct(by[m].wer.wer) for m in cols]
    row += [_delta(by[m].verify_delta_pct) for m in cols if m != "baseline" and "baseline" in by]
    return _md_table(head, [row])


def mode_table(run: EvalRun) -> str:
    head = ["mode", "WER (%)", "S", "D", "I", "ref words", "latency mean / p50 / p90 (s)", "RTFx",
            "verify time (s)", "Δ% verify vs baseline", "verify ms/token", "acceptance", "accepted/step", "target calls/token",
            "= baseline tokens", "peak mem (MiB)"]
    rows = []
    for s in run.summaries:
        rows.append([
            s.label, _pct(s.wer.wer), str(s.wer.substitutions), str(s.wer.deletions), str(s.wer.insertions),
            str(s.wer.reference_words),
            f"{_num(s.latency_mean_s)} / {_num(s.latency_p50_s)} / {_num(s.latency_p90_s)}", _num(s.rtfx, ".2f"),
            _num(s.verify_profiled_s, ".4f"), _delta(s.verify_delta_pct), _num(s.verify_ms_per_token, ".3f"),
            _pct(s.acceptance_rate, 1),
            _num(s.mean_accepted_per_step, ".2f"), _num(s.target_calls_per_token, ".3f"),
            _pct(s.equal_to_baseline, 0), _mib(s.peak_memory_bytes),
        ])
    return _md_table(head, rows)


def sweep_table(run: EvalRun) -> str | None:
    """The paper's Table 2 shape: sigmoid at alpha=-s, beta=s."""
    sweep = [s for s in run.summaries if s.label.startswith("sigmoid@")]
    if not sweep:
        return None
    head = ["scale s (alpha=-s, beta=s)", "WER (%)", "acceptance", "accepted/step", "Δ% profiling time vs baseline",
            "verify ms/token"]
    rows = [[f"{s.beta:.0e}", _pct(s.wer.wer), _pct(s.acceptance_rate, 1), _num(s.mean_accepted_per_step, ".2f"),
             _delta(s.verify_delta_pct), _num(s.verify_ms_per_token, ".3f")] for s in sweep]
    return _md_table(head, rows)


def _short(name: object) -> str:
    """A model's display name: the folder name of a local path, the hub id otherwise."""
    if not name:
        return "none"
    text = str(name)
    return Path(text).name if Path(text).is_dir() else text


def _verify_clock_text(clock: str | None) -> str:
    if clock == CPU_CLOCK:
        return "process CPU time (not wall time, so other programs' load does not move it)"
    if clock == "cuda":
        return "GPU time of the kernels (PyTorch profiler)"
    return "not measured"


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render_report(run: EvalRun, meta: dict, plots: dict[str, str]) -> str:
    temp = meta.get("temperature")
    parts = [
        "# asr-eval report",
        "",
        f"- command: `{meta.get('command', '')}`",
        f"- dataset: {meta.get('dataset_label', '')}; {len(run.records)} utterances, "
        f"{len(run.records) - len(run.failures)} evaluated, {len(run.failures)} excluded",
        f"- target: {meta.get('target')}; draft: {meta.get('draft')}; device: {meta.get('device')}; "
        f"dtype: {meta.get('dtype')}" + (f" (draft: {meta['draft_dtype']})" if meta.get("draft_dtype") else ""),
        f"- decoding: {'greedy (temperature 0)' if not temp else f'sampling, temperature {temp}'}, seed "
        f"{meta.get('seed')}, gamma {meta.get('gamma')}, sigmoid alpha/beta {meta.get('alpha')}/{meta.get('beta')}",
        f"- warm-up: {run.warmup_utterances} utterance(s) per mode, not measured; verification time: "
        f"{_verify_clock_text(run.verify_clock)}, summed over the `asr_app.verify` ranges (profile pass: "
        f"{run.profile}; modes interleaved per utterance); peak memory: {run.memory_kind}",
        f"- WER: jiwer after Whisper's English normaliser on both sides (spelling map: "
        f"{'yes' if meta.get('spelling_map') else 'MISSING'})",
        "",
        "## Table 1 (paper shape)",
        "",
        table1(run, meta),
        "",
        "Δ% profiling time: change of the summed verification-step time relative to baseline "
        "(negative = less time).",
        "",
        "## All modes",
        "",
        mode_table(run),
        "",
    ]
    sweep = sweep_table(run)
    if sweep:
        parts += ["## Sigmoid scale sweep (paper Table 2 shape)", "", sweep, ""]
    empty = [r.id for r in run.records if r.error is None and not r.reference_normalized.strip()]
    if empty:
        parts += [f"Empty references (hypothesis words count as insertions): {', '.join(empty)}", ""]
    if run.failures:
        parts += ["## Excluded utterances", ""]
        parts += [f"- `{r.id}` ({r.source}): {r.error}" for r in run.failures]
        parts.append("")
    if run.notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in run.notes] + [""]
    if plots:
        parts += ["## Plots", ""] + [f"![{name}]({path})" for name, path in plots.items()] + [""]
    return "\n".join(parts)


def write_report_md(run: EvalRun, meta: dict, plots: dict[str, str], path: Path) -> str:
    text = render_report(run, meta, plots)
    _atomic_write(path, text)
    return text
