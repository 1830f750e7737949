"""runtime.allocator: glibc's malloc keeps freed memory for reuse (real allocations, real page faults)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asr_app.runtime.allocator import keep_freed_memory

# A child process allocates two 12 MiB blocks (under glibc's largest mmap threshold), frees them, again
# three times, then prints the page faults the last pair cost, as a share of its pages: an encoder's
# activations come and go like this at every layer.
PROBE = """
import resource, sys, torch
from asr_app.runtime.allocator import keep_freed_memory
print(keep_freed_memory() if sys.argv[1] == "keep" else "default", file=sys.stderr)
size = 12 * 2**20
def pair():
    x = torch.empty(size, dtype=torch.uint8).fill_(1)
    y = torch.empty(size, dtype=torch.uint8).fill_(1)
    del x, y
for _ in range(3):
    pair()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
pair()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (2 * size / 4096))
"""


def _fault_share(setting: str) -> float:
    proc = subprocess.run([sys.executable, "-c", PROBE, setting], capture_output=True, text=True, check=True)
    return float(proc.stdout.strip())


@pytest.mark.skipif(not keep_freed_memory(), reason="the C library is not glibc")
def test_kept_memory_is_reused_without_new_page_faults():
    # With glibc's defaults the block is mapped afresh and every page faults again; kept, it is reused.
    assert _fault_share("default") > 0.5
    assert _fault_share("keep") < 0.05
    assert keep_freed_memory() is True  # once per process: a second call changes nothing and says so
