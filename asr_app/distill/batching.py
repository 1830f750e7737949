"""Length-bucketed batches in an order fixed by the seed, and their tensors.

Step s of a run always trains on the same batch, whatever happened before it: an epoch's batches are a
function of (seed, epoch) alone, so a resumed run sees exactly the batches an uninterrupted one does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from asr_app.distill.cache import LabelInfo
from asr_app.distill.student import encoder_view
from asr_app.distill.teacher import Record


def epoch_batches(examples: Sequence[LabelInfo], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Indices of `examples` in batches of similar length (little padding), the batches in random order.
    Ties in length are broken at random per epoch, so equal-length examples meet different partners."""
    rng = np.random.default_rng([seed, epoch])
    ties = rng.random(len(examples))
    order = sorted(range(len(examples)), key=lambda i: (examples[i].length, ties[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


class Schedule:
    """The batch of every step: epoch after epoch of `epoch_batches`."""

    def __init__(self, examples: Sequence[LabelInfo], batch_size: int, seed: int) -> None:
        self.examples = list(examples)
        self.batch_size = batch_size
        self.seed = seed
        self.per_epoch = -(-len(self.examples) // batch_size)
        self._epoch: tuple[int, list[list[int]]] | None = None

    def batch(self, step: int) -> list[LabelInfo]:
        epoch, index = divmod(step, self.per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, epoch_batches(self.examples, self.batch_size, self.seed, epoch))
        return [self.examples[i] for i in self._epoch[1][index]]


@dataclass
class Batch:
    input_ids: torch.Tensor   # long [B, T]: each label without its last token, right-padded
    encoder: torch.Tensor     # float32 [B, frames, d]
    rows: torch.Tensor        # long [N]: the batch row of each predicted position
    cols: torch.Tensor        # long [N]: its position in the row
    labels: torch.Tensor      # long [N]: the label token's index in the head, -1 outside it
    topk_pos: torch.Tensor    # long [N, k]: the teacher's top-k ids as head indices, -1 outside the head
    topk_logp: torch.Tensor   # float32 [N, k]

    @property
    def positions(self) -> int:
        return self.rows.numel()


def head_index(vocab: int, head_ids: torch.Tensor | None) -> torch.Tensor:
    """long [vocab]: each token id's index in the head, -1 for ids the head leaves out."""
    if head_ids is None:
        return torch.arange(vocab)
    index = torch.full((vocab,), -1, dtype=torch.long)
    index[head_ids.cpu()] = torch.arange(head_ids.numel())
    return index


def collate(infos: Sequence[LabelInfo], load: Callable[[str], Record], to_head: torch.Tensor, view: str,
            device: torch.device) -> Batch:
    records = {key: load(key) for key in dict.fromkeys(i.key for i in infos)}
    labels = [records[i.key].labels[i.index] for i in infos]
    width = max(len(lab.tokens) - 1 for lab in labels)
    input_ids = torch.zeros((len(labels), width), dtype=torch.long)
    rows, cols, targets, topk_ids, topk_logp = [], [], [], [], []
    for r, lab in enumerate(labels):
        tokens = torch.tensor(lab.tokens, dtype=torch.long)
        input_ids[r, : len(tokens) - 1] = tokens[:-1]
        n = lab.predicted
        rows.append(torch.full((n,), r, dtype=torch.long))
        cols.append(torch.arange(lab.prompt_len - 1, lab.prompt_len - 1 + n))
        targets.append(tokens[lab.prompt_len :])
        topk_ids.append(lab.topk_ids.long())
        topk_logp.append(lab.topk_logp.float())
    encoder = torch.stack([records[i.key].encoder for i in infos]).float()
    encoder = encoder_view(encoder, [i.seconds for i in infos], view)
    return Batch(input_ids.to(device), encoder.to(device), torch.cat(rows).to(device), torch.cat(cols).to(device),
                 to_head[torch.cat(targets)].to(device), to_head[torch.cat(topk_ids)].to(device),
                 torch.cat(topk_logp).to(device))
