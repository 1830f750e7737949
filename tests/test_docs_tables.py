"""The figures tables in docs/ match the committed result files they name (tools/docs_tables.py): a table whose
file changed, or is gone, fails here. Fast: JSON and Markdown only."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_tables", REPO / "tools" / "docs_tables.py")
docs_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_tables)


def test_every_table_in_the_docs_matches_its_result_file():
    assert docs_tables.stale() == []
    marked = [doc for doc in docs_tables.documents() if docs_tables.MARKED.search(doc.read_text())]
    assert REPO / "docs" / "results.md" in marked  # the check has tables to check


def batch_report(tokens_per_s: float) -> dict:
    row = {"mode": "off", "batch": 1, "samples_s": [2.0], "median_s": 2.0, "tokens": 100, "tokens_per_s": tokens_per_s,
           "rtfx": 5.0, "speedup_vs_off": 1.0, "loop_share": 0.5, "tokens_per_target_call": 1.0,
           "identical_to_off": None}
    return {"meta": {"device": "Some CPU"}, "rows": [row],
            "config": {"workload": "w", "threads": 2, "repeats": 1, "loadavg_before_after": [0.5, 0.7]}}


def test_a_table_whose_file_changed_or_went_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    result = tmp_path / "bench" / "results" / "some-cpu" / "2026-11-25" / "batch_bench.json"
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps(batch_report(50.0)))
    other = result.with_name("memory_bench.json")  # no renderer: the .md the bench wrote beside it
    other.write_text("{}")
    other.with_suffix(".md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    doc = tmp_path / "docs" / "results.md"
    doc.write_text(f"# Results\n\n<!-- table: {result.relative_to(tmp_path)} -->\nold\n<!-- /table -->\n\nprose\n\n"
                   f"<!-- table: {other.relative_to(tmp_path)} -->\n<!-- /table -->\n")
    assert len(docs_tables.stale(tmp_path)) == 1  # written by hand, not from the files
    doc.write_text(docs_tables.regenerate(doc.read_text(), tmp_path))
    text = doc.read_text()
    assert "| off | 1 | 2.00 | 50.0 | 5.0 |" in text and "| 1 | 2 |" in text and "prose" in text
    assert docs_tables.stale(tmp_path) == []
    result.write_text(json.dumps(batch_report(51.0)))  # the figures changed, the table did not
    assert docs_tables.stale(tmp_path) == ["docs/results.md: a table no longer matches its result file "
                                           "(python tools/docs_tables.py)"]
    result.unlink()
    assert "does not exist" in docs_tables.stale(tmp_path)[0]
    with pytest.raises(FileNotFoundError):
        docs_tables.regenerate(text, tmp_path)
