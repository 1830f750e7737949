"""Token ids -> text and segments."""

from __future__ import annotations

import zlib

from asr_app.decoding.options import Segment

SECONDS_PER_TIMESTAMP = 0.02


def text_tokens(tokens: list[int], eos: int) -> list[int]:
    """Plain text ids (every special token, timestamps included, sits at or above EOS)."""
    return [t for t in tokens if t < eos]


def decode_text(tokenizer, tokens: list[int], eos: int) -> str:
    return tokenizer.decode(text_tokens(tokens, eos), skip_special_tokens=True).strip()


def split_segments(tokenizer, tokens: list[int], eos: int, timestamp_begin: int | None,
                   window_s: float) -> list[Segment]:
    """One segment per <|t0|> text <|t1|> pair; without timestamps one segment for the whole window.
    A trailing unclosed segment ends at the window's end."""
    if timestamp_begin is None or not any(t >= timestamp_begin for t in tokens):
        text = decode_text(tokenizer, tokens, eos)
        return [Segment(0.0, window_s, text, text_tokens(tokens, eos))] if text else []
    segments: list[Segment] = []
    start: float | None = None
    current: list[int] = []
    for tok in tokens:
        if tok >= timestamp_begin:
            t = (tok - timestamp_begin) * SECONDS_PER_TIMESTAMP
            if start is None:
                start = t
            else:
                text = decode_text(tokenizer, current, eos)
                if text:
                    segments.append(Segment(start, t, text, text_tokens(current, eos)))
                start, current = None, []
        else:
            current.append(tok)
    text = decode_text(tokenizer, current, eos)
    if text:
        segments.append(Segment(start if start is not None else 0.0, max(window_s, start or 0.0), text,
                                text_tokens(current, eos)))
    return segments


def compression_ratio(text: str) -> float:
    """Bytes of `text` over bytes of its zlib compression: about 1-2 for speech, more for a repetition loop."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0
