"""The models behind the web app: loaded once per process, shared by every session.

Each session (and each request) gets its own light `SpeculativeDecoder` over the one shared
`ModelPair`, so a mode or temperature chosen in one browser tab never leaks into another.
Forward passes over the shared modules are serialised by one lock: on a CPU two decodes at
once only compete for the same cores, and the lock keeps the shared modules free of any
cross-request surprises (transformers mutates configs in a few places).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from asr_app.decoding import DecodingOptions, DecodingResult, SpeculativeDecoder
from asr_app.decoding.options import MODES, DecodingStats
from asr_app.languages import LANGUAGES
from asr_app.models import ModelPair
from asr_app.streaming import StreamingOptions

# Modes offered in the UI. "hf" (transformers' assisted generation) stays a CLI/evaluator anchor.
UI_MODES = tuple(m for m in MODES if m != "hf")
COMPARE_MODES = ("exact", "sigmoid", "baseline")


class SessionDecoder:
    """A session's decoder (the `Decoder` interface, decoding/protocol.py): the shared models behind the
    engine's lock, with usage recorded, and the session's own decoding options."""

    def __init__(self, decoder: SpeculativeDecoder, lock: threading.Lock, options: DecodingOptions):
        self._decoder = decoder
        self._lock = lock
        self._options = options
        self.usage: DecodingStats | None = None  # this session's decodes, summed (a running total: bounded)

    @property
    def pair(self) -> ModelPair:
        return self._decoder.pair

    @property
    def options(self) -> DecodingOptions:
        return self._options

    def decode(self, audio, options: DecodingOptions | None = None, prompts=None, hints=None) -> list[DecodingResult]:
        return self._locked(self._decoder.decode, audio, options or self._options, prompts, hints)

    def decode_features(self, features, options: DecodingOptions | None = None, prompts=None,
                        hints=None) -> list[DecodingResult]:
        return self._locked(self._decoder.decode_features, features, options or self._options, prompts, hints)

    def _locked(self, method, *args) -> list[DecodingResult]:
        with self._lock:
            results = method(*args)
        parts = ([self.usage] if self.usage is not None else []) + [r.stats for r in results]
        self.usage = DecodingStats.total(parts)
        return results


@dataclass
class UiEngine:
    """One model pair per process plus the decoding options chosen at launch."""

    pair: ModelPair
    base_options: DecodingOptions = field(default_factory=DecodingOptions)
    streaming: StreamingOptions = field(default_factory=StreamingOptions)
    lock: threading.Lock = field(default_factory=threading.Lock)
    decoder: SpeculativeDecoder | None = None  # shared by every session (built once: runtimes, measured costs)

    def __post_init__(self) -> None:
        if self.decoder is None:
            self.decoder = SpeculativeDecoder(self.pair, self.base_options)

    @classmethod
    def from_decoder(cls, decoder: SpeculativeDecoder, streaming: StreamingOptions | None = None) -> UiEngine:
        return cls(pair=decoder.pair, base_options=decoder.options, streaming=streaming or StreamingOptions(),
                   decoder=decoder)

    @property
    def has_draft(self) -> bool:
        return self.pair.draft is not None

    @property
    def modes(self) -> tuple[str, ...]:
        # Without a draft only target-only decoding is possible.
        return UI_MODES if self.has_draft else ("off",)

    @property
    def languages(self) -> tuple[str, ...]:
        """The language choices: "auto" (detected) and every code for a multilingual model, else "en"."""
        if getattr(self.pair.target.generation_config, "is_multilingual", False):
            return ("auto", *LANGUAGES)
        return ("en",)

    def options(self, mode: str, temperature: float, language: str = "auto", **overrides: Any) -> DecodingOptions:
        if mode not in self.modes:
            raise ValueError(f"mode {mode!r} is not available here (choose from {', '.join(self.modes)})")
        if not 0.0 <= float(temperature) <= 1.0:
            raise ValueError(f"temperature {temperature} is out of range (0 to 1)")
        language = language or "auto"
        if "auto" not in self.languages:  # an English-only model: "auto" means English too
            if language not in ("auto", "en"):
                raise ValueError(f"language {language!r} is not available: this is an English-only model")
            code = "en"
        elif language == "auto":
            code = None  # detected per window
        elif language in self.languages:
            code = language
        else:
            raise ValueError(f"unknown language {language!r}")
        return replace(self.base_options, mode=mode, temperature=float(temperature), language=code, **overrides)

    def session_decoder(self, mode: str, temperature: float, language: str = "auto", **overrides: Any) -> SessionDecoder:
        return SessionDecoder(self.decoder, self.lock, self.options(mode, temperature, language, **overrides))

    def describe(self) -> dict[str, str]:
        pair = self.pair
        if pair.draft is None:
            draft = "none (target-only decoding)"
        else:
            encoder = "shares the target's encoder" if pair.shared_encoder else "runs its own encoder"
            draft = f"{pair.draft_name} ({encoder})"
        return {
            "target": str(pair.target_name),
            "draft": draft,
            "device": str(pair.device),
            "dtype": str(pair.dtype).removeprefix("torch."),
            "draft_dtype": str(pair.draft_dtype).removeprefix("torch.") if pair.draft_dtype else None,
        }
