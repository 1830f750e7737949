"""Tests for gaps the mutation check found (tools/mutation_check.py, docs/decoding.md "Mutation check").

Each test names the mutant it kills; all are fast (no checkpoint is read: one builds a tiny random Whisper).
"""

from __future__ import annotations

import torch
from test_decoding_greedy import processor  # noqa: F401 (fixture)

from asr_app.kernels import draw_randomness, verify
from asr_app.kernels.exact import verify_exact_torch, verify_exact_triton

NEG_INF = float("-inf")


def test_baseline_row_that_accepted_every_draft_draws_its_bonus_from_p():
    """baseline-resid-on-accepted-rows: in a batch where another row was rejected, a row that accepted
    every draft still draws the token after them from p, not from a residual."""
    trials, vocab = 4_000, 8
    target = torch.full((2 * trials, 2, vocab), NEG_INF)
    draft = torch.full((2 * trials, 1, vocab), NEG_INF)
    target[:, 0, 0] = 0.0        # p at the drafted id 0: 1 on the even rows ...
    target[1::2, 0, 0] = NEG_INF  # ... 0 on the odd rows, which reject it
    target[1::2, 0, 1] = 0.0
    draft[:, 0, 0] = 0.0          # q one-hot at id 0
    target[:, 1, 0] = target[:, 1, 1] = 0.0  # the bonus row: ids 0 and 1, half each
    tokens = torch.zeros((2 * trials, 1), dtype=torch.int64)
    result = verify(target, draft, tokens, torch.ones(2 * trials, dtype=torch.int64), "baseline", 1.0,
                    generator=torch.Generator().manual_seed(0))
    assert result.num_accepted[0::2].eq(1).all() and result.num_accepted[1::2].eq(0).all()
    share_of_id0 = float(result.tokens[0::2, 1].eq(0).double().mean())
    assert 0.45 < share_of_id0 < 0.55, share_of_id0


def test_exact_kernel_draws_the_same_tokens_after_a_constant_logit_shift():
    """exact-triton-target-rows-off-by-one, exact-triton-target-live-off-by-one: the row after the last draft
    must be normalised by its own log-sum-exp. Without it the kernel draws from exp(z) unnormalised, which
    the inverse CDF forgives until exp overflows (logits around 100, or a low temperature): softmax does not
    change when every logit moves by a constant, and neither may the tokens."""
    gen = torch.Generator().manual_seed(4)
    target = torch.randn(3, 4, 37, generator=gen) * 2.0
    draft = target[:, :3].clone()  # q = p: every draft accepted, the next token comes from row num_draft
    tokens = torch.multinomial(torch.softmax(draft.reshape(-1, 37), -1), 1, generator=gen).reshape(3, 3)
    nd = torch.tensor([3, 0, 2])
    rnd = draw_randomness(3, 3, torch.device("cpu"), gen)
    expected = verify_exact_torch(target, draft, tokens, nd, rnd)
    assert expected.num_accepted.tolist() == [3, 0, 2]
    for shift in (100.0, -120.0):
        want = verify_exact_torch(target + shift, draft + shift, tokens, nd, rnd)
        got = verify_exact_triton(target + shift, draft + shift, tokens, nd, rnd)
        assert torch.equal(want.num_accepted, expected.num_accepted), shift
        assert torch.equal(got.num_accepted, want.num_accepted), shift
        assert torch.equal(got.tokens, want.tokens), (shift, got.tokens, want.tokens)


def test_captured_prompt_step_applies_the_first_token_rules(processor):  # noqa: F811
    """steps-first-step-rules-state: with graphs (emulated here) the prompt's target step is
    ``Steps.first_step``, which the eager CPU loop never runs; it must apply the first-token rules too
    (timestamps on: the first token is a timestamp), so emulated graphs give the eager tokens."""
    from test_decoding_greedy import FULL_VOCAB, JFK_FLAC, load_clip, make_pair, perturbed_copy, tiny_target

    from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder

    target = tiny_target(source_positions=25)
    pair = make_pair(target, perturbed_copy(target, scale=0.3, seed=1), processor)
    features = processor.feature_extractor(load_clip(JFK_FLAC)[:8000], sampling_rate=16_000,
                                           return_tensors="pt").input_features[..., :50]
    opts = DecodingOptions(mode="exact", timestamps=True, max_new_tokens=6)
    eager = SpeculativeDecoder(pair, runtime=FULL_VOCAB).decode_features(features, opts)[0]
    emulated = SpeculativeDecoder(pair, runtime=RuntimeOptions(draft_vocab=None, cuda_graphs="emulate"))
    assert eager.tokens[0] > target.generation_config.no_timestamps_token_id
    assert emulated.decode_features(features, opts)[0].tokens == eager.tokens
