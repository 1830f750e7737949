"""Whisper's logit rules over several positions == transformers' processors applied prefix by prefix."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_EN_DIR, lj_clip
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    WhisperTimeStampLogitsProcessor,
)

from asr_app.decoding.gamma import (
    AcceptanceEstimate,
    AcceptanceMemory,
    CostAwareGamma,
    GammaPolicy,
    StepCosts,
    expected_tokens,
)
from asr_app.decoding.rules import RuleState, WhisperLogitRules


@pytest.fixture(scope="module")
def gc() -> GenerationConfig:
    return GenerationConfig.from_pretrained(TINY_EN_DIR)


def reference(gc, prompt_len, history, sequences, logits, timestamps):
    """transformers' processors on each position's prefix: position j sees prompt + tokens[:history + j]."""
    procs = [SuppressTokensAtBeginLogitsProcessor(gc.begin_suppress_tokens, prompt_len),
             SuppressTokensLogitsProcessor(gc.suppress_tokens)]
    if timestamps:
        procs.append(WhisperTimeStampLogitsProcessor(gc, begin_index=prompt_len))
    out = torch.empty_like(logits)
    for j in range(logits.shape[1]):
        ids = sequences[:, : prompt_len + history + j]
        scores = logits[:, j]
        for p in procs:
            scores = p(ids, scores)
        out[:, j] = scores
    return out


@pytest.mark.parametrize("timestamps", [False, True])
@pytest.mark.parametrize("history", [0, 1, 2, 5])
def test_rules_match_transformers_at_every_position(gc, timestamps, history):
    gen = torch.Generator().manual_seed(history)
    batch, positions, vocab = 6, 4, 51864
    ts_begin = gc.no_timestamps_token_id + 1
    prompt = torch.tensor([[gc.decoder_start_token_id]] * batch)
    # token streams mixing text and (non-decreasing) timestamps, so every pairing case occurs
    tokens = torch.randint(0, 1000, (batch, history + positions - 1), generator=gen)
    is_ts = torch.rand(tokens.shape, generator=gen) < 0.5
    stamps = ts_begin + torch.sort(torch.randint(0, 60, tokens.shape, generator=gen), dim=1).values
    tokens = torch.where(is_ts, stamps, tokens)
    sequences = torch.cat([prompt, tokens], dim=1)
    logits = torch.randn(batch, positions, vocab, generator=gen) * 3
    logits[:, :, ts_begin:] += 2.0  # make the "timestamps win" rule fire on some rows

    rules = WhisperLogitRules(gc, vocab, torch.device("cpu"), timestamps=timestamps)
    state = rules.advance(RuleState.initial(batch, torch.device("cpu")), tokens[:, :history])
    got = rules.apply(logits, state, tokens[:, history:])
    want = reference(gc, 1, history, sequences, logits, timestamps)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], want[~torch.isinf(want)])
    if timestamps:
        assert torch.isinf(got).sum() > torch.isinf(rules.suppress.apply(logits)).sum()


def test_gamma_heuristic_and_fixed():
    policy = GammaPolicy()
    assert policy.next(100) == 5
    policy.update(5, 5)
    assert policy.next(100) == 7
    policy.update(7, 2)
    assert policy.next(100) == 6
    assert policy.next(3) == 3  # capped by the length budget
    for _ in range(10):
        policy.update(policy.next(100), 0)
    assert policy.next(100) == 1
    fixed = GammaPolicy(3)
    fixed.update(3, 3)
    assert fixed.next(100) == 3 and fixed.next(0) == 0


def test_gamma_policies_learn_from_ragged_rows():
    # the heuristic schedule moves once per step, by the rows' mean; one move per row would swing it
    policy = GammaPolicy()
    policy.update_rows(5, [5, 5, 5, 4])   # mean 4.75 rounds to 5: every draft, as a step
    assert policy.next(100) == 7
    policy.update_rows(7, [7, 0, 0, 0])
    assert policy.next(100) == 6
    # the cost policy's acceptance sees each row's prefix: 3 rows that took all 4 drafts, one that took 1
    rows = CostAwareGamma(StepCosts(draft=0.1, target=1.0, per_token=0.02), AcceptanceEstimate(prior=0.5, weight=2))
    rows.update_rows(4, [4, 4, 4, 1])
    assert rows.acceptance.value == pytest.approx((1 + 13) / (2 + 13 + 1), rel=0.02)


def test_expected_tokens_matches_simulation():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75) and expected_tokens(1.0, 4) == 5 and expected_tokens(0.3, 0) == 1
    gen = torch.Generator().manual_seed(0)
    for alpha, gamma in ((0.6, 3), (0.9, 6)):
        accept = torch.rand((20_000, gamma), generator=gen) < alpha
        tokens = accept.int().cumprod(dim=1).sum(dim=1) + 1  # accepted prefix + the target's token
        assert tokens.float().mean().item() == pytest.approx(expected_tokens(alpha, gamma), rel=0.02)


def test_cost_aware_gamma_drafts_only_where_it_pays():
    cheap = StepCosts(draft=0.1, target=1.0, per_token=0.02)  # a GPU-like ratio: speculate deep
    assert CostAwareGamma(cheap, AcceptanceEstimate(prior=0.9)).best(100) >= 6
    assert CostAwareGamma(cheap, AcceptanceEstimate(prior=0.9)).best(2) == 2  # the length budget caps it
    cpu = StepCosts(draft=0.28, target=1.0, per_token=0.16)  # roughly this CPU's tiny.en pair: shallow
    assert 1 <= CostAwareGamma(cpu, AcceptanceEstimate(prior=0.8)).best(100) <= 3
    dear = StepCosts(draft=0.9, target=1.0, per_token=0.5)  # a draft as slow as the target: never pays
    policy = CostAwareGamma(dear, AcceptanceEstimate(prior=0.8))
    choices = [policy.next(100) for _ in range(CostAwareGamma.PROBE_EVERY)]
    assert choices[:-1] == [0] * (CostAwareGamma.PROBE_EVERY - 1) and choices[-1] == 1  # target-only, then a probe
    # acceptance is learned: a draft that keeps being rejected loses its steps
    learning = CostAwareGamma(cpu, AcceptanceEstimate(prior=0.8))
    before = learning.best(100)
    for _ in range(40):
        learning.update(before, 0)
    assert learning.acceptance.value < 0.3 and learning.best(100) == 0
    learning.update(0, 0)  # a target-only step teaches nothing
    assert learning.acceptance.value < 0.3


def test_decoder_measures_costs_and_picks_the_policy(tiny_en_pair, monkeypatch):
    from asr_app.decoding import DecodingOptions, SpeculativeDecoder
    from asr_app.decoding.costs import PINNED_ENV

    monkeypatch.delenv(PINNED_ENV)  # conftest pins them for repeatable tests: measure for real here
    decoder = SpeculativeDecoder(tiny_en_pair)
    costs = decoder.step_costs
    assert 0 < costs.draft < costs.target and costs.per_token >= 0
    assert decoder.step_costs is costs  # measured once
    monkeypatch.setenv(PINNED_ENV, "0.001,0.004,0.0005")
    assert SpeculativeDecoder(tiny_en_pair).step_costs == StepCosts(0.001, 0.004, 0.0005)
    monkeypatch.setenv(PINNED_ENV, "fast")
    with pytest.raises(ValueError, match=PINNED_ENV):
        _ = SpeculativeDecoder(tiny_en_pair).step_costs
    assert isinstance(decoder._gamma_policy(DecodingOptions(mode="exact"), True), CostAwareGamma)
    # a seeded sampled decode must not depend on timings: it keeps transformers' schedule
    assert isinstance(decoder._gamma_policy(DecodingOptions(mode="exact", temperature=0.5), True), GammaPolicy)
    assert isinstance(decoder._gamma_policy(DecodingOptions(mode="exact", gamma_policy="heuristic"), True),
                      GammaPolicy)
    with pytest.raises(ValueError, match="gamma_policy"):
        DecodingOptions(gamma_policy="fastest")


def test_acceptance_memory_follows_every_step_more_slowly():
    costs = StepCosts(draft=0.28, target=1.0, per_token=0.16)
    memory = AcceptanceMemory()
    policy = CostAwareGamma(costs, AcceptanceEstimate(prior=memory.value), memory)
    for _ in range(10):
        policy.update(3, 3)  # every draft accepted
    learned = memory.value
    assert AcceptanceEstimate.PRIOR < learned < policy.acceptance.value
    policy.update(0, 0)  # a target-only step teaches neither
    assert memory.value == learned
    alone = CostAwareGamma(costs, AcceptanceEstimate())  # without a memory: its own, as before
    alone.update(3, 0)
    assert alone.memory is not memory and alone.acceptance.value < AcceptanceEstimate.PRIOR


def test_short_decodes_still_probe_after_the_remembered_acceptance_collapsed():
    """A remembered acceptance too low to draft: decodes shorter than the probe interval must still probe
    between them, or the decoder would decode target-only for good."""
    costs, memory = StepCosts(draft=0.28, target=1.0, per_token=0.16), AcceptanceMemory()
    for _ in range(200):
        memory.estimate.update(3, 0)
    choices = []
    for _ in range(2 * CostAwareGamma.PROBE_EVERY // 5 + 1):  # short decodes of 5 steps, each a new policy
        policy = CostAwareGamma(costs, AcceptanceEstimate(prior=memory.value), memory)
        choices += [policy.next(100) for _ in range(5)]
    assert choices.count(1) >= 2 and set(choices) == {0, 1}


def test_a_decode_starts_from_the_acceptance_of_the_decodes_before_it(tiny_en_pair, monkeypatch):
    from asr_app.audio import load_audio
    from asr_app.decoding import DecodingOptions, SpeculativeDecoder
    from asr_app.decoding.costs import PINNED_ENV

    audio, greedy = load_audio(lj_clip("LJ001-0002")), DecodingOptions(mode="exact")
    pinned = SpeculativeDecoder(tiny_en_pair)  # conftest pins the costs: every decode starts from the prior
    text = pinned.decode(audio, greedy)[0].text
    assert pinned._gamma_policy(greedy, True).acceptance.value == AcceptanceEstimate.PRIOR
    monkeypatch.delenv(PINNED_ENV)
    decoder = SpeculativeDecoder(tiny_en_pair)
    decoder._step_costs = StepCosts(0.0019, 0.0067, 0.00105)  # the pinned figures, without pinning the prior
    first = decoder._gamma_policy(greedy, True)
    assert first.acceptance.value == AcceptanceEstimate.PRIOR and first.memory is decoder._acceptance_memory
    result = decoder.decode(audio, greedy)[0]
    assert result.stats.drafted > 0 and result.text == text  # other gammas, the same tokens
    learned = decoder._acceptance_memory.value
    assert learned != AcceptanceEstimate.PRIOR
    assert decoder._gamma_policy(greedy, True).acceptance.value == learned


def test_decoding_stats_add_up():
    from asr_app.decoding.options import DecodingStats

    a = DecodingStats("exact", True, tokens_out=10, target_calls=4, drafted=8, accepted=6, total_s=1.0,
                      verify_steps=[(3, 0.1)])
    b = DecodingStats("exact", True, tokens_out=5, target_calls=2, drafted=2, accepted=1, total_s=0.5)
    total = DecodingStats.total([a, b])
    assert (total.tokens_out, total.target_calls, total.drafted, total.accepted, total.windows) == (15, 6, 10, 7, 2)
    assert total.acceptance_rate == pytest.approx(0.7) and total.mean_accepted_per_step == pytest.approx(7 / 6)
    assert total.total_s == pytest.approx(1.5) and total.verify_steps == [(3, 0.1)]
    off = DecodingStats.total([DecodingStats("off", False, tokens_out=3, target_calls=3)])
    assert off.acceptance_rate is None and off.mean_accepted_per_step is None  # nothing drafted: no rate
    with pytest.raises(ValueError):
        DecodingStats.total([])
