"""Where every benchmark puts its results: JSON for machines, the same table as Markdown for people."""

from __future__ import annotations

import json
from pathlib import Path


def save_results(out: Path, data: dict, table: str) -> None:
    """Print `table`, write `data` to `out` (JSON) and `table` beside it (`.md`)."""
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))
    out.with_suffix(".md").write_text(table + "\n")
