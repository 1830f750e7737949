"""The speculative decoding loop: options, results, Whisper's logit rules, gamma policy."""

from asr_app.decoding.engine import SpeculativeDecoder
from asr_app.decoding.options import (
    MODES,
    DecodingOptions,
    DecodingResult,
    DecodingStats,
    RuntimeOptions,
    Segment,
)

__all__ = ["MODES", "DecodingOptions", "DecodingResult", "DecodingStats", "RuntimeOptions", "Segment", "SpeculativeDecoder"]
