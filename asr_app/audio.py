"""Audio in: files, raw arrays (browser chunks) and live sources, all as 16 kHz mono float32.

Everything that reaches the feature extractor goes through `prepare_audio`, so it is
always one channel at 16 kHz with finite float32 samples: Whisper's feature extractor
reads an (N, 2) array as N clips (docs/ARCHITECTURE.md, "Traps").
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE = 16_000
# Rates audio may come at. Outside them a header is broken or lies: a file that claims 1 Hz would be
# resampled 16,000-fold (hours of audio and gigabytes from a short file), so it is refused before that.
MIN_RATE = 8_000
MAX_RATE = 192_000
WINDOW_SECONDS = 30.0  # Whisper's window: the encoder always sees 30 s (docs/ARCHITECTURE.md)
# Extensions libsndfile decodes; `asr-transcribe` only picks these up from folders.
AUDIO_EXTENSIONS = frozenset({".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".au", ".caf"})

# Integer PCM is scaled by its type's full range, never by the chunk's own maximum:
# a silent chunk would otherwise divide by zero and a quiet one be blown up to full scale.
# Float audio far past full scale is integer PCM sent as float (or garbage): refused, not decoded into noise.
# Real float audio may pass 1.0 a little (mixing, inter-sample peaks); this leaves it 36 dB of room.
MAX_FLOAT_PEAK = 64.0
_INT_SCALE = {np.dtype(np.int16): 32768.0, np.dtype(np.int32): 2147483648.0, np.dtype(np.int8): 128.0}


class AudioLoadError(ValueError):
    """Audio that cannot be used; the message names the file (or source) and the reason."""


def is_audio_path(path: str | Path) -> bool:
    return Path(path).suffix.lower() in AUDIO_EXTENSIONS


def _check_file(path: Path) -> None:
    """Clear reasons for the file-system problems libsndfile words badly ("System error.", "possibly a pipe?")."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise AudioLoadError(f"{path}: file not found") from None
    except OSError as exc:  # ELOOP (a symlink loop), EACCES on a folder on the way, ...
        raise AudioLoadError(f"{path}: cannot be opened ({exc.strerror or exc})") from None
    if path.is_dir():
        raise AudioLoadError(f"{path}: is a directory, not an audio file")
    if info.st_size == 0:
        raise AudioLoadError(f"{path}: file is empty (0 bytes)")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise AudioLoadError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _sndfile_error(path: Path, exc: Exception) -> AudioLoadError:
    text = str(exc)
    if "possibly a pipe" in text or "System error" in text:  # libsndfile's words for a broken file
        text = "its data is corrupt, or the format is not one libsndfile decodes"
    # otherwise libsndfile's own wording ("Format not recognised", "unknown error in flac decoder") is
    # the useful part of the reason, so keep it.
    return AudioLoadError(f"{path}: not a readable audio file ({text})")


def load_audio(path: str | Path) -> np.ndarray:
    """Read an audio file as float32 mono 16 kHz; `AudioLoadError` if it cannot be used. The whole file is in
    memory: long files go through `AudioFileReader` instead."""
    path = Path(path)
    _check_file(path)
    try:
        samples, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise _sndfile_error(path, exc) from exc
    if samples.shape[0] == 0:
        raise AudioLoadError(f"{path}: contains no audio samples (zero length)")
    return prepare_audio(samples, rate, source=str(path))


class AudioFileReader:
    """A file's audio as 16 kHz mono float32, read from disk and resampled block by block, so memory stays
    bounded whatever the file's length: the caller asks for windows whose starts never go back, and only
    the samples from the earliest start still needed are kept.

    Blocks are downmixed and resampled with soxr's streaming resampler (the same engine as `load_audio`;
    values agree to float rounding)."""

    BLOCK_S = 10.0

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        _check_file(self.path)
        try:
            self._file = sf.SoundFile(str(self.path))
        except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
            raise _sndfile_error(self.path, exc) from exc
        if self._file.frames == 0:
            self._file.close()
            raise AudioLoadError(f"{self.path}: contains no audio samples (zero length)")
        self.rate = self._file.samplerate
        try:
            check_sample_rate(self.rate, str(self.path))
        except AudioLoadError:
            self._file.close()
            raise
        self._resampler = (soxr.ResampleStream(self.rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
                           if self.rate != SAMPLE_RATE else None)
        self._buffer = np.zeros(0, dtype=np.float32)
        self._buffer_start = 0  # 16 kHz sample index of self._buffer[0]
        self._ended = False

    @property
    def duration(self) -> float:
        """Seconds, from the header."""
        return self._file.frames / self.rate

    @property
    def samples(self) -> int:
        """16 kHz samples, from the header (the resampled stream may differ by a sample or two)."""
        return int(round(self._file.frames * SAMPLE_RATE / self.rate))

    def _read_block(self) -> None:
        try:
            # BLOCK_S of mono audio per block, in samples over all channels: memory stays bounded whatever the count
            frames = max(1, int(self.BLOCK_S * self.rate) // max(1, self._file.channels))
            block = self._file.read(frames, dtype="float32", always_2d=True)
        except (sf.LibsndfileError, RuntimeError) as exc:
            raise _sndfile_error(self.path, exc) from exc
        last = block.shape[0] == 0 or self._file.tell() >= self._file.frames
        mono = block.mean(axis=1, dtype=np.float32) if block.size else np.zeros(0, dtype=np.float32)
        if not np.isfinite(mono).all():
            raise AudioLoadError(f"{self.path}: {int((~np.isfinite(mono)).sum())} samples are NaN or infinite")
        if self._resampler is not None:
            mono = self._resampler.resample_chunk(mono, last=last)
        self._buffer = np.concatenate([self._buffer, mono.astype(np.float32, copy=False)])
        self._ended = last

    def window(self, start: int, length: int) -> np.ndarray:
        """16 kHz samples [start, start + length) (shorter at the end of the file). `start` must not be
        before the previous call's; samples before it are released."""
        if start < self._buffer_start:
            raise ValueError(f"window start {start} is before {self._buffer_start}: the reader only goes forward")
        drop = start - self._buffer_start
        self._buffer, self._buffer_start = self._buffer[drop:], start
        while not self._ended and self._buffer.size < length:
            self._read_block()
        return self._buffer[:length].copy()

    def close(self) -> None:
        self._file.close()


class ArrayAudio:
    """An array already in memory, behind the same `window` / `samples` interface as `AudioFileReader`."""

    def __init__(self, audio: np.ndarray) -> None:
        self.audio = audio

    @property
    def samples(self) -> int:
        return len(self.audio)

    def window(self, start: int, length: int) -> np.ndarray:
        return self.audio[start:start + length]

    def close(self) -> None:
        pass


def check_sample_rate(sample_rate: object, source: str) -> None:
    """`AudioLoadError` unless `sample_rate` lies within MIN_RATE..MAX_RATE hertz."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | float | np.integer | np.floating):
        raise AudioLoadError(f"{source}: invalid sample rate {sample_rate!r}")
    if not MIN_RATE <= sample_rate <= MAX_RATE:
        raise AudioLoadError(f"{source}: sample rate {float(sample_rate):.10g} Hz is outside the {MIN_RATE}-{MAX_RATE} Hz "
                             "accepted (a header that claims less or more is broken)")


def prepare_audio(samples: np.ndarray, sample_rate: int, *, source: str = "audio array") -> np.ndarray:
    """Any PCM array -> float32 mono 16 kHz.

    Accepts shape (N,) or (N, C) (also channels-first (C, N) when C <= 8 < N), int8/16/32,
    uint8 or float. An empty input gives an empty output (a browser can send empty chunks);
    non-finite samples raise `AudioLoadError`.
    """
    samples = np.asarray(samples)
    check_sample_rate(sample_rate, source)
    floating = np.issubdtype(samples.dtype, np.floating)
    if samples.ndim == 2:
        if samples.shape[0] <= 8 < samples.shape[1]:
            samples = samples.T  # channels-first
        samples = _to_float32(samples, source).mean(axis=1, dtype=np.float32)
    elif samples.ndim == 1:
        samples = _to_float32(samples, source)
    elif samples.ndim == 0 or samples.size == 0:
        return np.zeros(0, dtype=np.float32)
    else:
        raise AudioLoadError(f"{source}: expected 1-D or 2-D audio, got shape {samples.shape}")
    if samples.size == 0:
        return np.zeros(0, dtype=np.float32)
    if not np.isfinite(samples).all():
        bad = int((~np.isfinite(samples)).sum())
        raise AudioLoadError(f"{source}: {bad} samples are NaN or infinite")
    if floating and (peak := float(np.abs(samples).max())) > MAX_FLOAT_PEAK:
        raise AudioLoadError(f"{source}: float samples should lie within [-1, 1] but reach {peak:.4g}: integer PCM "
                             "sent as float? Scale it by 1/32768, or send it as 16-bit PCM")
    if sample_rate != SAMPLE_RATE:
        samples = soxr.resample(samples, sample_rate, SAMPLE_RATE, quality="HQ").astype(np.float32, copy=False)
    return np.ascontiguousarray(samples, dtype=np.float32)


def _to_float32(samples: np.ndarray, source: str) -> np.ndarray:
    dtype = samples.dtype
    if dtype in _INT_SCALE:
        return samples.astype(np.float32) / _INT_SCALE[dtype]
    if dtype == np.uint8:
        return (samples.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(dtype, np.floating):
        return samples.astype(np.float32, copy=False)
    raise AudioLoadError(f"{source}: unsupported sample type {dtype}")


class FileSource:
    """Yields a file's (or array's) audio as 16 kHz float32 blocks, like a microphone would.

    `realtime=True` paces the blocks at the speed of the audio (block k is yielded no earlier
    than k+1 block durations after iteration started), so streaming latency can be measured
    without a microphone; `realtime=False` yields them as fast as the consumer takes them.
    If the consumer is slower than real time, blocks are not dropped: they are yielded late,
    as a microphone queue would deliver them.
    """

    def __init__(self, audio: str | Path | np.ndarray, *, block_s: float = 0.1, realtime: bool = True,
                 speed: float = 1.0):
        self.audio = load_audio(audio) if isinstance(audio, (str, Path)) else prepare_audio(audio, SAMPLE_RATE)
        self.name = str(audio) if isinstance(audio, (str, Path)) else "audio array"
        if block_s <= 0 or speed <= 0:
            raise ValueError("block_s and speed must be positive")
        self.block = max(1, int(round(block_s * SAMPLE_RATE)))
        self.realtime = realtime
        self.speed = speed
        self.started_at: float | None = None  # time.monotonic() when the first sample was "captured"

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_RATE

    def __iter__(self) -> Iterator[np.ndarray]:
        self.started_at = time.monotonic()
        total, position = len(self.audio), 0
        while position < total:
            end = min(position + self.block, total)
            if self.realtime:
                # A block is complete once its last sample has been "recorded".
                due = self.started_at + end / SAMPLE_RATE / self.speed
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    # The consumer fell behind: hand over everything recorded so far in one go,
                    # as draining a microphone queue would.
                    recorded = int((time.monotonic() - self.started_at) * self.speed * SAMPLE_RATE)
                    end = min(total, max(end, recorded - recorded % self.block))
            yield self.audio[position:end]
            position = end


class MicrophoneError(RuntimeError):
    """No usable microphone: PortAudio missing, no input device, or the device refused to open."""


class MicrophoneSource:
    """Live 16 kHz mono float32 blocks from the default (or given) input device via sounddevice."""

    def __init__(self, *, block_s: float = 0.1, device: int | str | None = None):
        try:
            import sounddevice as sd
        except (OSError, ImportError) as exc:  # sounddevice raises OSError when PortAudio is absent
            raise MicrophoneError(
                f"microphone unavailable: {exc}. Install PortAudio (Debian/Ubuntu: apt install "
                "libportaudio2) or use --simulate FILE"
            ) from exc
        self._sd = sd
        self.device = device
        try:
            info = sd.query_devices(device, kind="input")
        except (ValueError, sd.PortAudioError) as exc:
            raise MicrophoneError(f"no usable input device ({exc}); use --simulate FILE instead") from exc
        self.device_name = str(info.get("name", device))
        # Record at the device's native rate when 16 kHz is refused, and resample in a stream
        # (one resampler for the whole session, so block edges do not click).
        self.native_rate = SAMPLE_RATE
        try:
            sd.check_input_settings(device=device, channels=1, samplerate=SAMPLE_RATE, dtype="float32")
        except (ValueError, sd.PortAudioError):
            self.native_rate = int(info["default_samplerate"])
        self.block = max(1, int(round(block_s * self.native_rate)))
        self.started_at: float | None = None
        self._queue: queue.Queue[np.ndarray] = queue.Queue()
        self.dropped_overflows = 0

    def _callback(self, indata, frames, time_info, status) -> None:  # runs on PortAudio's thread
        if status.input_overflow:
            self.dropped_overflows += 1
        self._queue.put(indata[:, 0].copy())

    def __iter__(self) -> Iterator[np.ndarray]:
        resampler = (soxr.ResampleStream(self.native_rate, SAMPLE_RATE, 1, dtype="float32")
                     if self.native_rate != SAMPLE_RATE else None)
        try:
            stream = self._sd.InputStream(device=self.device, channels=1, samplerate=self.native_rate,
                                          dtype="float32", blocksize=self.block, callback=self._callback)
        except self._sd.PortAudioError as exc:
            raise MicrophoneError(f"cannot open input device {self.device_name!r}: {exc}") from exc
        with stream:
            self.started_at = time.monotonic()
            while True:
                blocks = [self._queue.get()]
                while not self._queue.empty():  # drain what piled up while the consumer was busy
                    blocks.append(self._queue.get_nowait())
                block = np.concatenate(blocks)
                if resampler is not None:
                    block = resampler.resample_chunk(block)
                if block.size:
                    yield block.astype(np.float32, copy=False)


# RMS of a 30 ms frame below which audio counts as silence. Whisper does not stay quiet on silence
# (tiny.en says "you" on 2 s of digital zeros and its no-speech rule does not catch it), so every
# path that decodes (files, streaming, the web app) skips audio in which no frame reaches this.
SILENCE_RMS = 0.003
_GATE_FRAME = 480  # 30 ms at 16 kHz


def peak_frame_rms(audio: np.ndarray, frame: int = _GATE_FRAME) -> float:
    """The largest RMS over consecutive `frame`-sample frames of 16 kHz mono audio (0.0 when empty)."""
    if audio.size == 0:
        return 0.0
    usable = audio[: audio.size - audio.size % frame] if audio.size >= frame else audio
    frames = usable.reshape(-1, frame) if usable.size >= frame else usable[None, :]
    return float(np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1)).max())


def is_silent(audio: np.ndarray, threshold: float = SILENCE_RMS) -> bool:
    """True when no 30 ms frame of `audio` reaches `threshold` RMS: nothing there worth decoding."""
    return peak_frame_rms(audio) < threshold
