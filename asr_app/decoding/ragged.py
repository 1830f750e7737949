"""Ragged batches: every row keeps all the drafts it accepted, not only those every row accepted.

The lock-step loop (loop.py) keeps the same number of tokens for every row of a step, the fewest any row
accepted, so that both KV caches keep one length for the batch. That common prefix shrinks fast with the
batch: with a per-draft acceptance a, one row keeps k drafts or more with probability a^k, all B rows with
a^(Bk). Measured on real clips (tiny.en pair, greedy, docs/serving.md), batches of 4 kept about one token
per target call per row where one row alone kept 1.3 or more: a batch threw its speculation away.

Here each row keeps its own accepted drafts plus the target's token, and its caches hold its own number of
tokens. Every step then gives each row its own positions ([B, L]: the row's cache slots, position
embeddings and causal mask, runtime/decoder.py). The target is always fed one pending token plus the
proposals per row, so its columns line up and verification is unchanged. The draft lags each row by a
different number of tokens (one, or more after a step that accepted every draft or a hint), so its first
call of a step feeds each row's missing tokens padded on the right to the longest; padding is written to
the cache's last slot, which no live row reaches (a row stops two tokens short of it) and no real query sees,
and the draft reads each row's next-token logits at the row's last real column. Each row's tokens are exactly what verifying its own
drafts gives, so greedy output is the target's and sampled output keeps the target's distribution, as for
one row alone.

Captured CUDA graphs need one shape and one position per step, and the fused layers write one position per
column, so this loop runs where steps run eagerly on unfused layers (a CPU); elsewhere the lock-step loop
runs. Finished rows leave the batch as in the lock-step loop (eagerly).
"""

from __future__ import annotations

import torch

from asr_app.decoding.loop import BatchState, Proposal, SpeculativeLoop
from asr_app.decoding.steps import rules_count, state_tensors
from asr_app.runtime.ops import visible_keys


class RaggedLoop(SpeculativeLoop):
    """`SpeculativeLoop` with per-row lengths: propose, score + verify and commit per row (module doc)."""

    def run(self, batch: BatchState) -> None:
        if not self.eager or self.steps.target.fused_layers:
            raise ValueError("ragged batches run eagerly on unfused layers only")
        rows, prompt = batch.history.shape
        self.lengths = [prompt] * rows        # history tokens per row (batch.history is padded on the right)
        self.target_lengths = [0] * rows      # target cache slots holding the row's history
        self.draft_lengths = [0] * rows       # draft cache slots holding the row's history after draft_skip
        self.row_generated = [0] * rows
        super().run(batch)

    # ------------------------------------------------------------------ 1. propose
    def _draft(self, b: BatchState, gamma: int, hints: list[list[int]] | None = None) -> Proposal:
        steps, skip = self.steps, self.draft_skip
        feeds = [n - skip - d for n, d in zip(self.lengths, self.draft_lengths)]
        ids, positions, last = self._draft_feed(b, feeds)
        rows = len(feeds)
        following = torch.tensor([d + c for d, c in zip(self.draft_lengths, feeds)], device=self.device)
        span = max(d + c for d, c in zip(self.draft_lengths, feeds))
        state, uniforms = state_tensors(b.rules), self._uniforms(rows, gamma)
        tokens, logits = [], []
        for j in range(gamma):
            tensors = {"ids": ids, **state}
            if uniforms is not None:
                tensors["uniform"] = uniforms[:, j]
            if j == 0:
                tensors["last"] = last
            out = self._eager(steps.draft_step, tensors, positions, span + j, generated=rules_count(b.generated + j))
            token = out["token"]
            tokens.append(token)
            if uniforms is not None:
                logits.append(out["logits"])
            state = {k: out[k] for k in ("last_is_ts", "penult_is_ts", "last_ts")}
            ids, positions = token[:, None], (following + j)[:, None]
            if self.reads_are_free and bool((token == self.eos).all()):
                break
            if self.reads_are_free and j == 0 and hints is not None and self._hint_follows(b, token, hints):
                break
        return Proposal(tokens=torch.stack(tokens, dim=1),
                        draft_logits=torch.stack(logits, dim=1) if logits else None, drafted=len(tokens))

    def _draft_feed(self, b: BatchState, feeds: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The draft's first call of a step: each row's history tokens missing from its cache, padded on the
        right to the longest (ids [B, C], positions [B, C]), and the column of each row's last one [B]."""
        width, skip = max(feeds), self.draft_skip
        slots = self.steps.ws.draft.self_k.shape[3]
        ids = torch.zeros((len(feeds), width), dtype=torch.long, device=self.device)
        positions = torch.full((len(feeds), width), slots - 1, dtype=torch.long)
        for i, (start, count) in enumerate(zip(self.draft_lengths, feeds)):
            ids[i, :count] = b.history[i, skip + start : skip + start + count]
            positions[i, :count] = torch.arange(start, start + count)
        last = torch.tensor([c - 1 for c in feeds], device=self.device)
        return ids, positions.to(self.device), last

    @staticmethod
    def _eager(fn, tensors: dict[str, torch.Tensor], positions: torch.Tensor, span: int, **static):
        """A step at per-row `positions` [B, L], attending over the first `span` cache slots."""
        return fn(positions=positions, span=span, mask=visible_keys(positions, span), **tensors, **static)

    # ------------------------------------------------------------------ 2. score and verify
    def score_and_verify(self, b: BatchState, p: Proposal) -> dict[str, torch.Tensor]:
        if b.generated == 0:  # the prompt's step: every row has the same prompt and empty caches
            return super().score_and_verify(b, p)
        if any(n - t != 1 for n, t in zip(self.lengths, self.target_lengths)):
            raise RuntimeError("after the prompt's step every row has exactly one token pending")
        rows = len(self.lengths)
        index = torch.tensor([n - 1 for n in self.lengths], device=self.device)
        pending = b.history[torch.arange(rows, device=self.device), index][:, None]
        ids = pending if p.tokens is None else torch.cat([pending, p.tokens], dim=1)
        mode, check_inputs = self._verify_inputs(p, rows)
        starts = torch.tensor(self.target_lengths, device=self.device)
        positions = starts[:, None] + torch.arange(ids.shape[1], device=self.device)
        span = max(self.target_lengths) + ids.shape[1]
        logits = self._eager(self.steps.score, {"ids": ids, **state_tensors(b.rules)}, positions, span,
                             proposals=p.gamma, generated=rules_count(b.generated))
        self.timings.target_s += self.timings.lap()
        return self._check(logits, ids[:, 1:], check_inputs, mode, p.gamma)

    # ------------------------------------------------------------------ 3. commit
    def commit(self, b: BatchState, p: Proposal, result: dict[str, torch.Tensor]) -> list[int]:
        """Read the step's outcome once; each row keeps its accepted proposals + 1 token. Returns the rows
        that finished: EOS, or the length limit."""
        gamma = p.gamma
        host = self._read_step(result)
        finished, counts, accepted = [], [], []
        for i, row in enumerate(host):
            taken = min(int(row[gamma + 1]), gamma)
            tokens = [int(t) for t in row[: taken + 1]]
            if self._record(b, i, p, tokens, row[gamma + 2 : gamma + 3 + taken], taken):
                finished.append(i)
            counts.append(taken + 1)
            accepted.append(taken)
        if p.drafted:
            self.policy.update_rows(p.drafted, [min(taken, p.drafted) for taken in accepted])
        self._advance_tracker(b, p, host, counts)  # every row of a ragged batch is active
        kept = result["tokens"][:, : max(counts)].clamp_min(0)  # a finished row's padding must stay a valid id
        self._extend_history(b, kept, counts)
        b.rules = self.steps.target_rules.advance_rows(b.rules, kept, torch.tensor(counts, device=self.device))
        for i, (count, taken) in enumerate(zip(counts, accepted)):
            if p.drafted:  # the draft fed the pending tokens and its first drafted - 1 drafts
                self.draft_lengths[i] = self.lengths[i] - self.draft_skip + min(taken, p.drafted - 1)
            self.lengths[i] += count
            self.target_lengths[i] = self.lengths[i] - 1
            self.row_generated[i] += count
            if self.row_generated[i] >= self.max_len and i not in finished:
                finished.append(i)
        going = [g for i, g in enumerate(self.row_generated) if i not in finished]
        b.generated = max(going, default=self.max_len)
        return finished

    def _extend_history(self, b: BatchState, kept: torch.Tensor, counts: list[int]) -> None:
        """Append each row's kept tokens after its own history (rows padded on the right)."""
        width = max([b.history.shape[1]] + [n + c for n, c in zip(self.lengths, counts)])
        history = torch.zeros((len(counts), width), dtype=b.history.dtype, device=self.device)
        history[:, : b.history.shape[1]] = b.history
        for i, (n, c) in enumerate(zip(self.lengths, counts)):
            history[i, n : n + c] = kept[i, :c]
        b.history = history

    # ------------------------------------------------------------------ 4. drop finished rows
    def drop_finished(self, b: BatchState, finished: list[int]) -> None:
        if finished:
            alive = [i for i in range(len(self.lengths)) if i not in finished]
            for name in ("lengths", "target_lengths", "draft_lengths", "row_generated"):
                values = getattr(self, name)
                setattr(self, name, [values[i] for i in alive])
        super().drop_finished(b, finished)
