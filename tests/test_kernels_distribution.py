"""Distribution preservation of the sampled verification modes (PyTorch implementations).

For ``baseline`` and ``exact`` the first emitted token must follow the target distribution p for
any draft distribution q, checked with a chi-square goodness-of-fit test over many independent
trials (vectorised as one large batch) and fixed seeds. The Triton kernels return the same tokens
as the ``exact``/``sigmoid`` references given the same random numbers (test_kernels_identity.py),
so these results carry over to them. ``sigmoid`` is not exact: its empirical distribution must
match the closed form implied by its rules (residual over the ids the draft scores, the target's
softmax after the accepted drafts), its total-variation distance to p is recorded, and each sigmoid
test also checks that it rejects the rules sigmoid mode had before (normalised p_hat for the token
after the accepted drafts, a residual over every id).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from asr_app.kernels import draft_probs_from_logits, draw_randomness, verify
from asr_app.kernels.exact import verify_exact_torch
from asr_app.kernels.sigmoid import verify_sigmoid_torch

VOCAB = 16
NEG_INF = float("-inf")


def adversarial_pairs() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(target logits, draft logits) over VOCAB tokens, chosen to stress the correction step."""
    gen = torch.Generator().manual_seed(1234)
    p = torch.randn(VOCAB, generator=gen) * 1.5
    disjoint_p = p.clone()
    disjoint_p[VOCAB // 2 :] = NEG_INF
    disjoint_q = torch.randn(VOCAB, generator=gen)
    disjoint_q[: VOCAB // 2] = NEG_INF
    one_hot_q = torch.full((VOCAB,), NEG_INF)
    one_hot_q[3] = 0.0
    zeros_p = p.clone()
    zeros_p[[0, 5, 6, 11]] = NEG_INF
    peaked_q = p.clone()
    peaked_q[5] += 4.0  # the draft loves a token the target forbids
    return {
        "disjoint-support": (disjoint_p, disjoint_q),
        "one-hot-q": (p, one_hot_q),
        "q-close-to-p": (p, p + 0.05 * torch.randn(VOCAB, generator=gen)),
        "p-with-zeros": (zeros_p, peaked_q),
        "unrelated": (p, torch.randn(VOCAB, generator=gen) * 2.0),
    }


def run_trials(mode: str, target_row, draft_row, trials: int, gamma: int, temperature: float, seed: int,
               alpha: float = -1e3, beta: float = 1e3, column: int | None = 0) -> torch.Tensor:
    """First emitted token of ``trials`` independent verification steps (one batch of that size);
    ``column=None``: every emitted token, [trials, g+1] (-1 after the row's last)."""
    gen = torch.Generator().manual_seed(seed)
    target = target_row.expand(trials, gamma + 1, VOCAB)
    draft = draft_row.expand(trials, gamma, VOCAB)
    q = draft_probs_from_logits(draft_row, mode, temperature, alpha, beta)
    tokens = torch.multinomial(q, trials, replacement=True, generator=gen).T.contiguous()  # [trials, g]
    num_draft = torch.full((trials,), gamma, dtype=torch.int64)
    if mode == "baseline":
        result = verify(target, draft, tokens, num_draft, "baseline", temperature, generator=gen)
    else:
        rnd = draw_randomness(trials, gamma, torch.device("cpu"), gen)
        if mode == "exact":
            result = verify_exact_torch(target, draft, tokens, num_draft, rnd, temperature)
        else:
            result = verify_sigmoid_torch(target, draft, tokens, num_draft, rnd, temperature, alpha, beta)
    return result.tokens if column is None else result.tokens[:, column]


def chi_square_pvalue(first_tokens: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Goodness of fit; bins with expected count < 5 are pooled; zero-probability tokens must not occur."""
    observed = torch.bincount(first_tokens, minlength=VOCAB).double()
    expected = expected_probs.double() * first_tokens.numel()
    impossible = expected_probs == 0
    assert observed[impossible].sum() == 0, f"tokens of probability 0 were emitted: {observed[impossible]}"
    small = (expected < 5) & ~impossible
    obs = torch.cat([observed[~impossible & ~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~impossible & ~small], expected[small].sum()[None]])
    keep = exp > 0
    exp = exp[keep] * (obs[keep].sum() / exp[keep].sum())  # remove float rounding of the totals
    return float(chisquare(obs[keep].numpy(), exp.numpy()).pvalue)


CASES = [pytest.param(name, id=name) for name in adversarial_pairs()]


@pytest.mark.parametrize("name", CASES)
def test_exact_first_token_follows_target(name):
    p_logits, q_logits = adversarial_pairs()[name]
    for gamma, temperature, seed in ((1, 1.0, 0), (4, 0.7, 1)):
        target_row = torch.stack([p_logits] + [p_logits.roll(c) for c in range(1, gamma + 1)])
        draft_row = torch.stack([q_logits.roll(c) for c in range(gamma)])
        first = run_trials("exact", target_row, draft_row, 40_000, gamma, temperature, seed)
        pvalue = chi_square_pvalue(first, torch.softmax(p_logits / temperature, dim=-1))
        assert pvalue > 1e-3, f"{name} g={gamma} T={temperature}: chi-square p = {pvalue:.2e}"


@pytest.mark.parametrize("name", CASES)
def test_baseline_first_token_follows_target(name):
    p_logits, q_logits = adversarial_pairs()[name]
    first = run_trials("baseline", torch.stack([p_logits, p_logits.flip(0)]), q_logits[None], 40_000, 1, 1.0, 7)
    pvalue = chi_square_pvalue(first, torch.softmax(p_logits, dim=-1))
    assert pvalue > 1e-3, f"{name}: chi-square p = {pvalue:.2e}"


def test_exact_chi_square_detects_a_wrong_distribution():
    # The check has power: the draft's own distribution is rejected as "the target's".
    p_logits, q_logits = adversarial_pairs()["unrelated"]
    first = run_trials("exact", torch.stack([p_logits, p_logits]), q_logits[None], 40_000, 1, 1.0, 3)
    assert chi_square_pvalue(first, torch.softmax(q_logits, dim=-1)) < 1e-6


def sigmoid_closed_form(p_logits, q_logits, temperature, alpha, beta, old_rules: bool = False) -> torch.Tensor:
    """Distribution of the first token under sigmoid mode's rules, g = 1, draft sampled from its softmax.

    f(x) = q(x) a(x) + (1 - sum_y q(y) a(y)) r(x), with q = softmax(z_q / T), a = min(1, P/Q) and
    r = max(0, P - Q) over the ids the draft scores (z_q > -inf), normalised; the target's softmax
    when that residual is identically zero. ``old_rules``: the rules before issue 31 (residual over
    every id, P normalised as the fallback), for the tests' power checks.
    """
    width = beta - alpha
    P = torch.sigmoid((p_logits.double() / temperature - alpha) / width)
    Q = torch.sigmoid((q_logits.double() / temperature - alpha) / width)
    q = torch.softmax(q_logits.double() / temperature, dim=-1)
    accept = torch.where(Q > 0, torch.clamp(P / Q, max=1.0), torch.zeros_like(P))
    residual = torch.clamp(P - Q, min=0.0)
    if not old_rules:
        residual = torch.where(q_logits > NEG_INF, residual, torch.zeros_like(residual))
    fallback = P / P.sum() if old_rules else torch.softmax(p_logits.double() / temperature, dim=-1)
    r = residual / residual.sum() if residual.sum() > 0 else fallback
    return q * accept + (1.0 - (q * accept).sum()) * r


def reduced_head_pair() -> tuple[torch.Tensor, torch.Tensor]:
    """A draft head that scores only the first 10 of 16 ids (-inf elsewhere, as ``to_full`` leaves the
    ids a reduced head never scores) against a target that scores all 16."""
    p_logits, q_logits = adversarial_pairs()["unrelated"]
    q_reduced = q_logits.clone()
    q_reduced[10:] = NEG_INF
    return p_logits, q_reduced


SIGMOID_CASES = {**{name: adversarial_pairs()[name] for name in ("unrelated", "p-with-zeros", "q-close-to-p")},
                 "reduced-draft-head": reduced_head_pair()}


@pytest.mark.parametrize("alpha,beta", [(-1e3, 1e3), (-4.0, 4.0)], ids=["paper-1e3", "narrow-4"])
@pytest.mark.parametrize("name", list(SIGMOID_CASES))
def test_sigmoid_matches_its_closed_form_and_records_tv(name, alpha, beta, record_property):
    p_logits, q_logits = SIGMOID_CASES[name]
    temperature = 1.0
    trials = 40_000
    first = run_trials("sigmoid", torch.stack([p_logits, p_logits]), q_logits[None], trials, 1, temperature, 11,
                       alpha, beta)
    closed = sigmoid_closed_form(p_logits, q_logits, temperature, alpha, beta)
    pvalue = chi_square_pvalue(first, closed.float())
    target = torch.softmax(p_logits.double() / temperature, dim=-1)
    tv_closed = 0.5 * float((closed - target).abs().sum())
    empirical = torch.bincount(first, minlength=VOCAB).double() / trials
    tv_empirical = 0.5 * float((empirical - target).abs().sum())
    record_property("tv_closed_form", tv_closed)
    record_property("tv_empirical", tv_empirical)
    print(f"sigmoid {name} alpha={alpha} beta={beta}: TV(closed form, p) = {tv_closed:.4f}, "
          f"TV(empirical, p) = {tv_empirical:.4f}, chi-square p = {pvalue:.3f}")
    assert pvalue > 1e-3, f"empirical sigmoid distribution departs from its closed form (p = {pvalue:.2e})"
    assert abs(tv_empirical - tv_closed) < 0.02
    old = sigmoid_closed_form(p_logits, q_logits, temperature, alpha, beta, old_rules=True)
    if 0.5 * float((old - closed).abs().sum()) > 0.05:  # the old rules differ here: the test must tell them apart
        assert chi_square_pvalue(first, old.float()) < 1e-6


def test_sigmoid_residual_stays_on_the_ids_a_reduced_draft_head_scores():
    # Narrow constants so that drafts are rejected; after a rejection only ids 0-9 (scored by the draft's
    # head) may follow, where the old residual put most of its mass on ids 10-15 (q_hat = 0 there).
    p_logits, q_logits = reduced_head_pair()
    gen = torch.Generator().manual_seed(5)
    trials = 20_000
    target = p_logits.expand(trials, 2, VOCAB)
    draft = q_logits.expand(trials, 1, VOCAB)
    tokens = torch.multinomial(torch.softmax(q_logits, -1), trials, replacement=True, generator=gen)[:, None]
    rnd = draw_randomness(trials, 1, torch.device("cpu"), gen)
    result = verify_sigmoid_torch(target, draft, tokens, torch.ones(trials, dtype=torch.int64), rnd, 1.0, -4.0, 4.0)
    rejected = result.num_accepted == 0
    assert int(rejected.sum()) > 1000, "the case must reject drafts often enough to test the residual"
    assert int((result.tokens[rejected, 0] >= 10).sum()) == 0


@pytest.mark.parametrize("alpha,beta", [(-1e3, 1e3), (-4.0, 4.0)], ids=["paper-1e3", "narrow-4"])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sigmoid_token_after_accepted_drafts_follows_the_target_softmax(alpha, beta, temperature):
    # The bonus token (every draft accepted) comes from softmax(z_target / T) of the row after the drafts,
    # as transformers draws it: a chi-square fit over the steps that accepted both drafts. The old rule
    # (normalised p_hat, near-uniform at -/+1e3) must be rejected by the same data.
    gen = torch.Generator().manual_seed(17)
    p_logits = torch.randn(VOCAB, generator=gen) * 2.0
    bonus_logits = torch.randn(VOCAB, generator=gen) * 2.0
    bonus_logits[[2, 9]] = NEG_INF
    trials, gamma = 40_000, 2
    rows = torch.stack([p_logits, p_logits.roll(1), bonus_logits])
    draft_rows = torch.stack([p_logits + 0.1, p_logits.roll(1) + 0.1])  # q close to p: most steps accept both
    tokens = run_trials("sigmoid", rows, draft_rows, trials, gamma, temperature, 23, alpha, beta, column=None)
    all_accepted = (tokens[:, :gamma] >= 0).all(dim=1) & (tokens[:, gamma] >= 0)
    assert int(all_accepted.sum()) > 10_000
    bonus = tokens[all_accepted, gamma]
    target = torch.softmax(bonus_logits / temperature, dim=-1)
    assert chi_square_pvalue(bonus, target) > 1e-3
    width = beta - alpha
    old_rule = torch.sigmoid((bonus_logits / temperature - alpha) / width)
    assert chi_square_pvalue(bonus, old_rule / old_rule.sum()) < 1e-6
