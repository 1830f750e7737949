"""Live audio over a WebSocket: `/v1/live` (docs/serving.md, "WebSocket").

The client connects with its audio's format in the query (`sample_rate`, `encoding` pcm16 or f32, mono)
and its decoding choices (`mode`, `temperature`, `language`), sends audio as binary frames and
`{"type": "stop"}` as a text frame when it is done. The server answers with JSON text frames: `ready`
(the session), the streaming events `asr-stream --jsonl` prints (`partial`, `commit` with word times),
`error` for a refused chunk (the session goes on), `flushed` once the audio sent before a `{"type": "flush"}`
frame went through the session's stream processor, and, after a stop, `stats` and `done`. Each session is
a `LiveSession` whose re-decodes go through the shared scheduler; the session's place is given back when
the client stops or goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque

import numpy as np
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.concurrency import run_in_threadpool

from asr_app.audio import AudioLoadError
from asr_app.limits import LimitExceeded
from asr_app.serve.security import AccessSettings, bearer, key_matches
from asr_app.sessions import LiveSession, SessionsFull
from asr_app.ui.engine import UiEngine
from asr_app.ui.live import convert_chunk, new_session

log = logging.getLogger(__name__)

ENCODINGS = {"pcm16": np.dtype("<i2"), "f32": np.dtype("<f4")}
POLICY_VIOLATION, TRY_AGAIN_LATER = 1008, 1013
SEND_EVERY_S = 0.05
MAX_UNSENT_EVENTS = 2000   # events a client has not read (minutes of speech): past it the session ends


def build_live_router(engine: UiEngine, access: AccessSettings) -> APIRouter:
    router = APIRouter()

    @router.websocket("/v1/live")
    async def live(ws: WebSocket, sample_rate: str = "16000", encoding: str = "pcm16", mode: str | None = None,
                   temperature: str | None = None, language: str | None = None,
                   api_key: str | None = None) -> None:
        # Every value is read as text and checked here: a wrong one gets the `error` event and a 1008 like any
        # other refusal (left to FastAPI, `temperature=hot` would be an HTTP 403 at the handshake, no reason).
        if not key_matches(access.api_key, bearer(ws.headers, api_key)):
            await _refuse(ws, POLICY_VIOLATION, "missing or wrong API key")
            return
        try:
            rate = engine.limits.check_rate(sample_rate)
            if encoding not in ENCODINGS:
                raise LimitExceeded(f"encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
            chosen = mode or (engine.base_options.mode if engine.base_options.mode in engine.modes
                              else engine.modes[0])
            base = engine.base_options   # what a client leaves out: the server's launch options
            session = new_session(engine, chosen, base.temperature if temperature is None else _number(temperature),
                                  language or base.language or "auto")
        except SessionsFull as exc:
            await _refuse(ws, TRY_AGAIN_LATER, str(exc))
            return
        except (LimitExceeded, ValueError) as exc:
            await _refuse(ws, POLICY_VIOLATION, str(exc))
            return
        await ws.accept()
        try:
            await _serve(ws, engine, session, rate, ENCODINGS[encoding])
        finally:
            if not session.finished:
                session.abandon()
            engine.sessions.close(session)

    return router


def _number(text: str) -> float:
    """The query's temperature as a number (its range, NaN included, is the engine's to check: `UiEngine.options`)."""
    try:
        return float(text)
    except ValueError:
        raise LimitExceeded(f"temperature {text!r} is not a number") from None


async def _refuse(ws: WebSocket, code: int, message: str) -> None:
    """Accept, say why in an `error` event (a close reason alone is easy to miss), close with `code`."""
    await ws.accept()
    await ws.send_json({"kind": "error", "message": message})
    await ws.close(code=code, reason=message[:120])


async def _serve(ws: WebSocket, engine: UiEngine, session: LiveSession, rate: int, dtype: np.dtype) -> None:
    session.events = deque()
    await ws.send_json({"kind": "ready", "session": session.session_id, "mode": session.mode,
                        "temperature": session.temperature})
    sender = asyncio.create_task(_forward_events(ws, session))
    try:
        stopped = await _receive_audio(ws, engine, session, rate, dtype)
        if not stopped:
            return
        await run_in_threadpool(session.stop_and_finish)
        sender.cancel()
        await _flush(ws, session)
        await ws.send_json({"kind": "stats", **session.summary()})
        await ws.send_json({"kind": "done", "text": session.committed_text})
        await ws.close()
    except WebSocketDisconnect:
        pass
    finally:
        sender.cancel()


async def _receive_audio(ws: WebSocket, engine: UiEngine, session: LiveSession, rate: int,
                         dtype: np.dtype) -> bool:
    """Audio frames into the session until the client stops (True) or leaves (False)."""
    limits = engine.limits
    while True:
        try:
            message = await asyncio.wait_for(ws.receive(), engine.sessions.idle_s)
        except TimeoutError:
            if engine.sessions.holds(session):   # quiet, but nobody needed its place: it may speak again
                continue
            # Its place went to another session: nothing bounds what it holds any more. It ends (text so far, done).
            await ws.send_json({"kind": "error", "message": f"this session sent nothing for "
                                f"{engine.sessions.idle_s:g} s and its place went to another: the session ends"})
            return True
        if message["type"] == "websocket.disconnect":
            return False
        if len(session.events or ()) > MAX_UNSENT_EVENTS:   # nothing more is sent to it: it would not be read
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(POLICY_VIOLATION, f"more than {MAX_UNSENT_EVENTS} events unread"), 1)
            return False
        if message.get("text") is not None:
            try:
                command = json.loads(message["text"])
            except json.JSONDecodeError:
                command = None
            if isinstance(command, dict) and command.get("type") in ("stop", "finish", "eos"):
                return True
            if isinstance(command, dict) and command.get("type") == "flush":
                # Answer once everything sent so far went through the session's stream processor (decoded
                # where a step was due): a client that waits for "flushed" after each frame gets the same
                # steps, so the same text, however busy the server is.
                # Bounded by the request timeout, so a flush never holds a worker thread longer than a request.
                drained = await run_in_threadpool(session.drain, limits.request_timeout_s)
                await _flush(ws, session)
                if drained:
                    await ws.send_json({"kind": "flushed", "audio_s": round(session.processed_s, 3)})
                else:
                    await ws.send_json({"kind": "error", "command": "flush",
                                        "message": f"flush: the audio sent so far was not decoded "
                                        f"within {limits.request_timeout_s:g} s; it is still queued and the "
                                        "session goes on"})
                continue
            await ws.send_json({"kind": "error",
                                "message": 'text frames are commands: send {"type": "stop"} or {"type": "flush"}'})
            continue
        data = message.get("bytes") or b""
        try:
            if len(data) % dtype.itemsize:
                raise LimitExceeded(f"a frame of {len(data)} bytes is not whole {dtype.itemsize}-byte samples")
            samples = np.frombuffer(data, dtype=dtype)
            if session.audio_s + samples.size / rate > limits.max_session_s:
                await ws.send_json({"kind": "error", "message": f"a live session may send at most "
                                                                f"{limits.max_session_s / 3600:g} h of audio"})
                return True
            audio = convert_chunk(engine, rate, samples, "audio frame")
        except (AudioLoadError, LimitExceeded, ValueError) as exc:
            await ws.send_json({"kind": "error", "message": f"skipped a frame: {exc}"})
            continue
        try:
            engine.sessions.keep(session)
        except SessionsFull as exc:   # idle too long, and the house filled meanwhile: end with the text so far
            await ws.send_json({"kind": "error", "message": f"this session sent no audio for "
                                f"{engine.sessions.idle_s:g} s and lost its place: {exc}"})
            return True
        session.feed(audio)


async def _forward_events(ws: WebSocket, session: LiveSession) -> None:
    while True:
        await _flush(ws, session)
        await asyncio.sleep(SEND_EVERY_S)


async def _flush(ws: WebSocket, session: LiveSession) -> None:
    while session.events:
        event = session.events.popleft()
        await ws.send_json(event.to_dict())
    if session.message and session.message.startswith(("Transcription failed", "Decoding is slower")):
        with session.lock:
            message, session.message = session.message, ""
        await ws.send_json({"kind": "error", "message": message})
