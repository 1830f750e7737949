"""Live tab: browser microphone chunks -> one streaming processor per session.

The browser sends int16 PCM at its own rate (44.1 or 48 kHz, sometimes stereo) every
`stream_every` seconds. Each chunk is converted by `prepare_audio` (downmix, scale by 1/32768,
resample to 16 kHz) and handed to the session's worker thread, which feeds the session's
`StreamingProcessor` (the same pipeline `asr-stream` uses) and runs its re-decodes.

Why a worker: Gradio's input stream keeps only the *latest* chunk for an event that is still
running (`/stream/{event_id}` replaces the event's data), so a handler that decodes inline
loses audio whenever one decode takes longer than a chunk (seen on a loaded CPU: words
missing from the middle of sentences). The stream handler therefore only queues the chunk and
returns the text decoded so far; decoding happens beside it, over all the audio that arrived
meanwhile.

The session itself (queue, worker, bounded memory) is `asr_app.sessions.LiveSession`, shared with the
WebSocket endpoint of `asr-serve`. Every chunk is checked against the engine's `ServiceLimits` before it
is converted (a claimed rate outside 8-192 kHz, a chunk too long), and a new recording beyond
`max_sessions` gets a "busy" message.
"""

from __future__ import annotations

import logging

import numpy as np

from asr_app.audio import AudioLoadError, prepare_audio
from asr_app.limits import LimitExceeded
from asr_app.sessions import MAX_PENDING_S, LiveSession, SessionsFull
from asr_app.streaming import StreamingProcessor
from asr_app.ui.engine import UiEngine
from asr_app.ui.text import live_transcript_html

log = logging.getLogger(__name__)

BrowserChunk = tuple[int, np.ndarray]
__all__ = ["MAX_PENDING_S", "LiveSession", "live_chunk", "live_stop", "live_reset", "new_session"]


def new_session(engine: UiEngine, mode: str, temperature: float, language: str = "auto") -> LiveSession:
    """A registered live session (raises ValueError for options this launch cannot run, SessionsFull when
    every session is taken)."""
    session = LiveSession(decoder=None, processor=None, mode=mode, temperature=float(temperature),  # type: ignore[arg-type]
                          max_pending_s=min(MAX_PENDING_S, engine.limits.max_pending_s))
    session.decoder = engine.session_decoder(mode, temperature, language, live=True, session=session.session_id)
    session.processor = StreamingProcessor(session.decoder, engine.streaming)
    return engine.sessions.open(session)


def convert_chunk(engine: UiEngine, rate: object, samples: np.ndarray, source: str) -> np.ndarray:
    """A client's chunk -> 16 kHz mono float32, after the bounds (rate, length) are checked on the claim:
    nothing is resampled before that."""
    checked = engine.limits.check_rate(rate)
    samples = np.asarray(samples)
    frames = samples.shape[0] if samples.ndim == 1 else max(samples.shape) if samples.ndim == 2 else samples.size
    engine.limits.check_chunk(int(frames), checked)
    return prepare_audio(samples, checked, source=source)


def _format_seconds(value: float | None, unit: str = "s") -> str:
    return "–" if value is None else f"{value:.2f} {unit}"


def live_figures_markdown(session: LiveSession | None) -> str:
    if session is None:
        return "Press **Record** and speak; text appears as it is recognised."
    usage = session.decoder.usage
    acceptance = usage.acceptance_rate if usage is not None else None
    rows = [
        ("mode", f"{session.mode} (temperature {session.temperature:g})"),
        ("latency of the last update", _format_seconds(session.last_update_s)),
        ("lag of the last committed text", _format_seconds(session.last_commit_lag_s)),
        ("real-time factor", "–" if session.real_time_factor is None else f"{session.real_time_factor:.2f}"),
        ("acceptance rate", "–" if acceptance is None else f"{acceptance:.1%}"),
        ("audio received", f"{session.audio_s:.1f} s"),
        ("audio waiting for the decoder", f"{session.pending_s:.1f} s"),
        ("audio held in the buffer", f"{session.buffer_s:.1f} s"),
        ("state", "finished" if session.finished else "recording"),
    ]
    table = "| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    if session.message:
        table = f"**{session.message}**\n\n" + table
    return table


def live_outputs(session: LiveSession | None) -> tuple[LiveSession | None, str, str]:
    if session is None:
        return None, live_transcript_html("", ""), live_figures_markdown(None)
    with session.lock:  # one consistent snapshot while the worker may be updating
        html = live_transcript_html(session.committed_text, session.partial)
        figures = live_figures_markdown(session)
    return session, html, figures


def live_chunk(engine: UiEngine, chunk: BrowserChunk | None, session: LiveSession | None,
               mode: str, temperature: float, language: str = "auto") -> tuple[LiveSession | None, str, str]:
    """One streamed microphone chunk: queue it for the session's worker, show the text so far."""
    if chunk is None:
        return live_outputs(session)
    if session is not None and session.finished:
        # A chunk that was still on its way when the recording stopped: decoded and committed at once (a new
        # recording starts from an empty state: the start event resets it).
        try:
            session.feed_late(convert_chunk(engine, chunk[0], chunk[1], "microphone chunk"))
        except (AudioLoadError, LimitExceeded, TypeError, ValueError) as exc:
            with session.lock:
                session.message = f"Skipped a microphone chunk: {exc}"
        return live_outputs(session)
    if session is None:
        try:
            session = new_session(engine, mode, temperature, language)
        except (ValueError, SessionsFull) as exc:  # a mode this launch cannot run; a full house
            return None, live_transcript_html("", ""), f"**{exc}**"
    try:
        rate, samples = chunk
        audio = convert_chunk(engine, rate, samples, "microphone chunk")
    except (AudioLoadError, LimitExceeded, TypeError, ValueError) as exc:
        with session.lock:
            session.message = f"Skipped a microphone chunk: {exc}"
        return live_outputs(session)
    try:
        engine.sessions.keep(session)
    except SessionsFull as exc:   # idle too long, and the house filled meanwhile
        with session.lock:
            session.message = (f"This recording sent no audio for {engine.sessions.idle_s:g} s and lost its place: "
                               f"{exc}. Press Stop to keep the text so far.")
        return live_outputs(session)
    session.feed(audio)
    return live_outputs(session)


def live_stop(engine: UiEngine, session: LiveSession | None) -> tuple[LiveSession | None, str, str]:
    """Recording stopped: decode what is queued, flush the processor so the tail is committed."""
    if session is None or session.finished:
        return live_outputs(session)
    try:
        session.stop_and_finish()
    except Exception as exc:
        log.exception("finishing the live transcript failed")
        with session.lock:
            session.message = f"Could not finalise the transcript: {type(exc).__name__}: {exc}"
            session.partial = ""
            session.finished = True
    return live_outputs(session)


def live_reset() -> tuple[None, str, str]:
    """A new recording starts: forget the previous session."""
    return live_outputs(None)
