"""What a client can make the service do, bounded before any work is done (docs/serving.md, "Bounds").

Every entry point (the web app's microphone and upload, the HTTP API, the WebSocket) checks its input
against one `ServiceLimits`: a chunk's claimed sample rate and length before it is resampled, an upload's
bytes and its decoded duration (read from the file's header) before it is decoded. A refusal is a
`LimitExceeded` with one sentence for the client; nothing is resampled, read or queued first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import soundfile as sf

from asr_app.audio import MAX_RATE, MIN_RATE


class LimitExceeded(ValueError):
    """A request outside the service's bounds (answered with a 4xx and this message)."""


@dataclass(frozen=True)
class ServiceLimits:
    min_rate: int = MIN_RATE
    max_rate: int = MAX_RATE
    max_chunk_s: float = 10.0         # one live chunk (the browser sends ~0.5 s)
    max_pending_s: float = 30.0       # live audio waiting for the decoder per session (older audio is dropped)
    max_session_s: float = 4 * 3600.0  # audio one live session may send in total
    max_upload_mb: float = 200.0
    max_upload_s: float = 2 * 3600.0  # decoded duration of one upload
    max_channels: int = 8             # of an upload (7.1 sound has 8); each is read before the downmix
    max_requests: int = 32            # API transcriptions at once; the next one is told the service is busy
    max_sessions: int = 16            # live sessions at once; the next one is told the service is busy
    request_timeout_s: float = 600.0  # one API request, queueing included

    def __post_init__(self) -> None:
        if not MIN_RATE <= self.min_rate <= self.max_rate <= MAX_RATE:   # audio outside those is never read
            raise ValueError(f"sample-rate bounds must satisfy {MIN_RATE} <= min <= max <= {MAX_RATE}, got "
                             f"{self.min_rate}, {self.max_rate}")
        for name in ("max_chunk_s", "max_pending_s", "max_session_s", "max_upload_mb", "max_upload_s",
                     "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("max_sessions", "max_channels", "max_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def check_rate(self, rate: object) -> int:
        """The sample rate as an int, or a refusal (before any resampling: a claimed 1 Hz would expand a
        chunk 16,000-fold)."""
        try:
            number = float(rate)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise LimitExceeded(f"sample rate {rate!r} is not a number") from None
        if isinstance(rate, bool) or not number.is_integer():
            raise LimitExceeded(f"sample rate {rate!r} is not a whole number of hertz")
        value = int(number)
        if not self.min_rate <= value <= self.max_rate:
            raise LimitExceeded(f"sample rate {value} Hz is outside the accepted {self.min_rate}-{self.max_rate} Hz")
        return value

    def check_chunk(self, frames: int, rate: int) -> None:
        """A live chunk of `frames` samples per channel at `rate` (already checked)."""
        if frames / rate > self.max_chunk_s:
            raise LimitExceeded(f"a chunk of {frames / rate:.1f} s is longer than the {self.max_chunk_s:g} s "
                                "accepted per chunk")

    def check_upload_bytes(self, size: int, complete: bool = True) -> None:
        """`size` bytes of an upload: the whole file, or (`complete=False`) as much of it as has arrived, whose
        total is not known yet."""
        if size > self.max_upload_mb * 1e6:
            if not complete:
                raise LimitExceeded(f"the upload is larger than the {self.max_upload_mb:g} MB that is accepted")
            raise LimitExceeded(f"the upload is {size / 1e6:.1f} MB; at most {self.max_upload_mb:g} MB is accepted")

    def check_upload_file(self, path: str | Path) -> float:
        """Bytes, then the decoded duration from the header; returns the duration in seconds. A file whose
        header cannot be read is refused here too (one sentence, no server path)."""
        path = Path(path)
        self.check_upload_bytes(path.stat().st_size)
        try:
            info = sf.info(str(path))
        except Exception:  # noqa: BLE001 - soundfile raises several types for unreadable input
            raise LimitExceeded("the upload is not an audio file this service can read "
                                "(WAV, FLAC, OGG/Vorbis or Opus, MP3)") from None
        if info.frames <= 0 or info.samplerate <= 0:
            raise LimitExceeded("the upload holds no audio")
        self.check_rate(info.samplerate)
        if info.channels > self.max_channels:   # a few KB of a 255-channel Vorbis file decode to 0.5 GB per block
            raise LimitExceeded(f"the upload has {info.channels} channels; at most {self.max_channels} are accepted "
                                "(mix it down to mono or stereo)")
        duration = info.frames / info.samplerate
        if duration > self.max_upload_s:
            raise LimitExceeded(f"the upload is {spoken_duration(duration)} of audio; at most "
                                f"{spoken_duration(self.max_upload_s)} is accepted")
        return duration


def spoken_duration(seconds: float) -> str:
    """12.5 -> '12.5 s', 5400 -> '90 min', 7200 -> '2 h' (for messages)."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 3 * 3600 and seconds % 3600:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"
