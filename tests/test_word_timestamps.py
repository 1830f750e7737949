"""Word timestamps from the target's cross-attention (asr_app/decoding/alignment.py).

The reference is transformers' own word timestamps (`pipeline(..., return_timestamps="word")`) on the
same tiny.en checkpoint and the same real clips, recorded by tools/record_word_starts.py (the pipeline took
a minute of every test run) with the checkpoint's fingerprint; starts of the words both transcripts share
must agree within 60 ms on average.
"""

from __future__ import annotations

import difflib
import json
import re

import numpy as np
import pytest
from conftest import DATA_DIR, JFK_FLAC, LIBRISPEECH_DIR, TINY_EN_DIR, lj_clip, normalise

from asr_app.audio import SAMPLE_RATE, load_audio
from asr_app.decoding.alignment import dtw_path, dtw_paths, median_filter, merge_punctuation, split_words

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CLIPS = {
    "jfk": JFK_FLAC,
    "1089-134686-0000": LIBRISPEECH_DIR / "LibriSpeech/test-clean/1089/134686/1089-134686-0000.flac",
    "1089-134691-0001": LIBRISPEECH_DIR / "LibriSpeech/test-clean/1089/134691/1089-134691-0001.flac",
    "LJ001-0004": lj_clip("LJ001-0004"),
}
MAX_MEAN_START_DIFF_S = 0.060
RECORDED_WORD_STARTS = DATA_DIR / "transformers_word_starts.json"


@pytest.fixture(scope="module")
def decoder(tiny_en_pair):
    from asr_app.decoding import DecodingOptions, SpeculativeDecoder

    return SpeculativeDecoder(tiny_en_pair, DecodingOptions(mode="exact", word_timestamps=True))


@pytest.fixture
def reuse_decoder_words(monkeypatch, decoder):
    """Hand the CLI the loaded decoder instead of loading tiny.en again."""
    def from_args(args):
        assert args.target == str(TINY_EN_DIR)
        return decoder
    monkeypatch.setattr("asr_app.arguments.decoder_from_args", from_args)


@pytest.fixture(scope="module")
def transformers_words(tiny_en_pair):
    """(word, start) lists from transformers' pipeline on the same checkpoint, as recorded."""
    from asr_app.distill.teacher import target_fingerprint

    record = json.loads(RECORDED_WORD_STARTS.read_text())
    assert record["model_fingerprint"] == target_fingerprint(tiny_en_pair.target), \
        "the recorded word starts are of other weights: run tools/record_word_starts.py"
    assert set(record["clips"]) == set(CLIPS)
    return {name: [(text, start) for text, start in words] for name, words in record["clips"].items()}


def words_of(result) -> list:
    return [w for s in result.segments for w in s.words]


def matched_start_differences(ours: list[tuple[str, float]], theirs: list[tuple[str, float]]) -> tuple[list, int]:
    """|start difference| of the words both transcripts have at the same place (normalised text)."""
    a, b = [normalise(w) for w, _ in ours], [normalise(w) for w, _ in theirs]
    diffs = []
    for block in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            diffs.append(abs(ours[block.a + k][1] - theirs[block.b + k][1]))
    return diffs, len(a)


def test_word_starts_match_transformers_on_real_clips(decoder, transformers_words):
    means = {}
    for name, path in CLIPS.items():
        result = decoder.decode(load_audio(path))[0]
        ours = [(w.word, w.start) for w in words_of(result)]
        diffs, count = matched_start_differences(ours, transformers_words[name])
        # most words of either transcript are matched (neither side's words missing), and there are words
        assert len(diffs) >= 0.8 * max(count, len(transformers_words[name])) > 0, (name, ours, transformers_words[name])
        means[name] = float(np.mean(diffs))
    assert all(m <= MAX_MEAN_START_DIFF_S for m in means.values()), means


def test_words_cover_the_text_in_order_within_the_audio(decoder):
    audio = load_audio(JFK_FLAC)
    result = decoder.decode(audio)[0]
    words = words_of(result)
    assert "".join(w.word for w in words).strip() == result.text
    duration = len(audio) / SAMPLE_RATE
    assert all(0.0 <= w.start <= w.end <= duration + 0.02 for w in words)
    assert [w.start for w in words] == sorted(w.start for w in words)
    assert all(0.0 < w.probability <= 1.0 for w in words)
    # The 11 s clip's words spread over it, not piled at one end.
    assert words[0].start < 1.0 and words[-1].end > duration - 1.5


def test_every_mode_aligns_the_target_tokens_identically(decoder):
    from asr_app.decoding import DecodingOptions

    audio = load_audio(CLIPS["1089-134686-0000"])
    timings = {}
    for mode in ("off", "exact", "sigmoid", "hf"):
        result = decoder.decode(audio, DecodingOptions(mode=mode, word_timestamps=True))[0]
        timings[mode] = [(w.word, w.start, w.end) for w in words_of(result)]
    assert timings["off"] and timings["exact"] == timings["off"] and timings["hf"] == timings["off"]
    assert timings["sigmoid"] == timings["off"]  # greedy: sigmoid keeps the target's argmax too


def test_dtw_finds_the_cheapest_monotone_path():
    rng = np.random.default_rng(0)
    for n, m in [(1, 1), (1, 5), (4, 1), (3, 7), (6, 6), (5, 12)]:
        cost = rng.random((n, m))
        rows, cols = dtw_path(cost)
        assert (rows[0], cols[0]) == (0, 0) and (rows[-1], cols[-1]) == (n - 1, m - 1)
        steps = np.stack([np.diff(rows), np.diff(cols)], axis=1)
        assert all(tuple(s) in {(1, 1), (1, 0), (0, 1)} for s in steps)
        best = np.full((n, m), np.inf)  # plain dynamic programme, cell by cell
        for i in range(n):
            for j in range(m):
                before = [best[i - 1, j - 1] if i and j else np.inf, best[i - 1, j] if i else np.inf,
                          best[i, j - 1] if j else np.inf]
                best[i, j] = cost[i, j] + (0.0 if i == j == 0 else min(before))
        assert cost[rows, cols].sum() == pytest.approx(best[-1, -1])


def test_median_filter_removes_spikes_and_keeps_steps():
    import torch

    x = torch.tensor([[0.0, 0, 0, 9, 0, 0, 0, 1, 1, 1, 1, 1]])
    out = median_filter(x, 3)
    assert out.tolist() == [[0.0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]]


def test_words_split_at_spaces_and_punctuation_joins_its_neighbour(tiny_en_pair):
    tokenizer = tiny_en_pair.processor.tokenizer
    tokens = tokenizer(' "Hello," she said, unbelievably.', add_special_tokens=False)["input_ids"]
    words = merge_punctuation(split_words(tokenizer, tokens))
    assert [w for w, _ in words] == [' "Hello,"', " she", " said,", " unbelievably."]
    assert sum(count for _, count in words) == len(tokens)


def test_cli_word_timestamps_json_and_one_word_subtitles(tmp_path, capsys, reuse_decoder_words):
    from asr_app.cli.transcribe import main

    out = tmp_path / "out"
    rc = main([str(JFK_FLAC), "-o", str(out), "-f", "json,srt", "--word_timestamps", "True",
               "--max_words_per_line", "1", "--target", str(TINY_EN_DIR), "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    record = json.loads((out / "jfk.json").read_text())
    words = [w for s in record["segments"] for w in s["words"]]
    assert set(words[0]) == {"word", "start", "end", "probability"}
    assert len(words) >= 20 and [w["start"] for w in words] == sorted(w["start"] for w in words)
    cues = re.findall(r"\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n(.+)\n", (out / "jfk.srt").read_text())
    assert len(cues) == len(words) and all(len(c.split()) == 1 for c in cues)


def test_cli_max_words_per_line_needs_word_timestamps(capsys):
    from asr_app.cli.transcribe import main

    with pytest.raises(SystemExit) as exc:
        main([str(JFK_FLAC), "--max_words_per_line", "3"])
    assert exc.value.code == 2 and "--word_timestamps" in capsys.readouterr().err


def test_long_form_words_are_absolute_and_follow_their_segments(decoder):
    from asr_app.longform import TranscribeOptions, transcribe

    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    audio = np.concatenate([load_audio(lj_clip("LJ001-0001")), gap, load_audio(JFK_FLAC), gap,
                            load_audio(lj_clip("LJ001-0003"))])
    assert len(audio) / SAMPLE_RATE > 31.0
    result = transcribe(decoder, audio, TranscribeOptions(decoding=decoder.options))
    for segment in result.segments:
        assert segment.words, segment
        assert normalise("".join(w.word for w in segment.words)) == normalise(segment.text)
        assert all(segment.start - 0.5 <= w.start <= segment.end + 0.5 for w in segment.words), segment
    starts = [w.start for s in result.segments for w in s.words]
    assert starts == sorted(starts) and starts[-1] > 30.0
    # Across a window's edge too, a word ends before the next one starts: the audio after the point where the
    # next window starts is decoded again, so a word of this window cannot run past it.
    words = [w for s in result.segments for w in s.words]
    overlaps = [(a, b) for a, b in zip(words, words[1:]) if a.end > b.start]
    assert not overlaps, overlaps
    # Each segment names its window's start in 10 ms frames (openai-whisper's seek), as the API reports it.
    seeks = [s.seek for s in result.segments]
    assert seeks[0] == 0 and seeks == sorted(seeks) and seeks[-1] > 0, seeks
    assert all(s.seek / 100 <= s.start + 1e-6 < s.seek / 100 + 30 for s in result.segments)


def test_dtw_breaks_ties_diagonal_first_then_next_token_then_next_frame():
    # Costs rounded to one decimal tie often: the path must be the one a cell-by-cell programme finds when
    # its way back prefers the diagonal, then the row above, then the column to the left (what the vector
    # version before 2026-11-27 chose, and so every word time it gave).
    rng = np.random.default_rng(1)
    for n, m in [(2, 2), (3, 9), (7, 7), (9, 30)]:
        cost = np.round(rng.standard_normal((n, m)), 1)
        total = np.full((n + 1, m + 1), np.inf)
        total[0, 0] = 0.0
        for i in range(1, n + 1):
            for j in range(1, m + 1):
                total[i, j] = cost[i - 1, j - 1] + min(total[i - 1, j - 1], total[i - 1, j], total[i, j - 1])
        i, j, path = n, m, []
        while i > 0 and j > 0:
            path.append((i - 1, j - 1))
            moves = [(total[i - 1, j - 1], (i - 1, j - 1)), (total[i - 1, j], (i - 1, j)), (total[i, j - 1], (i, j - 1))]
            i, j = min(moves, key=lambda move: move[0])[1]   # min keeps the first of equal totals
        rows, cols = dtw_path(cost)
        assert list(zip(rows.tolist(), cols.tolist())) == path[::-1]


def test_words_without_probabilities_keep_their_times_and_streaming_asks_for_none(decoder):
    # Streaming's words carry no probability, so its re-decodes skip the pass over the vocabulary for it.
    import math

    from asr_app.decoding import DecodingOptions
    from asr_app.streaming import StreamingOptions, StreamingProcessor

    audio = load_audio(CLIPS["1089-134686-0000"])
    full = words_of(decoder.decode(audio, DecodingOptions(mode="exact", word_timestamps=True))[0])
    bare = words_of(decoder.decode(audio, DecodingOptions(mode="exact", word_timestamps=True,
                                                          word_probabilities=False))[0])
    assert [(w.word, w.start, w.end) for w in bare] == [(w.word, w.start, w.end) for w in full] and full
    assert all(0 < w.probability <= 1 for w in full) and all(math.isnan(w.probability) for w in bare)
    assert StreamingProcessor(decoder, StreamingOptions()).decoding.word_probabilities is False


def test_words_reuse_the_decodes_cross_attention_and_match_each_row_alone(decoder, monkeypatch):
    # Alignment reads the window's cross-attention K/V the decode computed (per row of a batch, finished rows
    # dropped from the loop's view included) instead of computing them again: the same words as each clip
    # decoded alone, and no second computation of the K/V.
    from asr_app.decoding import DecodingOptions
    from asr_app.runtime.decoder import DecoderRuntime

    # The rows are aligned in one pass of the target and one time warp (align_batch): rows of different token
    # counts and lengths (silence among them: tiny.en hears one word in it), each as alone.
    clips = [load_audio(CLIPS["1089-134686-0000"]), load_audio(JFK_FLAC)[: 5 * 16_000],
             np.zeros(3 * 16_000, dtype=np.float32), load_audio(JFK_FLAC)[3 * 16_000 :]]
    opts = DecodingOptions(mode="exact", word_timestamps=True)
    alone = [[(w.word, w.start, w.end) for w in words_of(decoder.decode(c, opts)[0])] for c in clips]
    loads, passes = [], []
    original, pass_ = DecoderRuntime.load_encoder, DecoderRuntime.cross_attention
    monkeypatch.setattr(DecoderRuntime, "load_encoder", lambda self, *a: (loads.append(1), original(self, *a))[1])
    monkeypatch.setattr(DecoderRuntime, "cross_attention",
                        lambda self, hidden, ids, *a: (passes.append(ids.shape[0]), pass_(self, hidden, ids, *a))[1])
    together = [[(w.word, w.start, w.end) for w in words_of(r)] for r in decoder.decode(clips, opts)]
    assert together == alone and all(alone)
    assert len({len(words) for words in alone}) == len(alone)   # word counts differ: rows padded in the pass
    assert len(loads) == 2   # the target's and the draft's for the batch; none for the alignments
    assert passes == [4]     # one pass for the four rows


def test_a_batch_mixing_rows_with_and_without_text_and_sliced_by_the_memory_bound(decoder, monkeypatch):
    # align_batch straight: a row without text among rows with it gets no words and leaves theirs as alone;
    # with the bound on the attention probabilities kept (PROBE_BUDGET_BYTES) made tiny, the rows go one
    # pass each (slices of the batch), with the same words.
    import torch

    from asr_app.decoding import alignment
    from asr_app.decoding.alignment import AlignmentInput, align_batch, align_words
    from asr_app.runtime.decoder import DecoderRuntime

    clips = [load_audio(JFK_FLAC)[: 5 * 16_000], load_audio(CLIPS["1089-134686-0000"])]
    results = decoder.decode(clips)
    windows = [c.size / 16_000 for c in clips]
    sot = decoder._alignment_sot(decoder.prompt_for(decoder.options))
    texts = [[t for seg in r.segments for t in seg.tokens] for r in results]
    items = [AlignmentInput(sot, texts[0], decoder.eos, windows[0]), AlignmentInput(sot, [], decoder.eos, 2.0),
             AlignmentInput(sot, texts[1], decoder.eos, windows[1])]
    with torch.inference_mode():
        feats = decoder._features([clips[0], clips[0][:32_000], clips[1]], decoder.options, [windows[0], 2.0, windows[1]])
        hidden = decoder.target.get_encoder()(feats).last_hidden_state
        args = (decoder.alignment_heads, decoder.tokenizer, False)
        alone = [align_words(decoder.target_runtime, hidden[r : r + 1], items[r], *args) for r in range(3)]
        passes = []
        pass_ = DecoderRuntime.cross_attention
        monkeypatch.setattr(DecoderRuntime, "cross_attention",
                            lambda self, h, ids, *a: (passes.append(ids.shape[0]), pass_(self, h, ids, *a))[1])
        together = align_batch(decoder.target_runtime, hidden, items, *args)
        monkeypatch.setattr(alignment, "PROBE_BUDGET_BYTES", 1)
        sliced = align_batch(decoder.target_runtime, hidden, items, *args)
    key = lambda rows: [[(w.word, w.start, w.end) for w in words] for words in rows]  # noqa: E731
    assert key(together) == key(alone) == key(sliced) and alone[0] and alone[2] and alone[1] == []
    assert passes == [3, 1, 1]   # the batch in one pass, then row by row (the row without text has none)


def test_rows_without_text_get_no_words_and_no_pass():
    from asr_app.decoding.alignment import AlignmentInput, align_batch

    items = [AlignmentInput([50257, 50362], [], 50256, 3.0)] * 2
    # no runtime is needed: nothing is aligned
    assert align_batch(None, None, items, [(2, 0)], tokenizer=None) == [[], []]


def test_dtw_of_several_matrices_at_once_finds_each_ones_own_path():
    # A batch's rows are warped in one array padded at their ends; each path must be the one it gets alone,
    # ties included (costs rounded to one decimal), whatever the other matrices' shapes, NaNs among them.
    rng = np.random.default_rng(2)
    shapes = [(1, 1), (2, 9), (7, 7), (9, 30), (4, 3), (12, 250), (1, 40)]
    costs = [np.round(rng.standard_normal(shape), 1) for shape in shapes]
    costs[3][2, 5] = np.nan
    together = dtw_paths(costs)
    assert len(together) == len(costs)
    for cost, (rows, cols) in zip(costs, together):
        alone_rows, alone_cols = dtw_path(cost)
        assert rows.tolist() == alone_rows.tolist() and cols.tolist() == alone_cols.tolist(), cost.shape
    assert [dtw_paths(costs[k::-1])[0][1].tolist() for k in range(3)] == [p[1].tolist() for p in together[:3]]
    assert dtw_paths([]) == []


def test_dtw_covers_every_row_and_column_even_with_non_finite_costs():
    for cost in (np.array([[np.nan, 1.0], [1.0, 1.0]]), np.full((3, 2), np.inf), np.full((2, 4), np.nan),
                 np.array([[1.0, -np.inf, 2.0], [np.nan, 0.5, np.inf]])):
        rows, cols = dtw_path(cost)
        assert (rows[0], cols[0]) == (0, 0) and (rows[-1], cols[-1]) == (cost.shape[0] - 1, cost.shape[1] - 1)
        assert set(rows.tolist()) == set(range(cost.shape[0])) and set(cols.tolist()) == set(range(cost.shape[1]))
