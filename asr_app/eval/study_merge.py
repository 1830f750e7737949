"""Sampling studies run in parts, joined into one: each part decodes the same clips and modes with its own
seeds (`asr-eval --seed S --seeds N`), so two one-thread processes on two cores finish a study in half the
time; `tools/merge_study.py` reads their folders and writes the study the whole run would have written.

Parts must agree on everything but their seeds: clips (and their references), modes, temperatures, the
WER reference and the verification clock; a seed found in two parts is refused, as its items would count
twice in the paired tests.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from asr_app.decoding.options import DecodingOptions
from asr_app.eval.runner import ModeSpec
from asr_app.eval.study import StudyClip, StudyItem, StudyRun
from asr_app.eval.study_report import STUDY_FILES


class StudyMergeError(ValueError):
    """The parts cannot be one study; the message says how they differ."""


def read_study(folder: Path) -> tuple[StudyRun, dict]:
    """A study folder written by `write_study` back as (run, meta)."""
    return read_study_files(folder / STUDY_FILES["json"], folder / STUDY_FILES["items"])


def read_study_files(json_path: Path, items_path: Path) -> tuple[StudyRun, dict]:
    """A study from its JSON and its items (`.jsonl`, or `.jsonl.gz` as docs/eval_study/ keeps them)."""
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
        raw = items_path.read_bytes()
        lines = (gzip.decompress(raw) if items_path.suffix == ".gz" else raw).decode("utf-8").splitlines()
    except (OSError, json.JSONDecodeError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise StudyMergeError(f"{json_path.parent}: not a readable study ({exc})") from exc
    names = {f.name for f in fields(StudyItem)}
    items = [StudyItem(**{k: v for k, v in json.loads(line).items() if k in names}) for line in lines if line]
    specs = [ModeSpec(m["label"], DecodingOptions(mode=m["mode"], alpha=m["alpha"], beta=m["beta"]))
             for m in data["modes"]]
    run = StudyRun(specs=specs, temperatures=data["temperatures"], seeds=data["seeds"],
                   reference=data["wer_reference"], clips=[StudyClip(**c) for c in data["clips"]], items=items,
                   verify_clock=data["verify_clock"], encoder_reuses=data.get("encoder_reuses", 0),
                   seed_streams=data.get("seed_streams", "shared"))  # studies written before derive_seed
    return run, data["meta"]


def merge_studies(parts: Sequence[tuple[StudyRun, dict]]) -> tuple[StudyRun, dict]:
    """One study of every part's items; StudyMergeError where the parts are not one study split by seeds."""
    if len(parts) < 2:
        raise StudyMergeError("give at least two study folders to merge")
    first, meta = parts[0]
    for run, _ in parts[1:]:
        for what, mine, theirs in (
                ("modes", [s.label for s in first.specs], [s.label for s in run.specs]),
                ("temperatures", first.temperatures, run.temperatures),
                ("clips", [(c.id, c.reference, c.error) for c in first.clips],
                 [(c.id, c.reference, c.error) for c in run.clips]),
                ("WER reference", first.reference, run.reference),
                ("verification clock", first.verify_clock, run.verify_clock),
                ("seed streams", first.seed_streams, run.seed_streams)):
            if mine != theirs:
                raise StudyMergeError(f"the parts differ in their {what}; only their seeds may differ")
    seeds = [seed for run, _ in parts for seed in run.seeds]
    if len(set(seeds)) != len(seeds):
        raise StudyMergeError(f"a seed appears in two parts ({sorted(seeds)}): its items would count twice")
    merged = StudyRun(specs=first.specs, temperatures=first.temperatures, seeds=sorted(seeds),
                      reference=first.reference, clips=first.clips,
                      items=[item for run, _ in parts for item in run.items], verify_clock=first.verify_clock,
                      encoder_reuses=sum(run.encoder_reuses for run, _ in parts), seed_streams=first.seed_streams)
    seconds = [m.get("study_seconds") for _, m in parts]
    merged_meta = {**meta, "parts": [m.get("command") for _, m in parts],
                   "study_seconds": max(seconds) if all(s is not None for s in seconds) else None,
                   "study_seconds_note": "wall time of the slowest part (the parts ran side by side)"}
    return merged, merged_meta
