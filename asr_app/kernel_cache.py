"""A bound on oneDNN's cache of compiled CPU kernels, for processes that serve for hours.

On a CPU, torch's linear layers run oneDNN kernels compiled for each shape they meet, and oneDNN keeps up to
1024 of them. A speculative decoder meets many shapes (batch rows x tokens x cached positions), so a server's
resident memory keeps what those kernels hold long after the load that made them (docs/serving.md, "Load
and faults"). The services (`asr-serve`, `python app.py`) bound the cache unless the operator's environment
already does; one-off commands keep oneDNN's default.

oneDNN reads the bound from its environment when it compiles its first kernel, so `bound_kernel_cache` has
to run before the models are loaded; setting it later changes nothing.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import MutableMapping

VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")   # oneDNN reads either
SERVICE_DEFAULT = 64
ONEDNN_DEFAULT = 1024


def add_kernel_cache_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu-kernel-cache", type=int, default=None, metavar="N",
                        help=f"on a CPU, keep at most N compiled kernels (oneDNN's primitive cache) so memory "
                             f"does not grow with every shape met (default {SERVICE_DEFAULT}, or "
                             f"${VARIABLES[0]} when set; oneDNN's own default is {ONEDNN_DEFAULT})")


def kernel_cache_problem(entries: int | None) -> str | None:
    """A --cpu-kernel-cache the service refuses: a cache of 0 would compile every kernel on every call."""
    if entries is not None and entries < 1:
        return f"--cpu-kernel-cache must be at least 1, got {entries}"
    return None


def bound_kernel_cache(entries: int | None, environ: MutableMapping[str, str] | None = None) -> str:
    """Set the bound in `environ` (this process's environment) before oneDNN starts: `entries` when given,
    else the environment's own when it has one, else SERVICE_DEFAULT. Returns a short description of the
    bound in force."""
    environ = os.environ if environ is None else environ
    if entries is not None:
        for name in VARIABLES:   # the flag wins over both spellings
            environ.pop(name, None)
        environ[VARIABLES[0]] = str(entries)
        return f"{entries} (--cpu-kernel-cache)"
    for name in VARIABLES:
        if environ.get(name):
            return f"{environ[name]} (${name})"
    environ[VARIABLES[0]] = str(SERVICE_DEFAULT)
    return f"{SERVICE_DEFAULT} (default)"
