"""Ragged batches (decoding/ragged.py): every row keeps all the drafts it accepted, and a batch's output is
each row's output alone. Also the runtime's per-row positions and the rules' per-row advance under it."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from conftest import DISTIL_DRAFT_DIR, TINY_EN_DIR
from scipy.stats import chi2_contingency
from test_decoding_greedy import clips, make_pair, tiny_target  # noqa: F401  (clips: a fixture)
from test_decoding_sampling import shaped_pair  # noqa: F401  (a fixture)

from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.decoding.loop import SpeculativeLoop
from asr_app.decoding.ragged import RaggedLoop
from asr_app.decoding.rules import RuleState, WhisperLogitRules
from asr_app.models import load_pair
from asr_app.runtime import DecoderRuntime
from asr_app.runtime.ops import visible_keys


@pytest.fixture(scope="module")
def decoders():
    pair = load_pair(target=str(TINY_EN_DIR), draft=str(DISTIL_DRAFT_DIR), device="cpu")
    return SpeculativeDecoder(pair), SpeculativeDecoder(pair, runtime=RuntimeOptions(ragged_batches=False))


def target_calls(results) -> int:
    return sum(r.stats.target_calls for r in results)


@pytest.mark.parametrize("timestamps", [False, True])
def test_rows_keep_their_own_drafts_and_decode_as_alone(decoders, clips, timestamps):  # noqa: F811
    ragged, lock_step = decoders
    assert ragged._loop_class(len(clips)) is RaggedLoop and lock_step._loop_class(len(clips)) is SpeculativeLoop
    assert ragged._loop_class(1) is SpeculativeLoop  # one row: nothing to be ragged about
    # exact only: at T = 0 every speculative mode verifies through one greedy function (kernels/api.py)
    opts = DecodingOptions(mode="exact", timestamps=timestamps, gamma=4)  # a fixed gamma: comparable call counts
    alone = [ragged.decode(c, opts)[0] for c in clips]
    together = ragged.decode(clips, opts)
    in_lock_step = lock_step.decode(clips, opts)
    assert [r.tokens for r in together] == [r.tokens for r in alone] == [r.tokens for r in in_lock_step]
    # each row needed as many target calls as alone; lock-step rows needed more (the fewest accepted won)
    assert [r.stats.target_calls for r in together] == [r.stats.target_calls for r in alone]
    assert target_calls(together) < target_calls(in_lock_step)


def test_rows_reach_the_length_limit_at_their_own_steps(decoders, clips):  # noqa: F811
    ragged, _ = decoders
    opts = DecodingOptions(mode="exact", max_new_tokens=5, gamma=3)
    alone = [ragged.decode(c, opts)[0].tokens for c in clips]
    assert all(len(t) == 5 for t in alone)  # every row stops at the limit, not at EOS
    assert [r.tokens for r in ragged.decode(clips, opts)] == alone


def second_tokens(decoder, features, mode: str, seeds, **options) -> tuple[list[int], list]:
    """The second sampled token of 400 rows per seed (T = 1), and the results."""
    tokens, results = [], []
    for seed in seeds:
        opts = DecodingOptions(mode=mode, temperature=1.0, seed=seed, max_new_tokens=3, **options)
        batch = decoder.decode_features(features.expand(400, -1, -1), opts)
        tokens += [r.tokens[1] for r in batch if len(r.tokens) >= 2]
        results += batch
    return tokens, results


def same_distribution(a: list[int], b: list[int]) -> float:
    """p-value of a two-sample chi-square test over the 8 commonest tokens and the rest."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    top = [t for t, _ in (ca + cb).most_common(8)]
    table = np.array([[c[t] for t in top] + [sum(v for t, v in c.items() if t not in top)] for c in (ca, cb)])
    return chi2_contingency(table)[1]


def test_sampled_ragged_rows_keep_the_target_distribution(shaped_pair):  # noqa: F811
    """At T = 1 with 2 drafts a step, a row's second token comes from the first step where it accepted a
    draft and from the second where it did not: ragged rows. Its distribution is still the target's."""
    pair, features = shaped_pair
    decoder = SpeculativeDecoder(pair)
    assert decoder._loop_class(400) is RaggedLoop
    speculative, results = second_tokens(decoder, features, "exact", range(2), gamma=2)
    assert any(r.stats.target_calls == 1 and len(r.tokens) >= 2 for r in results)  # second token in step 1
    assert any(r.stats.target_calls >= 2 for r in results)
    target_only, _ = second_tokens(decoder, features, "off", range(10, 12))
    assert same_distribution(speculative, target_only) > 1e-3
    # the draft's own second tokens differ clearly: the test has power
    draft_only, _ = second_tokens(SpeculativeDecoder(make_pair(pair.draft, pair.draft, pair.processor)), features,
                                  "off", range(20, 22))
    assert same_distribution(speculative, draft_only) < 1e-6


def test_per_row_positions_equal_each_row_alone():
    """Two rows whose caches hold 5 and 2 tokens, stepped together at per-row positions, give each row's
    hidden states stepped alone; padding written past a row's end is never seen."""
    torch.manual_seed(0)
    runtime = DecoderRuntime.from_model(tiny_target(), packed=False)
    encoder = torch.randn(2, 30, runtime.weights.d_model)
    histories = [torch.randint(0, 400, (1, 5)), torch.randint(0, 400, (1, 2))]
    new = torch.randint(0, 400, (2, 2))
    alone = []
    for i, history in enumerate(histories):
        state = runtime.new_state(encoder[i : i + 1])
        runtime.step(state, history)
        alone.append(runtime.step(state, new[i : i + 1]))
    state = runtime.new_state(encoder)
    for i, history in enumerate(histories):  # each row's prefix, written row by row, padded with junk
        row_state = runtime.new_state(encoder[i : i + 1])
        runtime.step(row_state, torch.cat([history, torch.randint(0, 400, (1, 5 - history.shape[1]))], dim=1))
        state.self_k[:, i], state.self_v[:, i] = row_state.self_k[:, 0], row_state.self_v[:, 0]
    positions = torch.tensor([[5, 6], [2, 3]])
    together = runtime.forward(state, new, positions, 7, visible_keys(positions, 7))
    torch.testing.assert_close(together[0], alone[0][0])
    torch.testing.assert_close(together[1], alone[1][0])


def test_rules_advance_each_row_by_its_own_count():
    gc = tiny_target().generation_config
    rules = WhisperLogitRules(gc, tiny_target().config.vocab_size, torch.device("cpu"), timestamps=True)
    ts = rules.timestamp_begin
    tokens = torch.tensor([[ts + 3, 400, ts + 9], [ts + 5, ts + 6, 401]])
    start = rules.advance(RuleState.initial(2, torch.device("cpu")), torch.tensor([[ts], [ts]]))
    both = rules.advance_rows(start, tokens, torch.tensor([1, 2]))
    for row, count in ((0, 1), (1, 2)):
        alone = rules.advance(start.select(torch.tensor([row])), tokens[row : row + 1, :count])
        assert bool(both.last_is_ts[row] == alone.last_is_ts[0])
        assert bool(both.penult_is_ts[row] == alone.penult_is_ts[0])
        assert int(both.last_ts[row]) == int(alone.last_ts[0])
