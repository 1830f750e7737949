"""The figures tables in docs/ (and README.md), made from the committed result files they name.

A table is kept between two markers that name its result file (bench/report_io.py's convention):

    <!-- table: bench/results/<device>/<date>/<bench>.json -->
    ...generated; edits here are overwritten...
    <!-- /table -->

Its content is the bench's table rendered from that JSON (`report_io.TABLES`, by the file name's start), or,
for a bench without a renderer there, the `.md` the bench wrote beside the JSON in the same run. Figures
without a result file stay in the docs as prose marked historical; this script does not touch them.

    python tools/docs_tables.py            # rewrite every table from its file
    python tools/docs_tables.py --check    # list the tables that no longer match their files (exit 1)

tests/test_docs_tables.py runs the check, so CI fails when a table and its result file disagree.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from report_io import TABLES  # noqa: E402  (bench/ is not a package)

MARKED = re.compile(r"(<!-- table: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.DOTALL)


def documents(repo: Path = REPO) -> list[Path]:
    return sorted((repo / "docs").glob("*.md")) + [p for p in [repo / "README.md"] if p.exists()]


def render(result: Path) -> str:
    """The table of one result file (see the module doc)."""
    for bench, table in TABLES.items():
        if result.name.startswith(bench):
            return table(json.loads(result.read_text()))
    beside = result.with_suffix(".md")
    if not beside.exists():
        raise FileNotFoundError(f"no renderer for {result.name} and no {beside.name} beside it")
    return beside.read_text().rstrip("\n")


def regenerate(text: str, repo: Path = REPO) -> str:
    """`text` with every marked table rebuilt from its file (a missing file raises FileNotFoundError)."""
    def table(match: re.Match) -> str:
        result = repo / match["path"]
        if not result.exists():
            raise FileNotFoundError(f"{match['path']} (named by a table marker) does not exist")
        return f"{match[1]}{render(result)}\n{match[4]}"

    return MARKED.sub(table, text)


def stale(repo: Path = REPO) -> list[str]:
    """One line per document whose tables differ from what their files give, or whose files are missing."""
    problems = []
    for doc in documents(repo):
        text = doc.read_text()
        try:
            if regenerate(text, repo) != text:
                problems.append(f"{doc.relative_to(repo)}: a table no longer matches its result file "
                                f"(python tools/docs_tables.py)")
        except (FileNotFoundError, KeyError, ValueError) as err:
            problems.append(f"{doc.relative_to(repo)}: {err}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    args = ap.parse_args(argv)
    if args.check:
        problems = stale()
        print("\n".join(problems) or "every table matches its result file")
        return 1 if problems else 0
    for doc in documents():
        text = doc.read_text()
        new = regenerate(text)
        if new != text:
            doc.write_text(new)
            print(f"rewrote the tables of {doc.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
