"""Loading target/draft pairs (hub id or local directory), presets and pair checks."""

from asr_app.models.derive import derive_draft
from asr_app.models.errors import ModelLoadError
from asr_app.models.loading import ModelPair, detect_shared_encoder, load_pair
from asr_app.models.presets import PRESETS, Preset

__all__ = ["PRESETS", "ModelLoadError", "ModelPair", "Preset", "derive_draft", "detect_shared_encoder", "load_pair"]
