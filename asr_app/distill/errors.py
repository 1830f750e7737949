"""The one error a distillation run raises for a problem the user can act on (a leaf module)."""

from __future__ import annotations


class DistillError(RuntimeError):
    """A problem with the run's inputs or outputs, worded as one line for the user (no traceback)."""


class Interrupted(DistillError):
    """The run was stopped (Ctrl-C, SIGTERM) and saved; `--resume` continues it."""
