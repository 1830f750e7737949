"""The speculative decoding loop: options, results, Whisper's logit rules, gamma policy.

Names are imported on first use (asr_app/lazy.py): `asr_app.decoding.options` loads without torch."""

from asr_app.lazy import lazy_exports

_HOMES = {
    "SpeculativeDecoder": "engine", "MODES": "options", "DecodingOptions": "options", "DecodingResult": "options",
    "DecodingStats": "options", "RuntimeOptions": "options", "Segment": "options", "Decoder": "protocol",
}
__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
