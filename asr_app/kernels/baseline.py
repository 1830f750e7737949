"""Mode ``baseline``: the semantics of transformers' ``_speculative_sampling`` in plain PyTorch.

The yardstick the paper measured against, batched: softmax of both logit sets, accept draft c iff
``r_c <= p(x_c)/q(x_c)`` with ``r = torch.rand``, keep the accepted prefix, then ``multinomial``
from ``max(0, p - q)`` normalised at the first rejection or from ``p`` for the bonus token. The
random draws are the same calls with the same shapes as transformers' batch-1 function, so with
the same generator state a batch-1 call returns the same tokens as transformers' function.

Differences, on purpose: probabilities are float32 whatever the input dtype; rows of a ragged batch
use only their first ``num_draft[b]`` drafts (0 allowed: the token then comes from p); a residual
that is identically zero (transformers divides by zero and ``multinomial`` raises) falls back to p.
Being the reference, it reads ``num_draft.max()`` on the host, as transformers reads ``n_matches``.
"""

from __future__ import annotations

import torch

from .common import assemble_tokens, clamp_num_draft, draft_valid_mask, gather_at_drafts, scaled_logits
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
    nd = clamp_num_draft(num_draft, gamma)
    used = int(nd.max())  # transformers' candidate_length (batch 1)
    p = torch.softmax(scaled_logits(target_logits[:, : used + 1], inv_temperature), dim=-1)
    q = torch.softmax(scaled_logits(draft_logits[:, :used], inv_temperature), dim=-1)
    rows_b = torch.arange(batch, device=p.device)

    p_i = gather_at_drafts(p[:, :used], draft_tokens[:, :used])
    q_i = gather_at_drafts(q, draft_tokens[:, :used])
    probability_ratio = p_i / q_i
    r_i = torch.rand(probability_ratio.shape, dtype=probability_ratio.dtype, device=p.device, generator=generator)
    is_accepted = (r_i <= probability_ratio) & draft_valid_mask(nd, used)
    n_matches = ((~is_accepted).cumsum(dim=-1) < 1).sum(dim=-1)
    n_matches = torch.minimum(n_matches, nd)

    p_next = p[rows_b, n_matches]
    p_prime = p_next
    rejected = n_matches < nd
    if bool(rejected.any()):
        residual = torch.clamp(p_next - q[rows_b, n_matches.clamp(max=max(used - 1, 0))], min=0)
        total = residual.sum(dim=-1, keepdim=True)
        normalised = residual / torch.where(total > 0, total, torch.ones_like(total))
        p_prime = torch.where(rejected[:, None] & (total > 0), normalised, p_next)
    next_token = torch.multinomial(p_prime, num_samples=1, generator=generator)[:, 0]
    return VerifyResult(tokens=assemble_tokens(draft_tokens, n_matches, next_token), num_accepted=n_matches)


def transformers_speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits):
    """transformers' own batch-1 ``_speculative_sampling`` (the anchor of tests and benchmarks), called the
    same way across 5.x releases: some (5.17) take a required 5th positional ``is_done_candidate``, later
    ones an optional ``assistant_ensemble_weight``."""
    import inspect

    from transformers.generation.utils import _speculative_sampling

    extra = (False,) if "is_done_candidate" in inspect.signature(_speculative_sampling).parameters else ()
    return _speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, *extra)
