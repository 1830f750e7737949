"""Package namespaces whose names are imported on first use (PEP 562).

Light modules of a package (options, presets, errors) can then be imported without the heavy ones
(torch, transformers, gradio): the command-line tools parse and check their arguments first.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy_exports(package: str, homes: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` that imports `package.<homes[name]>` when `name` is first asked for."""

    def __getattr__(name: str) -> object:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{homes[name]}"), name)

    return __getattr__
