"""The real app: `python app.py` in a subprocess on a free localhost port, driven with
gradio_client (file and compare endpoints, two clients at once) and loaded in headless
Debian chromium, whose screenshot is kept under artifacts/ (gitignored) as a test artifact.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import DISTIL_DRAFT_DIR, JFK_FLAC, LJSPEECH_DIR, REPO_ROOT, TINY_EN_DIR
from gradio_client import Client, handle_file

from asr_app.ui_text import word_error_rate

ARTIFACTS = REPO_ROOT / "artifacts"
STARTUP_TIMEOUT_S = 240
JFK_TEXT = (JFK_FLAC.parent / "jfk.txt").read_text().strip()
LJ_SHORT = LJSPEECH_DIR / "wavs" / "LJ001-0002.wav"   # 1.9 s: "in being comparatively modern."
LJ_SHORT_TEXT = "in being comparatively modern."
LJ_OTHER = LJSPEECH_DIR / "wavs" / "LJ001-0008.wav"   # 1.8 s: "has never been surpassed."
LJ_OTHER_TEXT = "has never been surpassed."


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("app") / "server.log"
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(REPO_ROOT / "app.py"), "--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR),
           "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"app.py exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"app.py did not start within {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_page_header_names_the_model_pair(server):
    url, _ = server
    with urllib.request.urlopen(url + "config", timeout=10) as response:
        config = response.read().decode()
    assert "whisper-tiny.en" in config and "distil-tiny.en-draft" in config and "cpu" in config


def test_file_endpoint_over_http(server):
    url, _ = server
    client = Client(url, verbose=False)
    message, text, segments, files, stats = client.predict(
        handle_file(str(JFK_FLAC)), "exact", 0.0, api_name="/transcribe_file")
    assert message == ""
    assert word_error_rate(JFK_TEXT, text) < 0.1
    assert segments["data"] and segments["data"][0][0] == 0.0
    downloaded = sorted(Path(f).suffix for f in files)
    assert downloaded == [".json", ".srt", ".vtt"]
    assert stats["mode"] == "exact" and stats["acceptance_rate"] > 0


def test_compare_endpoint_over_http(server):
    url, _ = server
    client = Client(url, verbose=False)
    # Temperature 1.0: sampling, the paper's setting, where exact and sigmoid can differ.
    message, exact, sigmoid, baseline, table, chart = client.predict(
        handle_file(str(LJ_SHORT)), LJ_SHORT_TEXT, 1.0, api_name="/compare")
    assert "differ from the reference" in message
    rows = table["data"]
    assert [row[0] for row in rows] == ["exact", "sigmoid", "baseline"]
    for row in rows:
        assert row[1] is not None and row[1] >= 0.0              # WER against the reference
        assert row[4] > 0                                        # verification-step time (ms)
    for highlighted in (exact, sigmoid, baseline):
        words = "".join(piece["token"] for piece in highlighted)
        assert words.strip()
    assert {point["mode"] for point in chart["data"]} if isinstance(chart.get("data"), list) and chart["data"] \
        and isinstance(chart["data"][0], dict) else len(chart["data"]) == 6


def test_non_audio_upload_over_http_is_a_message(server, tmp_path):
    url, _ = server
    notes = tmp_path / "notes.txt"
    notes.write_text("not audio at all\n")
    message, text, _, files, _ = Client(url, verbose=False).predict(
        handle_file(str(notes)), "exact", 0.0, api_name="/transcribe_file")
    assert "notes.txt" in message and "not a readable audio file" in message
    assert text == "" and not files


def test_two_concurrent_clients_get_their_own_results(server):
    url, _ = server

    def transcribe(path: Path) -> str:
        client = Client(url, verbose=False)
        return client.predict(handle_file(str(path)), "exact", 0.0, api_name="/transcribe_file")[1]

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(transcribe, LJ_SHORT)
        second = pool.submit(transcribe, LJ_OTHER)
        first_text, second_text = first.result(timeout=300), second.result(timeout=300)
    assert word_error_rate(LJ_SHORT_TEXT, first_text) < 0.3, first_text
    assert word_error_rate(LJ_OTHER_TEXT, second_text) < 0.3, second_text
    assert "surpassed" not in first_text.lower() and "modern" not in second_text.lower()


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(chromium() is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_browser_shows_the_three_tabs(server, tmp_path):
    url, _ = server
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "ui_screenshot.png"
    screenshot.unlink(missing_ok=True)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", "--window-size=1280,1000", "--virtual-time-budget=15000"]
    dom = subprocess.run([chromium(), *flags, f"--user-data-dir={tmp_path / 'profile-dom'}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # The rendered page (after the app's JavaScript ran) has the three tabs and the header.
    for name in ("Live", "File", "Compare"):
        assert f">{name}<" in dom.stdout or f"{name}\n" in dom.stdout, name
    assert "whisper-tiny.en" in dom.stdout
    shot = subprocess.run([chromium(), *flags, f"--user-data-dir={tmp_path / 'profile-shot'}",
                           f"--screenshot={screenshot}", url], capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0, shot.stderr[-2000:]
    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
