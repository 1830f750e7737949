"""Streaming: the LocalAgreement-2 policy on its own, then the processor on real audio with tiny.en."""

from __future__ import annotations

import dataclasses
import json

import jiwer
import numpy as np
import pytest
import soundfile as sf
from conftest import DISTIL_DRAFT_DIR, JFK_FLAC, TINY_EN_DIR, lj_clip, lj_text, normalise

from asr_app.audio import SAMPLE_RATE, FileSource, load_audio
from asr_app.decoding import DecodingOptions
from asr_app.streaming import (
    AlignAtt,
    LocalAgreement,
    StreamingOptions,
    StreamingProcessor,
    Word,
    join_words,
    latency_report,
    words_from_segments,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def hyp(*spec: tuple[str, float]) -> list[Word]:
    """Words with 0.5 s durations ending at the given times."""
    return [Word(end - 0.5, end, text) for text, end in spec]


# -- LocalAgreement-2 ----------------------------------------------------------------------

def test_first_hypothesis_commits_nothing():
    la = LocalAgreement()
    assert la.insert(hyp(("hello", 0.5), ("world", 1.0))) == []
    assert [w.text for w in la.tail] == ["hello", "world"]


def test_commits_longest_common_prefix_of_last_two():
    la = LocalAgreement()
    la.insert(hyp(("and", 0.5), ("so", 1.0), ("my", 1.5)))
    committed = la.insert(hyp(("And", 0.5), ("so,", 1.0), ("mine", 1.5), ("fellow", 2.0)))
    # Case and punctuation do not break agreement; the newest spelling is the one committed.
    assert [w.text for w in committed] == ["And", "so,"]
    assert [w.text for w in la.tail] == ["mine", "fellow"]
    assert la.committed_end == 1.0


def test_agreed_words_at_the_buffer_edge_wait_for_more_audio():
    # Two hypotheses 0.05 s apart agree on "in" at the very end of the buffer: the speaker may be saying
    # "into". Held back while it ends within edge_s of the buffer's end, compared again with more audio.
    la = LocalAgreement(edge_s=0.3)
    la.insert(hyp(("walk", 0.5), ("in", 1.2)), buffer_end=1.25)
    assert [w.text for w in la.insert(hyp(("walk", 0.5), ("in", 1.2)), buffer_end=1.3)] == ["walk"]
    assert [w.text for w in la.tail] == ["in"]
    assert la.insert(hyp(("walk", 0.5), ("into", 1.4), ("the", 1.5)), buffer_end=1.6) == []
    assert [w.text for w in la.insert(hyp(("walk", 0.5), ("into", 1.4), ("the", 1.5)), buffer_end=2.0)] == [
        "into", "the"]
    # edge_s = 0 is plain LocalAgreement-2: the agreed edge word is committed at once.
    plain = LocalAgreement(edge_s=0.0)
    plain.insert(hyp(("walk", 0.5), ("in", 1.2)), buffer_end=1.25)
    assert [w.text for w in plain.insert(hyp(("walk", 0.5), ("in", 1.2)), buffer_end=1.3)] == ["walk", "in"]


def test_after_a_large_step_settled_new_words_commit_from_one_hypothesis():
    la = LocalAgreement(edge_s=0.3, settle_s=1.5)
    # a first decode of 2 s: nothing ends 1.5 s before its end but "one"
    assert [w.text for w in la.insert(hyp(("one", 0.5), ("two", 1.0), ("three", 1.8)), buffer_end=2.0)] == ["one"]
    # a loaded server's next decode, 4 s later: "two" and "three" agreed as before; "four" and "five" are new to it
    # and settled; "six" ends within 1.5 s of the end and waits
    committed = la.insert(hyp(("one", 0.5), ("two", 1.0), ("three", 1.8), ("four", 3.0), ("five", 4.4),
                              ("six", 5.0)), buffer_end=6.0)
    assert [w.text for w in committed] == ["two", "three", "four", "five"]
    assert [w.text for w in la.tail] == ["six"]


def test_settling_stops_where_the_previous_hypothesis_heard_a_word_clearly_and_disagrees():
    la = LocalAgreement(edge_s=0.3, settle_s=1.5)
    assert [w.text for w in la.insert(hyp(("one", 0.5), ("two", 1.0), ("three", 1.5)), buffer_end=2.2)] == ["one"]
    # "two" became "too", well inside the previous buffer: nothing from there on commits from one hypothesis
    committed = la.insert(hyp(("one", 0.5), ("too", 1.0), ("three", 1.5), ("four", 4.0)), buffer_end=7.0)
    assert committed == [] and [w.text for w in la.tail] == ["too", "three", "four"]
    # a word changed at the previous buffer's edge ("in" became "into") is one it could not have agreed on
    la = LocalAgreement(edge_s=0.3, settle_s=1.5)
    la.insert(hyp(("walk", 0.5), ("in", 2.1)), buffer_end=2.2)
    committed = la.insert(hyp(("walk", 0.5), ("into", 2.3), ("the", 3.0), ("hall", 6.0)), buffer_end=6.5)
    assert [w.text for w in committed] == ["into", "the"]
    # a word the previous decode heard well inside its buffer and left out stops it too (the two disagree)
    la = LocalAgreement(edge_s=0.3, settle_s=1.5)
    la.insert(hyp(("one", 0.5)), buffer_end=3.0)
    committed = la.insert(hyp(("one", 0.5), ("two", 1.0), ("four", 4.0)), buffer_end=7.0)
    assert [w.text for w in committed] == []
    # and so does a word the previous decode heard clearly that this one left out ("two")
    la = LocalAgreement(edge_s=0.3, settle_s=1.5)
    la.insert(hyp(("one", 0.5), ("two", 1.0)), buffer_end=2.2)
    assert la.insert(hyp(("one", 0.5), ("four", 4.0)), buffer_end=7.0) == []
    # a forced flush commits the tail; the audio the flushed hypothesis heard stays heard: at a 1 s step after it,
    # a word it left out ("and") does not commit from one hypothesis
    la = LocalAgreement(edge_s=0.3, settle_s=1.5)
    la.insert(hyp(("one", 0.5), ("two", 2.0)), buffer_end=3.0)
    assert [w.text for w in la.flush()] == ["two"]
    assert la.insert(hyp(("one", 0.5), ("two", 2.0), ("and", 2.4), ("four", 3.8)), buffer_end=4.0) == []
    # without the buffer's end (the default) nothing can be settled
    assert LocalAgreement(edge_s=0.3, settle_s=1.5).insert(hyp(("one", 0.5), ("two", 1.0))) == []


def test_short_steps_commit_as_plain_local_agreement_with_or_without_settling():
    hypotheses = [(hyp(("we", 0.4), ("walk", 0.9)), 1.2), (hyp(("we", 0.4), ("walk", 0.9), ("in", 1.3)), 1.5),
                  (hyp(("we", 0.4), ("walk", 0.9), ("into", 1.5), ("the", 1.7)), 1.8),
                  (hyp(("we", 0.4), ("walk", 0.9), ("into", 1.5), ("the", 1.7), ("hall", 2.2)), 2.3),
                  (hyp(("we", 0.4), ("walk", 0.9), ("into", 1.5), ("the", 1.7), ("hall", 2.2)), 2.9)]
    plain, settling = LocalAgreement(edge_s=0.3), LocalAgreement(edge_s=0.3, settle_s=1.5)
    # the first decode's audio is shorter than settle_s; after it every step is 0.6 s at most
    for words, end in hypotheses:
        assert plain.insert(words, end) == settling.insert(words, end)
    assert [w.text for w in plain.in_buffer] == ["we", "walk", "into", "the", "hall"]
    with pytest.raises(ValueError, match="settle_s"):
        LocalAgreement(edge_s=0.3, settle_s=0.3)
    with pytest.raises(ValueError, match="settle_s"):
        StreamingOptions(settle_s=0.2)


def test_committed_words_are_skipped_in_later_hypotheses():
    la = LocalAgreement()
    la.insert(hyp(("a", 0.5), ("b", 1.0)))
    assert [w.text for w in la.insert(hyp(("a", 0.5), ("b", 1.0), ("c", 1.5)))] == ["a", "b"]
    # The buffer still holds a, b: the next hypothesis repeats them and must not re-commit them.
    assert [w.text for w in la.insert(hyp(("a", 0.5), ("b", 1.0), ("c", 1.5), ("d", 2.0)))] == ["c"]
    assert [w.text for w in la.tail] == ["d"]


def test_rewritten_committed_words_fall_back_to_time_and_ngram():
    la = LocalAgreement()
    la.insert(hyp(("the", 0.5), ("cat", 1.0)))
    la.insert(hyp(("the", 0.5), ("cat", 1.0), ("sat", 1.5)))
    # The model now spells the committed words differently; "cat" is heard again at the seam.
    new = la.insert([Word(0.0, 0.4, "a"), Word(0.5, 1.05, "cat"), Word(1.0, 1.5, "sat"), Word(1.5, 2.0, "down")])
    assert [w.text for w in new] == ["sat"]
    assert [w.text for w in la.in_buffer] == ["the", "cat", "sat"]


def test_rewritten_committed_words_do_not_drop_the_next_word():
    # Hypotheses of a real stream (LibriSpeech 1089-134686-0001, tiny.en, a decode every 0.5 s): the last one
    # rewrites the committed "stuff it" as "Stuffered" and moves "counseled" 0.16 s earlier, before the old
    # time cut (committed end - 0.1 s). The committed "you, his belly," found again there anchors the new words.
    la = LocalAgreement()
    words = [("stuff", 0.0, 0.82), ("it", 0.82, 0.98), ("into", 0.98, 1.24), ("you,", 1.24, 1.66), ("his", 1.84, 1.9),
             ("belly,", 1.9, 2.34), ("counseled", 2.34, 2.68), ("him.", 2.68, 2.98)]
    la.insert([Word(a, b, t) for t, a, b in words[:6]], buffer_end=3.0)
    assert [w.text for w in la.insert([Word(a, b, t) for t, a, b in words], buffer_end=3.5)] == [
        t for t, _, _ in words[:6]]
    last = [("Stuffered", 0.0, 0.94), ("into", 0.94, 1.26), ("you,", 1.26, 1.8), ("his", 1.8, 1.9),
            ("belly", 1.9, 2.18), ("counseled", 2.18, 2.7), ("him.", 2.7, 3.26)]
    assert [w.text for w in la.insert([Word(a, b, t) for t, a, b in last], buffer_end=3.27)] == ["counseled"]
    assert [w.text for w in la.flush()] == ["him."]


def test_committed_audio_heard_again_as_other_words_adds_nothing():
    # Hypotheses of a real stream (jfk.flac, tiny.en, a decode every 0.3 s): "my" is committed, then the
    # decodes hear its audio as "am I", the "I" a zero-long word at the end of the committed "my". It
    # starts after the old time cut (committed end - 0.1 s) but has no audio of its own: not a new word.
    la = LocalAgreement()
    seen = [
        (1.5, [("And", 0.0, 0.76), ("so", 0.76, 1.04), ("my", 1.04, 1.42), ("fella", 1.42, 1.48)]),
        (1.8, [("And", 0.0, 0.76), ("so", 0.76, 1.04), ("my", 1.04, 1.40), ("fellow", 1.40, 1.78), ("men", 1.78, 1.78)]),
        (2.1, [("And", 0.0, 0.76), ("so", 0.76, 1.04), ("am", 1.04, 1.42), ("I", 1.42, 1.42), ("fellow", 1.42, 1.76),
               ("America", 1.76, 2.08)]),
        (2.4, [("And", 0.0, 0.76), ("so", 0.76, 1.04), ("am", 1.04, 1.42), ("I", 1.42, 1.42), ("fellow", 1.42, 1.76),
               ("Americans.", 1.76, 2.38)]),
    ]
    committed = [w.text for end, words in seen for w in la.insert([Word(a, b, t) for t, a, b in words], end)]
    assert committed + [w.text for w in la.flush()] == ["And", "so", "my", "fellow", "Americans."]


@pytest.mark.parametrize("make", [LocalAgreement, AlignAtt], ids=["local-agreement", "alignatt"])
@pytest.mark.parametrize("start, end", [(1.40, 1.48), (1.40, 1.45), (1.38, 1.44)])
def test_a_short_new_word_right_after_rewritten_committed_words_is_kept(make, start, end):
    # The same rewrite, but what follows the committed audio is a real word with audio of its own (40-80 ms of
    # it past the committed "my"): kept, by either policy (both skip committed words the same way).
    policy = make()
    first = [Word(0.0, 0.76, "And"), Word(0.76, 1.04, "so"), Word(1.04, 1.40, "my")]
    policy.insert(first, 2.0)
    assert [w.text for w in policy.insert(first, 2.5)] in (["And", "so", "my"], [])
    assert [w.text for w in policy.in_buffer] == ["And", "so", "my"]
    kept = policy.insert([Word(0.0, 0.76, "And"), Word(0.76, 1.04, "so"), Word(1.04, 1.40, "am"),
                          Word(start, end, "a"), Word(end, 1.9, "fellow")], 1.95)
    assert [w.text for w in kept + policy.flush()] == ["a", "fellow"]


def test_a_zero_long_word_after_the_seam_is_not_taken_for_committed_audio():
    # Only a word at the seam can be the committed audio heard again: one that DTW squeezed to nothing later on
    # ("a" at 1.60, after "fellow") is the hypothesis' own and stays.
    la = LocalAgreement()
    first = [Word(0.0, 0.76, "And"), Word(0.76, 1.04, "so"), Word(1.04, 1.40, "my")]
    la.insert(first, 2.0)
    la.insert(first, 2.5)
    la.insert([Word(0.0, 0.76, "And"), Word(0.76, 1.04, "so"), Word(1.04, 1.40, "am"), Word(1.40, 1.60, "fellow"),
               Word(1.60, 1.60, "a"), Word(1.60, 1.9, "man")], 3.0)
    assert [w.text for w in la.flush()] == ["fellow", "a", "man"]


def test_one_recurring_word_is_not_an_anchor():
    # Committed "that is that"; the next decode rewrites the last "that" as "than". "that" alone recurs 0.5 s
    # earlier: anchored there, "is than" would be committed a second time. Two words are the least anchor.
    la = LocalAgreement()
    first = [Word(3.9, 4.5, "that"), Word(4.5, 4.6, "is"), Word(4.6, 5.0, "that")]
    la.insert(first, buffer_end=6.0)
    assert [w.text for w in la.insert(first, buffer_end=6.5)] == ["that", "is", "that"]
    la.insert([Word(3.9, 4.5, "that"), Word(4.5, 4.6, "is"), Word(4.6, 5.0, "than"), Word(5.0, 5.3, "it")], 7.0)
    assert [w.text for w in la.flush()] == ["it"]


def test_flush_commits_tail_and_trim_forgets_old_words():
    la = LocalAgreement()
    la.insert(hyp(("x", 0.5), ("y", 1.0)))
    assert [w.text for w in la.flush()] == ["x", "y"]
    assert la.tail == [] and la.committed_end == 1.0
    la.trim(0.6)
    assert [w.text for w in la.in_buffer] == ["y"]


def test_alignatt_commits_words_the_attention_has_moved_past():
    policy = AlignAtt(frontier_s=0.5)
    # Buffer ends at 3.0: words ending by 2.5 are final, the rest waits.
    assert [w.text for w in policy.insert(hyp(("a", 1.0), ("b", 2.4), ("c", 2.8)), 3.0)] == ["a", "b"]
    assert [w.text for w in policy.tail] == ["c"]
    # One hypothesis is enough (no second one needed, unlike LocalAgreement-2); committed words are skipped.
    assert [w.text for w in policy.insert(hyp(("a", 1.0), ("b", 2.4), ("c", 2.8), ("d", 3.6)), 4.0)] == ["c"]
    # A word too close to the end stops the commit, even if later words would qualify by time.
    assert policy.insert(hyp(("a", 1.0), ("b", 2.4), ("c", 2.8), ("d", 4.2), ("e", 3.9)), 4.5) == []
    assert [w.text for w in policy.flush()] == ["d", "e"]


def test_words_from_segments_interpolates_by_characters():
    seg = dataclasses.make_dataclass("Seg", ["start", "end", "text"])
    words = words_from_segments([seg(1.0, 3.0, " ab abcdef ab"), seg(3.0, 9.0, "   ")], offset=10.0, limit=2.5)
    assert [w.text for w in words] == ["ab", "abcdef", "ab"]
    # Segment clamped to the 2.5 s of audio: 1.5 s over 10 characters.
    assert words[0].start == pytest.approx(11.0) and words[0].end == pytest.approx(11.3)
    assert words[1].end == pytest.approx(12.2) and words[2].end == pytest.approx(12.5)


def test_latency_report_follows_whisper_streaming_definition():
    from asr_app.streaming import StreamEvent

    w1, w2, w3 = Word(0.0, 1.0, "a"), Word(1.0, 2.0, "b"), Word(2.0, 3.5, "c")
    events = [StreamEvent("partial", "a", 0.0, 1.0, emitted_at=1.6, audio_received=1.5, words=[w1]),
              StreamEvent("commit", "a b", 0.0, 2.0, emitted_at=3.0, audio_received=2.5, words=[w1, w2]),
              StreamEvent("commit", "c", 2.0, 3.5, emitted_at=4.5, audio_received=4.0, words=[w3])]
    report = latency_report(events, audio_seconds=4.0, compute_seconds=2.0)
    # Per committed word: emission minus the word's end -> 2.0, 1.0, 1.0.
    assert report["words"] == 3 and report["first_partial_s"] == pytest.approx(0.6)
    assert report["finalization_p50_s"] == pytest.approx(1.0)
    assert report["finalization_p90_s"] == pytest.approx(1.8)
    assert report["audio_lag_p50_s"] == pytest.approx(0.5) and report["rtf"] == pytest.approx(0.5)


# -- the processor on real audio with the real decoder --------------------------------------


@pytest.fixture(scope="module")
def decoder(tiny_en_pair):
    from asr_app.decoding import SpeculativeDecoder

    return SpeculativeDecoder(tiny_en_pair, DecodingOptions(mode="exact"))


def run_stream(decoder, audio, options=StreamingOptions()):
    processor = StreamingProcessor(decoder, options)
    events = []
    for block in FileSource(audio, block_s=0.5, realtime=False):
        processor.insert_audio(block)
        events.extend(processor.process())
    events.extend(processor.finish())
    return processor, events


def test_stream_matches_offline_transcript_and_silence_adds_nothing(decoder):
    speech = load_audio(JFK_FLAC)  # 11 s
    rng = np.random.default_rng(1)
    silence = np.concatenate([np.zeros(SAMPLE_RATE), rng.normal(0, 1e-4, 4 * SAMPLE_RATE)]).astype(np.float32)
    offline = decoder.decode([speech])[0].text
    processor, events = run_stream(decoder, np.concatenate([speech, silence]), StreamingOptions(step_s=2.0))
    commits = [e for e in events if e.kind == "commit"]
    streamed = " ".join(e.text for e in commits)
    assert streamed == processor.committed_text
    assert jiwer.wer(normalise(offline), normalise(streamed)) <= 0.1, (offline, streamed)
    # Text became final while audio was still arriving, not only at finish().
    assert sum(e.audio_received < 11.0 for e in commits) >= 2
    # Events are ordered in emission time; committed words in audio time, all inside the speech
    # (the trailing silence added nothing).
    assert [e.emitted_at for e in events] == sorted(e.emitted_at for e in events)
    ends = [w.end for e in commits for w in e.words]
    assert ends == sorted(ends) and ends[-1] <= 11.0 + 0.3
    # Committed text never changes: each commit's words are exactly the next words of the final text.
    final_words = processor.committed_text.split()
    position = 0
    for e in commits:
        assert e.text.split() == final_words[position:position + len(e.words)]
        position += len(e.words)
    report = latency_report(events, processor.audio_seconds, sum(s.compute_s for s in processor.steps))
    assert report["words"] == len(final_words) and report["finalization_p50_s"] is not None
    assert max(s.buffer_end - s.buffer_start for s in processor.steps) <= 30.0
    # Once all speech was committed, silent steps were not decoded and the speech was dropped.
    assert processor.steps[-1].skipped_silence and processor.steps[-1].compute_s == 0.0
    assert processor.buffer_seconds <= 2.5


def test_long_stream_trims_buffer_at_committed_segments(decoder):
    clips = [load_audio(lj_clip(f"LJ001-{i:04d}")) for i in (1, 3)]
    gap = np.zeros(int(0.4 * SAMPLE_RATE), dtype=np.float32)
    audio = np.concatenate([clips[0], gap, clips[1]])  # about 19.7 s
    # Target-only decoding keeps this long test cheap; the speculative path is covered above.
    options = StreamingOptions(step_s=3.0, trim_s=6.0, decoding=DecodingOptions(mode="off"))
    processor, events = run_stream(decoder, audio, options)
    # The buffer was cut at committed segment ends, so it never held the whole stream,
    # and the text before the cut went to the decoder as prompt.
    assert any(s.buffer_start > 0 for s in processor.steps)
    assert max(s.buffer_end - s.buffer_start for s in processor.steps) < len(audio) / SAMPLE_RATE - 3.0
    assert any("the" in e.text.lower() for e in events if e.kind == "commit" and e.start > 8.0)
    reference = " ".join(lj_text(clip) for clip in ("LJ001-0001", "LJ001-0003"))
    assert jiwer.wer(normalise(reference), normalise(processor.committed_text)) <= 0.15, processor.committed_text


@pytest.mark.parametrize("mode", ["off", "exact"])
def test_reusing_the_previous_hypothesis_changes_compute_not_text(decoder, mode):
    # Each re-decode is offered the previous decode of the buffer as a hint; the decoder verifies it, so
    # every event is the same as without it (greedy), while the target scores the reused part in one call.
    # This clip is a hard case: from one decode to the next Whisper flips "Printing, in" / "printing in".
    audio = load_audio(lj_clip("LJ001-0001"))[: 6 * SAMPLE_RATE]
    runs = {}
    for reuse in (False, True):
        options = StreamingOptions(step_s=1.0, reuse_hypothesis=reuse, decoding=DecodingOptions(mode=mode))
        runs[reuse] = run_stream(decoder, audio, options)
    (plain, plain_events), (reused, reused_events) = runs[False], runs[True]
    assert [(e.kind, e.text, e.start, e.end) for e in plain_events] == \
        [(e.kind, e.text, e.start, e.end) for e in reused_events]
    assert plain.committed_text == reused.committed_text and len(plain.committed_text.split()) >= 10
    assert all(s.hint_tokens == 0 for s in plain.steps)
    plain_calls = sum(s.target_calls for s in plain.steps)
    reused_calls = sum(s.target_calls for s in reused.steps)
    if mode == "off":  # the hint is the only proposer: most tokens come from it
        assert sum(s.hint_accepted for s in reused.steps) >= 10
        assert reused_calls < 0.6 * plain_calls, (reused_calls, plain_calls)
    else:  # the draft proposes first; the hint only lengthens steps where the draft agrees with it
        assert sum(s.hint_accepted for s in reused.steps) >= 5
        assert reused_calls < plain_calls, (reused_calls, plain_calls)


def test_silence_yields_no_text(decoder):
    rng = np.random.default_rng(2)
    silence = np.concatenate([np.zeros(2 * SAMPLE_RATE), rng.normal(0, 1e-4, 3 * SAMPLE_RATE)]).astype(np.float32)
    processor, events = run_stream(decoder, silence)
    assert processor.committed_text == ""
    assert all(e.text == "" for e in events)
    assert processor.steps and all(s.skipped_silence for s in processor.steps)
    assert processor.buffer_seconds <= 1.5  # silent audio is not kept


def test_stream_word_times_come_from_cross_attention(decoder):
    """JFK's "my" ends near 1.4 s (transformers' word timestamps place it 1.38-1.44 s); segment interpolation
    put it seconds away."""
    processor, _ = run_stream(decoder, load_audio(JFK_FLAC), StreamingOptions(step_s=1.0))
    words = {w.text.strip(",.").lower(): w for w in processor.committed}
    assert abs(words["my"].end - 1.44) < 0.3 and abs(words["fellow"].start - 1.44) < 0.3
    assert abs(words["country"].end - 10.7) < 0.6


def test_alignatt_commits_sooner_with_the_same_text(decoder):
    audio = load_audio(lj_clip("LJ001-0001"))  # 10 s of dense read speech
    offline = decoder.decode([audio])[0].text
    runs = {}
    for policy in ("local-agreement", "alignatt"):
        processor, events = run_stream(decoder, audio, StreamingOptions(step_s=1.0, policy=policy))
        lags = [e.audio_received - w.end for e in events if e.kind == "commit" for w in e.words]
        runs[policy] = (processor.committed_text, float(np.median(lags)))
        assert jiwer.wer(normalise(offline), normalise(processor.committed_text)) <= 0.1, processor.committed_text
    # Audio-time lag of the policy alone (unpaced) at a 1 s step: one hypothesis instead of two agreeing
    # ones a step apart (at short steps, where hypotheses come back to back, LocalAgreement-2 catches up).
    assert runs["alignatt"][1] < runs["local-agreement"][1], runs


def test_settling_commits_sooner_after_large_steps_with_the_same_text(decoder):
    # A server that falls behind re-decodes seconds of new audio at once: steps of 3 s stand for one here
    audio = load_audio(lj_clip("LJ001-0001"))
    runs = {}
    for settle in (None, 1.5):
        processor, events = run_stream(decoder, audio, StreamingOptions(step_s=3.0, settle_s=settle))
        lags = [e.audio_received - w.end for e in events if e.kind == "commit" for w in e.words]
        runs[settle] = (normalise(processor.committed_text), float(np.median(lags)))
    assert runs[1.5][0] == runs[None][0], runs
    assert runs[1.5][1] < 0.85 * runs[None][1], runs   # the settled words a step sooner (3.2 -> 2.5 s here)


def test_sentence_lines_break_at_sentence_ends_and_pauses():
    from asr_app.cli.stream import SentenceLines

    lines = SentenceLines(pause_s=0.8, idle_s=0.8)
    words = [Word(0.0, 0.3, "Hello"), Word(0.3, 0.6, "there."), Word(0.7, 1.0, "How"), Word(1.0, 1.2, "are"),
             Word(2.5, 2.8, "you"), Word(2.8, 3.0, "today")]
    assert lines.add(words) == ["Hello there.", "How are"]  # sentence end, then a 1.3 s pause
    assert lines.idle(3.5, speech_pending=False) == []
    assert lines.idle(3.9, speech_pending=True) == []  # more words are on their way
    assert lines.idle(3.9, speech_pending=False) == ["you today"]
    assert lines.close() == []


# -- asr-stream --------------------------------------------------------------------------

MODEL_ARGS = ["--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR), "--device", "cpu"]


@pytest.fixture
def stream_cli(monkeypatch, decoder):
    from asr_app.cli import stream

    def from_args(args):  # reuse the loaded tiny.en, after checking the CLI asked for it
        assert args.target == str(TINY_EN_DIR) and args.mode == decoder.options.mode
        return decoder
    monkeypatch.setattr("asr_app.arguments.decoder_from_args", from_args)
    return stream


def test_asr_stream_jsonl_events(stream_cli, capsys):
    clip = lj_clip("LJ001-0002")  # "in being comparatively modern."
    assert stream_cli.main(["--simulate", str(clip), "--fast", "--jsonl", "--step", "1", *MODEL_ARGS]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {e["kind"] for e in events} <= {"commit", "partial"}
    committed = " ".join(e["text"] for e in events if e["kind"] == "commit")
    assert normalise(committed) == "in being comparatively modern"
    assert [e["emitted_at"] for e in events] == sorted(e["emitted_at"] for e in events)


def test_asr_stream_refuses_a_file_claiming_1_hz_in_one_line(stream_cli, capsys, tmp_path):
    """Read as 1 Hz, a second of audio would be resampled into 4.4 hours (it ran out of memory before)."""
    lying = tmp_path / "lying.wav"
    sf.write(str(lying), np.zeros(16_000, dtype=np.float32), 1)
    assert stream_cli.main(["--simulate", str(lying), "--fast", *MODEL_ARGS]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "sample rate 1 Hz is outside" in err and "Traceback" not in err


def test_asr_stream_ctrl_c_flushes_last_words(stream_cli, capsys, monkeypatch):
    class InterruptedSource(FileSource):
        """Ctrl-C arrives after 5 s of jfk.flac, while the words are still unconfirmed."""
        def __iter__(self):
            for block in super().__iter__():
                yield block
                if self._sent(block) >= 5.0:
                    raise KeyboardInterrupt

        def _sent(self, block):
            self.sent = getattr(self, "sent", 0.0) + block.size / SAMPLE_RATE
            return self.sent

    monkeypatch.setattr(stream_cli, "FileSource", InterruptedSource)
    status = stream_cli.main(["--simulate", str(JFK_FLAC), "--fast", "--plain", "--step", "2", *MODEL_ARGS])
    assert status == 0
    text = normalise(capsys.readouterr().out)
    # Everything said in the first 5 s is printed, including what was not yet agreed on.
    assert text.startswith("and so my fellow americans ask not") and "country can do for you" not in text


def test_asr_stream_piped_prints_one_line_per_sentence(stream_cli, capsys, tmp_path):
    import soundfile as sf

    clips = [load_audio(lj_clip("LJ001-0002")), np.zeros(SAMPLE_RATE, dtype=np.float32),
             load_audio(lj_clip("LJ001-0008"))]
    joined = tmp_path / "two.flac"
    sf.write(joined, np.concatenate(clips), SAMPLE_RATE)
    assert stream_cli.main(["--simulate", str(joined), "--fast", "--plain", "--policy", "alignatt", *MODEL_ARGS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines  # one line per sentence, not one per commit
    assert normalise(lines[0]) == "in being comparatively modern" and lines[0].endswith(".")
    assert normalise(lines[1]) == "has never been surpassed" and lines[1].endswith(".")


class PromptSilenced:
    """The real decoder, except that a decode given a prompt comes back judged silent (no-speech 0.99, low
    log-probability): what a prompt can talk Whisper into on a real buffer."""

    def __init__(self, decoder) -> None:
        self.decoder, self.prompted = decoder, 0

    pair = property(lambda self: self.decoder.pair)
    options = property(lambda self: self.decoder.options)

    def decode(self, audio, options=None, prompts=None, hints=None):
        results = self.decoder.decode(audio, options, prompts=prompts, hints=hints)
        for result, prompt in zip(results, prompts or [None] * len(results)):
            if prompt is not None:
                self.prompted += 1
                result.no_speech_prob, result.avg_logprob = 0.99, -2.0
        return results


def test_a_silent_judgement_is_checked_without_the_prompt_before_words_are_dropped(decoder):
    """Every prompted decode looks silent here; the processor decodes those buffers again without the prompt,
    so the speech after the first commit is still transcribed (without the retry it was dropped)."""
    speech = load_audio(JFK_FLAC)
    offline = decoder.decode([speech])[0].text
    silenced = PromptSilenced(decoder)
    # A short trim length: the buffer is cut after the first commits, so later decodes carry a prompt.
    processor, _ = run_stream(silenced, speech, StreamingOptions(step_s=2.0, trim_s=4.0))
    assert silenced.prompted >= 1 and processor.prompt_retries == silenced.prompted
    assert jiwer.wer(normalise(offline), normalise(processor.committed_text)) <= 0.15, processor.committed_text


def test_a_finished_stream_takes_a_late_chunk(decoder):
    speech = load_audio(JFK_FLAC)
    cut = 8 * SAMPLE_RATE
    processor, _ = run_stream(decoder, speech[:cut], StreamingOptions(step_s=2.0))
    before = processor.committed_text
    processor.resume()
    processor.insert_audio(speech[cut:])
    processor.finish()
    assert processor.committed_text.startswith(before) and "country" in processor.committed_text.lower()


def test_microphone_overflows_are_reported(capsys):
    from asr_app.cli.stream import report_overflows

    class Source:
        dropped_overflows = 3

    assert report_overflows(Source()) == 3 and "overflowed 3 time(s)" in capsys.readouterr().err
    assert report_overflows(object()) == 0 and capsys.readouterr().err == ""


class PromptRecorder:
    """The real decoder, recording every prompt it is given."""

    def __init__(self, decoder) -> None:
        self.decoder, self.prompts = decoder, []
        self.pair, self.options = decoder.pair, decoder.options

    def decode(self, audio, options=None, prompts=None, hints=None):
        self.prompts += list(prompts or [])
        return self.decoder.decode(audio, options, prompts=prompts, hints=hints)


def test_prompt_tokens_gives_every_long_enough_prompt_one_length(decoder):
    """With prompt_tokens = 8 the prompt is the last 8 tokens of the committed text (so sessions can share a
    batch); the transcript stays right."""
    speech = load_audio(JFK_FLAC)
    offline = decoder.decode([speech])[0].text
    recorder = PromptRecorder(decoder)
    options = StreamingOptions(step_s=2.0, trim_s=4.0, prompt_tokens=8)
    processor, _ = run_stream(recorder, speech, options)
    given = [p for p in recorder.prompts if p is not None]
    assert given and all(isinstance(p, list) and 1 <= len(p) <= 8 for p in given), given
    assert any(len(p) == 8 for p in given), given
    # A prompt is made from the committed words before the buffer (a prefix of the final ones): it must be
    # exactly the last 8 tokens of one such prefix's text, encoded as the decoder encodes a text prompt.
    tokenizer = decoder.pair.processor.tokenizer
    texts = [join_words(processor.committed[:k])[-options.prompt_chars:].strip()
             for k in range(1, len(processor.committed) + 1)]
    encoded = [tokenizer(" " + text, add_special_tokens=False)["input_ids"] for text in texts]
    for prompt in given:
        assert any(prompt == ids[-8:] for ids in encoded), tokenizer.decode(prompt)
    # ... and some prompt was cut from a longer text whose first 8 tokens differ from its last 8, so keeping
    # the first tokens instead of the last cannot pass.
    assert any(prompt == ids[-8:] != ids[:8] for prompt in given for ids in encoded), given
    committed = normalise(processor.committed_text)
    assert jiwer.wer(normalise(offline), committed) <= 0.15, processor.committed_text
    with pytest.raises(ValueError, match="prompt_tokens"):
        StreamingOptions(prompt_tokens=0)
