"""Writing output files atomically with ordinary permissions (one home for every writer of outputs).

A staged file is named for its owner: `.asr-tmp-p<pid>h<host>.<name>.<random>` (host: 8 hex digits of a hash
of the host's name), so that a later run can tell a file a killed run left behind from one another run,
live, is writing right now (`writers.remove_stale_temps`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import socket
import tempfile
from pathlib import Path

TEMP_PREFIX = ".asr-tmp-"
_OWNER = re.compile(re.escape(TEMP_PREFIX) + r"p(\d+)h([0-9a-f]{8})\.")


def host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def temp_owner(name: str) -> tuple[int, str] | None:
    """(pid, host tag) of the process that staged the file `name`, or None (not ours, or an older form)."""
    match = _OWNER.match(name)
    return (int(match.group(1)), match.group(2)) if match else None


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
    owner = f"p{os.getpid()}h{host_tag()}"
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{owner}.{path.name}.", dir=path.parent)
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
    A reader, or a resumed run, never sees a half-written file; the last name is renamed last. The folders
    are synced after the renames, so the new names survive a power cut as the files' contents do."""
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
    for folder in dict.fromkeys(path.parent for _, path in staged):
        sync_folder(folder)
    return [path for _, path in staged]


def sync_folder(folder: Path) -> None:
    """fsync a folder: its entries (renames, new names) reach the disk. Where a system or filesystem cannot
    sync a folder (Windows; EINVAL/ENOTSUP from some network filesystems) there is nothing more to do."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_atomic(path: str | Path, text: str) -> Path:
    """One file, atomically (see write_all_atomic)."""
    return write_all_atomic({Path(path): text})[0]


def unwritable(folder: Path, keep: bool = True) -> str | None:
    """Why outputs cannot be written to `folder` (created if missing), as a sentence, or None when they can:
    asked before any model loads, so a run never ends with its results unwritten (see `write_problem`)."""
    why = write_problem(folder, keep)
    return f"cannot write to the output folder {folder}: {why}" if why else None


def write_problem(folder: Path, keep: bool = True) -> str | None:
    """The system's reason `folder` cannot be made and written to, or None. Without `keep`, folders made for
    the trial are removed again: nothing is left behind by a run that stops before it writes."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]   # deepest first
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".asr-write-test-"):
            pass
    except OSError as exc:
        return str(exc.strerror or exc)
    finally:
        for path in made if not keep else ():
            with contextlib.suppress(OSError):
                path.rmdir()
    return None
