"""The model card beside the weights (card.json for programs, README.md for people) and the training plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from asr_app.fileio import write_all_atomic

CARD_JSON = "card.json"
CARD_MD = "README.md"
PLOT = "training.png"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _decoder_lines(decoder: dict, name: str) -> list[str]:
    lines = [f"{name}: greedy `exact` identical to `off` on {decoder['identical']} of {decoder['clips']} clips."]
    if decoder.get("speedup"):
        lines.append(f"{name}: `exact` (cost-aware gamma) against `off`, end to end over the clips: "
                     f"{decoder['speedup']:.2f}x (`exact` {decoder['exact_s']:.1f} s, `off` {decoder['off_s']:.1f} s).")
    if decoder.get("ceiling"):
        off = decoder["off_split"]
        lines.append(f"{name}: the token loop alone {_num(decoder.get('loop_speedup'))}x; it was "
                     f"{_pct(decoder['off_loop_s'] / decoder['off_s'])} of `off`'s time (the encoder "
                     f"{_pct(off['encoder_s'] / decoder['off_s'])}), so no draft could make `exact` more than "
                     f"{decoder['ceiling']:.2f}x `off` on these clips.")
    for language, row in decoder.get("by_language", {}).items():
        heard = row.get("detected_as")
        heard_as = f" (detected as {', '.join(f'{k} {n}' for k, n in sorted(heard.items()))})" if heard else ""
        speed = f", `exact` {row['speedup']:.2f}x `off`" if row.get("speedup") else ""
        lines.append(f"- {language}: {row['clips']} clips, acceptance {_pct(row['acceptance'])}, "
                     f"{row['tokens_per_call']:.2f} tokens per target call{speed}{heard_as}")
    return lines


def _evaluation_lines(card: dict) -> list[str]:
    ev = card.get("evaluation") or {}
    if not ev:
        return ["No held-out audio was given (`--eval-audio`, or `--holdout` > 0): nothing was measured."]
    base = ev.get("baseline") or {}
    name = f"baseline `{base['draft']}`" if base else "baseline"
    decoded = {"given": "each in its folder's language where one is named (`--eval-language given`), else detected",
               "en": "in English (an English-only target)"}.get(ev.get("language"), "in the language the target detects")
    lines = [f"Held-out audio never trained on: {ev['clips']} clips, {ev['hours'] * 60:.1f} min, decoded {decoded}.", "",
             f"| metric | untrained (target layers) | this draft | {name} |", "|---|---|---|---|"]
    before, after, other = ev.get("initial") or {}, ev.get("final") or {}, base.get("final") or {}
    for label, key, show in (("teacher-forced agreement", "agreement", _pct), ("KL to the teacher (top-k + rest)",
                                                                              "kl", lambda v: _num(v, 3))):
        lines.append(f"| {label} | {show(before.get(key))} | {show(after.get(key))} | {show(other.get(key))} |")
    calls = (base.get("decoder") or {}).get("tokens_per_call", {})
    for gamma, value in ev["decoder"]["tokens_per_call"].items():
        lines.append(f"| tokens per target call, gamma {gamma} | | {_num(value)} | {_num(calls.get(gamma))} |")
    lines += ["", *_decoder_lines(ev["decoder"], "this draft")]
    if base:
        lines += _decoder_lines(base["decoder"], name)
    return lines


def _student(train: dict) -> str:
    if train.get("started_from"):
        return f"the draft `{train['started_from']}` trained further (its layers and head)"
    return f"decoder layers {train['layers']} of the target"


def render_markdown(card: dict) -> str:
    data, train, teacher = card["data"], card["training"], card["teacher"]
    lines = [
        f"# Draft for {card['target']['name']}", "",
        "A decoder-only Whisper draft (`WhisperForCausalLM`) distilled by `asr-distill` from its target, which it",
        "runs beside (on the target's encoder output). Load it with `--draft` and this folder.", "",
        f"- target: `{card['target']['name']}` (fingerprint `{card['target']['fingerprint'][:16]}`)",
        f"- student: {_student(train)}; embeddings frozen at the target's",
        f"- command: `{card.get('command', '')}`", "",
        "## Data", "",
        f"Training: {data['train']['clips']} clips from {data['train']['files']} files, "
        f"{data['train']['hours'] * 60:.1f} min, in {', '.join(data['train']['sources'])}; labels are the target's own",
        f"greedy transcripts ({', '.join(teacher['variants'])}), {data['train']['labels']} label sequences.", "",
        "## Training", "",
        f"{train['steps']} steps in {train['seconds'] / 60:.1f} min on {card['device']} (teacher pass "
        f"{teacher['seconds'] / 60:.1f} min: {teacher['computed']} clips labelled, {teacher['reused']} from the cache).",
        f"First {train['first']['steps']} steps: loss {train['first']['loss']:.3f}, agreement "
        f"{_pct(train['first']['agreement'])}; last {train['final']['steps']}: loss {train['final']['loss']:.3f}, "
        f"agreement {_pct(train['final']['agreement'])} (training batches, teacher-forced).", "",
        "## Evaluation", "", *_evaluation_lines(card), "",
        f"`{CARD_JSON}` holds every figure and option; `{PLOT}` shows loss and agreement per step.",
    ]
    return "\n".join(lines) + "\n"


def write_card(folder: Path, card: dict) -> None:
    write_all_atomic({folder / CARD_JSON: json.dumps(card, indent=1, sort_keys=True) + "\n",
                      folder / CARD_MD: render_markdown(card)})


def plot_history(path: Path, steps: Sequence[int], loss: Sequence[float], agreement: Sequence[float],
                 held_out: float | None = None) -> Path:
    """Loss and agreement per training step (a running mean over a few steps beside the raw values)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = max(1, len(steps) // 50)

    def smooth(values: Sequence[float]) -> list[float]:
        return [sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
                for i in range(len(values))]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(steps, loss, color="tab:blue", alpha=0.3, linewidth=0.8)
    top.plot(steps, smooth(loss), color="tab:blue", label="loss (KL + weighted CE)")
    top.set_ylabel("loss")
    top.legend()
    bottom.plot(steps, [100 * a for a in agreement], color="tab:green", alpha=0.3, linewidth=0.8)
    bottom.plot(steps, smooth([100 * a for a in agreement]), color="tab:green", label="agreement, training batch")
    if held_out is not None:
        bottom.axhline(100 * held_out, color="tab:red", linestyle="--", label="agreement, held-out (final)")
    bottom.set_xlabel("step")
    bottom.set_ylabel("agreement with the target (%)")
    bottom.legend()
    fig.subplots_adjust(left=0.1, right=0.97, top=0.97, bottom=0.09, hspace=0.08)  # tight_layout: ~0.4 s
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
