"""Streaming speech recognition: Whisper (target) + Distil-Whisper (draft), speculative decoding."""

__version__ = "0.1.0"
