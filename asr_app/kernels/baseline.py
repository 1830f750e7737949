"""Mode ``baseline``: the semantics of transformers' ``_speculative_sampling`` in plain PyTorch.

The yardstick the paper measured against. Per batch row (transformers' function is batch-1 only):
softmax of both logit sets, ``r <= p(x)/q(x)`` with ``r = rand`` per draft, the accepted prefix,
then ``multinomial`` from ``max(0, p - q)`` normalised at the first rejection or from ``p`` for the
bonus token. The random draws are the same calls in the same order as transformers makes, so with
the same generator state a batch-1 call returns the same tokens as transformers' function.

Differences, on purpose: probabilities are computed in float32 whatever the input dtype; rows of a
ragged batch use only their first ``num_draft[b]`` drafts (0 allowed: the token comes from p);
a residual that is identically zero (transformers would divide by zero and ``multinomial`` would
raise) falls back to ``p``. Being a reference, it synchronises with the host (``if n < gamma``) as
transformers does.
"""

from __future__ import annotations

import torch

from .common import assemble_tokens, scaled_logits
from .types import VerifyResult


def verify_baseline(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    batch, rows, _ = target_logits.shape
    gamma = rows - 1
    inv_temperature = 1.0 / temperature
    device = target_logits.device
    accepted = torch.zeros(batch, dtype=torch.int64, device=device)
    next_tokens = torch.zeros(batch, dtype=torch.int64, device=device)
    for b, nd in enumerate(num_draft.clamp(0, gamma).tolist()):
        n, token = _speculative_sampling_row(
            scaled_logits(target_logits[b : b + 1, : nd + 1], inv_temperature),
            scaled_logits(draft_logits[b : b + 1, :nd], inv_temperature),
            draft_tokens[b : b + 1, :nd],
            generator,
        )
        accepted[b] = n
        next_tokens[b] = token
    return VerifyResult(tokens=assemble_tokens(draft_tokens, accepted, next_tokens), num_accepted=accepted)


def _speculative_sampling_row(new_logits, candidate_logits, candidate_ids, generator):
    """One row, [1, nd+1, V] / [1, nd, V] / [1, nd]; returns (n accepted, next token) as tensors."""
    nd = candidate_ids.shape[1]
    p = new_logits.softmax(dim=-1)
    if nd == 0:
        return torch.zeros((), dtype=torch.int64), torch.multinomial(p[:, 0, :], 1, generator=generator)[0, 0]
    positions = torch.arange(nd, device=p.device)
    q = candidate_logits.softmax(dim=-1)
    q_i = q[:, positions, candidate_ids].squeeze(0, 1)
    p_i = p[:, positions, candidate_ids].squeeze(0, 1)
    probability_ratio = p_i / q_i
    r_i = torch.rand(probability_ratio.shape, dtype=probability_ratio.dtype, device=p.device, generator=generator)
    is_accepted = r_i <= probability_ratio
    n_matches = ((~is_accepted).cumsum(dim=-1) < 1).sum()
    p_next = p[:, n_matches, :]
    if n_matches < nd:
        p_prime = torch.clamp(p_next - q[:, n_matches, :], min=0)
        total = p_prime.sum()
        p_prime = p_prime.div_(total) if total > 0 else p_next
    else:
        p_prime = p_next
    token = torch.multinomial(p_prime, num_samples=1, generator=generator)[0, 0]
    return n_matches, token
