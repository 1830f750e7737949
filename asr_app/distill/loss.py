"""The distillation loss: KL to the teacher's top-k plus one rest bucket, and cross-entropy on its labels.

The teacher's probabilities are over the whole vocabulary; the student's over its head (all ids, or the
runtime's reduced draft vocabulary). Teacher mass on ids outside the head joins the rest bucket, where the
student's mass is everything in its head outside the teacher's top-k: both sides are then distributions
over the same k + 1 outcomes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asr_app.distill.batching import Batch

LOG_FLOOR = -50.0  # a student rest bucket that is empty (a head no larger than k) would give log 0


@dataclass
class LossParts:
    loss: torch.Tensor   # the weighted sum, for backward
    kl: float            # mean over positions
    ce: float            # mean over positions whose label is in the head
    agreed: int          # positions where the student's argmax (suppressed tokens excluded) is the label
    positions: int

    @property
    def agreement(self) -> float:
        return self.agreed / self.positions if self.positions else 0.0


def student_logits(student, batch: Batch, head: torch.Tensor) -> torch.Tensor:
    """float32 [N, K]: the student's raw scores over its head at every predicted position."""
    hidden = student.model.decoder(input_ids=batch.input_ids, encoder_hidden_states=batch.encoder,
                                   use_cache=False).last_hidden_state
    return hidden[batch.rows, batch.cols] @ head.T


def kl_top_k(logq: torch.Tensor, topk_pos: torch.Tensor, topk_logp: torch.Tensor) -> torch.Tensor:
    """Per position KL(teacher || student) over the teacher's top-k ids in the head plus the rest."""
    inside = topk_pos >= 0
    index = topk_pos.clamp(min=0)
    p = topk_logp.exp() * inside
    logq_top = logq.gather(-1, index)
    hits = torch.zeros_like(logq).scatter_add_(-1, index, inside.to(logq.dtype)) > 0
    logq_rest = torch.logsumexp(logq.masked_fill(hits, float("-inf")), dim=-1).clamp(min=LOG_FLOOR)
    p_rest = (1.0 - p.sum(-1)).clamp(min=0.0)
    top = (p * (topk_logp - logq_top)).sum(-1)
    rest = torch.where(p_rest > 0, p_rest * (p_rest.clamp(min=1e-12).log() - logq_rest), torch.zeros_like(p_rest))
    return top + rest


def distill_loss(logits: torch.Tensor, batch: Batch, kl_weight: float, ce_weight: float,
                 suppress: torch.Tensor | None) -> LossParts:
    """`suppress`: bool [K], the head positions of the target's always-suppressed tokens (left out of the
    argmax that agreement counts, as the decoder's rules leave them out)."""
    logq = torch.log_softmax(logits.float(), dim=-1)
    kl = kl_top_k(logq, batch.topk_pos, batch.topk_logp).mean()
    known = batch.labels >= 0
    nll = -logq[known].gather(-1, batch.labels[known, None]).squeeze(-1)
    ce = nll.mean() if nll.numel() else logq.new_zeros(())
    with torch.no_grad():
        scores = logits.masked_fill(suppress, float("-inf")) if suppress is not None else logits
        agreed = int((scores.argmax(-1) == batch.labels).sum())
    return LossParts(kl_weight * kl + ce_weight * ce, float(kl.detach()), float(ce.detach()), agreed, batch.positions)
