"""Loading target/draft pairs (hub id, local or CTranslate2 directory, bundled draft), presets, checks.

Names are imported on first use (asr_app/lazy.py): presets and errors load without torch."""

from asr_app.lazy import lazy_exports

_HOMES = {
    "PRESETS": "presets", "Preset": "presets", "ModelLoadError": "errors", "derive_draft": "derive",
    "ModelPair": "loading", "detect_shared_encoder": "loading", "load_pair": "loading",
}
__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
