"""How the suite is split between pytest-xdist workers (tests/conftest.py): every module is one unit of work
on one worker, the Ray modules one unit together. pytest 9.2 once broke xdist's own grouping silently (every
test became a unit and a module's server started on both workers), so the split itself is checked."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from conftest import RAY_MODULES, work_unit

WORKERS_SEEN: list[str] = []   # one entry per test of this module that ran in this process


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def test_first_of_three_in_one_unit():
    WORKERS_SEEN.append(_worker())
    assert WORKERS_SEEN == [_worker()]


def test_second_of_three_in_one_unit():
    WORKERS_SEEN.append(_worker())
    assert WORKERS_SEEN == [_worker()] * 2, "this module's tests ran on more than one worker"


def test_the_scheduler_splits_by_module_and_keeps_the_ray_modules_together():
    WORKERS_SEEN.append(_worker())
    assert WORKERS_SEEN == [_worker()] * 3, "this module's tests ran on more than one worker"
    pytest.importorskip("xdist")
    from conftest import pytest_xdist_make_scheduler

    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True), getvalue=lambda name: ["2*popen"])
    scheduler = pytest_xdist_make_scheduler(config, log=None)
    assert config.option.loadscopereorder is False   # the longest-first order is kept
    scopes = {scheduler._split_scope(nodeid) for nodeid in (
        "tests/test_serve.py::test_models_and_every_response_format",
        "tests/test_serve.py::test_bad[a@b]",
        "tests/test_serve.py::test_bad[a@b]@test_serve")}
    assert scopes == {"test_serve"}
    assert {scheduler._split_scope(f"tests/{module}.py::test_x") for module in RAY_MODULES} == {"ray"}
    assert work_unit("tests/test_streaming.py::test_y[off]") == "test_streaming"
