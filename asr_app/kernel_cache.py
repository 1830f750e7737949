"""A bound on oneDNN's cache of compiled CPU kernels, for processes that serve for hours.

On a CPU, torch's linear layers run oneDNN kernels compiled for each shape they meet, and oneDNN keeps up to
1024 of them. A speculative decoder meets many shapes (batch rows x tokens x cached positions), so a server's
resident memory keeps what those kernels hold long after the load that made them (docs/serving.md, "Memory
on a CPU"). The services (`asr-serve`, `python app.py`) bound the cache unless the operator's environment
already does; one-off commands keep oneDNN's default.

oneDNN reads the bound from its environment when it compiles its first kernel, so `bound_kernel_cache` has
to run before the models are loaded; setting it later changes nothing.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass

VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")   # oneDNN reads either
SERVICE_DEFAULT = 256
ONEDNN_DEFAULT = 1024


@dataclass(frozen=True)
class KernelCacheBound:
    """The bound in force: `entries` in `variable`, chosen by `source` (the flag, the environment, default)."""
    entries: int
    variable: str
    source: str

    def __str__(self) -> str:
        return f"{self.entries} ({self.source})"

    def startup_note(self, device_type: str) -> str:
        """What a service's startup line adds: the bound where oneDNN runs (a CPU), nothing elsewhere."""
        return f"; CPU kernel cache {self}" if device_type == "cpu" else ""


def add_kernel_cache_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu-kernel-cache", type=int, default=None, metavar="N",
                        help=f"on a CPU, keep at most N compiled kernels (oneDNN's primitive cache) so memory "
                             f"does not grow with every shape met (default {SERVICE_DEFAULT}, or "
                             f"${VARIABLES[0]} when set; oneDNN's own default is {ONEDNN_DEFAULT})")


def _operator_setting(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, value) of the bound the environment sets, in oneDNN's order; None when it sets none."""
    return next(((name, environ[name]) for name in VARIABLES if environ.get(name)), None)


def kernel_cache_problem(entries: int | None, environ: Mapping[str, str] | None = None) -> str | None:
    """A bound the service refuses, from the flag or else the environment: a cache of 0 (or a value oneDNN
    would read as 0) compiles every kernel on every call."""
    if entries is not None:
        return None if entries >= 1 else f"--cpu-kernel-cache must be at least 1, got {entries}"
    setting = _operator_setting(os.environ if environ is None else environ)
    if setting is not None and not (re.fullmatch(r"\s*[0-9]+\s*", setting[1]) and int(setting[1]) >= 1):
        return f"${setting[0]} must be a whole number of at least 1, got {setting[1]!r}"
    return None


def bound_kernel_cache(entries: int | None, environ: MutableMapping[str, str] | None = None) -> KernelCacheBound:
    """Set the bound in `environ` (this process's environment) before oneDNN starts: `entries` when given,
    else the environment's own when it has one, else SERVICE_DEFAULT. Check with `kernel_cache_problem`
    first."""
    environ = os.environ if environ is None else environ
    if entries is not None:
        for name in VARIABLES:   # the flag wins over both spellings
            environ.pop(name, None)
        environ[VARIABLES[0]] = str(entries)
        return KernelCacheBound(entries, VARIABLES[0], "--cpu-kernel-cache")
    setting = _operator_setting(environ)
    if setting is not None:
        return KernelCacheBound(int(setting[1]), setting[0], f"${setting[0]}")
    environ[VARIABLES[0]] = str(SERVICE_DEFAULT)
    return KernelCacheBound(SERVICE_DEFAULT, VARIABLES[0], "default")


@contextmanager
def kernel_cache_bound(entries: int | None) -> Iterator[KernelCacheBound]:
    """`bound_kernel_cache` in this process's environment, put back as it was on the way out (a benchmark's
    main, which tests also call in their own process)."""
    saved = {name: os.environ.get(name) for name in VARIABLES}
    try:
        yield bound_kernel_cache(entries)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
