"""The models behind the web app and the API: loaded once per process, shared by every session.

Each session (and each request) gets its own `ScheduledDecoder` with its own options, so a mode or
temperature chosen in one browser tab never leaks into another. Every decode goes through the one
`Scheduler` (asr_app/scheduler.py), which owns the `SpeculativeDecoder` and decodes the requests of all
sessions in shared batches: no lock here. The engine also holds the service's bounds (`ServiceLimits`)
and its live sessions (`SessionRegistry`), so every front end enforces the same ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from asr_app.arguments import fallback_schedule
from asr_app.decoding import DecodingOptions, SpeculativeDecoder
from asr_app.decoding.options import UI_MODES
from asr_app.languages import LANGUAGES, language_code
from asr_app.limits import ServiceLimits
from asr_app.models import ModelPair
from asr_app.scheduler import FILE, LIVE, ScheduledDecoder, Scheduler
from asr_app.sessions import SessionRegistry
from asr_app.streaming import StreamingOptions

COMPARE_MODES = ("exact", "sigmoid", "baseline")


@dataclass
class UiEngine:
    """One model pair per process plus the decoding options chosen at launch."""

    pair: ModelPair
    base_options: DecodingOptions = field(default_factory=DecodingOptions)
    streaming: StreamingOptions = field(default_factory=StreamingOptions)
    decoder: SpeculativeDecoder | None = None  # shared by every session (built once: runtimes, measured costs)
    schedule: tuple[float, ...] = ()  # launch's --temperature list: the File and Compare tabs' fallback schedule
    scheduler: Scheduler | None = None         # owns the decoder; several engines may share one
    limits: ServiceLimits = field(default_factory=ServiceLimits)
    sessions: SessionRegistry | None = None
    live_encoder_context_s: float | None = None  # live re-decodes encode their buffer plus this, not 30 s

    def __post_init__(self) -> None:
        if self.decoder is None:
            self.decoder = SpeculativeDecoder(self.pair, self.base_options)
        if self.scheduler is None:
            self.scheduler = Scheduler(self.decoder)
        if self.sessions is None:
            self.sessions = SessionRegistry(self.limits.max_sessions)

    @classmethod
    def from_decoder(cls, decoder: SpeculativeDecoder, streaming: StreamingOptions | None = None,
                     limits: ServiceLimits | None = None) -> UiEngine:
        return cls(pair=decoder.pair, base_options=decoder.options, streaming=streaming or StreamingOptions(),
                   decoder=decoder, limits=limits or ServiceLimits())

    def fallback(self, temperature: float) -> tuple[float, ...]:
        """The temperatures a failed window of a whole clip is decoded again at: as asr-transcribe does with
        `--temperature <temperature>`, or the launch's --temperature list where one was given (long-form
        uses its values above `temperature`)."""
        return fallback_schedule(self.schedule or (float(temperature),))

    def sharing(self, **changes: Any) -> UiEngine:
        """The same decoder, scheduler and sessions with other settings (e.g. streaming options)."""
        return replace(self, **changes)

    @property
    def has_draft(self) -> bool:
        return self.pair.draft is not None

    @property
    def modes(self) -> tuple[str, ...]:
        # Without a draft only target-only decoding is possible.
        return UI_MODES if self.has_draft else ("off",)

    @property
    def languages(self) -> tuple[str, ...]:
        """The language choices: "auto" (detected) and every code the multilingual model knows (large-v3 knows
        Cantonese, the others do not), else "en"."""
        config = self.pair.target.generation_config
        if getattr(config, "is_multilingual", False):
            known = getattr(config, "lang_to_id", None) or {}
            return ("auto", *(code for code in LANGUAGES if not known or f"<|{code}|>" in known))
        return ("en",)

    def options(self, mode: str, temperature: float, language: str = "auto", **overrides: Any) -> DecodingOptions:
        if mode not in self.modes:
            raise ValueError(f"mode {mode!r} is not available here (choose from {', '.join(self.modes)})")
        if not 0.0 <= float(temperature) <= 1.0:
            raise ValueError(f"temperature {temperature} is out of range (0 to 1)")
        code = self._language_code(language)
        if "auto" not in self.languages:  # an English-only model: "auto" means English too
            if code not in (None, "en"):
                raise ValueError(f"language {language!r} is not available: this is an English-only model")
            code = "en"
        elif code is not None and code not in self.languages:
            raise ValueError(f"language {language!r} is not one this model knows")
        return replace(self.base_options, mode=mode, temperature=float(temperature), language=code, **overrides)

    @staticmethod
    def _language_code(language: str | None) -> str | None:
        """None for "auto" (detected per window), else the code of a code or name Whisper knows ("fr",
        "French")."""
        if not language or language.strip().lower() == "auto":
            return None
        try:
            return language_code(language)
        except ValueError:
            raise ValueError(f"unknown language {language!r}: give a code such as 'en' or 'fr', a name such as "
                             "'French', or 'auto'") from None

    def session_decoder(self, mode: str, temperature: float, language: str = "auto", *, live: bool = False,
                        session: str = "", **overrides: Any) -> ScheduledDecoder:
        """A decoder for one session or request: its own options, its decodes queued on the shared scheduler
        (live ones first), `session` its fairness key (one row per session per batch)."""
        if live and self.live_encoder_context_s is not None:
            overrides.setdefault("encoder_context_s", self.live_encoder_context_s)
        options = self.options(mode, temperature, language, **overrides)
        return self.scheduler.client(options, priority=LIVE if live else FILE, session=session,
                                     timeout_s=None if live else self.limits.request_timeout_s)

    def describe(self) -> dict[str, str]:
        pair = self.pair
        if pair.draft is None:
            draft = "none (target-only decoding)"
        else:
            encoder = "shares the target's encoder" if pair.shared_encoder else "runs its own encoder"
            draft = f"{public_name(pair.draft_name)} ({encoder})"
        return {
            "target": public_name(pair.target_name),
            "draft": draft,
            "device": str(pair.device),
            "dtype": str(pair.dtype).removeprefix("torch."),
            "draft_dtype": str(pair.draft_dtype).removeprefix("torch.") if pair.draft_dtype else None,
        }


_PATH_IN_TEXT = re.compile(r"(?<![\w.-])(?:~|\.{1,2})?/[^\s,()]+")


def public_name(name: object) -> str:
    """A model's name as visitors may see it: a hub id as it is, a local folder by its last part only (the
    server's paths are nobody else's business)."""
    text = str(name)
    if text.startswith(("/", "~", ".")) or Path(text).expanduser().exists():
        return Path(text.rstrip("/")).name or text
    # a folder inside a longer name: "derived(/srv/models/x, layers 0,3)" -> "derived(x, layers 0,3)"
    return _PATH_IN_TEXT.sub(lambda m: Path(m.group().rstrip("/")).name or m.group(), text)
