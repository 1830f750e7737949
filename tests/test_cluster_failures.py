"""Ray batch jobs (asr_app/cluster.py) under failing workers, on a real local Ray instance (Ray's own
memory monitor killing a worker: tests/test_cluster_oom.py).

Every per-file failure becomes that file's outcome and the batch goes on; a stuck worker is stopped
and its task moves to another worker. The workers here run a stand-in for `longform.transcribe_many`
(the `transcribe` seam of RayTranscriber) that acts on each file's name, so no model loads and each
case takes a second or two:

- raise:        the task raises ValueError (a Ray task error);
- alloc-once / alloc-always: a real failed allocation in the worker (torch asked for 2**50 bytes: the
                allocator refuses, "can't allocate memory"): on the first try only, escaping the task /
                on every try, reported for the file as long-form reports a failed decode;
- die-once:     the worker process is SIGKILLed mid-file, as the kernel's OOM killer does;
- hang-once / hang-always: the worker sleeps (a stuck worker), first try only / every try.

"once": a marker file in a shared folder records the first try, so the next worker passes.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

ray = pytest.importorskip("ray", reason="the cluster extra (Ray) is part of the dev extra")

from asr_app.cluster import ClusterOptions, RayTranscriber  # noqa: E402
from asr_app.transcript import Transcript  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (RayTranscriber joins it and leaves it running)."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stand-ins travel to the workers
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def stand_in(marks: str, items, options):
    """transcribe_many's stand-in: a Transcript per file, or the failure its name asks for."""
    import torch

    for key, path in items:
        name = Path(path).stem
        first = not (Path(marks) / name).exists()
        (Path(marks) / name).touch()
        if name.startswith("raise"):
            raise ValueError(f"cannot handle {name}")
        if name == "alloc-once" and first:
            torch.empty(2**50, dtype=torch.uint8)  # RuntimeError: ... can't allocate memory: the task raises
        if name == "alloc-always":
            try:
                torch.empty(2**50, dtype=torch.uint8)
            except RuntimeError as exc:  # reported for the file, as long-form reports a failed decode
                yield key, RuntimeError(f"{path}: decoding failed (RuntimeError: {exc})")
                continue
        if name == "die-once" and first:
            os.kill(os.getpid(), signal.SIGKILL)
        if name == "hang-always" or (name == "hang-once" and first):
            time.sleep(600)
        yield key, Transcript(path, 0.1, f"{name} by {os.getpid()}", [], "en", "exact")


def clips(folder: Path, names: list[str]) -> list[tuple[int, Path]]:
    folder.mkdir()
    items = []
    for i, name in enumerate(names):
        sf.write(folder / f"{name}.flac", np.zeros(1600, np.float32), 16000)
        items.append((i, folder / f"{name}.flac"))
    return items


def run_batch(tmp_path, names, batch_size=1, **cluster):
    marks = tmp_path / "marks"
    marks.mkdir()
    items = clips(tmp_path / "clips", names)
    options = ClusterOptions(num_workers=2, **cluster)
    outcomes = {}
    started = time.monotonic()
    with RayTranscriber(lambda: str(marks), lambda decoder: None, options, transcribe=stand_in) as transcriber:
        for key, outcome in transcriber.run(items, batch_size):
            assert key not in outcomes, f"{names[key]} came back twice"
            outcomes[names[key]] = outcome
        report = transcriber.report
    assert sorted(outcomes) == sorted(names)  # every file exactly once, the batch went on to its end
    return outcomes, report, time.monotonic() - started


def test_task_errors_and_out_of_memory_fail_only_their_file(local_ray, tmp_path):
    names = ["ok1", "raise", "ok2", "alloc-once", "alloc-always", "die-once", "ok3"]
    outcomes, report, _ = run_batch(tmp_path, names, batch_size=2)
    failed = {name: str(o) for name, o in outcomes.items() if isinstance(o, Exception)}
    assert sorted(failed) == ["alloc-always", "raise"], failed
    assert "ValueError: cannot handle raise" in failed["raise"] and "raise.flac" in failed["raise"]
    assert "can't allocate memory" in failed["alloc-always"] and "gave up after 3 tries" in failed["alloc-always"]
    for name in ("ok1", "ok2", "ok3", "alloc-once", "die-once"):
        assert outcomes[name].text.startswith(name), (name, outcomes[name])
    # ok1 shared a task with raise: it was split, so ok1 still got its transcript (and so did every other)
    assert report.task_errors == 3 and report.workers_lost == 1  # two tasks and raise alone raised; die-once
    assert report.timeouts == 0 and report.tasks_retried >= 3


def test_a_stuck_worker_is_stopped_and_its_file_moves(local_ray, tmp_path):
    names = ["ok1", "hang-once", "ok2", "hang-always", "ok3"]
    outcomes, report, took = run_batch(tmp_path, names, file_timeout_s=3.0, timeout_per_audio_s=0.0,
                                       max_attempts=2)
    assert "stuck (no result in 3 s); gave up after 2 tries" in str(outcomes["hang-always"])
    once = outcomes["hang-once"]
    assert not isinstance(once, Exception) and once.text.startswith("hang-once")
    assert all(outcomes[n].text.startswith(n) for n in ("ok1", "ok2", "ok3"))
    assert report.timeouts == 3 and report.workers_lost == 3  # hang-once once, hang-always twice
    assert took < 120, took  # nowhere near the stand-in's 600 s sleep
