"""A shortened encoder input (DecodingOptions.encoder_context_s, whisper.cpp's audio_ctx): the encoder runs over
a window's audio plus a few seconds of its padding instead of all 30 s, and a decode that went wrong for
it is recognised so it can be done again, over twice the context first, then over the whole window
(docs/serving.md, "Less work per re-decode")."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from asr_app.decoding.alignment import FRAMES_PER_SECOND
from asr_app.decoding.options import DecodingResult
from asr_app.decoding.text import compression_ratio

# A decode over a shortened input whose text compresses better than this looped (openai/whisper's 2.4) ...
LOOP_COMPRESSION_RATIO = 2.4
MAX_TOKENS_PER_SECOND = 12   # ... or produced more tokens than speech has (about 3-6 a second, timestamps included)


# Features are computed this far past the encoder's input, so that their last frame holds padding only.
FEATURE_MARGIN_S = 1.0
HOP_SAMPLES = 160   # Whisper's feature frame: 10 ms at 16 kHz


def feature_samples(context_s: float | None, windows: Sequence[float], full_window_s: float,
                    sample_rate: int) -> int | None:
    """How many samples of each clip (zero-padded) the feature extractor needs: the longest clip, the encoder's
    context past it (a shortened encoder input; None: none, the whole window is encoded) and a margin, or None
    where that reaches the whole window. Whisper's features past the audio are all one value per clip (the
    padding's log-mel, floored at the clip's maximum minus 8), so frames computed over padding stand for the
    rest (`pad_features`): the result equals the whole window's features, value for value (tested). A live
    re-decode of a few seconds so computes a few seconds of frames, not 30 s of them, with or without context."""
    seconds = max(windows) + (context_s or 0.0) + FEATURE_MARGIN_S
    if seconds >= full_window_s:
        return None
    return HOP_SAMPLES * math.ceil(seconds * sample_rate / HOP_SAMPLES)


def pad_features(features: torch.Tensor, frames: int) -> torch.Tensor:
    """`features` [B, mels, n] computed over a clip and its padding, made `frames` long by repeating their
    last frame (padding only: `feature_samples`)."""
    missing = frames - features.shape[-1]
    if missing <= 0:
        return features
    return torch.cat([features, features[..., -1:].expand(*features.shape[:-1], missing)], dim=-1)


def encoder_input(features: torch.Tensor, context_s: float | None, windows: Sequence[float]) -> torch.Tensor:
    """The feature frames to encode: the batch's longest audio plus `context_s` of padding, or all of them."""
    if context_s is None:
        return features
    frames = 2 * math.ceil((max(windows) + context_s) * FRAMES_PER_SECOND)
    return features[..., :frames] if frames < features.shape[-1] else features


def retry_contexts(context_s: float, window_s: float, full_window_s: float) -> tuple[float | None, ...]:
    """The contexts a lost decode is done again with, in turn (None: the whole window): twice the context
    first where that input is still shorter than the window, since a decode lost with a few seconds of
    context was not lost with twice as many in the cases seen, at a fraction of the whole window's encoder."""
    wider = 2 * context_s
    return (wider, None) if 0 < wider and window_s + wider < full_window_s else (None,)


def token_cap(window_s: float) -> int:
    """The fewest tokens that mark a shortened decode of `window_s` seconds as lost (more than speech holds).
    A decode over a shortened input stops there: it would be redone over the whole window anyway, and a row
    looping to the decoder's limit would keep its whole lock-step batch stepping."""
    return math.floor(MAX_TOKENS_PER_SECOND * window_s + 16) + 1


def lost_end_of_audio(result: DecodingResult, window_s: float, context_s: float) -> bool:
    """Whether a decode over a shortened input shows it did not see where the audio ends: a repetition loop,
    more tokens than speech holds, or text placed past the audio and its context."""
    ends = [s.end for s in result.segments]
    return (compression_ratio(result.text) > LOOP_COMPRESSION_RATIO
            or len(result.tokens) >= token_cap(window_s)
            or bool(ends and max(ends) > window_s + context_s))
