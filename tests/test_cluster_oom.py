"""A worker killed by Ray's memory monitor (a real out-of-memory kill, not a stand-in): its file goes to
another worker, or fails alone after `max_attempts` tries, and the batch goes on.

The local Ray instance here sets the monitor's threshold 3 GB above the memory this machine uses now, and
the worker for a file named eat-* allocates until the monitor kills it (a few seconds). The threshold is
this module's alone: the other cluster tests run without it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

ray = pytest.importorskip("ray", reason="the cluster extra (Ray) is part of the dev extra")

from asr_app.cluster import ClusterOptions, RayTranscriber  # noqa: E402
from asr_app.transcript import Transcript  # noqa: E402

MARGIN = 3 << 30  # the monitor fires this far above the memory in use when the module starts


def meminfo() -> tuple[int, int]:
    """(total, available) bytes of this machine, as Ray's monitor reads them (Linux's /proc/meminfo)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return tuple(int(fields[name].split()[0]) * 1024 for name in ("MemTotal", "MemAvailable"))


@pytest.fixture(scope="module")
def ray_with_a_low_memory_threshold():
    if not Path("/proc/meminfo").is_file():
        pytest.skip("Ray's memory monitor reads Linux's memory figures")
    total, available = meminfo()
    if available < 2 * MARGIN:
        pytest.skip(f"{available >> 20} MB available: too little to fill {MARGIN >> 20} MB safely")
    threshold = (total - available + MARGIN) / total
    saved = {k: os.environ.get(k) for k in ("RAY_memory_usage_threshold", "RAY_memory_monitor_refresh_ms")}
    os.environ.update(RAY_memory_usage_threshold=f"{threshold:.4f}", RAY_memory_monitor_refresh_ms="100")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        yield
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def eater(marks: str, items, options):
    """transcribe_many's stand-in: eat-always (and eat-once on its first try) allocates until killed."""
    for key, path in items:
        name = Path(path).stem
        first = not (Path(marks) / name).exists()
        (Path(marks) / name).touch()
        if name == "eat-always" or (name == "eat-once" and first):
            blocks = []
            for _ in range(4 * MARGIN // (256 << 20)):  # 4x the margin: the monitor fires long before
                blocks.append(np.ones((256 << 20) // 8))
                time.sleep(0.02)
            raise AssertionError("Ray's memory monitor never fired")  # the test fails on this message
        yield key, Transcript(path, 0.1, f"{name} by {os.getpid()}", [], "en", "exact")


def test_a_worker_killed_for_memory_loses_only_its_file(ray_with_a_low_memory_threshold, tmp_path):
    marks, folder = tmp_path / "marks", tmp_path / "clips"
    marks.mkdir()
    folder.mkdir()
    names = ["ok1", "eat-once", "ok2", "eat-always", "ok3"]
    items = []
    for i, name in enumerate(names):
        sf.write(folder / f"{name}.flac", np.zeros(1600, np.float32), 16000)
        items.append((i, folder / f"{name}.flac"))
    outcomes = {}
    # One worker: the monitor can only kill the worker running an eater. (With two, Ray kills the newest task
    # first, which may be an ok file running beside an eater: a bystander, and a flaky count.)
    cluster = ClusterOptions(num_workers=1, max_attempts=2)
    with RayTranscriber(lambda: str(marks), lambda decoder: None, cluster, transcribe=eater) as transcriber:
        for key, outcome in transcriber.run(items):
            assert names[key] not in outcomes
            outcomes[names[key]] = outcome
        report = transcriber.report
    assert sorted(outcomes) == sorted(names)
    failure = str(outcomes["eat-always"])
    assert "running low on memory" in failure and "gave up after 2 tries" in failure, failure
    assert "never fired" not in failure
    for name in ("ok1", "ok2", "ok3", "eat-once"):
        assert outcomes[name].text.startswith(name), outcomes[name]
    assert report.workers_lost == 3, report   # eat-once once, eat-always twice
