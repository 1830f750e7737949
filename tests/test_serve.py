"""The real service: `asr-serve` in a subprocess on a free loopback port (real tiny.en pair), driven by the
official `openai` package, a real WebSocket client and plain HTTP. Every bad input gets its 4xx and one
sentence, and the server keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import soundfile as sf
from conftest import DISTIL_DRAFT_DIR, JFK_FLAC, REPO_ROOT, TINY_EN_DIR, lj_clip
from test_ui_server import free_port, stop
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from asr_app.wer import word_error_rate

KEY = "test-key-123456"
STARTUP_TIMEOUT_S = 240
JFK_TEXT = (JFK_FLAC.parent / "jfk.txt").read_text().strip()
LJ_LIVE = lj_clip("LJ001-0004")    # 5.1 s
LJ_LIVE_TEXT = "produced the block books, which were the immediate predecessors of the true printed book,"
CLIPS = [lj_clip(c) for c in ("LJ001-0002", "LJ001-0008", "LJ001-0004", "LJ001-0002")]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    port = free_port()
    log_path = folder / "server.log"
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
               TMPDIR=str(folder))
    cmd = [sys.executable, "-m", "asr_app.serve.cli", "--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR),
           "--device", "cpu", "--threads", "1", "--port", str(port), "--api-key", KEY, "--max-upload-mb", "3",
           "--max-upload-minutes", "1", "--max-sessions", "2", "--no-ui"]
    proc, url = start_server(cmd, env, log_path, port)
    try:
        yield url, folder, log_path
    finally:
        stop(proc)
    log = log_path.read_text()
    assert "Traceback" not in log, log[-3000:]


def start_server(cmd: list[str], env: dict, log_path, port: int):
    """Start `cmd` (an asr-serve) and wait until /health answers; (process, url)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"asr-serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"asr-serve did not start:\n{log_path.read_text()[-3000:]}")


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def healthy(url: str) -> bool:
    with urllib.request.urlopen(url + "/health", timeout=10) as response:
        return json.loads(response.read())["status"] == "ok"


def metrics(url: str) -> dict[str, float]:
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        lines = response.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")}


def wav_bytes(samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype=subtype)
    return out.getvalue()


def test_models_and_every_response_format(service):
    url, _, _ = service
    api = client(url)
    ids = [m.id for m in api.models.list().data]
    assert ids == ["whisper-tiny.en+draft", "whisper-1"]
    assert [api.models.retrieve(i).id for i in ids] == ids   # what the openai package's retrieve() asks
    with pytest.raises(openai.NotFoundError, match="'gpt-9' is not served here"):
        api.models.retrieve("gpt-9")
    with open(JFK_FLAC, "rb") as f:
        text = api.audio.transcriptions.create(model=ids[0], file=f).text
    assert word_error_rate(JFK_TEXT, text) < 0.1, text
    with open(JFK_FLAC, "rb") as f:
        plain = api.audio.transcriptions.create(model="whisper-1", file=f, response_format="text")
    assert plain.strip() == text
    with open(JFK_FLAC, "rb") as f:
        srt = api.audio.transcriptions.create(model="whisper-1", file=f, response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> ") and "country" in srt
    with open(JFK_FLAC, "rb") as f:
        vtt = api.audio.transcriptions.create(model="whisper-1", file=f, response_format="vtt")
    assert vtt.startswith("WEBVTT") and "-->" in vtt
    with open(JFK_FLAC, "rb") as f:
        verbose = api.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                  timestamp_granularities=["word", "segment"])
    assert verbose.language == "english" and verbose.duration == pytest.approx(11.0, abs=0.1)
    assert verbose.text == text and verbose.segments and verbose.segments[0].start == 0.0
    words = verbose.words
    assert [w.word.strip(",") for w in words][:3] == ["And", "so", "my"]
    assert all(a.start <= b.start for a, b in zip(words, words[1:])) and words[-1].end <= 11.1


def test_streamed_transcription_arrives_as_events(service):
    url, _, _ = service
    with open(JFK_FLAC, "rb") as f:
        events = list(client(url).audio.transcriptions.create(model="whisper-1", file=f, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and "transcript.text.delta" in kinds
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
    assert deltas == events[-1].text and word_error_rate(JFK_TEXT, events[-1].text) < 0.1


def test_concurrent_requests_share_batches_and_match_one_at_a_time(service):
    url, _, _ = service
    api = client(url)

    def run(path):
        with open(path, "rb") as f:
            return api.audio.transcriptions.create(model="whisper-1", file=f).text

    alone = [run(p) for p in CLIPS[:3]]
    before = metrics(url)
    with ThreadPoolExecutor(len(CLIPS) * 2) as pool:
        together = list(pool.map(run, CLIPS * 2))
    after = metrics(url)
    assert together == [*alone, alone[0]] * 2   # greedy: the same text however the rows were batched
    rows = after["asr_rows_total"] - before["asr_rows_total"]
    batches = after["asr_batches_total"] - before["asr_batches_total"]
    assert rows >= len(CLIPS) * 2 and batches < rows, (rows, batches)   # some batch held several rows
    assert {"asr_batch_gathers_total", "asr_batch_gather_seconds_total"} <= set(after)   # exported
    # steps run eagerly on a CPU: nothing captured, no workspace held (a GPU server reports its captures)
    assert (after["asr_workspaces"], after["asr_graph_captures_total"], after["asr_workspace_evictions_total"],
            after["asr_graph_capture_seconds_total"]) == (0, 0, 0, 0)
    assert after.get('asr_http_responses_total{status="5xx"}', 0) == 0


@pytest.mark.parametrize("name, body, status, phrase", [
    ("one_hz.wav", wav_bytes(np.zeros(16, np.float32), 1), 400, "sample rate 1 Hz"),
    ("nan.wav", wav_bytes(np.full(16_000, np.nan, np.float32), 16_000, "FLOAT"), 400, "NaN"),
    ("truncated.flac", JFK_FLAC.read_bytes()[:3000], 400, None),
    ("empty.wav", b"", 400, "empty"),
    ("notes.txt", b"hello, this is not audio", 400, "not an audio file"),
    ("long.wav", wav_bytes(np.zeros(8_000 * 90, np.int16), 8_000), 413, "90 s of audio; at most 60 s"),
    # each channel is read before the downmix: a few KB of a 255-channel file would be 0.5 GB per block
    ("surround.wav", wav_bytes(np.zeros((16_000, 12), np.int16), 16_000), 400, "has 12 channels; at most 8"),
    # 3.84 MB: refused while it arrives, with the bound the server was given (--max-upload-mb 3)
    ("big.wav", wav_bytes(np.zeros(16_000 * 120, np.int16), 16_000), 413,
     "the upload is larger than the 3 MB that is accepted"),
    # past the bound with the form's overhead: refused by its Content-Length before the app reads it
    ("huge.wav", wav_bytes(np.zeros(16_000 * 140, np.int16), 16_000), 413,
     "the request is 4.5 MB; uploads of at most 3 MB are accepted"),
])
def test_bad_uploads_get_a_clear_4xx_and_the_server_goes_on(service, name, body, status, phrase):
    url, folder, _ = service
    refused = 'asr_http_responses_total{status="4xx"}'
    before = metrics(url).get(refused, 0)
    with pytest.raises(openai.APIStatusError) as caught:
        client(url).audio.transcriptions.create(model="whisper-1", file=(name, body))
    assert caught.value.status_code == status, caught.value.message
    assert metrics(url)[refused] == before + 1   # counted, the body-size refusal before the app included
    message = caught.value.body["message"]
    if phrase:
        assert phrase in message, message
    assert str(folder) not in message and "/tmp" not in message   # no server paths
    assert healthy(url)
    assert not list(folder.glob("asr_serve_*")), "an upload's temporary folder was left behind"


def test_an_upload_without_the_key_is_refused_before_its_body_is_read(service):
    """401 at once for a request that declares 2 MB and sends none of it (had the server waited for the body,
    this would time out), and a key error, not a form error, for a form without its file."""
    import http.client

    url, _, _ = service
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=20)
    connection.putrequest("POST", "/v1/audio/transcriptions")
    connection.putheader("Content-Type", "multipart/form-data; boundary=x")
    connection.putheader("Content-Length", str(2_000_000))
    connection.endheaders()
    answer = connection.getresponse()
    assert answer.status == 401 and "API key" in json.loads(answer.read())["error"]["message"]
    connection.close()
    with pytest.raises(openai.AuthenticationError):
        client(url, "wrong-key-000").audio.transcriptions.create(model="whisper-1", file=("a.wav", b""))
    assert healthy(url)


def test_a_chunked_upload_past_the_bound_is_told_the_bound(service):
    """An upload sent without a Content-Length (chunked) is counted as it arrives: past --max-upload-mb (3)
    plus the form's room it is a 413 naming the bound, not a parse error."""
    import httpx

    url, folder, _ = service
    boundary = "asrbound"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.wav\"\r\n"
            "Content-Type: audio/wav\r\n\r\n").encode()

    def body():   # 5 MB of a WAV's worth of zeros, chunk by chunk
        yield head + wav_bytes(np.zeros(16_000, np.int16), 16_000)
        for _ in range(80):
            yield bytes(64_000)
        yield f"\r\n--{boundary}--\r\n".encode()

    refused = 'asr_http_responses_total{status="4xx"}'
    before = metrics(url).get(refused, 0)
    answer = httpx.post(url + "/v1/audio/transcriptions", content=body(), timeout=60,
                        headers={"Authorization": f"Bearer {KEY}",
                                 "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"]["message"] == "the upload is larger than the 3 MB that is accepted"
    assert metrics(url)[refused] == before + 1   # counted once
    assert healthy(url) and not list(folder.glob("asr_serve_*"))


@pytest.mark.parametrize("passed", ["by the last message", "before the end"])
def test_the_upload_gate_answers_413_whether_the_bound_is_passed_before_the_end_or_by_it(passed):
    """The ASGI layer alone: a body that passes the bound in its last message is answered at once (reading on
    would wait for a client that is waiting for the answer); one that passes it earlier has its rest read
    and dropped first, so the client reads the 413."""
    from asr_app.serve.app import UploadGate

    async def form_parser(scope, receive, send):   # reads the body as FastAPI's form parsing does
        while (message := await receive())["type"] == "http.request" and message.get("more_body"):
            pass
        if message["type"] == "http.disconnect":
            raise RuntimeError("the client left")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    gate = UploadGate(form_parser, limit_mb=1)

    def message(size: int, more: bool) -> dict:
        return {"type": "http.request", "body": bytes(size), "more_body": more}

    half = gate.max_bytes // 2 + 1
    body = ([message(gate.max_bytes + 1, False)] if passed == "by the last message" else
            [message(half, True), message(half, True), message(1000, True), message(1000, False)])

    async def run() -> tuple[list[dict], int]:
        queue, sent = list(body), []

        async def receive():
            if queue:
                return queue.pop(0)
            await asyncio.Event().wait()   # a client that sent everything and waits for the answer

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "path": "/v1/audio/transcriptions", "headers": [], "query_string": b""}
        await asyncio.wait_for(gate(scope, receive, send), 10)
        return sent, len(queue)

    sent, unread = asyncio.run(run())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413 and unread == 0
    assert b"larger than the 1 MB" in sent[1]["body"]


@pytest.mark.parametrize("name", ["x" * 300 + ".wav", "ü" * 130 + ".flac", "..", "a/../../b.flac", "noext"])
def test_an_uploads_own_name_never_stops_its_transcription(service, name):
    """The server spools an upload under a name of its own: a client's name the file system would refuse
    (too long, '..', a path) transcribes like any other."""
    url, _, _ = service
    text = client(url).audio.transcriptions.create(model="whisper-1", file=(name, LJ_LIVE.read_bytes())).text
    assert word_error_rate(LJ_LIVE_TEXT, text) < 0.15, text


def test_wrong_key_unknown_model_and_bad_options_are_refused(service):
    url, _, _ = service
    with open(JFK_FLAC, "rb") as f:
        audio = f.read()
    cases = [
        (lambda: client(url, "wrong-key-000").audio.transcriptions.create(model="whisper-1", file=("a.flac", audio)),
         401, "API key"),
        (lambda: client(url).audio.transcriptions.create(model="gpt-9", file=("a.flac", audio)), 404, "not served"),
        (lambda: client(url).audio.transcriptions.create(model="whisper-1", file=("a.flac", audio),
                                                         response_format="xml"), 400, "response_format"),
        (lambda: client(url).audio.transcriptions.create(model="whisper-1", file=("a.flac", audio),
                                                         temperature=3.0), 400, "temperature"),
        (lambda: client(url).audio.transcriptions.create(model="whisper-1", file=("a.flac", audio),
                                                         extra_body={"mode": "turbo"}), 400, "mode"),
        (lambda: client(url).audio.translations.create(model="whisper-1", file=("a.flac", audio)), 400,
         "multilingual"),
        (lambda: client(url).audio.transcriptions.create(model="whisper-1", file=("a.flac", audio), language="xx"),
         400, "unknown language 'xx'"),
        (lambda: client(url).audio.transcriptions.create(model="whisper-1", file=("a.flac", audio), language="fr"),
         400, "English-only model"),
    ]
    for call, status, phrase in cases:
        with pytest.raises(openai.APIStatusError) as caught:
            call()
        assert caught.value.status_code == status and phrase in caught.value.body["message"], caught.value.body
    assert healthy(url)


def test_requests_outside_the_api_get_its_error_shape_and_names_work_as_codes(service):
    """An unknown path or method and a text where the file should be: OpenAI's error body, one sentence, no
    Python internals. A language given by name ("English", as the CLIs take it) is its code, and the
    granularities field is read without its brackets too."""
    import httpx

    url, _, _ = service
    auth = {"Authorization": f"Bearer {KEY}"}
    for method, path, status, phrase in [("GET", "/v1/nothing", 404, "there is no /v1/nothing here"),
                                         ("GET", "/v1/audio/transcriptions", 405, "GET is not accepted")]:
        answer = httpx.request(method, url + path, headers=auth, timeout=30)
        assert answer.status_code == status and phrase in answer.json()["error"]["message"], answer.text
    answer = httpx.post(url + "/v1/audio/transcriptions", headers=auth, timeout=30,
                        data={"model": "whisper-1", "file": "not-a-file"})
    message = answer.json()["error"]["message"]
    assert answer.status_code == 400 and "multipart" in message and "class" not in message, message
    with open(lj_clip("LJ001-0002"), "rb") as f:
        answer = httpx.post(url + "/v1/audio/transcriptions", headers=auth, timeout=120,
                            files={"file": ("short.flac", f.read())},
                            data={"model": "whisper-1", "language": "English", "response_format": "verbose_json",
                                  "timestamp_granularities": "word"})
    body = answer.json()
    assert answer.status_code == 200 and body["language"] == "english" and body["words"], body
    assert healthy(url)


async def _stream(url: str, path, *, rate_claim: int | None = None, paced: bool = False) -> list[dict]:
    samples, rate = sf.read(str(path), dtype="float32")
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    uri = f"{url.replace('http', 'ws')}/v1/live?sample_rate={rate_claim or rate}&mode=exact"
    events = []
    async with connect(uri, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        events.append(json.loads(await ws.recv()))
        if events[0]["kind"] != "ready":
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            events.append({"kind": "closed", "code": closed.value.rcvd.code})
            return events
        step = rate // 2
        for i in range(0, len(pcm), step):
            await ws.send(pcm[i:i + step].tobytes())
            if paced:
                await asyncio.sleep(0.05)
        await ws.send(b"\x01")   # half a sample: refused, the session goes on
        await ws.send(json.dumps({"type": "stop"}))
        async for message in ws:
            events.append(json.loads(message))
    return events


def test_live_websocket_streams_real_speech_to_final_text(service):
    url, _, _ = service
    events = asyncio.run(_stream(url, LJ_LIVE))
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "ready" and kinds[-2:] == ["stats", "done"] and "commit" in kinds
    assert any(e["kind"] == "error" and "not whole" in e["message"] for e in events)
    committed = " ".join(e["text"] for e in events if e["kind"] == "commit")
    assert committed.strip() == events[-1]["text"]
    assert word_error_rate(LJ_LIVE_TEXT, events[-1]["text"]) < 0.15, events[-1]["text"]
    words = [w for e in events if e["kind"] == "commit" for w in e["words"]]
    assert words and all(0 <= w["start"] <= w["end"] <= 5.2 for w in words)
    assert events[-2]["audio_s"] == pytest.approx(sf.info(str(LJ_LIVE)).duration, abs=0.01)


def test_live_refuses_bad_rates_and_sessions_beyond_the_limit(service):
    url, _, _ = service
    events = asyncio.run(_stream(url, LJ_LIVE, rate_claim=1))
    assert events[0]["kind"] == "error" and "outside the accepted 8000-192000 Hz" in events[0]["message"]
    assert events[1] == {"kind": "closed", "code": 1008}

    async def crowd() -> list[str]:
        uri = f"{url.replace('http', 'ws')}/v1/live?sample_rate=16000"
        headers = {"Authorization": f"Bearer {KEY}"}
        async with connect(uri, additional_headers=headers) as a, connect(uri, additional_headers=headers) as b:
            firsts = [json.loads(await a.recv())["kind"], json.loads(await b.recv())["kind"]]
            async with connect(uri, additional_headers=headers) as c:
                third = json.loads(await c.recv())
                with pytest.raises(ConnectionClosed) as closed:
                    await c.recv()
                assert closed.value.rcvd.code == 1013
            return [*firsts, third["kind"], third["message"]]

    kinds = asyncio.run(crowd())
    assert kinds[:3] == ["ready", "ready", "error"] and "live sessions are in use" in kinds[3]

    async def hot() -> tuple[dict, int]:   # a query value FastAPI would refuse with a bare HTTP 403
        uri = f"{url.replace('http', 'ws')}/v1/live?sample_rate=16000&temperature=hot"
        async with connect(uri, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            first = json.loads(await ws.recv())
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            return first, closed.value.rcvd.code

    assert asyncio.run(hot()) == ({"kind": "error", "message": "temperature 'hot' is not a number"}, 1008)
    # Both left without a stop: their places are free again.
    assert asyncio.run(_stream(url, lj_clip("LJ001-0002")))[-1]["kind"] == "done"
    assert healthy(url)


def test_asr_stream_sends_a_file_to_the_server(service):
    url, _, _ = service
    run = subprocess.run([sys.executable, "-m", "asr_app.cli.stream", "--server", url, "--api-key", KEY,
                          "--simulate", str(LJ_LIVE), "--fast", "--jsonl", "--stats"],
                         capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines()]
    committed = " ".join(e["text"] for e in events if e["kind"] == "commit")
    assert word_error_rate(LJ_LIVE_TEXT, committed) < 0.15, committed
    assert json.loads(run.stderr.strip().splitlines()[-1])["audio_s"] == pytest.approx(5.1, abs=0.1)
    refused = subprocess.run([sys.executable, "-m", "asr_app.cli.stream", "--server", url, "--step", "1",
                              "--simulate", str(LJ_LIVE)], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--step: decided by the server with --server" in refused.stderr
    wrong = subprocess.run([sys.executable, "-m", "asr_app.cli.stream", "--server", url, "--api-key", "nope-nope-1",
                            "--simulate", str(LJ_LIVE), "--fast"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "API key" in wrong.stderr
    # the base URL OpenAI clients are given works too; an address without the endpoint is one line, no traceback
    v1 = subprocess.run([sys.executable, "-m", "asr_app.cli.stream", "--server", url + "/v1", "--api-key", KEY,
                         "--simulate", str(LJ_LIVE), "--fast"], capture_output=True, text=True, timeout=300,
                        cwd=REPO_ROOT)
    assert v1.returncode == 0 and word_error_rate(LJ_LIVE_TEXT, v1.stdout) < 0.15, v1.stderr
    elsewhere = subprocess.run([sys.executable, "-m", "asr_app.cli.stream", "--server", url + "/elsewhere",
                                "--api-key", KEY, "--simulate", str(LJ_LIVE), "--fast"], capture_output=True,
                               text=True, timeout=60)
    assert elsewhere.returncode == 2 and "Traceback" not in elsewhere.stderr, elsewhere.stderr
    assert "answered HTTP 403 where the live WebSocket should be (/elsewhere/v1/live)" in elsewhere.stderr


def test_launch_options_reach_the_limits_and_cors_is_off_unless_asked(service):
    from asr_app.serve.cli import build_parser, limits_from_args
    args = build_parser().parse_args(["--max-sessions", "3", "--max-upload-mb", "5", "--max-upload-minutes", "2",
                                      "--max-chunk-seconds", "4", "--request-timeout", "30"])
    limits = limits_from_args(args)
    assert (limits.max_sessions, limits.max_upload_mb, limits.max_upload_s, limits.max_chunk_s,
            limits.request_timeout_s) == (3, 5.0, 120.0, 4.0, 30.0)
    with pytest.raises(ValueError, match="max_sessions"):
        limits_from_args(build_parser().parse_args(["--max-sessions", "0"]))
    url, _, _ = service
    request = urllib.request.Request(url + "/v1/models", headers={"Origin": "http://elsewhere.example",
                                                                   "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers.get("access-control-allow-origin") is None


def test_serving_anywhere_but_loopback_needs_a_key(monkeypatch, capsys):
    # asr-serve's main in this process (no second interpreter to import torch); loading the models is made
    # to fail loudly, so a key check that comes too late fails here at once instead of serving on 0.0.0.0.
    from asr_app.serve import cli

    def no_loading(*_args, **_kwargs):
        raise AssertionError("asr-serve went on to load the models")

    monkeypatch.setattr(cli, "load_decoder_or_report", no_loading)
    monkeypatch.setenv("ASR_SERVE_API_KEY", "")
    code = cli.main(["--host", "0.0.0.0", "--port", str(free_port())])
    out, err = capsys.readouterr()
    assert code == 2 and "needs an API key" in err and "models loaded" not in out


def test_translation_and_language_detection_on_the_multilingual_model(tmp_path):
    """Whisper base (the multilingual extra): /v1/audio/translations answers in English, a transcription
    without a language detects it, and verbose_json names it."""
    port = free_port()
    log_path = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "asr_app.serve.cli", "--pair", "base", "--device", "cpu", "--threads", "1",
           "--port", str(port), "--no-ui"]
    proc, url = start_server(cmd, dict(os.environ, HF_HUB_OFFLINE="1"), log_path, port)
    try:
        api = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        german = REPO_ROOT / "tests" / "data" / "audio" / "espeak" / "de.flac"
        assert [m.id for m in api.models.list().data][0] == "whisper-base+draft"   # its bundled draft beside it
        with open(german, "rb") as f:
            english = api.audio.translations.create(model="whisper-1", file=f).text
        with open(german, "rb") as f:
            verbose = api.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json")
        assert verbose.language == "german" and "morgen" in verbose.text.lower(), verbose.text
        assert "morning" in english.lower() and "morgen" not in english.lower(), english
    finally:
        stop(proc)


@contextlib.contextmanager
def in_process_server(engine, mount_ui: bool = False, access=None):
    """`asr-serve`'s app for `engine` (API only, or with the web app at /) in uvicorn on a free loopback port,
    in this process."""
    import threading

    import uvicorn

    from asr_app.serve.app import build_app
    from asr_app.serve.security import AccessSettings

    port = free_port()
    app = build_app(engine, access or AccessSettings(), mount_ui=mount_ui)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.scheduler.close()


def test_unknown_api_paths_get_the_api_answer_with_the_web_app_mounted(tiny_en_pair):
    """With the web app at / (asr-serve's default), a path under /v1 that no route takes would be the web
    app's to answer: it is the API's 404, a method a route does not take the API's 405 with Allow."""
    import httpx

    from asr_app.ui.engine import UiEngine

    with in_process_server(UiEngine(pair=tiny_en_pair), mount_ui=True) as port:
        url = f"http://127.0.0.1:{port}"
        missing = httpx.get(url + "/v1/nothing", timeout=30)
        wrong_method = httpx.get(url + "/v1/audio/transcriptions", timeout=30)
        socket_path = httpx.get(url + "/v1/live", timeout=30)
        page = httpx.get(url + "/", timeout=60)
    assert missing.status_code == 404 and "there is no /v1/nothing here" in missing.json()["error"]["message"]
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST", wrong_method.text
    assert "GET is not accepted" in wrong_method.json()["error"]["message"]
    assert socket_path.status_code == 400 and "WebSocket" in socket_path.json()["error"]["message"]
    assert page.status_code == 200 and "gradio" in page.text.lower()   # the web app still answers its own
    assert "recorder was not ready" in page.text   # with the page script that mends Gradio's Record race


def test_a_live_session_that_lost_its_place_while_idle_cannot_decode_past_max_sessions(tiny_en_pair, sessions_clock):
    """--max-sessions 1: a WebSocket session quiet for longer than the idle bound loses its place to a new one;
    its next frame is then refused (an error event and its text so far), not decoded uncounted beside it."""
    from asr_app.audio import load_audio
    from asr_app.limits import ServiceLimits
    from asr_app.sessions import SessionRegistry
    from asr_app.ui.engine import UiEngine

    engine = UiEngine(pair=tiny_en_pair, limits=ServiceLimits(max_sessions=1), sessions=SessionRegistry(1, 120))
    pcm = (np.clip(load_audio(str(LJ_LIVE))[:16_000], -1, 1) * 32767).astype("<i2").tobytes()

    async def quiet_then_crowded(port: int) -> tuple[list[dict], str]:
        uri = f"ws://127.0.0.1:{port}/v1/live?sample_rate=16000"
        async with connect(uri) as quiet:
            assert json.loads(await quiet.recv())["kind"] == "ready"
            await quiet.send(pcm)
            await asyncio.sleep(0.5)   # the frame reached the session
            sessions_clock.jump(121)   # past the idle bound
            async with connect(uri) as other:
                second = json.loads(await other.recv())["kind"]
                await quiet.send(pcm)
                events = []
                async for message in quiet:
                    events.append(json.loads(message))
                await other.send(json.dumps({"type": "stop"}))
                async for _ in other:
                    pass
                return events, second

    with in_process_server(engine) as port:
        # bounded: a session that kept decoding past the bound would otherwise wait for its stop forever
        events, second = asyncio.run(asyncio.wait_for(quiet_then_crowded(port), 120))
    assert second == "ready"
    errors = [e["message"] for e in events if e["kind"] == "error"]
    assert any("lost its place" in m and "live sessions are in use" in m for m in errors), events
    assert events[-1]["kind"] == "done"


def test_a_browser_on_an_allowed_origin_can_upload_with_the_key(tiny_en_pair):
    """--cors-origin with --api-key: the preflight (sent without the key) is CORS's to answer, and a refusal of
    the upload gate carries the CORS headers, so the page reads the reason."""
    import httpx

    from asr_app.serve.security import AccessSettings
    from asr_app.ui.engine import UiEngine

    origin = "http://page.example"
    access = AccessSettings(api_key=KEY, cors_origins=(origin,))
    with in_process_server(UiEngine(pair=tiny_en_pair), access=access) as port:
        url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
        preflight = httpx.options(url, timeout=30, headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        keyless = httpx.post(url, timeout=30, headers={"Origin": origin}, files={"file": ("a.wav", b"x")},
                             data={"model": "whisper-1"})
        with open(LJ_LIVE, "rb") as f:
            good = httpx.post(url, timeout=120, headers={"Origin": origin, "Authorization": f"Bearer {KEY}"},
                              files={"file": ("a.wav", f.read())}, data={"model": "whisper-1"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == origin
    assert keyless.status_code == 401 and keyless.headers["access-control-allow-origin"] == origin
    assert good.status_code == 200 and good.headers["access-control-allow-origin"] == origin
    assert word_error_rate(LJ_LIVE_TEXT, good.json()["text"]) < 0.15


def test_a_request_past_the_timeout_is_told_the_service_is_busy(tiny_en_pair):
    """A transcription that waited past --request-timeout is the server's overload, not bad audio: 503 with
    one sentence (which OpenAI's client retries), plain and streamed."""
    from asr_app.limits import ServiceLimits
    from asr_app.ui.engine import UiEngine

    engine = UiEngine(pair=tiny_en_pair, limits=ServiceLimits(request_timeout_s=0.02))
    with in_process_server(engine) as port:
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.InternalServerError) as refused:
            api.audio.transcriptions.create(model="whisper-1", file=JFK_FLAC.open("rb"))
        # streamed: the answer has begun (200), so the refusal is an error event, which the client raises
        with JFK_FLAC.open("rb") as audio, pytest.raises(openai.APIError) as streamed:
            list(api.audio.transcriptions.create(model="whisper-1", file=audio, stream=True))
    assert refused.value.status_code == 503
    message = refused.value.body["message"]
    assert message.startswith("the service is busy: ") and "0.02 s" in message and "Error" not in message, message
    assert streamed.value.body == {"message": message, "code": 503}, streamed.value.body


def test_a_flush_answers_within_the_request_timeout(tiny_en_pair):
    """A client's flush holds a server thread at most the request timeout: past it the client hears why, and
    the session goes on to its final text. (An in-process uvicorn on a real port, with a 20 ms timeout that
    one decode of 8 s of speech always exceeds on a CPU.)"""
    from asr_app.audio import load_audio
    from asr_app.limits import ServiceLimits
    from asr_app.ui.engine import UiEngine

    engine = UiEngine(pair=tiny_en_pair, limits=ServiceLimits(request_timeout_s=0.02))
    pcm = (np.clip(load_audio(str(JFK_FLAC))[: 8 * 16_000], -1, 1) * 32767).astype("<i2")

    async def flush_then_stop(port: int) -> list[dict]:
        async with connect(f"ws://127.0.0.1:{port}/v1/live?sample_rate=16000&mode=exact") as ws:
            events = [json.loads(await ws.recv())]
            await ws.send(pcm.tobytes())
            await ws.send(json.dumps({"type": "flush"}))
            while events[-1]["kind"] not in ("flushed", "error"):
                events.append(json.loads(await ws.recv()))
            await ws.send(json.dumps({"type": "stop"}))
            async for message in ws:
                events.append(json.loads(message))
            return events

    with in_process_server(engine) as port:
        events = asyncio.run(flush_then_stop(port))
    errors = [e for e in events if e["kind"] == "error"]
    assert any(e.get("command") == "flush" and "not decoded within 0.02 s" in e["message"] for e in errors), events
    assert "flushed" not in [e["kind"] for e in events]
    assert events[-1]["kind"] == "done" and "fellow Americans" in events[-1]["text"], events[-1]


def _one_second_upload() -> bytes:
    samples, rate = sf.read(str(LJ_LIVE), dtype="float32")
    return wav_bytes(samples[:rate], rate)


def test_transcriptions_past_max_requests_are_busy_and_health_answers_meanwhile(tiny_en_pair):
    """Each transcription holds a thread of its own, never one of the event loop's shared pool (40 threads): with
    the decoder held, 45 uploads at once leave /health answering at once; those past --max-requests (41 here)
    get a 503 that names the bound, and the others finish once the decoder is free."""
    import httpx

    from asr_app.limits import ServiceLimits
    from asr_app.ui.engine import UiEngine

    engine = UiEngine(pair=tiny_en_pair, limits=ServiceLimits(max_requests=41))
    body = _one_second_upload()
    with in_process_server(engine) as port, ThreadPoolExecutor(45) as pool:
        url = f"http://127.0.0.1:{port}"

        def upload() -> httpx.Response:
            return httpx.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", body)},
                              data={"model": "whisper-1"}, timeout=300)

        with engine.scheduler.hold():
            answers = [pool.submit(upload) for _ in range(45)]
            deadline = time.monotonic() + 60
            while (running := httpx.get(url + "/health", timeout=5).json()["requests"]) < 41:
                assert time.monotonic() < deadline, f"{running} of 41 transcriptions started"
                time.sleep(0.2)
            while sum(a.done() for a in answers) < 4:   # those past the bound are answered at once, not queued
                assert time.monotonic() < deadline, "the uploads past --max-requests were not answered"
                time.sleep(0.2)
            started = time.monotonic()
            assert httpx.get(url + "/metrics", timeout=5).status_code == 200
            assert time.monotonic() - started < 2
            early = [a.result().status_code for a in answers if a.done()]
        statuses = sorted(a.result(timeout=300).status_code for a in answers)
    assert early == [503] * 4 and statuses == [200] * 41 + [503] * 4, (early, statuses)
    busy = [a.result().json()["error"]["message"] for a in answers if a.result().status_code == 503]
    assert all("41 transcriptions are running (--max-requests)" in m for m in busy), busy


def test_a_client_that_leaves_cancels_its_transcription(tiny_en_pair):
    """A client that disconnects while its upload waits for the decoder: its window leaves the queue and nothing
    of it is decoded (before, the server transcribed the whole file for nobody, and an SDK's retries thrice)."""
    import httpx

    from asr_app.ui.engine import UiEngine

    engine = UiEngine(pair=tiny_en_pair)
    with in_process_server(engine) as port:
        url = f"http://127.0.0.1:{port}"
        with engine.scheduler.hold():
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", _one_second_upload())},
                           data={"model": "whisper-1"}, timeout=httpx.Timeout(30, read=1.0))
            deadline = time.monotonic() + 10
            while httpx.get(url + "/health", timeout=5).json()["requests"]:
                assert time.monotonic() < deadline, "the transcription went on after its client left"
                time.sleep(0.1)
            assert engine.scheduler.metrics().queue_depth == 0
        time.sleep(0.5)
        assert engine.scheduler.metrics().rows == 0


def test_a_fault_of_the_service_is_a_500_that_gives_nothing_away(tiny_en_pair, monkeypatch, caplog):
    """Not the audio's fault (here a decoder that breaks: a bug, a device error): a 500, which SDKs retry, with a
    sentence that gives no detail away; the error and its traceback go to the log."""
    import logging

    import httpx

    import asr_app.serve.api as api
    from asr_app.ui.engine import UiEngine

    def broken(*_args, **_kwargs):
        raise RuntimeError("CUDA error: illegal memory access at /srv/models/secret")

    monkeypatch.setattr(api, "transcribe", broken)
    with caplog.at_level(logging.ERROR, logger="asr_app.serve.api"), \
            in_process_server(UiEngine(pair=tiny_en_pair)) as port:
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/audio/transcriptions", timeout=60,
                            files={"file": ("a.wav", _one_second_upload())}, data={"model": "whisper-1"})
    assert answer.status_code == 500, answer.text
    message = answer.json()["error"]["message"]
    assert "the service failed" in message and "secret" not in message and "CUDA" not in message, message
    logged = [r for r in caplog.records if r.exc_info and "illegal memory access" in str(r.exc_info[1])]
    assert logged, [r.getMessage() for r in caplog.records]


def test_a_quiet_live_client_keeps_its_session_until_another_needs_the_place(tiny_en_pair):
    """--max-sessions 1, idle bound 1 s: a WebSocket that sends nothing keeps its session while nobody needs the
    place (push-to-talk clients are quiet for long); once a new session takes it, the quiet one is told so and
    ended with its text so far, instead of holding its connection and memory outside the bound."""
    from asr_app.limits import ServiceLimits
    from asr_app.sessions import SessionRegistry
    from asr_app.ui.engine import UiEngine

    engine = UiEngine(pair=tiny_en_pair, limits=ServiceLimits(max_sessions=1), sessions=SessionRegistry(1, 1.0))

    async def quiet_then_crowded(port: int) -> tuple[list[dict], bool, str]:
        uri = f"ws://127.0.0.1:{port}/v1/live?sample_rate=16000"
        async with connect(uri) as quiet:
            events = [json.loads(await quiet.recv())]
            try:   # two idle bounds and more: nobody wanted the place, the session goes on (nothing is sent)
                events.append(json.loads(await asyncio.wait_for(quiet.recv(), 2.5)))
                open_before = False
            except TimeoutError:
                open_before = True
            async with connect(uri) as other:
                second = json.loads(await other.recv())["kind"]
                events += [json.loads(message) async for message in quiet]
                await other.send(json.dumps({"type": "stop"}))
                async for _ in other:
                    pass
            return events, open_before, second

    with in_process_server(engine) as port:
        events, open_before, second = asyncio.run(asyncio.wait_for(quiet_then_crowded(port), 60))
    assert open_before and second == "ready"
    assert events[0]["kind"] == "ready" and events[-1] == {"kind": "done", "text": ""}, events
    assert any(e["kind"] == "error" and "its place went to another" in e["message"] for e in events), events


def test_verbose_json_gives_each_segment_its_own_windows_temperature():
    from asr_app.decoding.options import Segment
    from asr_app.serve.api import TranscriptionRequest, verbose
    from asr_app.transcript import Transcript

    segments = [Segment(0.0, 4.0, " One.", [1], seek=0), Segment(4.0, 29.0, " Two.", [2], seek=0),
                Segment(30.0, 33.0, " Three.", [3], seek=3000)]
    transcript = Transcript("a.wav", 33.0, "One. Two. Three.", segments, "en", "exact",
                            stats={"window_temperatures": [0.0, 0.4], "window_seeks": [0, 3000]})
    request = TranscriptionRequest("transcribe", "whisper-1", None, None, "verbose_json", 0.0, (), False, None)
    assert [s["temperature"] for s in verbose(request, transcript)["segments"]] == [0.0, 0.0, 0.4]


def test_a_streamed_request_whose_client_left_before_its_answer_began_gives_its_place_back(tiny_en_pair):
    """stream=true from a client that closes its socket right after its upload: the answer never begins (nor its
    body's generator), yet the transcription is cancelled, its window leaves the queue and its slot is free."""
    import socket

    import httpx

    from asr_app.ui.engine import UiEngine

    engine = UiEngine(pair=tiny_en_pair)
    with in_process_server(engine) as port:
        upload = httpx.Request("POST", f"http://127.0.0.1:{port}/v1/audio/transcriptions",
                               files={"file": ("a.wav", _one_second_upload())},
                               data={"model": "whisper-1", "stream": "true"})
        body = upload.read()
        head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                f"{upload.headers['content-type']}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with engine.scheduler.hold():
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(head + body)
            deadline = time.monotonic() + 20
            while httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["requests"]:
                assert time.monotonic() < deadline, "the streamed transcription kept its slot after its client left"
                time.sleep(0.1)
            assert engine.scheduler.metrics().queue_depth == 0
        time.sleep(0.5)
        assert engine.scheduler.metrics().rows == 0


def test_an_answer_of_the_catch_all_handler_is_counted(tiny_en_pair):
    """A handler that fails unexpectedly is answered by the app's last-resort handler (a 500 in the API's shape),
    outside the app's own layers: /metrics counts it all the same."""
    import httpx

    from asr_app.ui.engine import UiEngine

    engine = UiEngine(pair=tiny_en_pair)
    figures, failures = engine.scheduler.metrics, []

    def fails_once():
        if not failures:
            failures.append(1)
            raise RuntimeError("the scheduler's figures could not be read")
        return figures()

    engine.scheduler.metrics = fails_once
    with in_process_server(engine) as port:
        url = f"http://127.0.0.1:{port}"
        failed = httpx.get(url + "/health", timeout=30)
        text = httpx.get(url + "/metrics", timeout=30).text
    assert failed.status_code == 500 and "could not be read" not in failed.text, failed.text
    assert 'asr_http_responses_total{status="5xx"} 1.0' in text, text


def test_a_client_that_leaves_a_long_silent_upload_stops_its_reading(tiny_en_pair, caplog, monkeypatch):
    """Two hours of silence (8 kHz FLAC, 180 KB): no window is decoded, so no decoder sees the cancellation; the
    transcription stops between windows all the same, answered as a client gone (before, the file was read to
    its end and "transcribed" for nobody). The upload's check is slowed so that the client has left before the
    reading starts: the disconnect is then seen within milliseconds, reading the file takes seconds."""
    import logging

    import httpx

    import asr_app.serve.api as api
    from asr_app.ui.engine import UiEngine

    checked = api._checked_duration
    monkeypatch.setattr(api, "_checked_duration", lambda *args: (time.sleep(0.6), checked(*args))[1])

    silence = io.BytesIO()
    with sf.SoundFile(silence, "w", 8000, 1, format="FLAC", subtype="PCM_16") as out:
        for _ in range(120):
            out.write(np.zeros(60 * 8000, dtype=np.int16))
    engine = UiEngine(pair=tiny_en_pair)
    with caplog.at_level(logging.INFO, logger="asr_app.serve.api"), in_process_server(engine) as port:
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/audio/transcriptions", files={"file": ("silence.flac", silence.getvalue())},
                       data={"model": "whisper-1"}, timeout=httpx.Timeout(30, read=0.2))
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health", timeout=5).json()["requests"]:
            assert time.monotonic() < deadline, "the silent upload was still being read"
            time.sleep(0.1)
    gone = [r.getMessage() for r in caplog.records if "the client went away" in r.getMessage()]
    assert gone == ["transcription refused: the client went away"], [r.getMessage() for r in caplog.records]
    assert engine.scheduler.metrics().rows == 0


def _multipart(parts: list[tuple[str, bytes, str | None]], boundary: str = "peekboundary") -> tuple[bytes, str]:
    """A multipart form of (name, value, filename) parts in the order given -> (body, content type)."""
    body = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _post_raw(port: int, body: bytes, content_type: str, chunk: int = 1 << 18) -> tuple[str, int]:
    """POST `body` over a raw socket, sent by a thread while the answer is read here -> (the answer, bytes the
    client had sent when its first byte arrived)."""
    import socket
    import threading

    sent = [0]
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        def send_all() -> None:
            with contextlib.suppress(OSError):   # the server closes once it has answered
                sock.sendall(head)
                for start in range(0, len(body), chunk):
                    sock.sendall(body[start:start + chunk])
                    sent[0] = start + chunk

        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        answer = sock.recv(1 << 16)
        at_answer = sent[0]
        while not answer.endswith(b"}") and (more := sock.recv(1 << 16)):
            answer += more
    sender.join(timeout=60)
    return answer.decode("latin-1"), at_answer


def test_a_model_not_served_is_refused_before_its_upload_is_received(tiny_en_pair):
    """Fields sent before the file (as the openai package and httpx send them) are read as they pass: a model this
    server does not run is answered 404 once the file begins, after at most the bytes dropped so that the client
    reads the answer (16 MB), not after the whole upload. Sent after the file (curl in that order), the same
    404 comes once the upload is in."""
    from asr_app.ui.engine import UiEngine

    noise = np.random.default_rng(0).integers(-99, 99, size=32 << 20, dtype=np.int16).tobytes()   # 64 MB
    early, content_type = _multipart([("model", b"gpt-9", None), ("file", noise, "a.raw")])
    late, late_type = _multipart([("file", _one_second_upload(), "a.wav"), ("model", b"gpt-9", None)])
    with in_process_server(UiEngine(pair=tiny_en_pair)) as port:
        answer, sent = _post_raw(port, early, content_type)
        late_answer, _ = _post_raw(port, late, late_type)
    assert answer.startswith("HTTP/1.1 404") and "'gpt-9' is not served here" in answer, answer[:300]
    assert sent < len(early) / 2, f"{sent / 1e6:.1f} of {len(early) / 1e6:.1f} MB sent before the answer"
    assert late_answer.startswith("HTTP/1.1 404") and "'gpt-9' is not served here" in late_answer, late_answer


def test_form_peek_reads_the_fields_before_the_file_however_the_body_is_cut():
    from asr_app.serve.api import PEEKED_FIELDS
    from asr_app.serve.form_peek import FormPeek

    body, content_type = _multipart([("model", b"whisper-1", None), ("prompt", b"x" * 5000, None),
                                     ("timestamp_granularities[]", b"word", None),
                                     ("timestamp_granularities[]", "s\u00e9gment".encode(), None),
                                     ("file", b"RIFF" + bytes(4096), "a.wav"), ("response_format", b"srt", None)])
    for step in (1, 7, 4096, len(body)):
        peek = FormPeek(content_type, PEEKED_FIELDS)
        for start in range(0, len(body), step):
            peek.feed(body[start:start + step])
        assert peek.file_began and peek.done, step
        assert peek.fields == {"model": ["whisper-1"], "timestamp_granularities[]": ["word", "s\u00e9gment"]}, step
    not_a_form = FormPeek("application/json", PEEKED_FIELDS)
    broken = FormPeek(content_type, PEEKED_FIELDS)
    broken.feed(b"this is not multipart at all\r\n" * 10)
    assert not_a_form.done and broken.done and not broken.file_began and not broken.fields


def test_forms_the_early_check_cannot_read_are_left_to_the_app(tiny_en_pair):
    """A boundary python_multipart will not take (over 256 bytes) is the app's 400, never a 500 from the gate;
    empty fields count as not sent (FastAPI's reading), so the request is transcribed with the defaults."""
    import httpx

    from asr_app.ui.engine import UiEngine

    boundary = "b" * 300
    body, content_type = _multipart([("model", b"whisper-1", None), ("file", _one_second_upload(), "a.wav")],
                                    boundary)
    with in_process_server(UiEngine(pair=tiny_en_pair)) as port:
        answer, _ = _post_raw(port, body, content_type)
        blank = httpx.post(f"http://127.0.0.1:{port}/v1/audio/transcriptions", timeout=120,
                           files={"file": ("a.wav", _one_second_upload())},
                           data={"model": "whisper-1", "response_format": "", "prompt": ""})
    assert answer.startswith("HTTP/1.1 400"), answer[:300]
    assert blank.status_code == 200 and blank.json()["text"].strip(), blank.text
