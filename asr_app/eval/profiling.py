"""Verification-step time as the paper measures it: the PyTorch profiler over the sampling step.

The decoder wraps every verify call in `torch.profiler.record_function(VERIFY_LABEL)` when
`DecodingOptions(profile_verify=True)`; we sum the time of those ranges over all steps of a decode.
On CUDA the time is the GPU time of the range (kernels attributed to it), else the CPU time of the
range; `clock` says which, so a report never mixes the two silently.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

VERIFY_LABEL = "asr_app.verify"
CPU_CLOCK = "process-cpu"  # on CPU the evaluator reports the process CPU time of the verify calls


@dataclass
class VerifyProfile:
    seconds: float = 0.0       # summed time of all VERIFY_LABEL ranges
    calls: int = 0             # how many ranges (verification steps) were seen
    clock: str = "cpu"         # "cuda" (GPU time of the ranges) or "cpu" (CPU time of the ranges)


@contextmanager
def profile_verify_step(device: torch.device) -> Iterator[VerifyProfile]:
    """Profile the block; afterwards the yielded record holds the summed verify time."""
    on_cuda = device.type == "cuda" and torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    result = VerifyProfile(clock="cuda" if on_cuda else "cpu")
    prof = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
    with _quiet_stderr():
        prof.start()
    try:
        yield result
    finally:
        with _quiet_stderr():
            prof.stop()
    cpu_us = device_us = 0.0
    for event in prof.events():
        if event.name != VERIFY_LABEL:
            continue
        # With CUDA the label also appears as a GPU-side annotation; count only the CPU-side ranges,
        # whose device time is the time of the kernels launched inside them.
        if not str(getattr(event, "device_type", "")).endswith("CPU"):
            continue
        result.calls += 1
        cpu_us += event.cpu_time_total
        device_us += getattr(event, "device_time_total", 0.0) or 0.0
    if on_cuda and device_us > 0:
        result.seconds = device_us / 1e6
    else:
        result.clock = "cpu"
        result.seconds = cpu_us / 1e6


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 briefly: Kineto prints a line on every profiler start and stop,
    which would shred the progress bar when profiling one utterance at a time."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (some embedded runners): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class PeakMemory:
    """Peak memory per measured block: CUDA max allocated bytes, or the process's peak RSS on CPU."""

    def __init__(self, device: torch.device):
        self.on_cuda = device.type == "cuda" and torch.cuda.is_available()
        self.device = device
        self.kind = "cuda_max_allocated" if self.on_cuda else "process_peak_rss"
        # Linux lets a process reset its own RSS high-water mark; elsewhere the peak only grows.
        self._can_reset_rss = Path("/proc/self/clear_refs").exists()
        if not self.on_cuda and not self._can_reset_rss:
            self.kind = "process_peak_rss_cumulative"

    def reset(self) -> None:
        if self.on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._can_reset_rss:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                self._can_reset_rss = False
                self.kind = "process_peak_rss_cumulative"

    def read(self) -> int:
        if self.on_cuda:
            return int(torch.cuda.max_memory_allocated(self.device))
        status = Path("/proc/self/status")
        if status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
