"""Live tab: browser microphone chunks -> one streaming processor per session.

The browser sends int16 PCM at its own rate (44.1 or 48 kHz, sometimes stereo) every
`stream_every` seconds. Each chunk is converted by `prepare_audio` (downmix, scale by 1/32768,
resample to 16 kHz) and fed to the session's `StreamingProcessor`, the same pipeline
`asr-stream` uses. The session keeps only text and counters; the audio itself lives in the
processor's buffer, which the processor trims, so a long recording does not grow memory.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from asr_app.audio import SAMPLE_RATE, AudioLoadError, prepare_audio
from asr_app.streaming import StreamEvent, StreamingProcessor
from asr_app.ui_engine import SessionDecoder, UiEngine
from asr_app.ui_text import live_transcript_html

log = logging.getLogger(__name__)

BrowserChunk = tuple[int, np.ndarray]


@dataclass
class LiveSession:
    """Everything one browser session's recording needs (lives in that session's gr.State)."""

    decoder: SessionDecoder
    processor: StreamingProcessor
    mode: str
    temperature: float
    committed: list[str] = field(default_factory=list)
    partial: str = ""
    audio_s: float = 0.0            # 16 kHz audio received so far
    compute_s: float = 0.0          # time spent inserting + processing (for the real-time factor)
    last_update_s: float | None = None   # handler time of the last chunk: how stale the text can be
    last_commit_lag_s: float | None = None  # emission time minus audio end of the last committed text
    chunks: int = 0
    finished: bool = False
    message: str = ""               # the last problem to show the user, if any

    @property
    def committed_text(self) -> str:
        return " ".join(part.strip() for part in self.committed if part.strip())

    @property
    def buffer_s(self) -> float:
        """Seconds of audio the processor holds (bounded by its trimming, whatever the recording's length)."""
        return float(self.processor.buffer_seconds)

    @property
    def real_time_factor(self) -> float | None:
        return self.compute_s / self.audio_s if self.audio_s > 0 else None

    def apply(self, events: list[StreamEvent]) -> None:
        for event in events:
            if event.kind == "commit":
                self.committed.append(event.text)
                self.partial = ""
                # whisper_streaming's latency: emission time minus the committed audio's end
                # (both in seconds from the stream's first sample).
                self.last_commit_lag_s = max(0.0, event.emitted_at - event.end)
            elif event.kind == "partial":
                self.partial = event.text


def new_session(engine: UiEngine, mode: str, temperature: float) -> LiveSession:
    decoder = engine.session_decoder(mode, temperature)
    processor = StreamingProcessor(decoder, engine.streaming)
    return LiveSession(decoder=decoder, processor=processor, mode=mode, temperature=float(temperature))


def _format_seconds(value: float | None, unit: str = "s") -> str:
    return "–" if value is None else f"{value:.2f} {unit}"


def live_figures_markdown(session: LiveSession | None) -> str:
    if session is None:
        return "Press **Record** and speak; text appears as it is recognised."
    acceptance = session.decoder.usage.acceptance_rate
    rows = [
        ("mode", f"{session.mode} (temperature {session.temperature:g})"),
        ("latency of the last update", _format_seconds(session.last_update_s)),
        ("lag of the last committed text", _format_seconds(session.last_commit_lag_s)),
        ("real-time factor", "–" if session.real_time_factor is None else f"{session.real_time_factor:.2f}"),
        ("acceptance rate", "–" if acceptance is None else f"{acceptance:.1%}"),
        ("audio received", f"{session.audio_s:.1f} s"),
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
    return session, live_transcript_html(session.committed_text, session.partial), live_figures_markdown(session)


def live_chunk(engine: UiEngine, chunk: BrowserChunk | None, session: LiveSession | None,
               mode: str, temperature: float) -> tuple[LiveSession | None, str, str]:
    """One streamed microphone chunk: feed it, re-decode when the processor is due, show the text."""
    if chunk is None:
        return live_outputs(session)
    if session is None or session.finished:
        try:
            session = new_session(engine, mode, temperature)
        except ValueError as exc:  # a mode this launch cannot run
            return None, live_transcript_html("", ""), f"**{exc}**"
    started = time.monotonic()
    try:
        rate, samples = chunk
        audio = prepare_audio(samples, int(rate), source="microphone chunk")
        if audio.size:
            session.processor.insert_audio(audio)
            session.audio_s += audio.size / SAMPLE_RATE
            session.apply(session.processor.process())
        session.chunks += 1
        session.message = ""
    except AudioLoadError as exc:
        session.message = f"Skipped a microphone chunk: {exc}"
    except Exception as exc:  # the page must show a message, never a traceback
        log.exception("live transcription failed")
        session.message = f"Transcription failed on this chunk: {type(exc).__name__}: {exc}"
    elapsed = time.monotonic() - started
    session.compute_s += elapsed
    session.last_update_s = elapsed
    return live_outputs(session)


def live_stop(engine: UiEngine, session: LiveSession | None) -> tuple[LiveSession | None, str, str]:
    """Recording stopped: flush the processor so the tail is committed, and mark the session done."""
    if session is None or session.finished:
        return live_outputs(session)
    started = time.monotonic()
    try:
        session.apply(session.processor.finish())
        session.message = ""
    except Exception as exc:
        log.exception("finishing the live transcript failed")
        session.message = f"Could not finalise the transcript: {type(exc).__name__}: {exc}"
    session.partial = ""
    session.finished = True
    elapsed = time.monotonic() - started
    session.compute_s += elapsed
    session.last_update_s = elapsed
    return live_outputs(session)


def live_reset() -> tuple[None, str, str]:
    """A new recording starts: forget the previous session (its text stays until new text comes)."""
    return live_outputs(None)
