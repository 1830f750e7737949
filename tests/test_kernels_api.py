"""The verification API: baseline against transformers itself, greedy decoding paths, the draft's
distribution, and clear errors for bad input."""

from __future__ import annotations

import pytest
import torch

from asr_app.kernels import VerifyResult, draft_probs_from_logits, verify
from asr_app.kernels.baseline import transformers_speculative_sampling
from asr_app.kernels.greedy import verify_greedy_triton

VOCAB = 51864


def baseline_case(gamma: int, seed: int):
    gen = torch.Generator().manual_seed(1000 + seed)
    target = torch.randn(1, gamma + 1, VOCAB, generator=gen) * 2.0
    target[..., :100] = float("-inf")  # suppressed tokens, as Whisper's rules produce
    draft = target[:, :gamma] + torch.randn(1, gamma, VOCAB, generator=gen) * (0.2 + 0.2 * (seed % 3))
    draft_tokens = torch.multinomial(torch.softmax(draft[0], dim=-1), 1, generator=gen).T
    return target, draft, draft_tokens


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_baseline_equals_transformers_speculative_sampling(gamma, temperature):
    outcomes = set()
    for seed in range(8):
        target, draft, draft_tokens = baseline_case(gamma, seed)
        prompt = torch.tensor([[50257, 50362]])  # transformers takes prompt + candidates
        torch.manual_seed(seed)
        hf_tokens, hf_n = transformers_speculative_sampling(
            torch.cat([prompt, draft_tokens], dim=1), draft * (1.0 / temperature), gamma,
            target * (1.0 / temperature))
        num_draft = torch.tensor([gamma])
        torch.manual_seed(seed)  # same global random state ...
        ours = verify(target, draft, draft_tokens, num_draft, "baseline", temperature)
        # ... or the same state in an explicit generator
        ours_gen = verify(target, draft, draft_tokens, num_draft, "baseline", temperature,
                          generator=torch.Generator().manual_seed(seed))
        n = int(hf_n)
        for result in (ours, ours_gen):
            assert int(result.num_accepted[0]) == n
            assert result.tokens[0, : n + 1].tolist() == hf_tokens[0].tolist()
            assert result.tokens[0, n + 1 :].tolist() == [-1] * (gamma - n)
        outcomes.add(n == gamma)
    assert outcomes == {True, False}, "the seeds must cover both a rejection and a full acceptance"


class ToyTarget:
    """A deterministic 'language model': the next-token logits depend on the previous token."""

    def __init__(self, vocab: int, seed: int):
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 3.0

    def logits(self, previous: torch.Tensor) -> torch.Tensor:
        return self.table[previous]

    def greedy_path(self, start: int, length: int) -> list[int]:
        path, token = [], start
        for _ in range(length):
            token = int(self.table[token].argmax())
            path.append(token)
        return path


def speculative_greedy_decode(verify_fn, target: ToyTarget, draft: ToyTarget, starts: list[int], length: int,
                              gamma: int) -> list[list[int]]:
    """A miniature speculative loop: the draft proposes greedily, ``verify_fn`` decides."""
    sequences = [[s] for s in starts]
    while min(len(s) for s in sequences) < length + 1:
        proposals = []
        for seq in sequences:
            token, proposal = seq[-1], []
            for _ in range(gamma):
                token = int(draft.table[token].argmax())
                proposal.append(token)
            proposals.append(proposal)
        draft_tokens = torch.tensor(proposals)
        previous = torch.tensor([[seq[-1]] + prop for seq, prop in zip(sequences, proposals)])
        target_logits = target.logits(previous)  # [B, g+1, V]
        draft_logits = draft.logits(previous[:, :gamma])
        remaining = torch.tensor([max(0, min(gamma, length + 1 - len(s) - 1)) for s in sequences])
        result: VerifyResult = verify_fn(target_logits, draft_logits, draft_tokens, remaining)
        for b, seq in enumerate(sequences):
            n = int(result.num_accepted[b])
            if len(seq) < length + 1:
                seq.extend(result.tokens[b, : n + 1].tolist())
    return [s[1 : length + 1] for s in sequences]


@pytest.mark.parametrize("how", ["greedy", "exact-t0", "sigmoid-t0", "triton"])
def test_greedy_verification_reproduces_the_target_argmax_path(how):
    vocab, gamma, length = 64, 4, 24
    target = ToyTarget(vocab, seed=0)
    draft = ToyTarget(vocab, seed=0)
    draft.table = target.table + 2.5 * torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1))
    if how == "triton":
        def verify_fn(t, d, x, n):
            return verify_greedy_triton(t, x, n)
    else:
        mode, temperature = {"greedy": ("greedy", 1.0), "exact-t0": ("exact", 0.0),
                             "sigmoid-t0": ("sigmoid", 0.0)}[how]

        def verify_fn(t, d, x, n):
            return verify(t, d, x, n, mode=mode, temperature=temperature)

    starts = [3, 17, 40]
    got = speculative_greedy_decode(verify_fn, target, draft, starts, length, gamma)
    assert got == [target.greedy_path(s, length) for s in starts]


def test_draft_probs_are_the_distributions_verify_assumes():
    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(0)) * 4
    logits[..., 7] = float("-inf")
    soft = draft_probs_from_logits(logits.half(), "exact", temperature=0.5)
    assert soft.dtype == torch.float32
    torch.testing.assert_close(soft, torch.softmax(logits.half().float() * 2.0, dim=-1))
    assert torch.equal(draft_probs_from_logits(logits, "baseline", 0.5), draft_probs_from_logits(logits, "exact", 0.5))
    # Sigmoid mode's draft samples from its own softmax (the paper's scheme); alpha/beta do not change q.
    sig = draft_probs_from_logits(logits, "sigmoid", 1.0, alpha=-5.0, beta=5.0)
    torch.testing.assert_close(sig, torch.softmax(logits, dim=-1))
    greedy = draft_probs_from_logits(logits, "greedy")
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1)) and torch.equal(greedy.sum(-1), torch.ones(2, 3))
    for probs in (soft, sig, greedy):
        assert bool((probs[..., 7] == 0).all())
        torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3))


def good_inputs(gamma: int = 3, vocab: int = 11):
    return (torch.randn(2, gamma + 1, vocab), torch.randn(2, gamma, vocab),
            torch.zeros(2, gamma, dtype=torch.int64), torch.tensor([gamma, 1]))


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a: {"mode": "fast"}, "unknown verification mode 'fast'"),
        (lambda a: {"temperature": -1.0}, "temperature must be a finite number >= 0"),
        (lambda a: {"mode": "sigmoid", "alpha": 2.0, "beta": 1.0}, "alpha < beta"),
        (lambda a: {"target_logits": a[0][0]}, "target_logits must be [B, g+1, V]"),
        (lambda a: {"draft_logits": a[1][:, :2]}, "draft_logits must be [B, g, V]"),
        (lambda a: {"draft_tokens": a[2][:, :1]}, "draft_tokens must be [B, g]"),
        (lambda a: {"num_draft": a[3][:1]}, "num_draft must be [B]"),
        (lambda a: {"target_logits": a[0].double()}, "target_logits must be float16, bfloat16 or float32"),
        (lambda a: {"draft_tokens": a[2].float()}, "draft_tokens must be an integer tensor"),
        (lambda a: {"num_draft": torch.tensor([4, 0])}, "num_draft values must lie in [0, g=3]"),
        (lambda a: {"draft_tokens": torch.full((2, 3), 11)}, "draft_tokens used by num_draft must lie in [0, V=11)"),
        (lambda a: {"draft_tokens": [[0, 0, 0]] * 2}, "draft_tokens must be a torch.Tensor"),
    ],
)
def test_bad_input_gets_a_clear_error(change, message):
    args = good_inputs()
    kwargs = dict(zip(("target_logits", "draft_logits", "draft_tokens", "num_draft"), args))
    kwargs.update(change(args))
    with pytest.raises(ValueError) as info:
        verify(**kwargs)
    assert message in str(info.value)


def test_generator_on_the_wrong_device_is_refused():
    fake_cuda_generator = type("FakeGenerator", (), {"device": torch.device("cuda")})()
    with pytest.raises(ValueError, match="generator is on cuda"):
        verify(*good_inputs(), generator=fake_cuda_generator)


def test_unused_draft_slots_may_hold_padding():
    target, draft, tokens, _ = good_inputs()
    tokens[1, 1:] = -1  # row 1 uses one draft; the rest is padding
    for mode in ("baseline", "exact", "sigmoid", "greedy"):
        result = verify(target, draft, tokens, torch.tensor([3, 1]), mode=mode, alpha=-4.0, beta=4.0,
                        generator=torch.Generator().manual_seed(0))
        assert result.tokens.shape == (2, 4) and int(result.num_accepted[1]) <= 1
        assert bool((result.tokens[1, 2:] == -1).all())
