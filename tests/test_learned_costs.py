"""Greedy identity on the default gamma path: step costs measured on this machine, acceptance learned
across each decoder's decodes (conftest.py pins the costs for every other test; `learned_costs` unpins
them here). The gammas this path chooses depend on the machine's speed and on the decodes before, and
they must change no token: batch 1 (with and without timestamps, a distilled and a derived draft),
batch 3, and hints, each against the target-only tokens. In `exact` only: at T = 0 every speculative mode
verifies through one greedy function (kernels/api.py), so the gamma path is the same in each, and
test_decoding_greedy checks every mode on the pinned path.
"""

from __future__ import annotations

import pytest
from conftest import JFK_FLAC
from test_decoding_greedy import clips, derived_pair, load_clip, real_pair  # noqa: F401 (fixtures)

from asr_app.decoding import DecodingOptions, SpeculativeDecoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: a second thread only waits


@pytest.fixture(scope="module")
def references(real_pair, clips):  # noqa: F811
    """Target-only tokens of each clip (no gamma involved): without timestamps all three clips, with them the
    first two (jfk and the shortest LibriSpeech clip, as test_decoding_greedy's identity test)."""
    off = SpeculativeDecoder(real_pair)
    return {ts: [off.decode(clip, DecodingOptions(mode="off", timestamps=ts))[0].tokens for clip in clips[: 2 + (not ts)]]
            for ts in (False, True)}


@pytest.mark.parametrize("timestamps", [False, True])
def test_greedy_identity_at_batch_1(real_pair, derived_pair, clips, references, timestamps, learned_costs):  # noqa: F811
    distil, derived = SpeculativeDecoder(real_pair), SpeculativeDecoder(derived_pair)
    accepted = 0
    for i, clip in enumerate(clips[:2]):
        result = distil.decode(clip, DecodingOptions(mode="exact", timestamps=timestamps))[0]
        assert result.tokens == references[timestamps][i], i
        accepted += result.stats.accepted
        # the derived draft is mostly rejected: the learned policy drafts little, and must still agree
        assert derived.decode(clip, DecodingOptions(mode="exact", timestamps=timestamps))[0].tokens == \
            references[timestamps][i], (i, "derived")
    assert accepted > 0  # the distilled draft's tokens were used: the learned costs chose to draft
    learned_costs(distil)


def test_greedy_identity_at_batch_3(real_pair, clips, references, learned_costs):  # noqa: F811
    decoder = SpeculativeDecoder(real_pair)
    together = decoder.decode(clips, DecodingOptions(mode="exact"))
    assert [r.tokens for r in together] == references[False]
    learned_costs(decoder)


@pytest.fixture(scope="module")
def jfk_answers(real_pair):  # noqa: F811
    """The JFK clip cut at 10 s, its target-only tokens, and those of its first 9 s (timestamps on, as in
    streaming, where the previous decode of the buffer is the hint)."""
    off = SpeculativeDecoder(real_pair)
    audio = load_clip(JFK_FLAC)
    opts = DecodingOptions(mode="off", timestamps=True)
    return audio[: 10 * 16_000], off.decode(audio[: 10 * 16_000], opts)[0].tokens, \
        off.decode(audio[: 9 * 16_000], opts)[0].tokens


def test_hints_change_no_token(real_pair, clips, references, jfk_answers, learned_costs):  # noqa: F811
    audio, answer, previous = jfk_answers
    decoder = SpeculativeDecoder(real_pair)  # one decoder: what it learns carries from hint to hint
    hints = {"the answer": answer, "previous buffer": previous, "a prefix": answer[:10],
             "wrong at 2nd token": [answer[0], 500 if answer[1] != 500 else 501, *answer[2:]],
             "answer + junk": answer + [300] * 5, "junk": [300, 301, 302] * 9}
    opts = DecodingOptions(mode="exact", timestamps=True)
    for name, hint in hints.items():
        result = decoder.decode(audio, opts, hints=[hint])[0]
        assert result.tokens == answer, name
        assert result.stats.hint_accepted <= result.stats.hinted
    alone = references[False]  # a batch with hints of different lengths, one wrong early
    together = decoder.decode(clips, DecodingOptions(mode="exact"), hints=[alone[0], alone[1][:4],
                                                                          [alone[2][0], 999, 998]])
    assert [r.tokens for r in together] == alone
    learned_costs(decoder)
