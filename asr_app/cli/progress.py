"""Progress of a batch in audio seconds: a bar on a terminal, a few plain lines otherwise.

tqdm's bar redrawn into a log file or a pipe repeats its last line several times and, once a failed
file's audio never arrives, shows an ETA below zero; this reporter never goes past its total (a failed
file's audio leaves the total) and, when stderr is not a terminal, prints one line every `every`
seconds and one at the end.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60:02d}:{seconds % 60:02d}"


class Progress:
    def __init__(self, total: float, enabled: bool = True, stream: TextIO | None = None, every: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.total, self.done = max(0.0, total), 0.0
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.every = every
        self.started = self.last_line = time.perf_counter()
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit="s", file=self.stream, dynamic_ncols=True,
                            bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s audio [{elapsed}<{remaining}, {rate_fmt}]")

    def line(self) -> str:
        elapsed = time.perf_counter() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        percent = 100.0 * self.done / self.total if self.total else 100.0
        return (f"{percent:3.0f}% {self.done:.1f}/{self.total:.1f} s audio, {rate:.1f} audio-s/s, "
                f"elapsed {_clock(elapsed)}, ETA {_clock(eta)}")

    def _show(self) -> None:
        if self.bar is not None:
            self.bar.n = self.done
            self.bar.total = self.total
            self.bar.refresh()
        elif self.enabled and self.done < self.total and time.perf_counter() - self.last_line >= self.every:
            # (at 100% no periodic line: close() prints the final one, which would repeat it)
            self.last_line = time.perf_counter()
            print(self.line(), file=self.stream, flush=True)

    def update(self, seconds: float) -> None:
        self.done = min(self.total, self.done + max(0.0, seconds))
        self._show()

    def drop(self, seconds: float) -> None:
        """A file failed: its audio will not arrive, so it leaves the total."""
        self.total = max(self.done, self.total - max(0.0, seconds))
        self._show()

    def write(self, message: str) -> None:
        """A message line that does not tear the bar."""
        if self.bar is not None:
            self.bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def clear(self) -> None:
        if self.bar is not None:
            self.bar.clear()

    def close(self, finished: bool = True) -> None:
        """`finished`: everything that could be transcribed was (header durations and decoded lengths
        differ by resampling rounding, so the count is set to the total)."""
        if finished:
            self.done = self.total
        if self.bar is not None:
            self.bar.n = self.done
            self.bar.refresh()
            self.bar.close()
        elif self.enabled:
            print(self.line(), file=self.stream, flush=True)
