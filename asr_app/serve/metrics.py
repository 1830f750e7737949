"""`/metrics` in Prometheus' text format, read from the scheduler when scraped (no per-request bookkeeping
beyond what the scheduler keeps): queue depth, rows per batch, request latency, audio seconds decoded per
second of decoder time, draft acceptance, live sessions."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from asr_app.ui.engine import UiEngine

LATENCY_QUANTILES = (0.5, 0.9, 0.99)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# (kind, name, help, SchedulerMetrics field): the figures exported as they are kept
FIGURES = (
    (CounterMetricFamily, "asr_batches", "Batches decoded", "batches"),
    (CounterMetricFamily, "asr_rows", "Rows (requests) decoded", "rows"),
    (CounterMetricFamily, "asr_failed_rows", "Rows whose decode failed", "failed"),
    (CounterMetricFamily, "asr_rows_resent", "Rows sent again after their decoder replica was lost", "resent"),
    (CounterMetricFamily, "asr_memory_trims", "Times freed memory went back to the system after an idle spell",
     "trims"),
    (CounterMetricFamily, "asr_batch_gathers", "Batches that waited for more file rows arriving", "gathers"),
    (CounterMetricFamily, "asr_batch_gather_seconds", "Seconds batches waited for more file rows", "gather_s"),
    (GaugeMetricFamily, "asr_workspaces",
     "Decoder workspaces held (one per batch size, with drafts or without; their caches and CUDA graphs)",
     "workspaces"),
    (GaugeMetricFamily, "asr_workspace_rows", "Batch rows the held workspaces' caches have room for",
     "workspace_rows"),
    (CounterMetricFamily, "asr_workspace_evictions", "Workspaces dropped to make room for another batch size",
     "workspace_evictions"),
    (CounterMetricFamily, "asr_graph_evictions", "CUDA graphs dropped inside a workspace to make room",
     "graph_evictions"),
    (CounterMetricFamily, "asr_graph_captures", "Decoding steps captured as CUDA graphs", "graph_captures"),
    (CounterMetricFamily, "asr_graph_capture_seconds", "Seconds spent capturing CUDA graphs", "graph_capture_s"),
)


class SchedulerCollector:
    def __init__(self, engine: UiEngine, requests: dict[str, int]) -> None:
        self.engine = engine
        self.requests = requests   # HTTP answers by status class, kept by the app

    def collect(self):
        m = self.engine.scheduler.metrics()
        yield GaugeMetricFamily("asr_queue_depth", "Decode requests waiting for the decoder", m.queue_depth)
        yield GaugeMetricFamily("asr_live_sessions", "Live sessions open now", len(self.engine.sessions))
        age = getattr(self.engine.scheduler, "figures_age_s", None)   # --engine ray: fetched from the replicas
        if age is not None:
            yield GaugeMetricFamily("asr_figures_age_seconds", "Age of the decoder replicas' figures", age)
        for family, name, text, field in FIGURES:
            yield family(name, text, getattr(m, field))
        rows = GaugeMetricFamily("asr_batches_by_rows", "Batches decoded, by rows per batch", labels=["rows"])
        for size, count in sorted(m.rows_per_batch.items()):
            rows.add_metric([str(size)], count)
        yield rows
        yield GaugeMetricFamily("asr_rows_per_batch", "Mean rows per batch",
                                m.rows / m.batches if m.batches else 0.0)
        yield CounterMetricFamily("asr_decoder_busy_seconds", "Seconds the decoder spent decoding", m.busy_s)
        yield CounterMetricFamily("asr_audio_seconds", "Audio seconds decoded (a live session's buffer counts again "
                                  "at each re-decode)", m.audio_s)
        yield GaugeMetricFamily("asr_audio_seconds_per_busy_second", "Audio seconds decoded per decoder second (live "
                                "buffers counted at each re-decode: not the service's real-time capacity)",
                                m.audio_s / m.busy_s if m.busy_s else 0.0)
        yield GaugeMetricFamily("asr_draft_acceptance", "Accepted draft tokens over drafted ones",
                                m.acceptance_rate if m.acceptance_rate is not None else 0.0)
        latency = SummaryMetricFamily("asr_request_latency_seconds",
                                      "Queueing plus decoding time of decode requests", labels=["kind"])
        for kind, count in m.latency_count.items():   # totals since the start: Prometheus reads them as counters
            if count:
                latency.add_metric([kind], count_value=count, sum_value=m.latency_sum.get(kind, 0.0))
        yield latency
        quantiles = GaugeMetricFamily("asr_request_latency_quantile_seconds",
                                      "Recent decode request latency quantiles", labels=["kind", "quantile"])
        for kind, values in m.latencies.items():
            for q in LATENCY_QUANTILES if values else ():
                quantiles.add_metric([kind, str(q)], _quantile(values, q))
        yield quantiles
        answers = CounterMetricFamily("asr_http_responses", "HTTP answers by status class", labels=["status"])
        for status, count in sorted(self.requests.items()):
            answers.add_metric([status], count)
        yield answers


def metrics_text(engine: UiEngine, requests: dict[str, int]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SchedulerCollector(engine, requests))
    return generate_latest(registry)
