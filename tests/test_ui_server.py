"""The real app: `python app.py` in a subprocess on a free localhost port, driven with
gradio_client (file and compare endpoints, two clients at once) and loaded in headless
Debian chromium, whose screenshot is kept under artifacts/ (gitignored) as a test artifact.
"""

from __future__ import annotations

import base64
import collections
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from conftest import DISTIL_DRAFT_DIR, JFK_FLAC, REPO_ROOT, TINY_EN_DIR, lj_clip
from gradio_client import Client, handle_file

from asr_app.wer import word_error_rate

ARTIFACTS = REPO_ROOT / "artifacts"
STARTUP_TIMEOUT_S = 240
JFK_TEXT = (JFK_FLAC.parent / "jfk.txt").read_text().strip()
LJ_SHORT = lj_clip("LJ001-0002")   # 1.9 s: "in being comparatively modern."
LJ_SHORT_TEXT = "in being comparatively modern."
LJ_OTHER = lj_clip("LJ001-0008")   # 1.8 s: "has never been surpassed."
LJ_OTHER_TEXT = "has never been surpassed."
LJ_LIVE = lj_clip("LJ001-0004")    # 5.1 s
LJ_LIVE_TEXT = "produced the block books, which were the immediate predecessors of the true printed book,"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(folder: Path, *extra: str, env: dict | None = None):
    """Start app.py on a free port; (process, url, log path) once the page answers."""
    port = free_port()
    log_path = folder / "server.log"
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **(env or {}))
    cmd = [sys.executable, str(REPO_ROOT / "app.py"), "--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR),
           "--device", "cpu", "--threads", "1", "--host", "127.0.0.1", "--port", str(port), *extra]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"app.py exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return proc, url, log_path
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"app.py did not start within {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)


def stop(proc, grace_s: float = 20) -> None:
    """SIGTERM, then SIGKILL if the process is still there after `grace_s`."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One app for the module, with a 1 MB upload limit and its own TMPDIR: the last test checks the limit,
    then stops the app with SIGTERM and checks that its folders are gone. (Every other upload here is
    far below 1 MB.)"""
    folder = tmp_path_factory.mktemp("app")
    scratch = folder / "tmp"
    scratch.mkdir()
    proc, url, log_path = launch(folder, "--max-upload-mb", "1", env={"TMPDIR": str(scratch)})
    try:
        yield url, log_path, proc, scratch
    finally:
        stop(proc)


def test_page_header_names_the_model_pair(server):
    url, *_ = server
    with urllib.request.urlopen(url + "config", timeout=10) as response:
        config = response.read().decode()
    assert "whisper-tiny.en" in config and "distil-tiny.en-draft" in config and "cpu" in config
    assert str(TINY_EN_DIR.parent) not in config   # the server's own folders are nobody's business


def test_file_endpoint_over_http(server):
    url, *_ = server
    client = Client(url, verbose=False)
    message, text, segments, files, stats, words = client.predict(
        handle_file(str(JFK_FLAC)), "exact", 0.0, api_name="/transcribe_file")
    assert [row[0] for row in words["data"][:4]] == ["And", "so", "my", "fellow"]
    assert all(0 <= row[1] <= row[2] <= 11.1 for row in words["data"])
    assert message == ""
    assert word_error_rate(JFK_TEXT, text) < 0.1
    assert segments["data"] and segments["data"][0][0] == 0.0
    downloaded = sorted(Path(f).suffix for f in files)
    assert downloaded == [".json", ".srt", ".vtt"]
    assert stats["mode"] == "exact" and stats["acceptance_rate"] > 0


def test_compare_endpoint_over_http(server):
    url, *_ = server
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
    # Bar chart: per mode, the verification step and the rest of decoding (seconds).
    assert chart["columns"] == ["mode", "part", "seconds"]
    assert sorted((row[0], row[1]) for row in chart["data"]) == sorted(
        (mode, part) for mode in ("exact", "sigmoid", "baseline") for part in ("verification step", "rest of decoding"))
    verify_ms = {row[0]: row[4] for row in rows}
    chart_verify = {row[0]: row[2] for row in chart["data"] if row[1] == "verification step"}
    assert all(abs(chart_verify[m] * 1000 - verify_ms[m]) < 0.01 for m in verify_ms)


def test_non_audio_upload_over_http_is_a_message(server, tmp_path):
    url, *_ = server
    notes = tmp_path / "notes.txt"
    notes.write_text("not audio at all\n")
    message, text, _, files, _, words = Client(url, verbose=False).predict(
        handle_file(str(notes)), "exact", 0.0, api_name="/transcribe_file")
    assert "notes.txt" in message and "not a readable audio file" in message
    assert text == "" and not files and not any(any(row) for row in words["data"])


def test_two_concurrent_clients_get_their_own_results(server):
    url, *_ = server

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


def test_port_in_use_is_a_clear_error_before_loading_models(monkeypatch, capsys):
    # app.py's main, in this process (app.py only exits with what it returns): no second interpreter to
    # import torch and Gradio. Loading the models is made to fail loudly, so a check that comes too late
    # fails here at once instead of loading them.
    import asr_app.ui.app as ui_app

    def no_loading(*_args, **_kwargs):
        raise AssertionError("app.py went on to load the models")

    monkeypatch.setattr(ui_app, "load_decoder_or_report", no_loading)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = ui_app.main(["--target", str(TINY_EN_DIR), "--device", "cpu", "--port", str(port)])
    out, err = capsys.readouterr()
    assert code == 2
    assert f"cannot serve on 127.0.0.1:{port}" in err and "in use" in err
    assert "Traceback" not in err and "models loaded" not in out
    # a port no socket can have: one line too (it was an OverflowError traceback)
    assert ui_app.main(["--target", str(TINY_EN_DIR), "--device", "cpu", "--port", "99999"]) == 2
    err = capsys.readouterr().err
    assert "cannot serve on 127.0.0.1:99999: port 99999 is out of range (0-65535)" in err and "Traceback" not in err


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browser_flags(tmp_path: Path) -> list[str]:
    """Headless chromium in its own profile, with no network of its own and a fake microphone it may use."""
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream"]


class DevTools:
    """A minimal Chrome DevTools Protocol client over --remote-debugging-pipe (stdlib only):
    the browser reads NUL-terminated JSON commands on fd 3 and writes replies on fd 4."""

    def __init__(self, binary: str, flags: list[str], stderr_path: Path):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's ends go above fd 10 first, so dup2 onto 3/4 always makes a fresh
        # (inheritable) descriptor.
        child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)

        def attach_pipes() -> None:
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        with open(stderr_path, "w") as err:
            self.proc = subprocess.Popen([binary, *flags, "--remote-debugging-pipe", "about:blank"],
                                         close_fds=False, preexec_fn=attach_pipes,
                                         stdout=subprocess.DEVNULL, stderr=err)
        os.close(child_r)
        os.close(child_w)
        self._id, self._buffer = 0, b""
        self.events: collections.deque[dict] = collections.deque(maxlen=20_000)   # reported while we waited

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                data = os.read(self._from_browser, 1 << 20)
                if not data:
                    raise RuntimeError(f"chromium closed the DevTools pipe during {method}")
                self._buffer += data
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if "method" in reply:
                self.events.append(reply)
            elif reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def new_tab(self) -> Page:
        """A new blank tab (each tab is its own Gradio session once it shows the app)."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        page.send("Page.enable")
        return page

    def open_page(self, url: str) -> Page:
        """A new tab showing `url`."""
        page = self.new_tab()
        page.send("Page.navigate", {"url": url})
        return page

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


class Page:
    def __init__(self, browser: DevTools, session: str):
        self.browser, self.session = browser, session

    def send(self, method: str, params: dict | None = None) -> dict:
        return self.browser.send(method, params, self.session)

    def js(self, expression: str, user_gesture: bool = False):
        """`expression`'s value; `user_gesture` runs it with the user activation a person's click carries
        (the page's clicks are made as a person makes them)."""
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                               "userGesture": user_gesture})
        if "exceptionDetails" in reply:
            raise RuntimeError(reply["exceptionDetails"].get("exception", {}).get("description", expression))
        return reply["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")

    def screenshot(self, path: Path) -> bytes:
        # A background tab produces no frames in headless mode, and the capture would wait for one.
        self.send("Page.bringToFront")
        data = base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])
        path.write_bytes(data)
        return data


CLICK_BUTTON = """(() => {{
  const b = Array.from(document.querySelectorAll('button')).find(b => b.textContent.trim() === {label!r}
      && b.offsetParent !== null);
  if (!b) return false;
  b.click();
  return true;
}})()"""
# Gradio renders the tab buttons twice (one copy measures overflow); the last one is the real one.
CLICK_LAST_BUTTON = """(() => {{
  const bs = Array.from(document.querySelectorAll('button')).filter(b => b.textContent.trim() === {label!r});
  if (!bs.length) return false;
  bs[bs.length - 1].click();
  return true;
}})()"""
BUTTON_LABELS = "Array.from(document.querySelectorAll('button')).map(b => b.textContent.trim())"
LIVE_TEXT = "(document.querySelector('.asr-live-transcript') || {innerText: ''}).innerText"


def _audio_received(page_text: str) -> float:
    match = re.search(r"audio received\s+([\d.]+) s", page_text)
    return float(match.group(1)) if match else 0.0


def _stalled(number: int, received: float, tab: Page, browser_log: Path) -> str:
    """What a failed wait for the recording shows: enough to tell a tab that never started recording
    (its buttons, the page's text) from a server that fell behind (audio received, the browser's log)."""
    text = tab.js("document.body.innerText") or ""
    log = browser_log.read_text(errors="replace")[-1500:] if browser_log.exists() else "(no browser log)"
    return (f"tab {number}: the server received only {received} s of the recording\n"
            f"buttons: {tab.js(BUTTON_LABELS)}\npage text (end): {text[-800:]!r}\nchromium log (end):\n{log}")


# Skipped only on a developer machine without chromium; under CI (.ci/run installs it) a missing
# browser is a failure, so the browser test can never silently drop out of CI.
@pytest.mark.skipif(chromium() is None and not os.environ.get("CI"),
                    reason="Debian's chromium is not installed (.ci/run installs it)")
def test_browser_shows_the_tabs_and_two_tabs_transcribe_the_microphone(server, tmp_path):
    """Headless Debian chromium loads the page (screenshot of the three tabs), then two tabs
    (two Gradio sessions) record a 5 s LJSpeech sentence at the same time through Chrome's fake
    microphone in the Live tab: the browser's own chunks go through the app's stream events,
    both sessions stream at once, each gets the speech once (no audio of the other), and
    stopping finalises the text."""
    assert chromium(), "chromium is not installed: .ci/run installs it with apt-get"
    url, *_ = server
    ARTIFACTS.mkdir(exist_ok=True)
    # Chrome's fake capture device plays a WAV file as the microphone: the sentence at 48 kHz
    # stereo, with silence either side (the long tail keeps the file from looping while we wait).
    samples, rate = sf.read(str(LJ_LIVE), dtype="float32")
    speech = soxr.resample(np.stack([samples, samples], axis=1), rate, 48_000)
    lead = np.zeros((24_000, speech.shape[1]), dtype=np.float32)
    tail = np.zeros((48_000 * 30, speech.shape[1]), dtype=np.float32)
    mic_wav = tmp_path / "mic.wav"
    sf.write(mic_wav, np.concatenate([lead, speech, tail]), 48_000, subtype="PCM_16")
    speech_end_s = (len(lead) + len(speech)) / 48_000
    flags = [*browser_flags(tmp_path), "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
             "--disable-backgrounding-occluded-windows", "--hide-scrollbars", "--window-size=1280,1000",
             f"--use-file-for-fake-audio-capture={mic_wav}"]
    browser = DevTools(chromium(), flags, tmp_path / "chromium.log")
    try:
        tabs = [browser.open_page(url), browser.open_page(url)]
        for tab in tabs:
            labels = tab.wait_for(f"(() => {{ const l = {BUTTON_LABELS}; return l.includes('Record') && l; }})()",
                                  60, "the page to render")
            for name in ("Live", "File", "Compare"):
                assert name in labels, labels
        assert "whisper-tiny.en" in tabs[0].js("document.body.innerText")
        shot = tabs[0].screenshot(ARTIFACTS / "ui_screenshot.png")
        assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000

        for tab in tabs:
            assert tab.js(CLICK_BUTTON.format(label="Record"), user_gesture=True)
        # The browser drops chunks whose upload has not finished when recording stops, so stop
        # only once the server has received the whole speech (on a loaded CPU it lags behind).
        deadline = time.monotonic() + 240
        for number, tab in enumerate(tabs):
            while (received := _audio_received(tab.js("document.body.innerText"))) < speech_end_s + 0.5:
                assert time.monotonic() < deadline, _stalled(number, received, tab, tmp_path / "chromium.log")
                time.sleep(0.2)
        for tab in tabs:
            assert tab.js(CLICK_BUTTON.format(label="Stop"), user_gesture=True)
        texts, received = [], []
        for tab in tabs:
            tab.wait_for("document.body.innerText.includes('finished')", 180, "the recording to be finalised")
            texts.append(tab.js(LIVE_TEXT))
            received.append(_audio_received(tab.js("document.body.innerText")))
        tabs[0].screenshot(ARTIFACTS / "ui_live_screenshot.png")

        # The Compare tab in the browser: upload a clip, give a reference, run the three modes.
        page = tabs[0]
        assert page.js(CLICK_LAST_BUTTON.format(label="Compare"), user_gesture=True)
        page.wait_for("document.querySelectorAll('input[type=file]').length > 0", 30, "the Compare tab")
        page.send("DOM.enable")
        root = page.send("DOM.getDocument", {"depth": -1, "pierce": True})["root"]["nodeId"]
        for node in page.send("DOM.querySelectorAll", {"nodeId": root, "selector": "input[type=file]"})["nodeIds"]:
            page.send("DOM.setFileInputFiles", {"files": [str(LJ_SHORT)], "nodeId": node})
        page.js("Array.from(document.querySelectorAll('input[type=file]'))"
                ".forEach(e => e.dispatchEvent(new Event('change', {bubbles: true})))")
        # The visible drop zone (the Compare tab's) gives way to the uploaded clip's player.
        page.wait_for("!document.body.innerText.includes('Drop Audio Here')", 30, "the upload")
        page.js(f"""(() => {{ const t = Array.from(document.querySelectorAll('textarea')).find(t => t.offsetParent);
            t.value = {LJ_SHORT_TEXT!r}; t.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})()""")
        assert page.js(CLICK_BUTTON.format(label="Compare exact / sigmoid / baseline"), user_gesture=True)
        page.wait_for("document.body.innerText.includes('Highlights show')", 120, "the comparison")
        compare_text = page.js("document.body.innerText")
        page.screenshot(ARTIFACTS / "ui_compare_screenshot.png")
    finally:
        browser.close()
    assert "differ from the reference" in compare_text
    # The figures table as rendered: mode, WER, latency, ... one cell per line.
    table_rows = re.findall(r"^(exact|sigmoid|baseline)\n([\d.]+)\n([\d.]+)\n", compare_text, flags=re.M)
    assert [row[0] for row in table_rows] == ["exact", "sigmoid", "baseline"], compare_text[-1500:]
    assert all(float(wer) >= 0 and float(latency) > 0 for _, wer, latency in table_rows)
    for text, seconds in zip(texts, received):
        # Each session heard the recording once: not the other tab's audio too.
        assert speech_end_s <= seconds < 2 * speech_end_s, received
        assert word_error_rate(LJ_LIVE_TEXT, text) < 0.3, texts


@pytest.mark.skipif(chromium() is None and not os.environ.get("CI"),
                    reason="Debian's chromium is not installed (.ci/run installs it)")
def test_a_record_click_before_the_recorder_loads_is_pressed_again_for_the_user(server, tmp_path):
    """Gradio loads its streaming recorder's modules after the page shows; a Record click before they load
    failed inside Gradio and recorded nothing while showing Stop (a CI run waited 240 s on it). The browser
    holds those modules back here, so the click always lands first: the page's script (ui/page_script.py)
    presses Stop and Record again once they load, and the microphone's audio reaches the server."""
    assert chromium(), "chromium is not installed: .ci/run installs it with apt-get"
    url, *_ = server
    browser = DevTools(chromium(), browser_flags(tmp_path), tmp_path / "chromium.log")
    try:
        page = browser.new_tab()
        page.send("Runtime.enable")
        # The recorder's modules (extendable-media-recorder and its WAV encoder) are Gradio's only "module-*" assets.
        page.send("Fetch.enable", {"patterns": [{"urlPattern": "*/assets/module-*.js"}]})
        page.send("Page.navigate", {"url": url})
        page.wait_for(f"(() => {{ const l = {BUTTON_LABELS}; return l.includes('Record') && l; }})()", 60,
                      "the page to render")
        held = [e["params"]["requestId"] for e in browser.events if e["method"] == "Fetch.requestPaused"]
        assert held, "no recorder module was requested: Gradio's asset names changed, update the pattern"
        assert page.js(CLICK_BUTTON.format(label="Record"), user_gesture=True)
        time.sleep(1)
        for request in held:
            page.send("Fetch.continueRequest", {"requestId": request})
        deadline = time.monotonic() + 120
        while (received := _audio_received(page.js("document.body.innerText"))) < 1.0:
            for event in list(browser.events):   # modules requested after the first ones (send adds events)
                if event["method"] == "Fetch.requestPaused" and event["params"]["requestId"] not in held:
                    held.append(event["params"]["requestId"])
                    page.send("Fetch.continueRequest", {"requestId": event["params"]["requestId"]})
            assert time.monotonic() < deadline, _stalled(0, received, page, tmp_path / "chromium.log")
            time.sleep(0.2)
        warnings = [str(e["params"]["args"][0].get("value")) for e in browser.events
                    if e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] == "warning"]
        # The click failed as Gradio fails before its recorder loads, and the page's script pressed again.
        assert any(re.search(r"recorder was not ready \((TypeError: .*not a constructor|NotSupportedError: .*audio/wav)",
                             w) for w in warnings), warnings
        assert page.js(CLICK_BUTTON.format(label="Stop"), user_gesture=True)
    finally:
        browser.close()


# Last in the module: it stops the module's app.
def test_upload_limit_and_cleanup_on_sigterm(server, tmp_path):
    # Uploads above --max-upload-mb are refused with a message; SIGTERM removes the app's own folders.
    url, _, proc, scratch = server
    client = Client(url, verbose=False)
    message, text, *_ = client.predict(handle_file(str(JFK_FLAC)), "exact", 0.0, api_name="/transcribe_file")
    assert message == "" and "country" in text  # 190 kB: under the limit
    big = tmp_path / "big.wav"
    sf.write(big, np.zeros(16_000 * 60, dtype=np.float32), 16_000, subtype="FLOAT")  # 3.8 MB
    with pytest.raises(Exception, match="(?i)size|large|exceed"):
        client.predict(handle_file(str(big)), "exact", 0.0, api_name="/transcribe_file")
    assert list(scratch.glob("asr_app_ui_*"))  # the downloads folder exists while the app runs
    uploads = [p for p in (scratch / "gradio").rglob("*") if p.is_file()]
    assert uploads   # Gradio's cache holds the uploads while the app runs ...
    stop(proc)
    assert proc.returncode == 0 and not list(scratch.glob("asr_app_ui_*"))
    assert not [p for p in uploads if p.exists()]   # ... and SIGTERM empties it, as Ctrl-C does
