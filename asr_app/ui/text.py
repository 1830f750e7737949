"""Text helpers for the web app: word diffs for highlighting, WER, and safe HTML.

Kept free of Gradio and of the models so each piece is testable on plain strings.
"""

from __future__ import annotations

import difflib
import html

from asr_app.wer import basic_normalize

# Labels shown by gr.HighlightedText; None means "same as the anchor".
DIFF_CHANGED = "differs"
DIFF_MISSING = "missing"



def _comparable(word: str) -> str:
    # Case and punctuation alone do not count as a difference worth highlighting.
    return basic_normalize(word)


def word_diff(text: str, anchor: str) -> list[tuple[str, str | None]]:
    """`text` as (word, label) pairs for gr.HighlightedText: label None where it agrees with
    `anchor`, "differs" for replaced or inserted words, and "missing" entries (struck words of
    the anchor) where `text` dropped them."""
    words, anchor_words = text.split(), anchor.split()
    matcher = difflib.SequenceMatcher(
        a=[_comparable(w) for w in anchor_words], b=[_comparable(w) for w in words], autojunk=False
    )
    pieces: list[tuple[str, str | None]] = []
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            pieces.extend((w, None) for w in words[b0:b1])
            continue
        if op == "delete":
            pieces.extend((w, DIFF_MISSING) for w in anchor_words[a0:a1])
        else:  # "replace" or "insert": the words this text has instead of (or beyond) the anchor's
            pieces.extend((w, DIFF_CHANGED) for w in words[b0:b1])
            # fewer words than the anchor had there: the rest of the anchor's are missing (and counted)
            pieces.extend((w, DIFF_MISSING) for w in anchor_words[a0 + (b1 - b0):a1])
    # One space between words so the component renders a readable sentence.
    spaced: list[tuple[str, str | None]] = []
    for i, (word, label) in enumerate(pieces):
        spaced.append((word if i == len(pieces) - 1 else word + " ", label))
    return spaced


def count_differences(pieces: list[tuple[str, str | None]]) -> int:
    return sum(1 for _, label in pieces if label is not None)


def live_transcript_html(committed: str, partial: str) -> str:
    """Committed text in plain type, the partial (not yet final) tail greyed and italic."""
    committed_html = html.escape(committed)
    partial_html = html.escape(partial)
    sep = " " if committed and partial else ""
    return (
        '<div class="asr-live-transcript" style="font-size:1.15em;line-height:1.6;min-height:3em">'
        f'<span class="asr-committed">{committed_html}</span>{sep}'
        f'<span class="asr-partial" style="color:#888;font-style:italic">{partial_html}</span>'
        "</div>"
    )
