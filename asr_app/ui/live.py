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

Memory stays bounded however long the recording: the session keeps text and counters, the
processor's buffer is trimmed to at most its 30 s window, and audio waiting for the worker is
capped at `MAX_PENDING_S` (the oldest is dropped, and reported, if decoding falls that far
behind real time).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from asr_app.audio import SAMPLE_RATE, WINDOW_SECONDS, AudioLoadError, prepare_audio
from asr_app.streaming import StreamEvent, StreamingProcessor
from asr_app.ui.engine import SessionDecoder, UiEngine
from asr_app.ui.text import live_transcript_html

log = logging.getLogger(__name__)

BrowserChunk = tuple[int, np.ndarray]
MAX_PENDING_S = WINDOW_SECONDS  # audio waiting for the worker beyond this is dropped (decoding too slow)
WORKER_IDLE_EXIT_S = 60.0  # a worker with nothing to do for this long exits (a new chunk restarts it)


@dataclass
class LiveSession:
    """Everything one browser session's recording needs (lives in that session's gr.State).

    The stream handler and the worker share the fields below under `lock`; the processor is
    touched only by the worker (and by `finish` once the worker has stopped).
    """

    decoder: SessionDecoder
    processor: StreamingProcessor
    mode: str
    temperature: float
    committed: list[str] = field(default_factory=list)
    partial: str = ""
    audio_s: float = 0.0            # 16 kHz audio received from the browser
    processed_s: float = 0.0        # audio handed to the processor
    skipped_s: float = 0.0          # audio dropped because decoding fell MAX_PENDING_S behind
    compute_s: float = 0.0          # time the worker spent in the processor (for the real-time factor)
    last_update_s: float | None = None      # arrival of the newest audio in the text -> text ready
    last_commit_lag_s: float | None = None  # emission minus audio end of the last committed text
    chunks: int = 0
    finished: bool = False
    message: str = ""               # the last problem to show the user, if any
    max_pending_s: float = MAX_PENDING_S
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _changed: threading.Condition = field(init=False, repr=False)
    _pending: deque = field(default_factory=deque, repr=False)  # (arrival time, 16 kHz samples)
    _pending_samples: int = 0
    _busy: bool = False
    _stop: bool = False
    _worker: threading.Thread | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._changed = threading.Condition(self.lock)

    # -- read by the UI (callers hold no lock; each property is one consistent read) ---------

    @property
    def committed_text(self) -> str:
        return " ".join(part.strip() for part in self.committed if part.strip())

    @property
    def buffer_s(self) -> float:
        """Audio held by the processor (bounded by its trimming, whatever the recording's length)."""
        return float(self.processor.buffer_seconds)

    @property
    def pending_s(self) -> float:
        return self._pending_samples / SAMPLE_RATE

    @property
    def real_time_factor(self) -> float | None:
        return self.compute_s / self.processed_s if self.processed_s > 0 else None

    # -- the stream handler's side -----------------------------------------------------------

    def feed(self, audio: np.ndarray) -> None:
        """Queue 16 kHz audio for the worker and make sure a worker is running; never blocks on decoding."""
        with self.lock:
            self.chunks += 1
            if self.message.startswith("Skipped a microphone chunk"):
                self.message = ""   # that problem is over: this chunk was fine
            if not audio.size:
                return
            self._pending.append((time.monotonic(), audio))
            self._pending_samples += audio.size
            self.audio_s += audio.size / SAMPLE_RATE
            while self._pending_samples > self.max_pending_s * SAMPLE_RATE and len(self._pending) > 1:
                _, dropped = self._pending.popleft()
                self._pending_samples -= dropped.size
                self.skipped_s += dropped.size / SAMPLE_RATE
                self.message = (f"Decoding is slower than real time here: skipped {self.skipped_s:.1f} s "
                                "of audio to keep up.")
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="asr-live-session", daemon=True)
                self._worker.start()
            self._changed.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the worker has processed all queued audio (the tests pace chunks with it)."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending and not self._busy, timeout)

    def stop_and_finish(self) -> None:
        """Process the queued audio, stop the worker, then flush the processor (commits the tail)."""
        self.drain()
        with self._changed:
            self._stop = True
            worker = self._worker
            self._changed.notify_all()
        if worker is not None:
            worker.join()
        events = self.processor.finish()
        with self.lock:
            self._apply(events)
            self.partial = ""
            self.finished = True

    # -- the worker ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending or self._stop, WORKER_IDLE_EXIT_S)
                if self._stop or not self._pending:
                    self._worker = None   # idle or stopped: a later chunk starts a new worker
                    self._changed.notify_all()
                    return
                batch = list(self._pending)
                self._pending.clear()
                self._pending_samples = 0
                self._busy = True
            started = time.monotonic()
            events: list[StreamEvent] = []
            problem = ""
            try:
                for _, audio in batch:
                    self.processor.insert_audio(audio)
                events = self.processor.process()
            except Exception as exc:  # shown in the page, never a traceback
                log.exception("live transcription failed")
                problem = f"Transcription failed: {type(exc).__name__}: {exc}"
            finally:
                done = time.monotonic()
                with self._changed:
                    self._apply(events)
                    self.processed_s += sum(audio.size for _, audio in batch) / SAMPLE_RATE
                    self.compute_s += done - started
                    if events or problem:
                        self.last_update_s = done - batch[-1][0]
                    if problem:
                        self.message = problem
                    self._busy = False
                    self._changed.notify_all()

    def _apply(self, events: list[StreamEvent]) -> None:
        for event in events:
            if event.kind == "commit":
                self.committed.append(event.text)
                self.partial = ""
                # whisper_streaming's latency: emission time minus the committed audio's end
                # (both in seconds from the stream's first sample).
                self.last_commit_lag_s = max(0.0, event.emitted_at - event.end)
            elif event.kind == "partial":
                self.partial = event.text


def new_session(engine: UiEngine, mode: str, temperature: float, language: str = "auto") -> LiveSession:
    decoder = engine.session_decoder(mode, temperature, language)
    processor = StreamingProcessor(decoder, engine.streaming)
    return LiveSession(decoder=decoder, processor=processor, mode=mode, temperature=float(temperature))


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
        # A chunk that was still on its way when the recording stopped: the transcript is final.
        # (A new recording starts from an empty state: the start event resets it.)
        return live_outputs(session)
    if session is None:
        try:
            session = new_session(engine, mode, temperature, language)
        except ValueError as exc:  # a mode this launch cannot run
            return None, live_transcript_html("", ""), f"**{exc}**"
    try:
        rate, samples = chunk
        audio = prepare_audio(samples, int(rate), source="microphone chunk")
    except (AudioLoadError, TypeError, ValueError) as exc:
        with session.lock:
            session.message = f"Skipped a microphone chunk: {exc}"
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
