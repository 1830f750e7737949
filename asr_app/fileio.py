"""Writing output files atomically with ordinary permissions (one home for every writer of outputs)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TEMP_PREFIX = ".asr-tmp-"


def _umask() -> int:
    """The process umask, read without changing it where the system says it (Linux), else set and reset."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _stage(path: Path, text: str) -> Path:
    """`text` in a hidden temporary file beside `path`, flushed to disk, with the mode a plain open() would
    give (0666 less the umask), not mkstemp's 0600; removed again if anything fails."""
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX + path.name + ".", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_all_atomic(files: dict[Path, str]) -> list[Path]:
    """Write several files so that they land all together or not at all: every text is staged in a
    temporary file first (a full disk or a killed process fails here, and the staged files are removed),
    then each is renamed onto its name, which needs no space and cannot fail half-way through a file.
    A reader, or a resumed run, never sees a half-written file; the last name is renamed last."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in files.items():
            staged.append((_stage(Path(path), text), Path(path)))
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)
    return [path for _, path in staged]


def write_atomic(path: str | Path, text: str) -> Path:
    """One file, atomically (see write_all_atomic)."""
    return write_all_atomic({Path(path): text})[0]
