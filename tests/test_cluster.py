"""`asr-transcribe --engine ray` on a real local Ray instance started by the tests (CPU workers)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import DISTIL_DRAFT_DIR, JFK_FLAC, LIBRISPEECH_DIR, LJSPEECH_DIR, REPO_ROOT, TINY_EN_DIR

from asr_app.audio import SAMPLE_RATE, load_audio

ray = pytest.importorskip("ray", reason="the cluster extra (Ray) is part of the dev extra")

MODEL_ARGS = ["--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR), "--device", "cpu", "--threads", "1"]
TIMED_STATS = {"setup_s", "encoder_s", "draft_s", "target_s", "verify_s", "verify_cpu_s", "total_s", "decode_s",
               "load_s"}


# Six short real clips of the three sources (25 s of speech in all; sorted by name, the last two are the
# longest): enough for two workers to share and for a killed driver to leave some undone.
CLIPS = ["1089-134686-0001", "1089-134691-0000", "LJ001-0002", "LJ001-0008", "LJ001-0004", "jfk"]


def clip_folder(root: Path, names: list[str] = CLIPS) -> Path:
    """The real clips `names` (LibriSpeech, LJSpeech, JFK) copied into one folder."""
    folder = root / "clips"
    folder.mkdir()
    for name in names:
        path = JFK_FLAC if name == "jfk" else next(
            p for corpus in (LIBRISPEECH_DIR, LJSPEECH_DIR) for p in corpus.rglob(f"{name}.flac"))
        shutil.copy(path, folder / path.name)
    return folder


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance (a slot for each of two workers) for the module, started after the test of
    asr-transcribe's own local instance: RayTranscriber joins it, and so does asr-transcribe --address (its
    address, the value), and both leave it running, as they would a cluster's."""
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield context.address_info["gcs_address"]
    ray.shutdown()


def without_timings(record: dict) -> dict:
    record = dict(record)
    record.pop("timings", None)
    record["stats"] = {k: v for k, v in record["stats"].items() if k not in TIMED_STATS}
    record["source"] = Path(record["source"]).name
    return record


def run_cli(*args: str) -> tuple[int, str]:
    from asr_app.cli.transcribe import main

    return main([*args, *MODEL_ARGS]), ""


def test_two_workers_write_what_the_local_engine_writes(tmp_path, capsys):
    # First in the module, before the `local_ray` fixture: asr-transcribe starts (and stops) its own local
    # Ray instance, as a user's run does.
    assert not ray.is_initialized()
    names = ["1089-134686-0001", "LJ001-0002", "jfk"]  # one clip of each corpus: both engines decode them all
    folder = clip_folder(tmp_path, names)
    total = len(names)
    local, ray_out = tmp_path / "local", tmp_path / "ray"
    assert run_cli(str(folder), "-o", str(local), "-f", "txt,srt,json")[0] == 0
    assert run_cli(str(folder), "-o", str(ray_out), "-f", "txt,srt,json", "--engine", "ray", "--num-workers", "2")[0] == 0
    err = capsys.readouterr().err
    assert f"{total} transcribed, 0 failed" in err and f"cluster: {total} file(s)" in err
    assert "over 2 worker process(es)" in err and "s to stop them" in err
    names = sorted(p.name for p in local.iterdir())
    assert names == sorted(p.name for p in ray_out.iterdir()) and len(names) == 3 * total
    for name in names:
        if name.endswith(".json"):
            ours, theirs = (json.loads((d / name).read_text()) for d in (local, ray_out))
            assert without_timings(ours) == without_timings(theirs), name
        else:
            assert (local / name).read_bytes() == (ray_out / name).read_bytes(), name


def test_a_killed_worker_loses_nothing_and_repeats_nothing(local_ray, tmp_path):
    from asr_app.arguments import decoder_from_args
    from asr_app.cli.transcribe import build_parser, transcribe_options
    from asr_app.cluster import ClusterOptions, RayTranscriber

    # The first worker gets a short clip (11 s), the second a 26 s file (more words to decode over the same one
    # window): when the short one is back, the second worker is most likely mid-file, and it is killed there
    # (the assertions hold whichever worker is killed). Three long files: the killed worker may hold
    # a second task, waiting behind its running one.
    speech = np.concatenate([load_audio(p) for p in sorted((LJSPEECH_DIR / "wavs").glob("*.flac"))[:4]])
    paths = [tmp_path / "short.flac"]
    sf.write(paths[0], load_audio(JFK_FLAC), SAMPLE_RATE)
    for i in range(1, 4):
        path = tmp_path / f"long{i}.flac"
        sf.write(path, np.roll(speech, i * SAMPLE_RATE), SAMPLE_RATE)
        paths.append(path)
    args = build_parser().parse_args([str(p) for p in paths] + MODEL_ARGS)
    args.num_workers = 2
    keys = []
    with RayTranscriber(functools.partial(decoder_from_args, args), functools.partial(transcribe_options, args),
                        ClusterOptions(num_workers=2)) as transcriber:
        pids = transcriber.pids()
        for key, outcome in transcriber.run(list(enumerate(paths))):
            assert not isinstance(outcome, Exception), outcome
            assert outcome.text.strip() and outcome.duration > (10 if key == 0 else 20)
            if not keys:  # the first file is back: kill the worker still busy with another
                busy = [pid for pid in pids if not any(name.endswith(f":{pid}") for name in transcriber.report.workers)]
                os.kill(busy[0], signal.SIGKILL)
            keys.append(key)
        report = transcriber.report
    assert sorted(keys) == list(range(len(paths)))  # every file exactly once
    # The killed worker held up to two tasks (one running, one waiting): both went to the other workers.
    assert report.workers_lost == 1 and report.tasks_retried in (1, 2)
    assert sum(w.files for w in report.workers.values()) == len(paths)


def test_skip_existing_after_the_driver_was_killed_redoes_only_the_missing(local_ray, tmp_path):
    # The driver joins the module's Ray instance (--address): killed, it takes its workers with it (Ray ends
    # the actors of a dead driver) and leaves the instance to the rerun.
    folder = clip_folder(tmp_path)
    total = len(CLIPS)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "asr_app.cli.transcribe", str(folder), "-o", str(out), "-f", "txt,json",
           "--engine", "ray", "--address", local_ray, "--num-workers", "1", "--skip-existing", "--quiet",
           *MODEL_ARGS]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    driver = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while len(list(out.glob("*.json"))) < 3:
            assert driver.poll() is None, driver.stderr.read().decode()
            assert time.monotonic() < deadline, "the driver wrote nothing in time"
            time.sleep(0.05)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    done = {p.stem for p in out.glob("*.json")}
    assert 3 <= len(done) < total
    assert {p.stem for p in out.glob("*.txt")} >= done  # json is written last: its file is complete
    rerun = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    skipped = len({p.stem for p in out.glob("*.txt")} & done)
    assert f"{total - skipped} transcribed, 0 failed, {skipped} skipped" in rerun.stderr
    assert len(list(out.glob("*.json"))) == total and not list(out.glob(".asr-tmp-*"))


def test_engine_ray_options_are_checked_before_loading(capsys):
    from asr_app.cli.transcribe import main

    with pytest.raises(SystemExit) as exc:
        main([str(JFK_FLAC), "--num-workers", "2"])
    assert exc.value.code == 2 and "--engine ray" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(JFK_FLAC), "--engine", "ray", "--num-workers", "0"])
    assert "--num-workers must be >= 1" in capsys.readouterr().err


def test_engine_ray_without_ray_says_how_to_install(monkeypatch, capsys):
    import importlib.util

    from asr_app.cli.transcribe import main

    real = importlib.util.find_spec
    # Ray is installed here (dev extra); a machine without it is one where find_spec finds nothing.
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main([str(JFK_FLAC), "--engine", "ray"]) == 2
    assert 'pip install "asr-app[cluster]"' in capsys.readouterr().err


def test_the_summary_rate_leaves_out_starting_and_stopping_the_workers():
    from asr_app.cluster import ClusterReport, WorkerReport, summary_lines

    worker = WorkerReport("node:1", files=4, audio_s=120.0, busy_s=5.0)
    report = ClusterReport(workers={"node:1": worker}, startup_s=8.0, work_s=6.0, shutdown_s=1.5)
    first, per_worker = summary_lines(report, wall_s=15.5)
    # 120 s of audio over the 6 s of work, not over the 15.5 s wall minus the start (7.5 s: 16.0 audio-s/s)
    assert "in 6.0 s = 20.0 audio-s/s" in first
    assert "after 8.0 s to start them, 1.5 s to stop them" in first
    assert per_worker == "  node:1: 4 file(s), 120.0 s audio, 24.0 audio-s/s while busy"
    # A batch that never reached its end (no work_s): the wall clock less starting and stopping.
    first, _ = summary_lines(ClusterReport(workers={"node:1": worker}, startup_s=8.0, shutdown_s=1.5), wall_s=15.5)
    assert "in 6.0 s = 20.0 audio-s/s" in first
