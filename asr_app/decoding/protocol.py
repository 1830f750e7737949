"""What the pipelines and front ends need of a decoder: the interface `SpeculativeDecoder` implements
(and the web app's per-session wrapper). Typed against this, they do not depend on the engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from asr_app.decoding.options import DecodingOptions, DecodingResult


class Decoder(Protocol):
    @property
    def pair(self):  # the loaded ModelPair: its processor, names, device
        ...

    @property
    def options(self) -> DecodingOptions: ...

    def decode(self, audio: np.ndarray | list[np.ndarray], options: DecodingOptions | None = None,
               prompts: list[str | Sequence[int] | None] | None = None,
               hints: Sequence[Sequence[int] | None] | None = None) -> list[DecodingResult]:
        """Clips of at most 30 s (16 kHz mono float32) -> one result per clip. A prompt is earlier text, or
        earlier windows' token ids (timestamps included)."""
        ...
