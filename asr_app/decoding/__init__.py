"""The speculative decoding loop: options, results, Whisper's logit rules, gamma policy.

Names are imported on first use (PEP 562), so that `asr_app.decoding.options` (plain data) can be
imported without torch: command-line tools parse their arguments before the heavy imports.
"""

from importlib import import_module

_HOME = {
    "SpeculativeDecoder": "engine", "MODES": "options", "DecodingOptions": "options", "DecodingResult": "options",
    "DecodingStats": "options", "RuntimeOptions": "options", "Segment": "options",
}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'asr_app.decoding' has no attribute {name!r}")
    return getattr(import_module(f"asr_app.decoding.{_HOME[name]}"), name)
