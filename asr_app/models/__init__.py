"""Loading target/draft pairs (hub id, local or CTranslate2 directory, bundled draft), presets, checks.

Names are imported on first use (PEP 562), so that light modules of this package (presets, errors) can
be imported without torch and transformers: command-line tools answer --help in well under a second.
"""

from importlib import import_module

_HOME = {
    "PRESETS": "presets", "Preset": "presets", "ModelLoadError": "errors", "derive_draft": "derive",
    "ModelPair": "loading", "detect_shared_encoder": "loading", "load_pair": "loading",
}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'asr_app.models' has no attribute {name!r}")
    return getattr(import_module(f"asr_app.models.{_HOME[name]}"), name)
