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
from asr_app.models import ModelPair
from asr_app.streaming import StreamingOptions

# Modes offered in the UI. "hf" (transformers' assisted generation) stays a CLI/evaluator anchor.
UI_MODES = ("off", "baseline", "exact", "sigmoid")
COMPARE_MODES = ("exact", "sigmoid", "baseline")


@dataclass
class UsageTotals:
    """Decoding statistics summed over every decode a session ran (for its live figures)."""

    decodes: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens_out: int = 0
    target_calls: int = 0
    verify_s: float = 0.0
    verify_steps: int = 0           # timed verification steps (only with profile_verify)
    decode_s: float = 0.0

    def add(self, result: DecodingResult) -> None:
        stats = result.stats
        self.decodes += 1
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.tokens_out += stats.tokens_out
        self.target_calls += stats.target_calls
        self.verify_s += stats.verify_s
        self.verify_steps += len(stats.verify_steps)
        self.decode_s += stats.total_s

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class SessionDecoder:
    """A session's decoder: the shared models behind the engine's lock, with usage recorded.

    It looks like a `SpeculativeDecoder` to whatever drives it (the streaming processor,
    `transcribe`), because it forwards every attribute it does not define itself.
    """

    def __init__(self, decoder: SpeculativeDecoder, lock: threading.Lock):
        self._decoder = decoder
        self._lock = lock
        self.usage = UsageTotals()

    def decode(self, *args: Any, **kwargs: Any) -> list[DecodingResult]:
        return self._locked(self._decoder.decode, *args, **kwargs)

    def decode_features(self, *args: Any, **kwargs: Any) -> list[DecodingResult]:
        return self._locked(self._decoder.decode_features, *args, **kwargs)

    def _locked(self, method: Any, *args: Any, **kwargs: Any) -> list[DecodingResult]:
        with self._lock:
            results = method(*args, **kwargs)
        for result in results:
            self.usage.add(result)
        return results

    def __getattr__(self, name: str) -> Any:  # pair, options, anything else the caller reads
        return getattr(self._decoder, name)


@dataclass
class UiEngine:
    """One model pair per process plus the decoding options chosen at launch."""

    pair: ModelPair
    base_options: DecodingOptions = field(default_factory=DecodingOptions)
    streaming: StreamingOptions = field(default_factory=StreamingOptions)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_decoder(cls, decoder: SpeculativeDecoder, streaming: StreamingOptions | None = None) -> UiEngine:
        return cls(pair=decoder.pair, base_options=decoder.options, streaming=streaming or StreamingOptions())

    @property
    def has_draft(self) -> bool:
        return self.pair.draft is not None

    @property
    def modes(self) -> tuple[str, ...]:
        # Without a draft only target-only decoding is possible.
        return UI_MODES if self.has_draft else ("off",)

    def options(self, mode: str, temperature: float, **overrides: Any) -> DecodingOptions:
        if mode not in self.modes:
            raise ValueError(f"mode {mode!r} is not available here (choose from {', '.join(self.modes)})")
        if not 0.0 <= float(temperature) <= 2.0:
            raise ValueError(f"temperature {temperature} is out of range (0 to 2)")
        return replace(self.base_options, mode=mode, temperature=float(temperature), **overrides)

    def session_decoder(self, mode: str, temperature: float, **overrides: Any) -> SessionDecoder:
        options = self.options(mode, temperature, **overrides)
        return SessionDecoder(SpeculativeDecoder(self.pair, options), self.lock)

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
