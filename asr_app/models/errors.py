"""The one error model loading raises (a leaf module: every loader imports it, it imports nothing of ours)."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model could not be loaded or the target/draft pair is unusable (message says why and what to do)."""
