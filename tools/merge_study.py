"""Join sampling-study parts that differ only in their seeds into one study (asr_app/eval/study_merge.py).

    asr-eval --dataset local --modes off,baseline,exact,sigmoid --temperatures 0.6,1.0 --threads 1 \
        --seed 0 --seeds 5 --output-dir part-a &
    asr-eval ... --seed 5 --seeds 5 --output-dir part-b &
    wait; python tools/merge_study.py part-a part-b --out study
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr_app.eval.study_merge import StudyMergeError, merge_studies, read_study
from asr_app.eval.study_report import write_study


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="+", type=Path, help="study folders (asr-eval --seeds ... --output-dir)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        run, meta = merge_studies([read_study(folder) for folder in args.parts])
    except StudyMergeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = write_study(run, meta, args.out)
    print(f"merged {len(args.parts)} parts, seeds {run.seeds}, {len(run.items)} items: "
          f"{', '.join(str(p) for p in paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
