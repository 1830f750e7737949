"""The teacher cache on disk: one file per clip, in a folder named by the target's fingerprint.

A second run, a tuning run or a resumed run finds its clips here and skips the teacher pass; a changed
target has another fingerprint, so its records are never mixed with an older target's (that target's
folder stays, for a run that goes back to it). Each record is written to a temporary file and renamed, so
a killed run leaves whole records only, and the teacher pass resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from asr_app.distill.errors import DistillError
from asr_app.distill.options import Variant
from asr_app.distill.teacher import Label, Record


def default_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "asr-app" / "distill"


@dataclass(frozen=True)
class LabelInfo:
    """What training needs to know of a cached label before reading it: its variant and lengths."""

    key: str
    index: int
    variant: Variant
    predicted: int   # positions with a loss
    length: int      # tokens, prompt included
    capped: bool
    seconds: float


def _unwritable(folder: Path, exc: OSError) -> DistillError:
    return DistillError(f"cannot write the teacher cache in {folder}: {exc.strerror or exc}; free some space or "
                        "pass --cache DIR on a disk with room that you can write to")


class TeacherCache:
    def __init__(self, root: Path, fingerprint: str, settings: dict, target_name: str) -> None:
        tag = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
        self.folder = Path(root) / f"{fingerprint[:20]}-{tag}"
        meta = {"target": target_name, "fingerprint": fingerprint, "settings": settings}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._write_text(self.folder / "target.json", json.dumps(meta, indent=1))
        except OSError as exc:
            raise _unwritable(self.folder, exc) from exc

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.safetensors"

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def _write_text(self, path: Path, text: str) -> None:
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def save(self, key: str, record: Record) -> None:
        tensors = {"encoder": record.encoder}
        labels = []
        for i, label in enumerate(record.labels):
            tensors[f"{i}.tokens"] = torch.tensor(label.tokens, dtype=torch.int32)
            tensors[f"{i}.topk_ids"] = label.topk_ids.contiguous()
            tensors[f"{i}.topk_logp"] = label.topk_logp.contiguous()
            labels.append({"task": label.variant.task, "timestamps": label.variant.timestamps,
                           "prompt_len": label.prompt_len, "capped": label.capped, "length": len(label.tokens)})
        meta = {"seconds": json.dumps(record.seconds), "language": json.dumps(record.language),
                "labels": json.dumps(labels)}
        path = self.path(key)
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        try:
            save_file(tensors, str(tmp), metadata=meta)
            os.replace(tmp, path)
        except OSError as exc:
            raise _unwritable(self.folder, exc) from exc
        finally:
            tmp.unlink(missing_ok=True)

    def _meta(self, key: str) -> dict:
        with safe_open(str(self.path(key)), framework="pt") as handle:
            meta = handle.metadata()
        return {name: json.loads(value) for name, value in meta.items()}

    def valid(self, key: str) -> bool:
        """The record exists and its header reads (a disk error may still have damaged one)."""
        try:
            return self.has(key) and "labels" in self._meta(key)
        except (OSError, SafetensorError, ValueError):
            return False

    def labels(self, key: str) -> list[LabelInfo]:
        meta = self._meta(key)
        return [LabelInfo(key, i, Variant(lab["task"], lab["timestamps"]), lab["length"] - lab["prompt_len"],
                          lab["length"], lab["capped"], meta["seconds"]) for i, lab in enumerate(meta["labels"])]

    def language(self, key: str) -> str | None:
        """The language a cached record was labelled in."""
        return self._meta(key)["language"]

    def tokens(self, key: str, indices: Iterable[int]) -> list[list[int]]:
        """Some of a record's labels' tokens (prompt included), read without the rest of the record."""
        with safe_open(str(self.path(key)), framework="pt") as handle:
            return [handle.get_tensor(f"{i}.tokens").tolist() for i in indices]

    def load(self, key: str) -> Record:
        meta = self._meta(key)
        tensors = load_file(str(self.path(key)))
        labels = [Label(Variant(lab["task"], lab["timestamps"]), tensors[f"{i}.tokens"].tolist(), lab["prompt_len"],
                        tensors[f"{i}.topk_ids"], tensors[f"{i}.topk_logp"], lab["capped"])
                  for i, lab in enumerate(meta["labels"])]
        return Record(tensors["encoder"], meta["seconds"], meta["language"], labels)
