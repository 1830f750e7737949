"""Voice activity detection with Silero VAD (`--vad_filter`), as faster-whisper offers it.

The model ships inside the PyPI package `silero-vad` (the `vad` extra; no model hub involved). It tells
where speech is in a 16 kHz window; long-form transcription skips windows without speech and jumps to
where speech starts, and the streaming pipeline uses it to gate its buffer. Whisper invents words on
music and noise as readily as on silence, which the energy gate alone does not catch.
"""

from __future__ import annotations

import numpy as np

from asr_app.audio import SAMPLE_RATE


class VadUnavailable(RuntimeError):
    """The `vad` extra is not installed."""


class SpeechDetector:
    def __init__(self, threshold: float = 0.5, min_speech_s: float = 0.25) -> None:
        try:  # an optional dependency: imported only when --vad_filter asks for it
            from silero_vad import get_speech_timestamps, load_silero_vad
        except ImportError as exc:
            raise VadUnavailable('--vad_filter needs Silero VAD: pip install "asr-app[vad]" (PyPI silero-vad)') from exc
        self._model = load_silero_vad()
        self._find = get_speech_timestamps
        self.threshold, self.min_speech_ms = threshold, int(1000 * min_speech_s)

    def speech(self, audio: np.ndarray) -> list[tuple[int, int]]:
        """(start, end) sample ranges of speech in a 16 kHz mono window."""
        import torch

        if audio.size < SAMPLE_RATE // 10:
            return []
        spans = self._find(torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)), self._model,
                           sampling_rate=SAMPLE_RATE, threshold=self.threshold,
                           min_speech_duration_ms=self.min_speech_ms)
        return [(int(s["start"]), int(s["end"])) for s in spans]
