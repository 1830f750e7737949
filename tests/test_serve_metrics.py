"""`/metrics`' text, rendered from the scheduler's figures: every figure under its own name (distinct values,
so two names swapped would show), without a server (tests/test_serve.py reads the real one)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from asr_app.scheduler_metrics import SchedulerMetrics
from asr_app.serve.metrics import metrics_text


def test_every_scheduler_figure_is_exported_under_its_own_name():
    figures = SchedulerMetrics(queue_depth=2, batches=3, rows=7, failed=1, busy_s=4.5, audio_s=9.5, drafted=20,
                               accepted=15, trims=6, gathers=8, gather_s=0.75, resent=9, workspaces=11,
                               workspace_rows=13, workspace_evictions=17, graph_evictions=19, graph_captures=23,
                               graph_capture_s=2.25, rows_per_batch={1: 1, 2: 1, 4: 1},
                               latencies={"live": [0.5, 1.5], "file": []}, latency_count={"live": 5000, "file": 0},
                               latency_sum={"live": 2500.0, "file": 0.0})
    engine = SimpleNamespace(scheduler=SimpleNamespace(metrics=lambda: figures), sessions={"a": 1, "b": 2})
    text = metrics_text(engine, {"2xx": 5, "4xx": 3}).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    plain = {name: value for (name, labels), value in samples.items() if not labels}
    expected = {
        "asr_queue_depth": 2, "asr_live_sessions": 2, "asr_batches_total": 3, "asr_rows_total": 7,
        "asr_failed_rows_total": 1, "asr_rows_resent_total": 9, "asr_memory_trims_total": 6,
        "asr_batch_gathers_total": 8, "asr_batch_gather_seconds_total": 0.75, "asr_workspaces": 11,
        "asr_workspace_rows": 13, "asr_workspace_evictions_total": 17, "asr_graph_evictions_total": 19,
        "asr_graph_captures_total": 23, "asr_graph_capture_seconds_total": 2.25,
        "asr_decoder_busy_seconds_total": 4.5, "asr_audio_seconds_total": 9.5,
        "asr_rows_per_batch": 7 / 3, "asr_audio_seconds_per_busy_second": 9.5 / 4.5,
        "asr_draft_acceptance": 0.75,
    }
    assert {name: plain.get(name) for name in expected} == expected
    assert samples[("asr_batches_by_rows", (("rows", "4"),))] == 1
    assert samples[("asr_http_responses_total", (("status", "4xx"),))] == 3
    # the summary counts every request since the start (a counter), not the recent window the quantiles read
    assert samples[("asr_request_latency_seconds_count", (("kind", "live"),))] == 5000
    assert samples[("asr_request_latency_seconds_sum", (("kind", "live"),))] == 2500.0
    assert ("asr_request_latency_seconds_count", (("kind", "file"),)) not in samples


def test_latency_totals_keep_growing_past_the_recent_window():
    from asr_app.scheduler_metrics import RecentLatencies

    recent = RecentLatencies(window=2, kinds=("live", "file"))
    for seconds in (1.0, 2.0, 4.0):
        recent.record("live", seconds)
    assert recent.snapshot() == {"live": [2.0, 4.0], "file": []}
    assert recent.totals() == ({"live": 3, "file": 0}, {"live": 7.0, "file": 0.0})
