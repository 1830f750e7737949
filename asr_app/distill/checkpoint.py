"""A training run's state on disk, written whole or not at all, and its run file.

`run.json` in the output folder says which run the folder holds (its identity: target fingerprint, data,
options) and how far it got; `checkpoint.pt` holds the trainable weights, the optimiser, the step and the
history. A resumed run must have the same identity, so it continues the run it claims to continue.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from asr_app.distill.errors import DistillError
from asr_app.fileio import write_atomic

RUN_FILE = "run.json"
CHECKPOINT = "checkpoint.pt"


def normalised(identity: dict) -> dict:
    """The identity as JSON reads it back (tuples become lists), so stored and new ones compare equal."""
    return json.loads(json.dumps(identity, sort_keys=True, default=str))


@dataclass
class RunFile:
    folder: Path

    @property
    def path(self) -> Path:
        return self.folder / RUN_FILE

    def read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, NotADirectoryError):   # no run yet; an --out that is no folder is refused later
            return None
        except (OSError, ValueError) as exc:
            raise DistillError(f"{self.path} cannot be read ({exc}); remove the folder or choose another --out") from exc

    def write(self, identity: dict, status: str, **extra) -> None:
        doc = {"status": status, "identity": normalised(identity), **extra}
        try:
            write_atomic(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        except OSError as exc:
            raise DistillError(f"cannot write to the output folder {self.folder}: {exc.strerror or exc}") from exc


def differences(stored: dict, current: dict, prefix: str = "") -> list[str]:
    """The keys whose values differ between two identities (dotted paths), for the error message."""
    out = []
    for key in sorted(set(stored) | set(current)):
        a, b = stored.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def save_checkpoint(folder: Path, state: dict) -> None:
    path = folder / CHECKPOINT
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise DistillError(f"cannot write a checkpoint to {folder}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(folder: Path, identity: dict) -> dict | None:
    """The checkpoint of the run `identity` names; None when the run has none yet."""
    path = folder / CHECKPOINT
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged file: torch raises several kinds
        raise DistillError(f"the checkpoint {path} cannot be read ({type(exc).__name__}); remove it to restart "
                           "the training from step 0 (the teacher cache is kept)") from exc
    changed = differences(state["identity"], normalised(identity))
    if changed:
        raise DistillError(f"the checkpoint in {folder} belongs to another run (it differs in "
                           f"{', '.join(changed[:6])}); resume with the options and audio it was started with")
    return state
