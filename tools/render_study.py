"""Write a published study again with this version's report (its figures, tests and plot), from its items.

    python tools/render_study.py docs/eval_study/all_clips_10_seeds

reads NAME.json and NAME_items.jsonl.gz and rewrites NAME.json, NAME.md and NAME.png; the items, which
are the measurements, are not touched. Used when the report gains a figure or a test (the seed-level
test and the seed-stream note came this way to studies run before them).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from asr_app.eval.study_merge import StudyMergeError, read_study_files
from asr_app.eval.study_report import write_study


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stems", nargs="+", type=Path, help="published study stems (NAME for NAME.json)")
    args = ap.parse_args(argv)
    for stem in args.stems:
        try:
            items = stem.with_name(stem.name + "_items.jsonl.gz")
            run, meta = read_study_files(stem.with_name(stem.name + ".json"), items)
        except StudyMergeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory() as tmp:
            paths = write_study(run, meta, Path(tmp))
            for kind, suffix in (("json", ".json"), ("markdown", ".md"), ("plot", ".png")):
                shutil.copyfile(paths[kind], stem.with_name(stem.name + suffix))
        print(f"{stem}: {len(run.items)} items, seeds {run.seeds}, seed streams {run.seed_streams}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
