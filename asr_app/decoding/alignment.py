"""Word timestamps from the target's cross-attention, by Whisper's method (docs/word-timestamps.md).

After a window is decoded, the target reads [start-of-transcript sequence, <|notimestamps|>, text
tokens, <|endoftext|>] once more in one pass. The cross-attention of the checkpoint's alignment heads
(`generation_config.alignment_heads`; the upper half of the layers when a checkpoint names none) is
cut to the frames that hold audio, standardised over the tokens, median-filtered over time, averaged
over the heads, and a dynamic-time-warping path through its negative maps each token to the frame
where the target starts attending to it. Words are groups of tokens (a new word at a leading space or
a punctuation token; punctuation then joins its neighbour) and take the times of their first token
and of the token after their last.

Every speculative mode emits the target's tokens, so this alignment is the target's in every mode.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from asr_app.decoding.options import Segment, Word

FRAMES_PER_SECOND = 50      # encoder frames: 1500 per 30 s window
MEDIAN_WIDTH = 7            # openai/whisper's median filter width, in frames
# The most one alignment pass keeps of its attention probabilities (fp32, every head of each probed layer, the
# batch's longest row): large-v3's 10 probed layers of 20 heads hold about 180 MB a row at 150 tokens.
PROBE_BUDGET_BYTES = 512 * 2**20
PREPENDED = "\"'“¿([{-"     # punctuation that joins the following word
APPENDED = "\"'.。,，!！?？:：”)]}、"  # punctuation that joins the previous word
CLAUSE_END = (".", "。", "!", "！", "?", "？", ",", "，")  # a word ending so may be followed by a pause


@dataclass(frozen=True)
class AlignmentInput:
    sot_sequence: list[int]   # <|startoftranscript|> [language] [task] <|notimestamps|>
    text_tokens: list[int]    # the window's text tokens (no timestamps, no special tokens)
    eos: int
    window_s: float           # seconds of audio in the window (the rest of the 30 s is padding)


def alignment_heads(generation_config, layers: int, heads: int) -> list[tuple[int, int]]:
    """(layer, head) pairs whose cross-attention follows the speech; the upper half when none are named."""
    named = getattr(generation_config, "alignment_heads", None)
    if named:
        return [(int(layer), int(head)) for layer, head in named]
    return [(layer, head) for layer in range(layers // 2, layers) for head in range(heads)]


def add_word_timestamps(segments: list[Segment], runtime, encoder_hidden: torch.Tensor, sot_sequence: list[int],
                        eos: int, window_s: float, heads: Sequence[tuple[int, int]], tokenizer,
                        probabilities: bool = True, cross: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Fill `segment.words` of one decoded window (times relative to the window's start). `cross`: the
    window's cross-attention K/V from the decode, reused (`DecoderRuntime.cross_attention`)."""
    add_batch_word_timestamps([segments], runtime, encoder_hidden[:1], [sot_sequence], eos, [window_s], heads,
                              tokenizer, probabilities, cross)


def add_batch_word_timestamps(segment_lists: Sequence[list[Segment]], runtime, encoder_hidden: torch.Tensor,
                              sot_sequences: Sequence[list[int]], eos: int, windows_s: Sequence[float],
                              heads: Sequence[tuple[int, int]], tokenizer, probabilities: bool = True,
                              cross: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """`add_word_timestamps` for the rows of one decoded batch at once (row r: `segment_lists[r]`,
    `encoder_hidden[r]`, `cross[:, r]`): one pass of the target over every row's tokens and one time warp
    for them all, where row by row each row paid both (docs/serving.md, "Host work per batch"). On a CPU in
    fp32 the same words as each row alone (tested); on a GPU the batch's products may round differently."""
    items = [AlignmentInput(list(sot), [t for segment in segments for t in segment.tokens], eos, window)
             for segments, sot, window in zip(segment_lists, sot_sequences, windows_s)]
    words = align_batch(runtime, encoder_hidden, items, heads, tokenizer, probabilities, cross)
    for segments, row_words in zip(segment_lists, words):
        if segments:
            attach_words(segments, row_words)


def align_words(runtime, encoder_hidden: torch.Tensor, item: AlignmentInput, heads: Sequence[tuple[int, int]],
                tokenizer, probabilities: bool = True,
                cross: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[Word]:
    """The words of one window: start/end seconds (window-relative), mean token probability (NaN without
    `probabilities`), tokens."""
    return align_batch(runtime, encoder_hidden[:1], [item], heads, tokenizer, probabilities, cross)[0]


def align_batch(runtime, encoder_hidden: torch.Tensor, items: Sequence[AlignmentInput],
                heads: Sequence[tuple[int, int]], tokenizer, probabilities: bool = True,
                cross: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[list[Word]]:
    """`align_words` of every row of a batch (row r: `items[r]` over `encoder_hidden[r]`). The rows' token
    sequences, padded at their ends, go through the target in one pass: its self-attention is causal, so a
    row's padding changes none of its own positions. Every row goes through it, those without text too (a
    pass over all rows reads the batch's cross K/V in place; picking rows would copy them). A batch whose
    attention probabilities would outgrow `PROBE_BUDGET_BYTES` goes in slices of rows (views, no copies)."""
    if not any(item.text_tokens for item in items):
        return [[] for _ in items]
    layers = {layer for layer, _ in heads}
    longest = max(len(item.sot_sequence) + len(item.text_tokens) + 1 for item in items)
    per_row = 4 * len(layers) * runtime.weights.heads * longest * encoder_hidden.shape[1]
    step = max(1, PROBE_BUDGET_BYTES // per_row)
    if len(items) > step:
        return [words for at in range(0, len(items), step) for words in align_batch(
            runtime, encoder_hidden[at : at + step], items[at : at + step], heads, tokenizer, probabilities,
            (cross[0][:, at : at + step], cross[1][:, at : at + step]) if cross is not None else None)]
    words: list[list[Word]] = [[] for _ in items]
    rows = [r for r, item in enumerate(items) if item.text_tokens]
    ids = [[*item.sot_sequence, *item.text_tokens, item.eos] for item in items]
    padded = torch.tensor([i + [item.eos] * (longest - len(i)) for item, i in zip(items, ids)],
                          device=encoder_hidden.device)
    hidden, attention = runtime.cross_attention(encoder_hidden, padded, layers, cross)
    matrices = [_alignment_matrix(attention, heads, r, items[r], encoder_hidden.shape[1]) for r in rows]
    # one copy to the host for every row (a GPU waits once, not once per row)
    on_host = torch.cat([m.double().reshape(-1) for m in matrices]).cpu().numpy()
    costs, at = [], 0
    for m in matrices:
        costs.append(-on_host[at : at + m.numel()].reshape(m.shape))
        at += m.numel()
    for r, (path_rows, path_cols) in zip(rows, dtw_paths(costs)):
        item = items[r]
        # The path visits every row in order; a token's time is the frame where the path reaches its row.
        token_times = path_cols[np.r_[0, np.flatnonzero(np.diff(path_rows)) + 1]] / FRAMES_PER_SECOND
        probs = (token_probabilities(runtime, hidden[r : r + 1], ids[r], len(item.sot_sequence)) if probabilities
                 else [math.nan] * len(item.text_tokens))
        words[r] = _words(tokenizer, item.text_tokens, token_times, probs)
    return words


def _alignment_matrix(attention: dict[int, torch.Tensor], heads: Sequence[tuple[int, int]], row: int,
                      item: AlignmentInput, encoder_frames: int) -> torch.Tensor:
    """One row's [text tokens, frames] alignment weights: its heads' cross-attention over the frames holding
    audio, standardised over its tokens, median-filtered over time, averaged over the heads."""
    frames = max(1, min(encoder_frames, round(item.window_s * FRAMES_PER_SECOND)))
    length = len(item.sot_sequence) + len(item.text_tokens) + 1
    weights = torch.stack([attention[layer][row, head, :length, :frames] for layer, head in heads])
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = median_filter((weights - mean) / std.clamp_min(1e-10), MEDIAN_WIDTH)
    # Rows: the input <|notimestamps|> (which predicts the first text token) .. the last text token.
    return weights.mean(dim=0)[len(item.sot_sequence) - 1 : -1]


def token_probabilities(runtime, hidden: torch.Tensor, ids: list[int], first: int) -> list[float]:
    """The target's probability of each text token (ids[first:-1]) given the tokens before it."""
    logits = runtime.logits(hidden[:, first - 1 : len(ids) - 2]).float()
    probs = torch.softmax(logits, dim=-1)[0]
    targets = torch.tensor(ids[first:-1], device=probs.device)
    return probs[torch.arange(len(targets), device=probs.device), targets].tolist()


def _words(tokenizer, tokens: list[int], token_times: np.ndarray, probs: list[float]) -> list[Word]:
    spans = []
    index = 0
    for text, count in merge_punctuation(split_words(tokenizer, tokens)):
        spans.append((text, index, count, float(token_times[index]), float(token_times[index + count])))
        index += count
    limit = _longest_plausible(spans)
    words: list[Word] = []
    for text, first, count, start, end in spans:
        end = max(end, start)
        if limit and end - start > limit and text.rstrip().endswith(CLAUSE_END):
            end = start + limit  # the path lingers on the word before a pause: the pause is not the word
        words.append(Word(text, round(start, 3), round(end, 3),
                          round(float(np.mean(probs[first : first + count])), 4), tokens[first : first + count]))
    return words


def _longest_plausible(spans: list[tuple]) -> float:
    """openai/whisper's bound for a word before punctuation: twice the median word length, at most 1.4 s."""
    durations = [end - start for *_, start, end in spans if end > start]
    return 2 * min(0.7, float(np.median(durations))) if durations else 0.0


def split_words(tokenizer, tokens: list[int]) -> list[tuple[str, int]]:
    """(text, token count) per word: a word starts at a token with a leading space or at punctuation.
    Tokens that are not whole UTF-8 characters on their own are kept together first."""
    pieces: list[tuple[str, int]] = []
    pending: list[int] = []
    for tok in tokens:
        pending.append(tok)
        text = tokenizer.decode(pending)
        if "\ufffd" not in text:
            pieces.append((text, len(pending)))
            pending = []
    if pending:
        pieces.append((tokenizer.decode(pending), len(pending)))
    words: list[tuple[str, int]] = []
    for text, count in pieces:
        punctuation = text.strip() in string.punctuation and text.strip() != ""
        if not words or text.startswith(" ") or punctuation:
            words.append((text, count))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + count)
    return words


def merge_punctuation(words: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Opening punctuation joins the next word, closing punctuation the previous one."""
    out: list[tuple[str, int]] = []
    carry = ("", 0)
    for text, count in words:
        stripped = text.strip()
        if stripped and all(ch in PREPENDED for ch in stripped):
            carry = (carry[0] + text, carry[1] + count)
            continue
        if stripped and all(ch in APPENDED for ch in stripped) and out:
            out[-1] = (out[-1][0] + text.strip(), out[-1][1] + count)
            continue
        if carry[1]:
            text, count = carry[0] + text.lstrip(), carry[1] + count
            carry = ("", 0)
        out.append((text, count))
    if carry[1]:
        out.append(carry)
    return out


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window of odd `width` along the last axis (edges mirrored)."""
    half = width // 2
    if x.shape[-1] <= half:
        return x
    flat = torch.nn.functional.pad(x.reshape(-1, 1, x.shape[-1]), (half, half), mode="reflect")
    return flat.unfold(-1, width, 1).median(dim=-1).values.reshape(x.shape)


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The monotonic path of least summed cost from (0, 0) to (N-1, M-1); rows and columns per step. Where
    moves tie, the diagonal goes first, then the next row (token), then the next column (frame)."""
    return dtw_paths([cost])[0]


def dtw_paths(costs: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`dtw_path` of several cost matrices of any shapes at once.

    Cells on one anti-diagonal depend only on the two before it, so each diagonal is one vector step over a
    flat view, of every matrix at once: the matrices lie in one array padded at their ends, and a cell past a
    matrix's own end never feeds one inside it (cells depend on smaller indices only). Each cell is the same
    sum of the same numbers as alone, so the paths are the same to the last tie. No move table: the way back
    compares the three totals again, in the same order, which gives the same path."""
    if not costs:
        return []
    n, m = max(c.shape[0] for c in costs), max(c.shape[1] for c in costs)
    stride, plane = m + 1, (n + 1) * (m + 1)
    total = np.full((len(costs), n + 1, m + 1), np.inf)
    total[:, 0, 0] = 0.0
    padded = np.zeros((len(costs), n, m))
    for b, cost in enumerate(costs):
        # Finite costs keep the path off the infinite border until (0, 0); a NaN would make every comparison
        # on the way back false (scores overflowing fp16, say): such cells cost the most instead.
        padded[b, : cost.shape[0], : cost.shape[1]] = np.nan_to_num(cost, nan=1e30, posinf=1e30, neginf=-1e30)
    flat, flat_costs = total.reshape(-1), padded.reshape(-1)
    starts, cost_starts = (np.arange(len(costs)) * plane)[:, None], (np.arange(len(costs)) * n * m)[:, None]
    for d in range(2, n + m + 1):
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        at = (starts + i * stride + d - i).reshape(-1)   # (b, i, d - i) in `total`
        best = np.minimum(np.minimum(flat[at - stride - 1], flat[at - stride]), flat[at - 1])
        flat[at] = flat_costs[(cost_starts + (i - 1) * m + d - i - 1).reshape(-1)] + best
    return [_way_back(total[b], *cost.shape) for b, cost in enumerate(costs)]


def _way_back(total: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The path from (n, m) back to the border of one matrix's totals, ties broken as `dtw_path` says."""
    i, j = n, m
    rows, cols = [], []
    while i > 0 and j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        diagonal, up, left = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
        if diagonal <= up and diagonal <= left:
            i, j = i - 1, j - 1
        elif up <= left:
            i -= 1
        else:
            j -= 1
    return np.array(rows[::-1]), np.array(cols[::-1])


def attach_words(segments: list[Segment], words: list[Word]) -> None:
    """Give each segment the words whose first token lies among its tokens (both in token order); words
    past the segments' tokens (a tail long-form decodes again) are left out."""
    bounds = np.cumsum([len(s.tokens) for s in segments])
    for segment in segments:
        segment.words = []
    first = 0
    for word in words:
        index = int(np.searchsorted(bounds, first, side="right"))
        if index >= len(segments):
            break
        segments[index].words.append(word)
        first += len(word.tokens)


def shift_words(words: list[Word] | None, offset: float, floor: float,
                ceiling: float = float("inf")) -> list[Word] | None:
    """Window-relative word times -> absolute ones, never before `floor` (the previous segment's end) nor past
    `ceiling` (where the next window starts: the audio after it is decoded again, and its words start there)."""
    if words is None:
        return None
    out = []
    for w in words:
        start = min(max(round(offset + w.start, 3), floor), ceiling)
        end = min(max(round(offset + w.end, 3), start), ceiling)   # start <= ceiling already
        out.append(Word(w.word, start, end, w.probability, w.tokens))
        floor = start
    return out
