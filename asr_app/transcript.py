"""The record of one transcribed file, and its JSON form (a leaf: writers and long-form both use it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asr_app.decoding.options import Segment


@dataclass
class Transcript:
    source: str
    duration: float                  # seconds of audio
    text: str
    segments: list[Segment]          # absolute times, monotone
    language: str | None
    mode: str
    model: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


def jsonable(value: Any) -> Any:
    """Dataclass/NumPy values -> plain JSON types (used by Transcript.to_dict)."""
    if hasattr(value, "__dataclass_fields__"):
        return {k: jsonable(getattr(value, k)) for k, f in value.__dataclass_fields__.items()
                if f.metadata.get("json", True)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value
