"""A live session: audio arriving in chunks, decoded by a worker thread through a streaming processor.

Shared by every live front end (the web app's microphone tab, the WebSocket endpoint of `asr-serve`):
the front end only converts and queues chunks (`feed`) and reads the text so far; the session's worker
feeds its `StreamingProcessor` (the pipeline `asr-stream` uses) and runs its re-decodes through the
scheduler, over all the audio that arrived meanwhile. So a session that falls behind re-decodes once with
all its new audio (a larger step), never a longer queue.

Memory stays bounded however long the recording: the session keeps text and counters, the processor's
buffer is trimmed to at most its 30 s window, and audio waiting for the worker is capped at
`max_pending_s` (the oldest is dropped, and reported, if decoding falls that far behind real time).
`SessionRegistry` bounds how many sessions exist at once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from asr_app.audio import SAMPLE_RATE, WINDOW_SECONDS
from asr_app.scheduler import ScheduledDecoder
from asr_app.streaming import StreamEvent, StreamingProcessor

log = logging.getLogger(__name__)

MAX_PENDING_S = WINDOW_SECONDS  # audio waiting for the worker beyond this is dropped (decoding too slow)
WORKER_IDLE_EXIT_S = 60.0  # a worker with nothing to do for this long exits (a new chunk restarts it)


@dataclass
class LiveSession:
    """Everything one browser session's recording needs (lives in that session's gr.State).

    The stream handler and the worker share the fields below under `lock`; the processor is
    touched only by the worker (and by `finish` once the worker has stopped).
    """

    decoder: ScheduledDecoder
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
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    last_activity: float = field(default_factory=time.monotonic)  # the newest chunk's arrival (idle expiry)
    late_chunks: int = 0            # chunks that arrived after the stop, decoded all the same
    events: deque | None = field(default=None, repr=False)  # when set, every event is also appended here
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _changed: threading.Condition = field(init=False, repr=False)
    _pending: deque = field(default_factory=deque, repr=False)  # (arrival time, 16 kHz samples)
    _pending_samples: int = 0
    _busy: bool = False
    _stop: bool = False
    _worker: threading.Thread | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._changed = threading.Condition(self.lock)
        self._finishing = threading.Lock()   # one finish at a time: the stop and any late chunk

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
            self.last_activity = time.monotonic()
            if self.message.startswith(("Skipped a microphone chunk", "This recording sent no audio")):
                self.message = ""   # that problem is over: this chunk was fine and has its place
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
        with self._finishing:
            # Chunks that came in while the worker was stopping are the recording's too.
            with self.lock:
                late, self._pending = list(self._pending), deque()
                self._pending_samples = 0
            for _, audio in late:
                self.processor.insert_audio(audio)
            events = self.processor.finish()
            with self.lock:
                self.processed_s += sum(audio.size for _, audio in late) / SAMPLE_RATE
                self._apply(events)
                self.partial = ""
                self.finished = True

    def feed_late(self, audio: np.ndarray) -> None:
        """A chunk that arrived after the recording was finished (the browser's last chunk and its stop event
        race): decoded at once and committed, so nothing that was recorded is dropped."""
        if not audio.size:
            return
        with self._finishing:
            with self.lock:
                self.chunks += 1
                self.audio_s += audio.size / SAMPLE_RATE
                self.late_chunks += 1
            started = time.monotonic()
            self.processor.resume()
            self.processor.insert_audio(audio)
            events = self.processor.finish()
            with self.lock:
                self.processed_s += audio.size / SAMPLE_RATE
                self.compute_s += time.monotonic() - started
                self._apply(events)
                self.partial = ""

    def abandon(self) -> None:
        """The client went away: drop queued audio, stop the worker after its current decode, free the place."""
        with self._changed:
            self._stop = True
            self._pending.clear()
            self._pending_samples = 0
            self.finished = True
            self._changed.notify_all()

    def summary(self) -> dict[str, float | int | None]:
        """The session's figures (what the live tab shows, as data)."""
        usage = self.decoder.usage
        rtf = self.real_time_factor
        return {"audio_s": round(self.audio_s, 3), "processed_s": round(self.processed_s, 3),
                "skipped_s": round(self.skipped_s, 3), "compute_s": round(self.compute_s, 3),
                "real_time_factor": None if rtf is None else round(rtf, 3),
                "acceptance_rate": None if usage is None or usage.acceptance_rate is None
                else round(usage.acceptance_rate, 4),
                "last_commit_lag_s": self.last_commit_lag_s, "chunks": self.chunks}

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
            if self.events is not None:
                self.events.append(event)
            if event.kind == "commit":
                self.committed.append(event.text)
                self.partial = ""
                # whisper_streaming's latency: emission time minus the committed audio's end
                # (both in seconds from the stream's first sample).
                self.last_commit_lag_s = max(0.0, event.emitted_at - event.end)
            elif event.kind == "partial":
                self.partial = event.text


class SessionsFull(RuntimeError):
    """No room for another live session (the caller tells the client the service is busy)."""


class SessionRegistry:
    """The live sessions that exist now, at most `max_sessions`; `open` refuses the next one at the door.
    A session that sent nothing for `idle_s` (a browser tab closed mid-recording) no longer holds a place."""

    def __init__(self, max_sessions: int, idle_s: float = 120.0) -> None:
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self._sessions: dict[str, LiveSession] = {}
        self._lock = threading.Lock()

    def _active(self, session: LiveSession, now: float) -> bool:
        return not session.finished and now - session.last_activity < self.idle_s

    def open(self, session: LiveSession) -> LiveSession:
        with self._lock:
            self._admit(session)
        return session

    def keep(self, session: LiveSession) -> None:
        """Audio arrived for `session`: it holds its place. One that lost its place while idle takes one
        again if there is room, else SessionsFull: an idle client never decodes beyond `max_sessions`."""
        with self._lock:
            if session.finished:
                return
            if session.session_id in self._sessions:
                session.last_activity = time.monotonic()   # before another's `open` could count it idle
            else:
                self._admit(session)

    def _admit(self, session: LiveSession) -> None:
        """Called under the lock: forget finished and idle sessions, then add `session` or refuse it."""
        now = time.monotonic()
        self._sessions = {k: s for k, s in self._sessions.items() if self._active(s, now)}
        if len(self._sessions) >= self.max_sessions:
            raise SessionsFull(f"all {self.max_sessions} live sessions are in use; try again in a minute")
        session.last_activity = now
        self._sessions[session.session_id] = session

    def close(self, session: LiveSession) -> None:
        with self._lock:
            self._sessions.pop(session.session_id, None)

    def holds(self, session: LiveSession) -> bool:
        """Whether `session` still has its place (one idle past `idle_s` loses it when another session opens)."""
        with self._lock:
            return session.session_id in self._sessions

    def __len__(self) -> int:
        with self._lock:
            now = time.monotonic()
            return sum(self._active(s, now) for s in self._sessions.values())
