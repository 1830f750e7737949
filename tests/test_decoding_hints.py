"""Hints (expected output tokens, e.g. the previous decode of a growing streaming buffer).

A hint only changes how many target calls a decode takes: greedy tokens are the same whatever the hint
(right, partly right, wrong, longer than the output), and at T > 0 the first token is still distributed
as the target's, whether the hint proposes its likeliest token or an unlikely one.
"""

from __future__ import annotations

import pytest
from conftest import JFK_FLAC
from scipy.stats import chisquare
from test_decoding_greedy import clips, load_clip, real_pair  # noqa: F401 (fixtures)
from test_decoding_sampling import TOP, bucket_counts, bucket_probs, first_token_probs, shaped_pair  # noqa: F401

from asr_app.decoding import DecodingOptions, SpeculativeDecoder


@pytest.fixture(scope="module")
def jfk_cases(real_pair):  # noqa: F811
    """The JFK clip cut at 9 s and 10 s, and the decode of each (timestamps on, as in streaming)."""
    decoder = SpeculativeDecoder(real_pair)
    audio = load_clip(JFK_FLAC)
    opts = DecodingOptions(mode="off", timestamps=True)
    shorter = decoder.decode(audio[: 9 * 16_000], opts)[0]
    longer = decoder.decode(audio[: 10 * 16_000], opts)[0]
    return decoder, audio[: 10 * 16_000], shorter.tokens, longer.tokens


# off and exact: at T = 0 every speculative mode verifies through one greedy function (kernels/api.py), so
# baseline and sigmoid would run the same code again (tests/test_decoding_greedy.py checks all three).
@pytest.mark.parametrize("mode", ["off", "exact"])
def test_greedy_tokens_do_not_depend_on_the_hint(jfk_cases, mode):
    decoder, audio, previous, answer = jfk_cases
    opts = DecodingOptions(mode=mode, timestamps=True)
    plain = decoder.decode(audio, opts)[0]
    assert plain.tokens == answer and plain.stats.hint_steps == 0
    wrong_second = [answer[0], 500 if answer[1] != 500 else 501, *answer[2:]]
    calls = plain.stats.target_calls
    cases = {  # name: (hint, most target calls it may take, fewest hint tokens it must contribute)
        "the answer": (answer, 1, 1),          # one call scores it all and adds EOS
        "answer + junk": (answer + [300] * 5, 1, 1),
        "previous buffer": (previous, calls - 1, 1),
        # one wrong token: the output realigns with the hint after it, and the rest is reused
        "wrong at 2nd token": (wrong_second, 3, 1),
        "a prefix": (answer[:10], calls, 1),
        "junk": ([300, 301, 302] * 9, calls, 0),  # a useless hint costs no extra target call
    }
    for name, (hint, most_calls, fewest_kept) in cases.items():
        res = decoder.decode(audio, opts, hints=[hint])[0]
        assert res.tokens == answer, (mode, name)
        st = res.stats
        assert st.target_calls <= most_calls and st.hint_accepted >= fewest_kept, (mode, name, st)
        assert st.hint_steps <= 8 and st.hint_accepted <= st.hinted
        # the draft model's statistics do not count hint tokens
        assert st.accepted <= st.drafted
    if mode == "off":  # no draft model: the hint is the whole proposal, so its counts are exact
        assert decoder.decode(audio, opts, hints=[answer[:10]])[0].stats.hint_accepted == 10
    else:  # the draft proposes first and the hint continues where the drafts agree with it
        res = decoder.decode(audio, opts, hints=[answer])[0]
        assert res.stats.accepted + res.stats.hint_accepted == len(answer) and res.stats.accepted >= 1
        # eagerly on a CPU the draft stops after one token that agrees with the hint: the hint does the rest
        assert res.stats.drafted == 1 and res.stats.target_calls == 1


def test_hints_in_a_batch_and_errors(real_pair, clips):  # noqa: F811
    decoder = SpeculativeDecoder(real_pair)
    for mode in ("off", "exact"):
        opts = DecodingOptions(mode=mode)
        alone = [decoder.decode(c, opts)[0].tokens for c in clips]
        # rows finish at different steps; hints of different lengths, one of them wrong early
        hints = [alone[0], alone[1][:4], [alone[2][0], 999, 998]]
        together = decoder.decode(clips, opts, hints=hints)
        assert [r.tokens for r in together] == alone, mode
        if mode == "off":  # (with a draft, a hint is used only where every row's drafts agree with it)
            assert all(r.stats.hint_steps >= 1 for r in together)
        # a row without a hint: the others still decode right (hints are then not used)
        mixed = decoder.decode(clips, opts, hints=[alone[0], None, alone[2]])
        assert [r.tokens for r in mixed] == alone and all(r.stats.hint_steps == 0 for r in mixed)
    with pytest.raises(ValueError, match="hints for"):
        decoder.decode(clips, hints=[[1, 2]])
    with pytest.raises(ValueError, match="token ids must lie"):
        decoder.decode(clips[0], hints=[[1, decoder.vocab]])


@pytest.mark.parametrize("mode", ["off", "exact"])
def test_sampling_with_a_hint_keeps_the_target_distribution(shaped_pair, mode):  # noqa: F811
    pair, features = shaped_pair
    p = bucket_probs(first_token_probs(pair.target, features))
    decoder = SpeculativeDecoder(pair)
    rows, rounds = 400, 2
    for hinted in (int(TOP[0]), int(TOP[7])):  # the target's likeliest token, and one it rarely picks
        tokens = []
        for seed in range(rounds):
            opts = DecodingOptions(mode=mode, temperature=1.0, seed=seed, max_new_tokens=2)
            tokens += [r.tokens[0] for r in decoder.decode_features(features.expand(rows, -1, -1), opts,
                                                                   hints=[[hinted]] * rows)]
        counts = bucket_counts(tokens)
        n = counts.sum()
        assert chisquare(counts, p * n).pvalue > 1e-3, (mode, hinted)
        # power: the target gives no token more than half the mass (shaped_pair), so a decoder that took
        # the hint as given would fail the test above and this one
        assert counts[TOP.tolist().index(hinted)] < 0.6 * n


def test_hint_tracker_realigns_after_a_changed_token():
    from asr_app.decoding.hints import HintTracker

    # case flip / substitution: " Printing" (7) for " printing" (1); the hint goes on after the next token
    tracker = HintTracker([[0, 1, 2, 3, 4, 5]])
    tracker.advance(0, [0])
    assert tracker.proposals() == [[1, 2, 3, 4, 5]]
    tracker.advance(0, [7])
    assert tracker.proposals() == [[]]  # lost: 7 is nowhere in the hint
    tracker.advance(0, [2])
    assert tracker.proposals() == [[3, 4, 5]]
    # an inserted token (a comma, 9): the token after it is found in the hint
    tracker = HintTracker([[0, 1, 2, 3, 4, 5]])
    tracker.advance(0, [0, 1, 9])
    assert tracker.proposals() == [[]]
    tracker.advance(0, [2])
    assert tracker.proposals() == [[3, 4, 5]]
    # a dropped token: the output skips 2 and goes on with 3
    tracker = HintTracker([[0, 1, 2, 3, 4, 5]])
    tracker.advance(0, [0, 1, 3])
    assert tracker.proposals() == [[4, 5]]
    # the bigram wins over a nearer unigram; matches far from the expected place are ignored
    tracker = HintTracker([[5, 6, 1, 2, 1, 3]])
    tracker.advance(0, [5, 6, 9, 2, 1])
    assert tracker.proposals() == [[3]]
    far = HintTracker([[8] + list(range(10, 40)) + [3, 4]])
    far.advance(0, [8, 99, 3])  # 3 is in the hint, but 29 tokens later than expected
    assert far.proposals() == [[]]
    # rows are tracked separately and dropped with their batch row
    two = HintTracker([[1, 2, 3], [4, 5, 6]])
    two.advance(0, [1])
    two.advance(1, [4, 5])
    assert two.proposals() == [[2, 3], [6]]
    two.keep_rows([1])
    assert two.proposals() == [[6]]
