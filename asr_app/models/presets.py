"""Named target/draft pairs (Whisper teacher + its Distil-Whisper student)."""

from __future__ import annotations

from dataclasses import dataclass

BUNDLED = "bundled"  # the draft value that names the distilled draft shipped in the package for the target


@dataclass(frozen=True)
class Preset:
    name: str
    target: str
    draft: str | None


PRESETS: dict[str, Preset] = {
    "tiny.en": Preset("tiny.en", "openai/whisper-tiny.en", BUNDLED),
    "base": Preset("base", "openai/whisper-base", BUNDLED),  # multilingual; its draft made by asr-distill
    "small.en": Preset("small.en", "openai/whisper-small.en", "distil-whisper/distil-small.en"),
    "medium.en": Preset("medium.en", "openai/whisper-medium.en", "distil-whisper/distil-medium.en"),
    "large-v2": Preset("large-v2", "openai/whisper-large-v2", "distil-whisper/distil-large-v2"),
    "large-v3": Preset("large-v3", "openai/whisper-large-v3", "distil-whisper/distil-large-v3"),
}


def preset_for_target(target: str) -> Preset | None:
    """The preset whose target is `target` (hub id), so `--target openai/whisper-small.en` gets its draft."""
    for preset in PRESETS.values():
        if preset.target == target:
            return preset
    return None
