"""The benchmarks run end to end on the CPU, in small settings, and write their reports: a benchmark that
breaks is found here rather than on a lent GPU's few minutes. Their figures are not checked (benchmarks
measure, tests do not); their structure is: the rows each report promises, each with a positive time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asr_app.kernels.triton_support import HAS_TRITON

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run_bench(script: str, *args: str) -> str:
    """Run bench/<script> in a child process (as a user does, from bench/); its output, or the failure's."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH.parent), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, script, *args], cwd=BENCH, env=env, capture_output=True, text=True,
                           timeout=600)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    return child.stdout


def import_bench(monkeypatch, script: str):
    """bench/<script> imported into this process, run from bench/ as a user does: its main() does what the
    child of run_bench would, without the child's ~6 s of importing torch, transformers and asr_app again
    (runtime_bench and verify_bench still run as children: the scripts' own entry point is tested there)."""
    import importlib

    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.chdir(BENCH)
    return importlib.import_module(script.removesuffix(".py"))


def test_a_result_records_the_environment_settings_it_ran_with(monkeypatch, tmp_path):
    """A run with oneDNN's kernel cache bounded (docs/serving.md) says so in its `meta`; unset ones are left out."""
    report_io = import_bench(monkeypatch, "report_io.py")
    for name in report_io.RECORDED_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    report_io.save_results(tmp_path / "r.json", {"x": 1}, "table")
    assert json.loads((tmp_path / "r.json").read_text())["meta"]["environment"] == {
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "MALLOC_ARENA_MAX": "2"}
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "MALLOC_ARENA_MAX"):
        monkeypatch.delenv(name)
    assert report_io.provenance()["environment"] == {}


@pytest.mark.skipif(not HAS_TRITON, reason="the fused rows need Triton (its interpreter on a CPU)")
def test_runtime_bench_reports_loops_steps_and_projections(tmp_path):
    # Without --fused-layers: interpreting the fused kernels quadruples this run (41 s against 10 s here), and
    # decoding through fused layers is tested in tests/test_fused_layers.py; the projection code is shared.
    run_bench("runtime_bench.py", "--shape", "tiny", "--device", "cpu", "--graphs", "emulate", "--tokens", "4",
              "--repeats", "1", "--out-dir", str(tmp_path))
    report = json.loads((tmp_path / "runtime_bench_tiny_cpu.json").read_text())
    assert set(report["loops"]) >= {"transformers generate (eager)", "ours off (eager)", "ours off (emulate graphs)",
                                    "ours exact (emulate graphs)"}
    assert all(row["ms_per_token"] > 0 for row in report["loops"].values())
    assert set(report["steps"]) == {"eager", "graphs"} and not report.get("projection_fused")
    gamma = report["config"]["gamma"]
    for steps, projection in ((report["steps"]["graphs"], report["projection"]),):
        # the projection follows from the step table it is printed beside (JSON keys are strings)
        target = {int(k): ms for k, ms in steps["target_ms"].items()}
        per_call = gamma * steps["draft_ms"] + target[gamma + 1]
        assert 1 <= projection["tokens_per_call"] <= gamma + 1  # what gamma drafts per call can give
        assert "random-weight pair" in projection["source"]  # no --real-models here: said so, not hidden
        assert projection["ms_per_token"] == pytest.approx(per_call / projection["tokens_per_call"])
        assert projection["speedup_vs_off"] == pytest.approx(target[1] / projection["ms_per_token"])
        assert projection["draft_over_target"] == pytest.approx(steps["draft_ms"] / target[1])
    what_if = report["projection_what_if"]
    assert what_if["tokens_per_call"] == 3.96 and what_if["source"].startswith("what-if")
    assert report["meta"]["command"].startswith("python runtime_bench.py") and report["meta"]["versions"]["torch"]
    assert (tmp_path / "runtime_bench_tiny_cpu.png").stat().st_size > 0
    assert "projected `exact`" in (tmp_path / "runtime_bench_tiny_cpu.md").read_text()


def test_runtime_bench_projects_at_the_real_pairs_tokens_per_call_measured_in_the_same_run(monkeypatch):
    # The projected speed-up of a large pair uses the real pair's tokens per target call from the same run
    # (its `exact` at the projection's gamma), the constant only as a labelled what-if beside it.
    monkeypatch.syspath_prepend(str(BENCH))
    import runtime_bench

    steps = {"target_ms": {1: 3.0, 2: 3.2, 3: 3.4}, "draft_ms": 0.5, "draft_latency_ms": 0.6}
    report = {"loops": {"ours exact (cuda graphs)": {"ms_per_token": 1.0, "tokens_per_target_call": 1.1}},
              "steps": {"graphs": steps},
              "real_tiny_en": {name: {"ms_per_token": 1.0, "e2e_ms_per_token": 2.0, "identical_to_off": True,
                                      "tokens_per_target_call": tpc, "tokens": 10,
                                      "samples_loop_s": [[0.01, 0.002], [0.02, 0.003]]}  # [clip][pass]
                               for name, tpc in (("ours exact (graphs)", 2.5), ("ours exact (graphs, gamma 2)", 2.99))}}
    runtime_bench.projections(report, 2)
    measured, what_if = report["projection"], report["projection_what_if"]
    assert measured["tokens_per_call"] == 2.99 and "real tiny.en" in measured["source"]
    assert measured["speedup_vs_off"] == pytest.approx(3.0 / ((2 * 0.5 + 3.4) / 2.99))
    assert what_if["tokens_per_call"] == 3.96 and what_if["speedup_vs_off"] > measured["speedup_vs_off"]
    assert report["projection_fused"] is None  # no fused step table in this run
    text = runtime_bench.markdown({**report, "config": {"shape": "large-v2", "target_params_M": 1, "device": "GPU",
                                                        "dtype": "float16", "tokens": 8}, "verify_in_graph_us": None})
    assert "at 2.99 tokens per target call (measured in this run: real tiny.en" in text and "what-if" in text
    assert "| 3.00 / 0.50 |" in text  # each pass over the clips: the first one's captures are not hidden
    del report["real_tiny_en"]  # without the real pair, the random pair's own figure, named as such
    runtime_bench.projections(report, 2)
    assert report["projection"]["tokens_per_call"] == 1.1 and "random-weight" in report["projection"]["source"]


def test_step_profile_reports_each_step(tmp_path, monkeypatch):
    import_bench(monkeypatch, "step_profile.py").main(["--shape", "tiny", "--device", "cpu", "--out-dir", str(tmp_path)])
    report = json.loads((tmp_path / "step_profile_tiny_cpu.json").read_text())
    assert set(report) == {"meta", "target k=1", "target k=6", "draft"}  # no device kernels on a CPU: counts are 0
    assert "### tiny: draft step" in (tmp_path / "step_profile_tiny_cpu.txt").read_text()


def test_verify_bench_reports_every_configuration_against_transformers(tmp_path):
    out = run_bench("verify_bench.py", "--quick", "--device", "cpu", "--impl", "transformers", "exact",
                    "--dtype", "float32", "--min-run-time", "0.01", "--rounds", "1", "--out-dir", str(tmp_path))
    rows = json.loads((tmp_path / "verify_bench_cpu.json").read_text())["rows"]
    assert sorted((row["impl"], row["gamma"]) for row in rows) == sorted(
        (impl, gamma) for impl in ("transformers", "exact") for gamma in (1, 5, 20))
    assert all(row["median_us"] > 0 for row in rows)
    assert all(row["speedup_vs_transformers"] for row in rows if row["impl"] == "exact")  # anchored in its config
    assert "target check: exact" in out and (tmp_path / "verify_bench_cpu.png").stat().st_size > 0


def test_stream_bench_reports_each_variant_under_its_own_names(tmp_path, monkeypatch):
    from conftest import DISTIL_DRAFT_DIR, LIBRISPEECH_DIR, TINY_EN_DIR

    # a 3.3 s LibriSpeech clip with its human transcript (7 words): every field of the 11 s JFK clip's report,
    # in a third of the streaming steps
    clip = sorted(LIBRISPEECH_DIR.rglob("*.flac"))[1]
    out = tmp_path / "stream.json"
    stream_bench = import_bench(monkeypatch, "stream_bench.py")
    assert stream_bench.main(["--modes", "off", "--reuse", "on", "--policies", "local-agreement,alignatt", "--fast",
                              "--clips", str(clip), "--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR),
                              "--out", str(out)]) == 0
    modes = json.loads(out.read_text())["modes"]
    assert {name: (row["mode"], row["policy"], row["reuse_hypothesis"]) for name, row in modes.items()} == {
        "off+reuse local-agreement": ("off", "local-agreement", True), "off+reuse alignatt": ("off", "alignatt", True)}
    assert all(row["words"] > 0 and row["clips"] == 1 and row["rtf"] > 0 for row in modes.values())


def test_batch_bench_reports_every_mode_at_every_batch_size(tmp_path, monkeypatch, one_torch_thread):
    # The real pair on real clips (as on the CPU) and a random-weight shape on random features (as on a GPU,
    # --shape large-v2), each writing the results convention's JSON (meta, raw rounds, medians) and a plot.
    # In this process: the libraries are loaded already (a child spent ~7 s importing them).
    from conftest import AUDIO_DIR, MODELS_DIR

    monkeypatch.syspath_prepend(str(BENCH))
    import batch_bench

    for shape, modes in (("real", ("off", "exact", "transformers")), ("toy", ("off", "exact"))):
        out = tmp_path / f"batch_bench_{shape}.json"
        batch_bench.main(["--shape", shape, "--models", str(MODELS_DIR), "--audio", str(AUDIO_DIR), "--clips", "2",
                          "--batch", "1", "2", "--tokens", "4", "--modes", *modes, "--out", str(out)])
        report = json.loads(out.read_text())
        assert report["meta"]["versions"]["torch"] and report["meta"]["device"] and report["meta"]["command"]
        assert sorted((r["mode"], r["batch"]) for r in report["rows"]) == sorted(
            (mode, b) for mode in modes for b in (1, 2))
        for row in report["rows"]:
            assert len(row["samples_s"]) == 1 and row["median_s"] > 0 and row["tokens"] > 0
            assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["median_s"])
            assert (row["rtfx"] is not None) == (shape == "real")
            assert row["identical_to_off"] in ((None,) if row["mode"] == "off" else (True,))  # greedy identity
        assert "| exact | 2 |" in out.with_suffix(".md").read_text()
        assert out.with_suffix(".png").stat().st_size > 0


def test_peers_bench_names_the_cpu_its_figures_came_from(monkeypatch):
    # CPU figures are comparable only between machines of one kind (docs/runtime.md, "CPU, a Zen 4 VM"): the
    # report says which CPU, and its fp32 rate measured in the same run.
    peers_bench = import_bench(monkeypatch, "peers_bench.py")
    import report_io

    facts = json.loads(json.dumps(report_io.cpu_facts(1)))  # as the report writes them
    first = peers_bench.table({"engines": {}, "config": {"cpu": facts}}).splitlines()[0]
    assert facts["fp32 GFLOP/s"] > 0 and facts["processor"]
    if Path("/proc/cpuinfo").exists():
        assert facts["model name"] and facts["cpu family"].isdigit()
    assert first.startswith(f"CPU: {facts.get('model name', facts['processor'])}")
    assert f"{facts['fp32 GFLOP/s']} GFLOP/s fp32" in first


def test_a_result_names_its_commit_and_whether_the_code_had_changed(monkeypatch, tmp_path):
    # A result measured on uncommitted code (as a lent GPU's runs often are) must not name a commit as its code.
    report_io = import_bench(monkeypatch, "report_io.py")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setattr(report_io, "REPO", tmp_path)
    assert report_io._commit() == head
    (tmp_path / "b.py").write_text("untracked\n")  # untracked files are not the measured code
    assert report_io._commit() == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert report_io._commit() == f"{head}+changes"
    monkeypatch.setattr(report_io, "REPO", tmp_path / "not-a-repo")
    assert report_io._commit() is None


def test_serve_bench_tables_say_what_graphs_cost_and_which_answers_differed(monkeypatch):
    # The committed H200 run predates the graph figures: its table renders as it was written. A run with
    # them (as the next GPU run will be) names captures and dropped workspaces; a CPU's zeros stay silent.
    bench = import_bench(monkeypatch, "serve_bench.py")
    run = BENCH / "results/nvidia-h200/2026-11-27/serve_bench.json"
    report = json.loads(run.read_text())
    assert bench.streams_table(report) == run.with_suffix(".md").read_text().rstrip("\n")
    report["streams"]["scheduler"]["graphs"] = {"workspaces": 6, "workspace_evictions": 0, "graph_evictions": 0,
                                                "captures": 84, "capture_s": 2.5}
    report["api"]["graphs"] = {"workspaces": 6, "workspace_evictions": 3, "captures": 90, "capture_s": 2.75}
    table = bench.streams_table(report)
    assert "scheduler: graphs captured 84 (2.5 s), workspaces dropped 0, graphs dropped 0" in table
    assert "graphs captured 90 (2.8 s), workspaces dropped 3, graphs dropped 0" in table
    report["api"]["graphs"]["captures"] = 0
    assert "graphs captured 90" not in bench.streams_table(report)
    api_only = json.loads((run.parent / "serve_bench_api.json").read_text())
    assert bench.streams_table(api_only).startswith("API: 64 requests at once 3.7 s")
    assert "(15 answers unlike it)" in bench.streams_table(api_only)
    differ = bench.text_differences([Path("a.flac"), Path("b.flac")], ["x", "y"], [["x", "y"], ["x", "z"]])
    assert differ == [{"round": 1, "together": True, "request": 1, "clip": "b.flac", "transcribe": "y", "api": "z"}]
    from asr_app.scheduler_metrics import SchedulerMetrics
    before = SchedulerMetrics(workspaces=2, workspace_evictions=1, graph_captures=10, graph_capture_s=1.0)
    after = SchedulerMetrics(workspaces=3, workspace_evictions=1, graph_evictions=2, graph_captures=16,
                             graph_capture_s=1.5)
    assert bench.graph_figures(after, before) == {"workspaces": 3, "workspace_evictions": 0, "graph_evictions": 2,
                                                  "captures": 6, "capture_s": 0.5}
    assert bench.graph_figures(after)["captures"] == 16


def test_serve_bench_says_how_busy_the_worker_was_while_the_streams_ran(monkeypatch):
    # Per N: the share of the wall time the worker decoded, its batches and rows, and the live re-decodes asked
    # meanwhile (only those: the metrics' window also holds earlier ones), under the table; none for the lock.
    bench = import_bench(monkeypatch, "serve_bench.py")
    from asr_app.scheduler_metrics import SchedulerMetrics
    before = SchedulerMetrics(batches=5, rows=6, busy_s=2.0, latency_count={"live": 3, "file": 0})
    after = SchedulerMetrics(batches=9, rows=12, busy_s=6.5, latency_count={"live": 9, "file": 0},
                             latencies={"live": [9.0, 9.0, 9.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6], "file": []})
    worker = bench.worker_figures(after, before, 5.0)
    assert worker == {"wall_s": 5.0, "busy_share": 0.9, "batches": 4, "rows": 6, "live_redecodes": 6,
                      "redecode_p50_s": 0.4, "redecode_p90_s": 0.6}
    assert bench.worker_line(worker) == ("worker busy 90%, 6 rows in 4 batches, re-decodes asked to answered "
                                         "p50 0.40 s, p90 0.60 s")
    assert bench.worker_line(bench.worker_figures(SchedulerMetrics(), SchedulerMetrics(), 5.0)) == \
        "worker: no re-decodes"
    run = BENCH / "results/intel-r-xeon-r-processor-family-6-model-207/2026-11-28/serve_bench_worker.json"
    table = bench.streams_table(json.loads(run.read_text()))
    assert table == run.with_suffix(".md").read_text().rstrip("\n") and "N = 8: worker busy 96%" in table


def test_serve_bench_joins_clips_into_long_sessions(monkeypatch, capsys):
    """--stream-seconds: consecutive clips joined with 0.5 s of silence until each stream is long enough, their
    transcripts joined in order; the table says so."""
    bench = import_bench(monkeypatch, "serve_bench.py")
    clips = [(np.full(n * 16_000, i + 1, dtype="<i2"), f"clip {i}") for i, n in enumerate([10, 4, 9, 30, 2, 3])]
    streams = bench.join_clips(clips, count=8, stream_s=20)
    assert [len(p) / 16_000 for p, _ in streams] == [24.0, 30.0]   # 10 + 4 + 9 and two gaps; 30 alone
    assert [t for _, t in streams] == ["clip 0 clip 1 clip 2", "clip 3"]   # the last 5 s never reach 20 s
    assert set(streams[0][0][10 * 16_000 : 10 * 16_000 + 8_000]) == {0}   # the silence between two clips
    assert len(bench.join_clips(clips, count=1, stream_s=20)) == 1
    exact = bench.join_clips(clips[:2], count=8, stream_s=14.5)   # 10 s + 0.5 s + 4 s: exactly long enough
    assert len(exact) == 1 and len(exact[0][0]) == 14.5 * 16_000
    assert bench.join_clips(clips[4:], count=8, stream_s=20) == []
    report = {"threads": 2, "cpu": "x", "streams": {"clips_s": [24.0, 30.0], "context_s": 3.0, "stream_seconds": 20,
                                                    "trim_s": 15.0, "scheduler": {"streams": {}}}}
    table = bench.streams_table(report)
    assert "2 real streams (consecutive real clips joined, 0.5 s apart, to 20 s or more) (54 s)" in table
    assert "trimmed" not in table
    report["streams"]["trim_s"] = 8.0
    assert "; buffers trimmed past 8 s (`--trim-seconds 8`)" in bench.streams_table(report)
    with pytest.raises(SystemExit):
        bench.main(["--trim-seconds", "0"])
    assert "--trim-seconds must lie in (0, 30], got 0" in capsys.readouterr().err
    report["streams"]["settle_s"] = 1.5
    assert "(`--settle-seconds 1.5`)" in bench.streams_table(report)
    with pytest.raises(SystemExit):
        bench.main(["--settle-seconds", "0.2"])
    assert "--settle-seconds: settle_s must lie in (0.3, 30]" in capsys.readouterr().err


def test_identity_probe_finds_no_difference_in_fp32_on_the_cpu(tmp_path, monkeypatch, one_torch_thread):
    # Alone, again, in exact and in a batch, and transcribe() repeated at the cost policy's and a fixed gamma:
    # in fp32 on a CPU every way gives the reference tokens (a GPU in fp16 may part at near ties).
    from conftest import AUDIO_DIR, JFK_FLAC, MODELS_DIR

    probe = import_bench(monkeypatch, "identity_probe.py")
    out = tmp_path / "identity_probe.json"
    probe.main(["--models", str(MODELS_DIR), "--audio", str(AUDIO_DIR), "--clips", "2", "--batch", "2",
                "--threads", "1", "--repeat-clip", str(JFK_FLAC), "--repeats", "2", "--repeat-gammas", "2",
                "--out", str(out)])
    report = json.loads(out.read_text())
    ways = report["dtypes"]["float32"]
    assert set(ways) == {"off alone again", "exact alone", "off batch 2", "exact batch 2"}
    assert all(way["differ"] == 0 and way["clips"] == 2 for way in ways.values())
    repeated = report["repeated"]["float32"]
    assert set(repeated) == {"off gamma cost", "exact gamma cost", "exact gamma 2"}
    texts = {text for counts in repeated.values() for text in counts}
    assert len(texts) == 1 and all(list(counts.values()) == [2] for counts in repeated.values())
    assert "And so my fellow Americans" in texts.pop()
    assert "exact gamma 2: 2x" in out.with_suffix(".md").read_text()


def test_draft_eval_compares_drafts_on_the_same_clips_in_one_run(tmp_path, monkeypatch, one_torch_thread):
    # Two drafts of the real tiny.en (the shipped one, and its layers 0 and 3 untrained), two clips: each draft's
    # own figures, output identical to the target's, and the shipped draft accepting more than the untrained one.
    import shutil

    from conftest import LJSPEECH_DIR, TINY_EN_DIR
    from transformers import WhisperForConditionalGeneration

    from asr_app.models import derive_draft

    audio = tmp_path / "held"
    audio.mkdir()
    for name in ("LJ001-0002", "LJ001-0008"):
        shutil.copy(LJSPEECH_DIR / "wavs" / f"{name}.flac", audio)
    derive_draft(WhisperForConditionalGeneration.from_pretrained(TINY_EN_DIR), (0, 3)).save_pretrained(tmp_path / "d03")
    bench = import_bench(monkeypatch, "draft_eval.py")
    out = tmp_path / "draft_eval.json"
    assert bench.main(["--target", str(TINY_EN_DIR), "--draft", "bundled", str(tmp_path / "d03"), "--audio", str(audio),
                       "--languages", "detect", "--gammas", "1,3", "--threads", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert list(runs) == ["bundled: detect", f"{tmp_path / 'd03'}: detect"] and report["drafts"][0] == "bundled"
    shipped, untrained = runs.values()
    assert shipped["identical"] == untrained["identical"] == 2 == report["clips"]
    assert shipped["tokens_per_call"]["3"] > untrained["tokens_per_call"]["3"] >= 1
    table = out.with_suffix(".md").read_text()
    assert "drafts `bundled` and" in table and "| bundled: detect | 2/2 |" in table


def test_encoder_dtype_bench_reports_speed_words_and_identity(tmp_path, monkeypatch, one_torch_thread):
    import torch

    from asr_app.runtime.ops import onednn_packing_works
    if not onednn_packing_works(torch.bfloat16):
        pytest.skip("this CPU has no oneDNN bf16 products: the bench refuses to compare fp32 with fp32")
    from conftest import AUDIO_DIR, MODELS_DIR

    bench = import_bench(monkeypatch, "encoder_dtype_bench.py")
    out = tmp_path / "encoder_dtype_bench.json"
    assert bench.main(["--models", str(MODELS_DIR), "--audio", str(AUDIO_DIR), "--max-clips", "2", "--repeats", "1",
                       "--threads", "1", "--whole-bf16", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["clips"] == 2 and report["meta"]["command"]
    assert all(report["encoder_ms"][b][s] > 0 for b in ("1", "4") for s in ("same", "bfloat16"))
    assert report["ratio"] == pytest.approx(report["seconds"]["bfloat16"] / report["seconds"]["same"])
    assert report["words"]["clips_with_transcripts"] == 2 and report["words"]["wer_same"] is not None
    assert report["exact_equals_off"] is True and report["whole_bf16"]["seconds"] > 0
    assert "| bf16 |" in out.with_suffix(".md").read_text()


def test_api_layers_times_every_layer_both_ways_and_compares_the_texts(tmp_path, monkeypatch, one_torch_thread):
    # Two clips, two rounds, through the decoder, transcribe(), the scheduler and a real server with the openai
    # client: each layer's rows and rounds, the batches each scheduler formed, every text against transcribe()'s.
    from conftest import AUDIO_DIR, MODELS_DIR

    bench = import_bench(monkeypatch, "api_layers.py")
    out = tmp_path / "api_layers.json"
    assert bench.main(["--models", str(MODELS_DIR), "--audio", str(AUDIO_DIR), "--requests", "2", "--batch", "2",
                       "--rounds", "2", "--threads", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    layers = report["layers"]
    assert list(layers) == ["decoder", "transcribe", "scheduler", "http"]
    assert all(len(row["one_rounds_s"]) == 2 and row["one_s"] > 0 for row in layers.values())
    assert all(len(layers[name]["together_rounds_s"]) == 2 for name in ("decoder", "scheduler", "http"))
    assert "together_s" not in layers["transcribe"]
    for name in ("scheduler", "http"):   # each layer's own scheduler decoded every window of both rounds at once
        assert sum(int(k) * n for k, n in layers[name]["batches_by_rows"].items()) == 2 * 2
        samples = layers[name]["batch_samples"]   # one per batch formed all at once, with its summary
        assert sum(s["rows"] for s in samples) == 2 * 2 and all(s["wall_s"] >= s["decode_s"] > 0 for s in samples)
        summary = layers[name]["sample_summary"]
        assert sum(row["batches"] for kind in summary.values() for row in kind.values()) == len(samples)
    assert report["identical"] == {"decoder": True, "transcribe": True, "scheduler": True, "http": True}
    table = out.with_suffix(".md").read_text()
    assert table.count("\n| ") == 5 and "| transcribe |" in table and "| - | - | - |" in table
    assert "decoder yes, transcribe yes, scheduler yes, http yes" in table
    added = report["scheduler_added"]   # each clip both ways in each round
    assert added["pairs"] == 2 * 2 and len(added["quartiles_s"]) == 3
    assert f"({added['pairs']} pairs): median {1000 * added['median_s']:+.0f} ms" in table


def test_api_layers_lets_in_every_request_it_sends_and_keeps_clips_a_decoder_call_takes(monkeypatch):
    # 64 requests at once must not meet asr-serve's default --max-requests (32): the H200 run of 2026-11-28
    # ended on that 503. And the decoder layer decodes each clip in one call: nothing over 30 s is sent.
    from conftest import AUDIO_DIR, MODELS_DIR

    from asr_app.decoding import SpeculativeDecoder
    from asr_app.limits import ServiceLimits
    from asr_app.models import load_pair

    bench = import_bench(monkeypatch, "api_layers.py")
    pair = load_pair(target=str(MODELS_DIR / "whisper-tiny.en"), draft=str(MODELS_DIR / "distil-tiny.en-draft"))
    engine = bench.make_engine(SpeculativeDecoder(pair), 64)
    try:
        assert engine.limits.max_requests == 64
        assert bench.make_engine(SpeculativeDecoder(pair), 3).limits.max_requests == ServiceLimits().max_requests
    finally:
        engine.scheduler.close()
    paths, audio = bench.clips(40, AUDIO_DIR, cycle=True)
    assert len(paths) == len(audio) == 40 and all(len(a) <= 30 * 16_000 for a in audio)


def test_serve_bench_names_a_changed_switch_interval_and_kernel_cache_and_puts_them_back(monkeypatch, capsys):
    bench = import_bench(monkeypatch, "serve_bench.py")
    api = json.loads((BENCH / "results/nvidia-h200/2026-11-28/serve_bench.json").read_text())
    report = {"switch_interval_ms": 0.5, "api": api["api"]}
    assert bench.streams_table(report).startswith("Thread switch interval 0.5 ms (`--switch-interval-ms`")
    assert bench.changed_settings({"switch_interval_ms": 5.0}) == []
    assert bench.changed_settings({"encoder_matmul_dtype": "bfloat16", "switch_interval_ms": 1.0}) == [
        "encoder products in bf16 (`--encoder-matmul-dtype bfloat16`)",
        "thread switch interval 1 ms (`--switch-interval-ms`; Python's own 5 ms)"]
    assert bench.changed_settings({"cpu_kernel_cache": "256 (default)"}) == []
    assert bench.changed_settings({"cpu_kernel_cache": "1024 (--cpu-kernel-cache)"}) == [
        "CPU kernel cache 1024 (--cpu-kernel-cache)"]
    before = sys.getswitchinterval()
    from asr_app.kernel_cache import VARIABLES

    def stop_with_the_settings(args, argv):   # what run() would decode under, then no models loaded
        raise RuntimeError(f"interval {sys.getswitchinterval()}, cache {os.environ[VARIABLES[0]]}, "
                           f"{VARIABLES[1] in os.environ}, {args.kernel_cache}")

    monkeypatch.setattr(bench, "run", stop_with_the_settings)
    monkeypatch.setenv(VARIABLES[0], "77")
    monkeypatch.setenv(VARIABLES[1], "88")
    with pytest.raises(RuntimeError, match=r"^interval 0.00025, cache 9, False, 9 \(--cpu-kernel-cache\)$"):
        bench.main(["--switch-interval-ms", "0.25", "--cpu-kernel-cache", "9", "--streams", "0"])
    assert sys.getswitchinterval() == before
    assert (os.environ[VARIABLES[0]], os.environ[VARIABLES[1]]) == ("77", "88")   # the environment as it was
    with pytest.raises(SystemExit):
        bench.main(["--cpu-kernel-cache", "0", "--streams", "0"])
    assert "--cpu-kernel-cache must be at least 1, got 0" in capsys.readouterr().err


def test_gil_probe_times_a_decode_alone_and_beside_a_spinning_thread(tmp_path, monkeypatch, one_torch_thread):
    # One interval, one decode each way: both rows, their ratio in the table, the interval put back after.
    import sys as _sys

    from conftest import MODELS_DIR

    probe = import_bench(monkeypatch, "gil_probe.py")
    before = _sys.getswitchinterval()
    out = tmp_path / "gil_probe.json"
    assert probe.main(["--models", str(MODELS_DIR), "--intervals-ms", "0.1", "--repeats", "1", "--out", str(out)]) == 0
    assert _sys.getswitchinterval() == before
    rows = json.loads(out.read_text())["rows"]
    assert [(r["interval_ms"], r["busy_threads"]) for r in rows] == [(0.1, 0), (0.1, 1)]
    assert all(r["median_s"] > 0 and r["target_calls"] > 0 for r in rows)
    table = out.with_suffix(".md").read_text()
    ratio = rows[1]["median_s"] / rows[0]["median_s"]
    assert f"| 0.1 | 1 | {1000 * rows[1]['median_s']:.0f} | {ratio:.1f}x |" in table


def test_serve_load_counts_the_kernels_onednn_compiled_from_its_verbose_lines(monkeypatch):
    bench = import_bench(monkeypatch, "serve_load.py")
    log = "\n".join([
        "models loaded: ...; CPU kernel cache 64 (default); serving on http://127.0.0.1:8931",
        "onednn_verbose,v1,primitive,create:cache_miss,cpu,inner_product,brg_matmul:avx512_core,forward_inference,"
        "src:f32::blocked:ab::f0 wei:f32:p:blocked:AB16b64a::f0 bia:undef::undef::: dst:f32::blocked:ab::f0,"
        "attr-scratchpad:user,,mb4ic384oc1152,0.25",
        "onednn_verbose,v1,primitive,create:cache_hit,cpu,inner_product,brg_matmul:avx512_core,forward_inference,"
        "src:f32::blocked:ab::f0,,mb4ic384oc1152,0.001",
        "onednn_verbose,v1,primitive,create:cache_miss,cpu,reorder,jit:uni,undef,src:f32::blocked:ab::f0,,24x16,1.75",
        "onednn_verbose,v1,primitive,create:cache_miss,cpu,reorder,jit:un",   # cut short when the server stopped
    ])
    assert bench.onednn_kernels(log) == {"compiled": 3, "compile_s": 0.002, "found": 1}
    assert bench.onednn_kernels("models loaded\nINFO nothing else") is None


def test_settle_bench_reports_lag_and_wer_per_step_and_settle_value(tmp_path, monkeypatch, one_torch_thread):
    # A short stream at a 3 s step, settling off and at 1.5 s, against the 0.5 s step without it.
    from conftest import AUDIO_DIR, MODELS_DIR

    bench = import_bench(monkeypatch, "settle_bench.py")
    out = tmp_path / "settle.json"
    assert bench.main(["--models", str(MODELS_DIR), "--audio", str(AUDIO_DIR), "--streams", "1", "--stream-seconds",
                       "12", "--steps", "3", "--settle", "none,1.5", "--threads", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = [report["reference"], *report["variants"]]
    assert [(r["step_s"], r["settle_s"]) for r in rows] == [(0.5, None), (3.0, None), (3.0, 1.5)]
    assert all(len(r["texts"]) == len(r["wer"]) == 1 and r["words"] > 10 for r in rows)
    off, settled = report["variants"]
    assert settled["lag_p50_s"] < off["lag_p50_s"]   # the settled words wait for no second decode
    table = out.with_suffix(".md").read_text()
    assert f"| 3 | 1.5 | {settled['words']} | {settled['lag_p50_s']:.2f} |" in table
    with pytest.raises(SystemExit):
        bench.main(["--settle", "0.1"])
