"""Whisper's logit rules as small classes (openai/whisper decoding.py style), vectorised over positions.

The decoding loop scores several positions per step (the target checks gamma drafts at once), and each
position must see the rules for *its* prefix: the history plus the drafts before it. Rules therefore
work on logits of shape [B, L, V] together with a `RuleState` per position, and nothing here reads
values back to the host (the timestamp state lives in small device tensors), so the loop stays free
of syncs. Rules can also run over a reduced token space (the draft's output head scores a subset of
the vocabulary, runtime/vocab.py): masks are built over the subset's positions, and since every special
and timestamp token is in any subset, the timestamp tokens stay one contiguous tail. The semantics follow transformers' `SuppressTokensAtBeginLogitsProcessor`,
`SuppressTokensLogitsProcessor` and `WhisperTimeStampLogitsProcessor`, applied in that order, so
greedy output matches `generate()` token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asr_app.decoding.prompt import eos_token
from asr_app.runtime.vocab import TokenSpace

NEG_INF = float("-inf")


@dataclass
class RuleState:
    """What the rules need to know about a row's generated tokens (prompt excluded).

    `generated` is the same for every row (rows of a batch advance together). The timestamp fields
    are [B] device tensors, or [B, L] when describing L consecutive positions.
    """

    generated: int
    last_is_ts: torch.Tensor  # bool: last generated token was a timestamp
    penult_is_ts: torch.Tensor  # bool: second-to-last was a timestamp (True while fewer than 2 tokens)
    last_ts: torch.Tensor  # int64: latest timestamp token generated, -1 if none

    @classmethod
    def initial(cls, batch: int, device: torch.device) -> RuleState:
        return cls(
            generated=0,
            last_is_ts=torch.zeros(batch, dtype=torch.bool, device=device),
            penult_is_ts=torch.ones(batch, dtype=torch.bool, device=device),
            last_ts=torch.full((batch,), -1, dtype=torch.long, device=device),
        )

    def advance(self, token: torch.Tensor, timestamp_begin: int) -> RuleState:
        """The state after appending `token` [B] to every row."""
        is_ts = token >= timestamp_begin
        penult = self.last_is_ts if self.generated >= 1 else torch.ones_like(self.last_is_ts)
        return RuleState(
            generated=self.generated + 1,
            last_is_ts=is_ts,
            penult_is_ts=penult,
            last_ts=torch.where(is_ts, token, self.last_ts),
        )

    def select(self, rows: torch.Tensor) -> RuleState:
        return RuleState(self.generated, self.last_is_ts[rows], self.penult_is_ts[rows], self.last_ts[rows])


class SuppressBlankAtBegin:
    """`begin_suppress_tokens` (blank, EOS) may not be the first generated token."""

    def __init__(self, tokens: list[int], space: TokenSpace, device: torch.device) -> None:
        self.mask = space.mask(tokens, device)

    def apply_(self, out: torch.Tensor, first_generated: int) -> None:
        """In place on `out` [B, L, V] (a tensor the rules own)."""
        if first_generated == 0:  # only position 0 of the very first step is affected
            out[:, :1].masked_fill_(self.mask, NEG_INF)


class SuppressTokens:
    """Tokens the model may never emit (`suppress_tokens` of the generation config)."""

    def __init__(self, tokens: list[int], space: TokenSpace, device: torch.device) -> None:
        self.space = space
        self.mask = space.mask(tokens, device)
        # adding a 0/-inf row is several times faster than a broadcast masked_fill on CPU (every step runs it)
        self.bias = torch.zeros(space.size, device=device).masked_fill(self.mask, NEG_INF)
        self._bias_by_dtype: dict[torch.dtype, torch.Tensor] = {}

    def extend(self, token: int) -> None:
        """Also suppress `token` everywhere (the timestamp rules never allow <|notimestamps|>)."""
        index = self.space.index(token)
        self.mask[index] = True
        self.bias[index] = NEG_INF
        self._bias_by_dtype.clear()

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """A new tensor: `logits` with the suppressed tokens at -inf (the later rules work on it in place)."""
        bias = self._bias_by_dtype.get(logits.dtype)
        if bias is None:
            bias = self._bias_by_dtype[logits.dtype] = self.bias.to(logits.dtype)
        return logits + bias


class ApplyTimestampRules:
    """Timestamps come in pairs, never decrease, start within `max_initial` steps of 0.00, and win when
    their total probability beats every single text token. (<|notimestamps|> is never allowed either;
    WhisperLogitRules folds that into SuppressTokens.)"""

    def __init__(self, no_timestamps: int, eos: int, max_initial: int | None, space: TokenSpace, device) -> None:
        self.no_timestamps = no_timestamps
        self.max_initial = max_initial
        # positions in the scored space: the timestamp tail starts at `tb`, text ends before `eos`
        self.tb = space.index(no_timestamps + 1)
        self.eos = space.index(eos)
        self.first_timestamp = no_timestamps + 1
        self.ts_ids = torch.arange(no_timestamps + 1, space.vocab, device=device)  # the timestamp tokens' ids
        self.vocab = space.vocab

    def apply_(self, out: torch.Tensor, states: RuleState) -> None:
        """In place on `out` [B, L, V] (a tensor the rules own); `states` fields [B, L] (the state before
        each position). Each mask touches only the part of the vocabulary it concerns, so the cost is
        about one pass over the logits however many positions are scored."""
        tb = self.tb
        pair_closed = states.last_is_ts & states.penult_is_ts  # two timestamps in a row: text or EOS next
        pair_open = states.last_is_ts & ~states.penult_is_ts   # one timestamp: its partner or EOS next
        # The lowest timestamp allowed: the open one itself, else one past the latest; none after a closed pair.
        floor = torch.where(states.last_ts >= 0, torch.where(pair_open, states.last_ts, states.last_ts + 1),
                            torch.full_like(states.last_ts, self.first_timestamp))
        floor = torch.where(pair_closed, torch.full_like(floor, self.vocab), floor)
        out[..., tb:].masked_fill_(self.ts_ids < floor[..., None], NEG_INF)
        out[..., : self.eos].masked_fill_(pair_open[..., None], NEG_INF)
        if states.generated == 0:  # first generated token: must be a timestamp, and an early one
            out[:, :1, :tb] = NEG_INF
            if self.max_initial is not None:
                out[:, :1, tb + self.max_initial + 1 :] = NEG_INF
        # transformers compares log-probabilities: logsumexp(logp[ts]) > max(logp[text]). Both sides carry
        # the same normaliser, so comparing the logits themselves is the same test without a log_softmax
        # over the whole vocabulary.
        scores = out.float()
        ts_mass = scores[..., tb:].logsumexp(dim=-1)
        best_text = scores[..., :tb].amax(dim=-1)
        out[..., :tb].masked_fill_((ts_mass > best_text)[..., None], NEG_INF)


class WhisperLogitRules:
    """All of Whisper's rules for one decoding run, applied to one or several consecutive positions."""

    def __init__(self, generation_config, vocab: int, device: torch.device, timestamps: bool,
                 space: TokenSpace | None = None) -> None:
        """Rules for logits over `space` (default: the whole vocabulary of `vocab` ids)."""
        gc = generation_config
        space = space or TokenSpace(vocab)
        eos = eos_token(gc)
        self.begin = SuppressBlankAtBegin(list(gc.begin_suppress_tokens or []), space, device)
        self.suppress = SuppressTokens(list(gc.suppress_tokens or []), space, device)
        self.timestamp = (
            ApplyTimestampRules(
                gc.no_timestamps_token_id, eos, getattr(gc, "max_initial_timestamp_index", None), space, device
            )
            if timestamps
            else None
        )
        self.timestamp_begin = gc.no_timestamps_token_id + 1
        if self.timestamp is not None:
            self.suppress.extend(gc.no_timestamps_token_id)

    @property
    def stateful(self) -> bool:
        return self.timestamp is not None

    def states_along(self, state: RuleState, tokens: torch.Tensor) -> RuleState:
        """States before each of L = tokens.shape[1] + 1 positions: `state`, then advanced by each token."""
        states = [state]
        if self.stateful:
            for j in range(tokens.shape[1]):
                states.append(states[-1].advance(tokens[:, j], self.timestamp_begin))
        else:
            return RuleState(state.generated, state.last_is_ts, state.penult_is_ts, state.last_ts)
        return RuleState(
            state.generated,
            torch.stack([s.last_is_ts for s in states], dim=1),
            torch.stack([s.penult_is_ts for s in states], dim=1),
            torch.stack([s.last_ts for s in states], dim=1),
        )

    def apply(self, logits: torch.Tensor, state: RuleState, drafts: torch.Tensor | None = None) -> torch.Tensor:
        """Process logits [B, L, V] for L consecutive positions; position j's prefix ends with drafts[:, :j]."""
        out = self.suppress.apply(logits)  # a new tensor: the other rules write into it
        self.begin.apply_(out, state.generated)
        if self.timestamp is not None:
            if drafts is None:
                drafts = torch.empty(logits.shape[0], 0, dtype=torch.long, device=logits.device)
            assert drafts.shape[1] == logits.shape[1] - 1, "one draft token between consecutive positions"
            self.timestamp.apply_(out, self.states_along(state, drafts))
        return out

    def advance_rows(self, state: RuleState, tokens: torch.Tensor, counts: torch.Tensor) -> RuleState:
        """State after appending to each row i its first counts[i] tokens of `tokens` [B, n] (rows that keep
        different numbers of tokens, decoding/ragged.py; every count >= 1). `generated` moves by n: the rules
        only ask whether it is 0, and the loop keeps each row's own count."""
        if not self.stateful:
            return RuleState(state.generated + tokens.shape[1], state.last_is_ts, state.penult_is_ts, state.last_ts)
        for j in range(tokens.shape[1]):
            after = state.advance(tokens[:, j], self.timestamp_begin)
            live = counts > j
            state = RuleState(after.generated, torch.where(live, after.last_is_ts, state.last_is_ts),
                              torch.where(live, after.penult_is_ts, state.penult_is_ts),
                              torch.where(live, after.last_ts, state.last_ts))
        return state

    def advance(self, state: RuleState, tokens: torch.Tensor) -> RuleState:
        """State after appending tokens [B, n] (device ops only; the generated count is kept on the host)."""
        if not self.stateful:
            return RuleState(state.generated + tokens.shape[1], state.last_is_ts, state.penult_is_ts, state.last_ts)
        for j in range(tokens.shape[1]):
            state = state.advance(tokens[:, j], self.timestamp_begin)
        return state
