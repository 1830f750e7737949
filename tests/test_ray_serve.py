"""`asr-serve --engine ray`: the service on a real local Ray Serve (two decoder replicas of the real tiny.en
pair, one ingress with the API, the WebSocket and the web app), driven by the official `openai` package and a
real WebSocket client. A decoder replica is killed with SIGKILL in the middle of live streams and uploads:
every stream's committed text and every upload's text equals the run without the kill, and nothing fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import DISTIL_DRAFT_DIR, JFK_FLAC, REPO_ROOT, TINY_EN_DIR, lj_clip
from test_serve import KEY, client, metrics, start_server
from test_ui_server import free_port, stop
from websockets.asyncio.client import connect

pytest.importorskip("ray.serve", reason="Ray Serve is part of the dev extra")

from asr_app.scheduler_metrics import BatchSample, SchedulerMetrics  # noqa: E402

sys.path.insert(0, str(REPO_ROOT / "bench"))   # the bench's helpers that find and kill a busy replica
from ray_serve_bench import kill_a_busy_replica, replica_pids  # noqa: E402

from asr_app.serve.ray_engine import RayServeOptions, merge_metrics  # noqa: E402

STREAMS = [lj_clip("LJ001-0004"), lj_clip("LJ001-0008")]
UPLOADS = [JFK_FLAC, lj_clip("LJ001-0002"), lj_clip("LJ001-0004"), lj_clip("LJ001-0008")]
FRAME = 8000   # 0.5 s at 16 kHz


@pytest.fixture(scope="module")
def ray_service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray-serve")
    port = free_port()
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
               RAY_USAGE_STATS_ENABLED="0")
    cmd = [sys.executable, "-m", "asr_app.serve.cli", "--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR),
           "--device", "cpu", "--threads", "1", "--port", str(port), "--api-key", KEY, "--engine", "ray",
           "--replicas", "2"]
    proc, url = start_server(cmd, env, folder / "server.log", port)
    try:
        yield url
    finally:
        # asr-serve takes Serve and its local Ray down on SIGTERM (9.5 s in a full CI run); the 120 s grace is a
        # margin for a loaded machine, not a need seen. (The earlier "replicas outlived asr-serve" errors came
        # from the module running on both xdist workers at once: see conftest's work units.)
        started = time.monotonic()
        stop(proc, grace_s=120)
        stopped_s = time.monotonic() - started
    # Ray ends the replica processes just after asr-serve has exited: a short margin before the check.
    deadline = time.monotonic() + 30
    while replica_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = replica_pids()
    assert not left, (f"the decoder replicas {left} outlived asr-serve (exit {proc.returncode} after "
                      f"{stopped_s:.1f} s):\n{process_states(left)}\n{(folder / 'server.log').read_text()[-3000:]}")


def process_states(pids: list[int]) -> str:
    """Each process's state and parent, for a failure message."""
    lines = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        lines.append(f"{pid}: " + ", ".join(line for line in status if line.startswith(("State", "PPid"))))
    return "\n".join(lines)


async def lockstep_stream(url: str, path: Path) -> str:
    """Stream `path` in 0.5 s frames, each one decoded before the next is sent (the `flush` command), so the
    committed text does not depend on the server's load; the text committed at the end."""
    audio, _ = sf.read(str(path), dtype="int16")
    ws_url = url.replace("http://", "ws://") + f"/v1/live?sample_rate=16000&mode=exact&temperature=0&api_key={KEY}"
    async with connect(ws_url) as ws:
        assert json.loads(await ws.recv())["kind"] == "ready"
        for i in range(0, len(audio), FRAME):
            await ws.send(audio[i:i + FRAME].tobytes())
            await ws.send(json.dumps({"type": "flush"}))
            while (event := json.loads(await ws.recv()))["kind"] != "flushed":
                assert event["kind"] != "error", event
        await ws.send(json.dumps({"type": "stop"}))
        async for message in ws:
            event = json.loads(message)
            assert event["kind"] != "error", event
            if event["kind"] == "done":
                return event["text"]
    raise AssertionError("the stream closed without its done event")


def upload(url: str, path: Path) -> str:
    with open(path, "rb") as f:
        return client(url).audio.transcriptions.create(model="whisper-1", file=f, temperature=0.0).text


def run_load(url: str, beside=None) -> tuple[list[str], list[str]]:
    """The streams and the uploads at once (and `beside` in a thread of its own): (committed texts, upload
    texts)."""
    async def streams():
        return await asyncio.gather(*(lockstep_stream(url, path) for path in STREAMS))

    with ThreadPoolExecutor(len(UPLOADS) + 1) as pool:
        other = pool.submit(beside) if beside else None
        uploads = [pool.submit(upload, url, path) for path in UPLOADS]
        texts = asyncio.run(streams())
        if other is not None:
            other.result()
        return texts, [f.result() for f in uploads]


def test_a_killed_decoder_replica_loses_nothing(ray_service):
    url = ray_service
    # Serve may still be replacing a replica it judged unhealthy while the machine was busy (seen on a loaded
    # CI machine: 4 replica processes for a moment); the test starts from the steady state of 2.
    deadline = time.monotonic() + 60
    while len(before := replica_pids()) != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(before) == 2, before
    calm_streams, calm_uploads = run_load(url)
    assert all(calm_streams) and all(calm_uploads), (calm_streams, calm_uploads)
    assert "ask not what your country can do for you" in calm_uploads[0]
    resent_before = metrics(url)["asr_rows_resent_total"]

    killed: list[int | None] = []   # the busy replica is killed 1 s into the load
    streams, uploads = run_load(url, lambda: killed.append(kill_a_busy_replica(before, 1.0)))
    assert killed and killed[0] is not None, "no decoder replica was seen busy"
    assert streams == calm_streams
    assert uploads == calm_uploads
    # The resent count is the ingress's own; rows and batches come from the replicas through the board
    # (published every second, read at most once a second), and the calm run above has counted some already.
    deadline = time.monotonic() + 10
    while (figures := metrics(url))["asr_rows_resent_total"] <= resent_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert figures.get('asr_http_responses_total{status="5xx"}', 0) == 0, figures
    assert figures["asr_rows_resent_total"] > resent_before, figures   # rows in flight went again
    assert figures["asr_rows_total"] > 0 and figures["asr_batches_total"] > 0, figures

    deadline = time.monotonic() + 120   # Serve starts a replacement for the dead replica
    while len(now := replica_pids()) < 2 or killed[0] in now:
        assert time.monotonic() < deadline, f"no replacement replica: {now}"
        time.sleep(0.2)


def test_the_web_app_its_file_tab_and_health_come_through_the_ingress(ray_service):
    with urllib.request.urlopen(ray_service + "/health", timeout=10) as response:
        health = json.loads(response.read())
    assert health["status"] == "ok" and health["model"] == "whisper-tiny.en+draft", health
    with urllib.request.urlopen(ray_service + "/", timeout=30) as response:
        page = response.read().decode()
    assert response.status == 200 and "gradio" in page.lower()
    from gradio_client import Client, handle_file
    web = Client(ray_service + "/", verbose=False)
    _message, text, *_ = web.predict(handle_file(str(JFK_FLAC)), "exact", 0.0, api_name="/transcribe_file")
    assert "ask not what your country can do for you" in text, text


def test_engine_ray_without_ray_installed_fails_before_loading_with_the_install_line(tmp_path, monkeypatch,
                                                                                     capsys):
    # Ray hidden from the interpreter (an import of it fails); the target does not exist, so loading anything
    # would fail with another message.
    from asr_app.serve.cli import main

    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    assert main(["--engine", "ray", "--target", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert 'pip install "ray[serve]' in err and "nowhere" not in err, err


def test_scaling_options_are_checked():
    assert RayServeOptions(replicas=3).scaling() == {"num_replicas": 3}
    auto = RayServeOptions(min_replicas=1, max_replicas=4).scaling()["autoscaling_config"]
    assert (auto["min_replicas"], auto["max_replicas"]) == (1, 4)
    assert RayServeOptions(min_replicas=1, max_replicas=4, cpus_per_replica=2).cpus_needed == 8
    for bad in ({"replicas": 0}, {"min_replicas": 1}, {"min_replicas": 3, "max_replicas": 2},
                {"min_replicas": 0, "max_replicas": 0}, {"gpus_per_replica": -1}):
        with pytest.raises(ValueError):
            RayServeOptions(**bad)
    from asr_app.serve.cli import main
    assert main(["--replicas", "2", "--target", "x"]) == 2   # a Ray option without --engine ray


def _sample(batch: int) -> BatchSample:
    return BatchSample(batch=batch, kind="file exact", ready=batch, rows=batch, costs={1: 0.5}, wall_s=1.0, cpu_s=0.9,
                       one_time_s=0.0, decode_s=0.9, encoder_s=0.1, loop_s=0.7, target_calls=9)


def test_metrics_of_replicas_add_up_and_a_silent_replica_leaves_the_queue():
    a = SchedulerMetrics(queue_depth=3, batches=2, rows=5, rows_per_batch={1: 1, 4: 1}, busy_s=1.0, audio_s=10.0,
                         drafted=10, accepted=7, latencies={"live": [0.1], "file": []}, gathers=1, gather_s=0.5,
                         workspaces=2, workspace_rows=5, workspace_evictions=1, graph_evictions=2,
                         graph_captures=30, graph_capture_s=1.5, choices={"file exact": {4: {2: 1}}},
                         samples=[_sample(1 + k) for k in range(400)])
    b = SchedulerMetrics(queue_depth=4, batches=1, rows=1, rows_per_batch={1: 1}, busy_s=0.5, audio_s=2.0,
                         drafted=4, accepted=1, latencies={"live": [0.3], "file": [2.0]}, gathers=2, gather_s=0.25,
                         workspaces=3, workspace_rows=7, workspace_evictions=4, graph_evictions=8,
                         graph_captures=50, graph_capture_s=2.5,
                         choices={"file exact": {4: {2: 2, 4: 1}}, "live exact": {1: {1: 3}}},
                         samples=[_sample(1 + k % 2) for k in range(400)])
    merged = merge_metrics({"a": (100.0, 1, a), "b": (90.0, 2, b)}, now=101.0)
    assert merged.queue_depth == 3   # b published 11 s ago: gone, its queue with it; its totals stay
    assert (merged.workspaces, merged.workspace_rows) == (2, 5)   # held now: the live replicas' only
    assert (merged.workspace_evictions, merged.graph_evictions, merged.graph_captures) == (5, 10, 80)
    assert (merged.gathers, merged.graph_capture_s, merged.gather_s) == (3, 4.0, 0.75)
    assert (merged.batches, merged.rows, merged.rows_per_batch) == (3, 6, {1: 2, 4: 1})
    assert (merged.drafted, merged.accepted, merged.audio_s) == (14, 8, 12.0)
    assert sorted(merged.latencies["live"]) == [0.1, 0.3] and merged.latencies["file"] == [2.0]
    assert np.isclose(merged.busy_s, 1.5)
    assert merged.choices == {"file exact": {4: {2: 3, 4: 1}}, "live exact": {1: {1: 3}}}
    assert len(merged.samples) == 800 and merged.samples[0].batch == 1 and merged.samples[399].batch == 400


def test_serve_batching_groups_rows_that_can_share_a_batch_and_fails_only_their_group():
    """--replica-batching serve: the rows @serve.batch hands over are decoded in groups of equal options,
    prompt length and hint-or-none (a lock-step batch needs them equal), each row getting its own result."""
    from asr_app.decoding import DecodingOptions
    from asr_app.serve.ray_batching import ServeBatchedReplica

    class Decoder:
        def __init__(self) -> None:
            self.calls = []

        def batch_key(self, options, prompt):
            return len(prompt or "")

        def decode(self, clips, options, prompts, hints):
            self.calls.append(list(prompts))
            if options.temperature == 0.5:
                raise ValueError("no such luck")
            return [SimpleResult(f"{p}:{len(c)}") for c, p in zip(clips, prompts)]

    replica = ServeBatchedReplica.__new__(ServeBatchedReplica)
    replica.decoder = Decoder()
    replica._start_figures()
    greedy, warm = DecodingOptions(mode="exact"), DecodingOptions(mode="exact", temperature=0.5)
    clip = np.zeros(1600, np.float32)
    rows = [(clip, greedy, "ab", None), (clip, greedy, "cd", None), (clip, greedy, "abc", None),
            (clip, warm, "ab", None), (clip, greedy, "ef", [1, 2])]
    outcomes = replica._decode_rows(rows)
    assert replica.decoder.calls == [["ab", "cd"], ["abc"], ["ab"], ["ef"]]
    assert [o.text for o in outcomes[:3]] + [outcomes[4].text] == ["ab:1600", "cd:1600", "abc:1600", "ef:1600"]
    assert isinstance(outcomes[3], ValueError)
    assert (replica.figures.batches, replica.figures.rows, replica.figures.failed) == (4, 5, 1)
    assert replica.figures.rows_per_batch == {2: 1, 1: 3}


def test_serve_batching_reports_its_queue_and_latencies_as_the_scheduler_does():
    """--replica-batching serve fills the figures /metrics reads: rows waiting or decoding as the queue
    depth, and each row's latency under its priority's name (failed rows too), as the Scheduler keeps them."""
    from asr_app.scheduler import FILE, LIVE
    from asr_app.serve.ray_batching import ServeBatchedReplica

    replica = ServeBatchedReplica.__new__(ServeBatchedReplica)
    replica._start_figures()
    assert replica.snapshot().latencies == {"live": [], "file": []}

    async def run() -> None:
        release = asyncio.Event()

        async def batched(row):   # @serve.batch's call, held until released
            await release.wait()
            return ValueError("bad row") if row[2] == "bad" else SimpleResult("ok")

        replica._batched = batched
        calls = [asyncio.create_task(replica.decode(None, None, prompt, None, priority, "s"))
                 for prompt, priority in (("a", LIVE), ("b", FILE), ("bad", FILE))]
        await asyncio.sleep(0.05)
        assert replica.snapshot().queue_depth == 3 and replica.snapshot().latencies == {"live": [], "file": []}
        release.set()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert [o.text for o in outcomes[:2]] == ["ok", "ok"] and isinstance(outcomes[2], ValueError)

    asyncio.run(run())
    figures = replica.snapshot()
    assert figures.queue_depth == 0
    assert len(figures.latencies["live"]) == 1 and len(figures.latencies["file"]) == 2
    assert all(0.04 <= s < 5 for values in figures.latencies.values() for s in values), figures.latencies
    merged = merge_metrics({"r": (time.time(), 1, figures)}, time.time())
    assert len(merged.latencies["file"]) == 2   # what /metrics reads through the board


class SimpleResult:
    def __init__(self, text: str) -> None:
        from types import SimpleNamespace
        self.text, self.stats = text, SimpleNamespace(drafted=4, accepted=3)


def test_a_replica_sends_the_board_its_latest_batch_samples_only(monkeypatch):
    import threading
    from types import SimpleNamespace

    from asr_app.serve import ray_engine

    sent, done = [], threading.Event()

    def remote(name, pid, metrics):
        sent.append(metrics)
        done.set()
        raise RuntimeError("the board is gone")   # the publisher stops: no thread left behind

    monkeypatch.setattr(ray_engine, "PUBLISH_EVERY_S", 0.01)
    live = SchedulerMetrics()
    for k in range(100):
        live.note_sample(_sample(1 + k))
    ray_engine.publish_metrics(SimpleNamespace(publish=SimpleNamespace(remote=remote)), lambda: live)
    assert done.wait(10)
    first = sent[0]
    assert [m.batch for m in first.samples] == list(range(37, 101)) and len(live.samples) == 100   # the live deque kept


def test_the_board_keeps_the_totals_of_replicas_it_drops():
    from asr_app.serve.ray_engine import MetricsBoard

    board = MetricsBoard()
    for k in range(70):   # more replicas than the board keeps (autoscaling churn, restarts)
        board.publish(f"r{k}", k, SchedulerMetrics(batches=1, rows=2, latencies={"live": [0.1]},
                                                   samples=[_sample(1)]))
    boards = board.snapshot()
    assert len(boards) == 65 and boards["retired"][2].batches == 6 and boards["retired"][2].latencies == {}
    assert list(boards["retired"][2].samples) == []   # a retired replica's batches are not the live ones
    merged = merge_metrics(boards, now=boards["r69"][0])
    assert (merged.batches, merged.rows) == (70, 140)   # no counter goes down


# -- the ingress's RemoteScheduler with fake Ray objects (no Ray instance) ------------------------------

class FakeResponse:
    """A DeploymentResponse: answers at once, or hangs until cancelled (then raises as Ray does)."""

    def __init__(self, hang: bool) -> None:
        import threading
        self.hang, self.cancelled, self.waited = hang, threading.Event(), []

    def result(self, *, timeout_s=None):
        from concurrent.futures import CancelledError
        self.waited.append(timeout_s)
        if not self.hang:
            return SimpleResult("answered")
        if self.cancelled.wait(timeout_s):
            raise CancelledError()
        raise TimeoutError("not answered in time")

    def cancel(self) -> None:
        self.cancelled.set()


class FakeHandle:
    """A DeploymentHandle of DecoderReplica whose calls hang (or not): `handle.decode.remote(...)`."""

    def __init__(self, hang: bool = True) -> None:
        from types import SimpleNamespace
        self.hang, self.responses = hang, []
        self.decode = SimpleNamespace(remote=self._remote)

    def _remote(self, *row):
        self.responses.append(FakeResponse(self.hang))
        return self.responses[-1]


def remote_scheduler(handle=None, **kwargs):
    from asr_app.decoding import DecodingOptions
    from asr_app.serve.ray_engine import RemoteScheduler
    return RemoteScheduler(handle or FakeHandle(), pair=None, default_options=DecodingOptions(), **kwargs)


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


def test_health_and_metrics_read_the_board_at_most_once_per_interval(monkeypatch):
    """/health and /metrics need no key: a client calling them in a loop costs one board read per second, and
    a board that does not answer in time leaves the last figures served, with their age."""
    from types import SimpleNamespace

    import ray
    from ray.exceptions import GetTimeoutError

    now, reads, waits, answering = [100.0], [], [], [True]

    def snapshot():
        reads.append(now[0])
        return {"r1": (time.time(), 1, SchedulerMetrics(queue_depth=len(reads), rows=10 * len(reads)))}

    def get(value, timeout=None):
        waits.append(timeout)
        if not answering[0]:
            raise GetTimeoutError("slow board")
        return value

    monkeypatch.setattr(ray, "get", get)
    scheduler = remote_scheduler(board=SimpleNamespace(snapshot=SimpleNamespace(remote=snapshot)),
                                 clock=lambda: now[0])
    try:
        assert scheduler.figures_age_s is None
        assert {scheduler.metrics().rows for _ in range(50)} == {10} and reads == [100.0]
        now[0] += 0.5
        assert scheduler.metrics().queue_depth == 1 and reads == [100.0] and scheduler.figures_age_s == 0.5
        now[0] += 0.5
        assert scheduler.metrics().rows == 20 and reads == [100.0, 101.0]   # one read per interval
        assert waits == [2.0, 2.0]   # never the old 10 s wait
        answering[0] = False
        now[0] += 3.0
        for _ in range(20):
            m = scheduler.metrics()
        assert (m.rows, m.queue_depth) == (20, 2) and len(waits) == 3   # the last figures; one try per interval
        assert scheduler.figures_age_s == 3.0
        now[0] += 1.0
        assert scheduler.metrics().rows == 20 and len(waits) == 4 and scheduler.figures_age_s == 4.0
    finally:
        scheduler.close()


def test_a_row_a_replica_does_not_answer_in_time_is_cancelled_there_and_answered_busy():
    from asr_app.scheduler import SchedulerBusy
    from asr_app.serve.api import refusal_for

    handle = FakeHandle(hang=True)
    scheduler = remote_scheduler(handle, call_timeout_s=0.05)
    try:
        future = scheduler.submit(np.zeros(1600, np.float32), scheduler.default_options)
        error = future.exception(timeout=5)
        assert isinstance(error, SchedulerBusy) and "0.05 s" in str(error), error
        assert refusal_for(error).status == 503   # the service's trouble, not a bad request
        assert handle.responses[0].waited == [0.05] and handle.responses[0].cancelled.is_set()
        assert len(handle.responses) == 1   # not sent again: a hung replica is not a lost one
        wait_for(lambda: scheduler.metrics().queue_depth == 0)
    finally:
        scheduler.close()


def test_a_request_past_its_timeout_cancels_its_rows_on_the_replica():
    """The caller's timeout (ScheduledDecoder) cancels the row's call, not only the local future that a
    running call no longer honours; the replica's task is then cancelled by Serve."""
    handle = FakeHandle(hang=True)
    scheduler = remote_scheduler(handle, call_timeout_s=60)
    try:
        with pytest.raises(TimeoutError, match="no decoder time within"):
            scheduler.client(timeout_s=0.1).decode(np.zeros(1600, np.float32))
        assert len(handle.responses) == 1 and handle.responses[0].cancelled.is_set()
        wait_for(lambda: scheduler.metrics().queue_depth == 0 and not scheduler._flights)

        answered = FakeHandle(hang=False)
        scheduler.handle = answered
        future = scheduler.submit(np.zeros(1600, np.float32), scheduler.default_options)
        assert future.result(5).text == "answered"
        assert scheduler.cancel(future) is False and not answered.responses[0].cancelled.is_set()
    finally:
        scheduler.close()


def test_a_row_cancelled_before_its_call_is_never_sent():
    from concurrent.futures import CancelledError

    from asr_app.serve.ray_engine import _Flight

    handle = FakeHandle()
    scheduler = remote_scheduler(handle)
    try:
        with pytest.raises(CancelledError):
            scheduler._send(_Flight(cancelled=True), np.zeros(1600, np.float32))
        assert handle.responses == []
    finally:
        scheduler.close()


def test_a_cancelled_call_drops_its_row_from_the_replicas_queue():
    from concurrent.futures import Future

    from asr_app.serve.ray_engine import DecoderReplica

    class Scheduler:
        def __init__(self) -> None:
            self.future, self.cancelled = Future(), []

        def submit(self, *row, priority, session):
            return self.future

        def cancel(self, future):
            self.cancelled.append(future)
            return True

    replica = DecoderReplica.__new__(DecoderReplica)
    replica.scheduler = Scheduler()

    async def cancel_it() -> None:
        task = asyncio.create_task(replica.decode(np.zeros(1600, np.float32), None, None, None, 0, "s"))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    assert replica.scheduler.cancelled == [replica.scheduler.future]


def test_a_shared_clusters_serve_elsewhere_or_running_our_application_is_refused_with_one_line():
    """--address: Ray ignores our --host/--port when Serve already runs there, and a second deployment named
    "asr" would replace the first; both are refused before anything is deployed."""
    from asr_app.serve.ray_launch import app_conflict, http_conflict

    assert http_conflict("127.0.0.1", 8000, ("127.0.0.1", 8000)) is None
    assert http_conflict("127.0.0.1", 8000, None) is None   # unreadable (Ray's private API moved): no refusal
    for running in (("0.0.0.0", 8000), ("127.0.0.1", 8123)):
        line = http_conflict("127.0.0.1", 8000, running)
        assert f"http://{running[0]}:{running[1]}" in line and "\n" not in line, line
        assert f"--host {running[0]} --port {running[1]}" in line
    assert app_conflict({}) is None and app_conflict({"other": object()}) is None
    line = app_conflict({"asr": object(), "other": object()})
    assert "'asr'" in line and "replace" in line and "\n" not in line, line


def test_a_serve_conflict_leaves_the_cluster_as_it_was(monkeypatch, capsys):
    """asr-serve refusing a shared cluster disconnects without `serve.delete` (the "asr" there is not ours)."""
    from asr_app.serve import cli, ray_launch

    calls = []

    def start(*_args):
        raise ray_launch.ServeConflict("Ray Serve on this cluster already runs an application named 'asr'")

    monkeypatch.setattr(ray_launch, "start", start)
    monkeypatch.setattr(ray_launch, "disconnect", lambda: calls.append("disconnect"))
    monkeypatch.setattr(ray_launch, "stop_service", lambda *_: calls.append("stop_service"))
    assert cli.serve_on_ray(None, RayServeOptions(address="auto"), {}) == 2
    assert calls == ["disconnect"]
    assert capsys.readouterr().err.strip() == ("asr-serve: error: Ray Serve on this cluster already runs an "
                                               "application named 'asr'")


def test_the_running_serve_address_is_read_defensively(monkeypatch):
    from types import SimpleNamespace

    from ray.serve import context

    from asr_app.serve.ray_launch import running_http_address

    config = SimpleNamespace(host="0.0.0.0", port=8123)
    monkeypatch.setattr(context, "_get_global_client", lambda: SimpleNamespace(http_config=config))
    assert running_http_address() == ("0.0.0.0", 8123)
    monkeypatch.setattr(context, "_get_global_client", lambda: SimpleNamespace())   # another Ray's shape
    assert running_http_address() is None


@pytest.mark.parametrize("argv, said", [
    (["--device", "cuda"], "needs --gpus-per-worker > 0"),
    (["--device", "cuda:1", "--gpus-per-worker", "1"], "sees them as cuda:0 to cuda:0"),
    (["--device", "cpu", "--gpus-per-worker", "0.5"], "--device cpu workers would never use"),
])
def test_asr_transcribe_on_ray_checks_the_device_against_the_gpus_per_worker(tmp_path, capsys, argv, said):
    """The check asr-serve makes of --gpus-per-replica (one check, asr_app/cluster.py): refused before any file
    is read or model loaded (neither exists here, so either would fail with another message)."""
    from asr_app.cli.transcribe import main

    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path / "in.flac"), "--engine", "ray", "--target", str(tmp_path / "nowhere"), *argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and said in err and "nowhere" not in err and "in.flac" not in err, err


def test_the_ray_device_check_lets_a_device_that_uses_its_reservation_through():
    from asr_app.cluster import ray_device_problem

    for device, gpus in (("auto", 0), ("auto", 0.5), ("cpu", 0), ("cuda", 1), ("cuda:0", 0.5), ("cuda:1", 2)):
        assert ray_device_problem(device, gpus, "--gpus-per-worker", "worker") is None, (device, gpus)
    from asr_app.serve.cli import _check_replica_device
    with pytest.raises(ValueError, match="needs --gpus-per-replica > 0: a replica"):
        _check_replica_device("cuda", 0)


def test_without_an_address_both_engines_start_a_ray_of_their_own(monkeypatch):
    """Ray's default (address None) joins a cluster that RAY_ADDRESS or an earlier `ray start` names; asr-serve
    would then shut down that cluster's Serve on its way out. "local" always starts a new instance."""
    from types import SimpleNamespace

    import ray

    from asr_app.cluster import ClusterError, ClusterOptions, RayTranscriber
    from asr_app.serve import ray_launch

    addresses = []

    def init(address=None, **_kwargs):
        addresses.append(address)
        raise RuntimeError("stop here")

    monkeypatch.setattr(ray, "init", init)
    args = SimpleNamespace(host="127.0.0.1", port=8000)
    with pytest.raises(RuntimeError, match="stop here"):
        ray_launch.start(args, {}, RayServeOptions())
    with pytest.raises(RuntimeError, match="stop here"):
        ray_launch.start(args, {}, RayServeOptions(address="auto"))
    transcriber = RayTranscriber.__new__(RayTranscriber)
    transcriber.ray = SimpleNamespace(is_initialized=lambda: False, init=init)
    for address in (None, "ray://head:10001"):
        transcriber.cluster = ClusterOptions(address=address)
        with pytest.raises(ClusterError, match="stop here"):
            transcriber._connect()
    assert addresses == ["local", "auto", "local", "ray://head:10001"]
