"""Whisper's no-speech rule: one home for the long-form, streaming and web-app pipelines."""

from __future__ import annotations

from asr_app.decoding.options import DecodingResult

NO_SPEECH_THRESHOLD = 0.6  # P(<|nospeech|>) at <|startoftranscript|> above this ...
LOGPROB_THRESHOLD = -1.0   # ... and a mean token log-probability below this: the window holds no speech


def judged_silent(result: DecodingResult, no_speech_threshold: float = NO_SPEECH_THRESHOLD,
                  logprob_threshold: float = LOGPROB_THRESHOLD) -> bool:
    """True when Whisper would drop this window's text as no speech (NaN log-probs, mode hf, never are)."""
    return result.no_speech_prob > no_speech_threshold and result.avg_logprob < logprob_threshold
