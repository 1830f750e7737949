"""Files under folders, through links: a data folder is often a set of links to corpora.

`Path.rglob` (Python 3.11) does not descend into linked folders, so such a folder looked empty. Here linked
folders are followed, each real folder once (a link back up cannot loop, and a folder reached through two
links is read through the first in sorted order). Links to files are files under their own names: a clip
linked under a second name is a second item (deciding what counts as the same audio is the caller's).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def files_under(folder: Path, accept: Callable[[Path], bool]) -> list[Path]:
    """The files under `folder` that `accept` takes, sorted."""
    seen_folders: set[str] = set()
    found: list[Path] = []
    for root, dirs, names in os.walk(folder, followlinks=True):
        dirs.sort()   # walk order decides which of two links to one folder names its files
        real = os.path.realpath(root)
        if real in seen_folders:
            dirs.clear()
            continue
        seen_folders.add(real)
        for name in sorted(names):
            path = Path(root) / name
            if accept(path) and path.is_file():
                found.append(path)
    return sorted(found)
