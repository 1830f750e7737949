"""`asr-stream --server URL`: stream the microphone (or a `--simulate` file) to an `asr-serve` WebSocket
and print its events as a local `asr-stream` would (docs/serving.md, "The WebSocket")."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit, urlunsplit

import numpy as np

from asr_app.audio import SAMPLE_RATE
from asr_app.streaming import StreamEvent, Word


class RemoteError(RuntimeError):
    """The server refused the stream or went away (the message says why)."""


@dataclass(frozen=True)
class RemoteOptions:
    url: str
    api_key: str | None = None
    mode: str | None = None
    temperature: float = 0.0
    language: str = "auto"


def live_url(options: RemoteOptions) -> str:
    """`http(s)://host:port[/path]` or `ws(s)://...` -> the WebSocket URL of /v1/live with the query."""
    parts = urlsplit(options.url if "://" in options.url else f"ws://{options.url}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise RemoteError(f"--server takes http://host:port or ws://host:port, got {options.url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1/live"):   # a base URL, with or without the /v1 OpenAI clients are given
        path = f"{path}/live" if path.endswith("/v1") else f"{path}/v1/live"
    query = {"sample_rate": SAMPLE_RATE, "encoding": "f32", "temperature": options.temperature,
             "language": options.language, **({"mode": options.mode} if options.mode else {})}
    return urlunsplit((scheme, parts.netloc, path, urlencode(query), ""))


def event_from_json(payload: dict) -> StreamEvent | None:
    """A server's `partial`/`commit` frame as the StreamEvent the printer takes (None for other kinds)."""
    if payload.get("kind") not in ("partial", "commit"):
        return None
    words = [Word(w["start"], w["end"], w["word"]) for w in payload.get("words", [])]
    return StreamEvent(payload["kind"], payload["text"], payload["start"], payload["end"], payload["emitted_at"],
                       payload.get("audio_received", 0.0), words)


def stream_to_server(options: RemoteOptions, blocks: Iterable[np.ndarray],
                     on_events: Callable[[list[StreamEvent]], None]) -> dict:
    """Send 16 kHz float32 blocks, hand each event to `on_events`, stop when the blocks end (or on Ctrl-C);
    returns the server's `stats` frame."""
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else None
    url = live_url(options)
    try:
        ws = connect(url, additional_headers=headers, open_timeout=30)
    except InvalidStatus as exc:   # an HTTP answer instead of a WebSocket: not our live endpoint there
        raise RemoteError(f"{options.url} answered HTTP {exc.response.status_code} where the live WebSocket "
                          f"should be ({urlsplit(url).path}): is it an asr-serve's address?") from None
    except (OSError, ConnectionClosed, TimeoutError, InvalidHandshake) as exc:
        raise RemoteError(f"cannot reach {options.url}: {exc}") from None
    with ws:
        first = json.loads(ws.recv())
        if first.get("kind") != "ready":
            raise RemoteError(f"the server refused the stream: {first.get('message', first)}")
        stop = threading.Event()
        sender = threading.Thread(target=_send_blocks, args=(ws, blocks, stop), name="asr-stream-send",
                                  daemon=True)
        sender.start()
        stats: dict = {}
        try:
            try:
                stats = _receive(ws, on_events)
            except KeyboardInterrupt:   # stop listening: the server decodes what it has and sends the rest
                stop.set()
                stats = _receive(ws, on_events)
        except ConnectionClosed as exc:
            raise RemoteError(f"the server closed the stream: {exc}") from None
        return stats


def _receive(ws, on_events: Callable[[list[StreamEvent]], None]) -> dict:
    stats: dict = {}
    for message in ws:
        payload = json.loads(message)
        event = event_from_json(payload)
        if event is not None:
            on_events([event])
        elif payload.get("kind") == "stats":
            stats = payload
        elif payload.get("kind") == "error":   # a refused frame: the server goes on, so do we
            print(f"server: {payload.get('message')}", file=sys.stderr)
    return stats


def _send_blocks(ws, blocks: Iterable[np.ndarray], stop: threading.Event) -> None:
    try:
        for block in blocks:
            if stop.is_set():
                break
            ws.send(np.asarray(block, dtype="<f4").tobytes())
    except Exception:  # noqa: BLE001 - a microphone or connection error ends the stream; the receiver reports
        pass
    finally:
        try:
            ws.send(json.dumps({"type": "stop"}))
        except Exception:  # noqa: BLE001 - the connection is already gone; the receiver reports it
            pass
