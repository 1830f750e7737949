"""The speculative decoding loop over one lock-step batch: propose, score + verify, commit, drop finished.

Each iteration is four named steps over a `BatchState`:

1. `propose`: the draft model proposes up to gamma tokens (each from rule-processed logits with its own
   prefix), and a hint (tokens the caller expects) may extend them: see "Hints" below.
2. `score_and_verify`: the target scores the pending token and every proposal in one forward pass, the
   rules process each position, the verification kernels decide how many proposals to keep and the next
   token. On a GPU this and each draft step are CUDA graph replays (runtime/graphs.py).
3. `commit`: the one device-to-host read of the step (tokens, accepted counts, log-probs); the kept
   tokens join the history, statistics and the gamma policy are updated, both caches roll back to what
   is now known to be right (moving a length index).
4. `drop_finished`: rows that emitted EOS leave the batch (eagerly: caches and rule state are
   index-selected, so a finished row costs nothing afterwards); captured graphs have fixed shapes, so
   there finished rows ride along and their outputs are ignored.

Batches: rows advance in lock-step so both KV caches keep one length for the whole batch. After a
verification each row has its own number of accepted drafts; the step keeps `m + 1` tokens for every
row, where `m` is the smallest acceptance among the active rows (rows that accepted more keep their
first m+1 tokens, all accepted drafts). This is exact: for greedy every kept token is the target's
argmax, and for sampling each kept token is a verification output whose stopping point does not depend
on its own value, so its distribution is still the target's. The cost is work thrown away.

Hints (every mode but `hf`): tokens the caller expects to follow the prompt, typically the previous
decode of a streaming buffer that has since grown (Yang et al. 2023, "Inference with Reference"). In
`off` the hint is a step's whole proposal; with a draft model, the draft proposes first and, where
every row's drafts equal its hint, the hint's continuation is appended, so a hint only ever lengthens a
step. Eagerly on a CPU the draft stops after one token when that token is every row's hint's next: the
hint then proposes the rest, and the draft steps that would mostly have repeated it are saved. A hint is
a deterministic draft (q one-hot) verified exactly, so the output is unchanged. After a disagreement
the tracker realigns (hints.py); at most HintTracker.MAX_STEPS steps per decode use it.
Comparing drafts with the hint reads them on the host: one more read per step, paid only with hints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from asr_app.decoding.hints import HintTracker
from asr_app.decoding.options import SPECULATIVE_MODES, DecodingOptions, DecodingStats
from asr_app.decoding.rules import RuleState
from asr_app.decoding.steps import Steps, no_speech_probability, rules_count, state_tensors, target_key

# Shapes captured in CUDA graphs (a workspace keeps at most RuntimeOptions.max_graphs, so only shapes that
# recur): a step's proposals (the gamma policy's at most 12; longer hint steps run eagerly) and a prompt
# without previous text (<|startoftranscript|>, language, task, <|notimestamps|>).
MAX_CAPTURED_PROPOSALS = 16
MAX_CAPTURED_PROMPT = 4


@dataclass
class Proposal:
    """A step's proposals: `drafted` tokens from the draft model, then `hinted` from the hint."""

    tokens: torch.Tensor | None = None        # [B, g] vocabulary ids
    draft_logits: torch.Tensor | None = None  # [B, drafted, K] the draft's processed logits (T > 0 only)
    drafted: int = 0
    hinted: int = 0

    @property
    def gamma(self) -> int:
        return self.drafted + self.hinted


@dataclass
class BatchState:
    """Everything the loop knows about one lock-step batch."""

    rows: list[int]                 # original index of each row in the batch
    done: list[bool]                # finished rows (kept in the batch only by captured graphs)
    history: torch.Tensor           # [B, n]: prompt + kept tokens
    rules: RuleState
    stats: list[DecodingStats]      # by original index
    out_tokens: list[list[int]]     # by original index, without EOS
    logprob_sum: list[float]        # by original index
    logprob_count: list[int]
    no_speech: torch.Tensor | None = None  # [B] by original index, from the first step
    tracker: HintTracker | None = None
    hint_steps_left: int = HintTracker.MAX_STEPS
    generated: int = 0

    @property
    def active(self) -> list[int]:
        return [i for i, d in enumerate(self.done) if not d]


class Timings:
    """Wall time per phase with no device syncs (on CUDA it measures launch time unless synced). Time spent
    capturing graphs (`captured()`, running seconds) is left out: the decode reports it as setup."""

    def __init__(self, captured: Callable[[], float] = lambda: 0.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.captured, self.clock = captured, clock
        self.t, self.capture_s = clock(), captured()
        self.draft_s = self.target_s = self.verify_s = 0.0

    def lap(self) -> float:
        now, capture_s = self.clock(), self.captured()
        dt = now - self.t - (capture_s - self.capture_s)
        self.t, self.capture_s = now, capture_s
        return dt


class SpeculativeLoop:
    """Runs the loop for one batch; `steps` holds the device-side step functions and their workspace."""

    def __init__(self, steps: Steps, options: DecodingOptions, eos: int, max_len: int,
                 sot_index: int, no_speech_id: int, generator: torch.Generator | None, policy) -> None:
        """`policy`: the gamma policy (decoding/gamma.py: next(budget), update(drafted, accepted))."""
        self.steps, self.opts, self.eos, self.max_len = steps, options, eos, max_len
        self.sot_index, self.no_speech_id = sot_index, no_speech_id
        # The draft never reads the earlier windows' text before <|startoftranscript|>: it only proposes
        # (the output is the target's either way), and the distilled draft's proposals were measured far
        # worse after a long prompt (docs/decoding.md). Its cache slot i holds history token i + skip.
        self.draft_skip = sot_index
        self.generator = generator
        self.runner = steps.ws.runner
        self.speculative = options.mode in SPECULATIVE_MODES
        self.policy = policy
        self.device = steps.ws.target.self_k.device
        self.eager = self.runner.mode == "eager"
        # Eagerly on a CPU reading a drafted token costs nothing (on a GPU it would be a sync per draft), so
        # there drafting stops early: once every row drafted EOS (later drafts are never kept), and after one
        # draft that every row's hint continues (the hint proposes the rest).
        self.reads_are_free = self.eager and self.device.type == "cpu"
        runner = self.runner   # not `self`: a closure over the loop would make a reference cycle that kept every
        self.timings = Timings(lambda: runner.capture_s)   # decode's workspace until a full gc (docs/serving.md)
        self._num_draft: dict[tuple[int, int], torch.Tensor] = {}
        self.verify_steps: list[tuple[int, float]] = []
        self.verify_cpu_s = 0.0

    def run(self, batch: BatchState) -> None:
        while batch.active and batch.generated < self.max_len:
            proposal = self.propose(batch)
            self.timings.draft_s += self.timings.lap()
            result = self.score_and_verify(batch, proposal)
            finished = self.commit(batch, proposal, result)
            self.drop_finished(batch, finished)
            self.timings.lap()

    # ------------------------------------------------------------------ 1. propose
    def propose(self, b: BatchState) -> Proposal:
        budget = self.max_len - b.generated - 1  # one more token always comes from the target
        hints = b.tracker.proposals() if b.tracker is not None else None
        if not self.speculative:
            return self._hint_only(b, hints, budget) if hints is not None else Proposal()
        gamma = self.policy.next(budget)
        if gamma == 0:
            return Proposal()
        proposal = self._draft(b, gamma, hints)
        if hints is not None:
            proposal = self._extend_with_hint(b, proposal, hints, budget)
        return proposal

    def _draft(self, b: BatchState, gamma: int, hints: list[list[int]] | None = None) -> Proposal:
        """Up to `gamma` draft tokens; with `hints`, eagerly on a CPU (where reading a token costs nothing),
        only one where every row's first draft is its hint's next token: the hint then proposes the rest, and
        drafting on would mostly repeat it at a draft step each."""
        ws, steps = self.steps.ws, self.steps
        ids, state = b.history[:, self.draft_skip + ws.draft.length:], state_tensors(b.rules)
        batch = ids.shape[0]
        uniforms = self._uniforms(batch, gamma)
        tokens, logits = [], []
        for j in range(gamma):
            tensors = {"ids": ids, **state}
            if uniforms is not None:
                tensors["uniform"] = uniforms[:, j]
            length, first = ids.shape[1], b.generated + j == 0  # the rules differ before the first token
            out = self.runner.run(("draft", batch, length, first, *steps.key), steps.draft_step, tensors,
                                  ws.draft.length, length, capturable=length <= (MAX_CAPTURED_PROMPT if first else 2),
                                  generated=rules_count(b.generated + j))
            ws.draft.length += length
            token = out["token"] if self.eager else out["token"].clone()  # a graph's outputs are reused
            tokens.append(token)
            if uniforms is not None:
                logits.append(out["logits"] if self.eager else out["logits"].clone())
            state = {k: out[k] for k in ("last_is_ts", "penult_is_ts", "last_ts")}
            ids = token[:, None]
            if self.reads_are_free and bool((token == self.eos).all()):
                break
            if self.reads_are_free and j == 0 and hints is not None and self._hint_follows(b, token, hints):
                break
        return Proposal(tokens=torch.stack(tokens, dim=1),
                        draft_logits=torch.stack(logits, dim=1) if logits else None, drafted=len(tokens))

    @staticmethod
    def _hint_follows(b: BatchState, token: torch.Tensor, hints: list[list[int]]) -> bool:
        """Whether every active row's draft `token` [B] is its hint's next token (one host read)."""
        drafted = token.tolist()
        return all(hints[i][:1] == [drafted[i]] for i in b.active)

    def _hint_only(self, b: BatchState, hints: list[list[int]], budget: int) -> Proposal:
        count = min(min(len(hints[i]) for i in b.active), budget)
        if count <= 0:
            return Proposal()
        rows = [h[:count] if not b.done[i] else [self.eos] * count for i, h in enumerate(hints)]
        return Proposal(tokens=torch.tensor(rows, dtype=torch.long, device=self.device), hinted=count)

    def _extend_with_hint(self, b: BatchState, p: Proposal, hints: list[list[int]], budget: int) -> Proposal:
        """Where every row's drafts are what its hint says, the hint continues the proposal (a wrong hint
        costs nothing once the draft disagrees)."""
        drafts = p.tokens.tolist()
        active = b.active
        if any(hints[i][:p.drafted] != drafts[i] for i in active):
            return p
        count = min(min(len(hints[i]) for i in active) - p.drafted, budget - p.drafted)
        if count <= 0:
            return p
        extra = [h[p.drafted:p.drafted + count] if not b.done[i] else [self.eos] * count
                 for i, h in enumerate(hints)]
        tokens = torch.cat([p.tokens, torch.tensor(extra, dtype=torch.long, device=self.device)], dim=1)
        return Proposal(tokens=tokens, draft_logits=p.draft_logits, drafted=p.drafted, hinted=count)

    # ------------------------------------------------------------------ 2. score and verify
    def score_and_verify(self, b: BatchState, p: Proposal) -> dict[str, torch.Tensor]:
        ws, steps = self.steps.ws, self.steps
        gamma = p.gamma
        pending = b.history[:, ws.target.length:]
        ids = pending if p.tokens is None else torch.cat([pending, p.tokens], dim=1)
        mode, check_inputs = self._verify_inputs(p, b.history.shape[0])
        start, length = ws.target.length, ids.shape[1]
        first = b.generated == 0
        if self._replays_target(mode, gamma, length - gamma if first else 1):
            return self._replay_target(b, ids, gamma, check_inputs, mode)
        if first:
            return self._first_step(b, ids, p, check_inputs, mode)
        logits = self.runner.run(("score",), steps.score, {"ids": ids, **state_tensors(b.rules)}, start, length,
                                 capturable=False, proposals=gamma, generated=b.generated)
        ws.target.length = start + length
        self.timings.target_s += self.timings.lap()
        return self._check(logits, ids[:, length - gamma:], check_inputs, mode, gamma)

    def _verify_inputs(self, p: Proposal, batch: int) -> tuple[str, dict[str, torch.Tensor]]:
        """The verification mode of this step and what verification reads besides the target's logits."""
        mode = self.opts.mode if p.drafted else "exact"  # a hint alone is a one-hot draft; no proposal: sampling from p
        check_inputs = {"num_draft": self._num_draft_of(batch, p.gamma)}
        q_logits = self._q_logits(p, batch)
        if q_logits is not None:
            check_inputs["draft_logits"] = q_logits
        uniforms = self._uniforms(batch, p.gamma + 1)
        if uniforms is not None and mode != "baseline":
            check_inputs["uniforms"] = uniforms
        return mode, check_inputs

    def _replays_target(self, mode: str, gamma: int, pending: int) -> bool:
        """Whether this target step is captured: with graphs, unless the verification draws from a generator
        (baseline sampling) or is profiled, and only for shapes that recur (graphs are kept per shape, a
        bounded number): up to MAX_CAPTURED_PROPOSALS proposals (a long hint runs eagerly) and, for the
        prompt's step, a prompt without previous text."""
        opts = self.opts
        return (not self.eager and not opts.profile_verify and not (mode == "baseline" and opts.temperature > 0)
                and gamma <= MAX_CAPTURED_PROPOSALS and pending <= MAX_CAPTURED_PROMPT)

    def _replay_target(self, b: BatchState, ids, gamma: int, check_inputs, mode: str) -> dict[str, torch.Tensor]:
        ws, steps = self.steps.ws, self.steps
        start, length = ws.target.length, ids.shape[1]
        tensors = {"ids": ids, **state_tensors(b.rules), **check_inputs}
        if b.generated == 0:  # the prompt's step: also P(<|nospeech|>) at <|startoftranscript|>
            key = ("first", ids.shape[0], length, gamma, mode, self.sot_index, *steps.key)
            out = self.runner.run(key, steps.first_step, tensors, start, length, proposals=gamma, mode=mode,
                                  sot_index=self.sot_index, no_speech_id=self.no_speech_id)
            b.no_speech = out["no_speech"].clone()  # a graph's outputs are reused
        else:
            key = target_key(ids.shape[0], length, gamma, mode, steps.key)
            out = self.runner.run(key, steps.target_step, tensors, start, length, proposals=gamma,
                                  generated=rules_count(b.generated), mode=mode)
        ws.target.length = start + length
        self.timings.target_s += self.timings.lap()
        return out

    def _first_step(self, b: BatchState, ids, p: Proposal, check_inputs, mode) -> dict[str, torch.Tensor]:
        """The prompt's step, eagerly: also P(<|nospeech|>) at <|startoftranscript|>."""
        ws, steps = self.steps.ws, self.steps
        hidden = steps.target.step(ws.target, ids)
        logits, sot_logits = steps.score_hidden(hidden, ids, p.gamma, b.rules, self.sot_index)
        b.no_speech = no_speech_probability(sot_logits, self.no_speech_id)
        self.timings.target_s += self.timings.lap()
        return self._check(logits, ids[:, ids.shape[1] - p.gamma:], check_inputs, mode, p.gamma)

    def _check(self, logits, drafts, check_inputs, mode: str, gamma: int) -> dict[str, torch.Tensor]:
        if self.opts.profile_verify and gamma > 0:
            out, seconds = self._profiled(lambda: self.steps.check(logits, drafts=drafts, mode=mode, **check_inputs))
            self.verify_steps.append((gamma, seconds))
        else:
            out = self.steps.check(logits, drafts=drafts, mode=mode, **check_inputs)
        if gamma > 0:
            self.timings.verify_s += self.timings.lap()
        return out

    def _profiled(self, fn: Callable[[], dict]) -> tuple[dict, float]:
        """Verify inside the profiler label the evaluator sums, timed with syncs on both sides."""
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()
        t0, cpu0 = time.perf_counter(), time.process_time()
        with torch.profiler.record_function("asr_app.verify"):
            out = fn()
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()
        # Process CPU time does not count the time other programs held the cores, so it keeps
        # comparisons between modes fair on a loaded CPU (see docs/decoding.md).
        self.verify_cpu_s += time.process_time() - cpu0
        return out, time.perf_counter() - t0

    def _q_logits(self, p: Proposal, batch: int) -> torch.Tensor | None:
        """The draft distribution verification assumes, [B, g, V]: the draft's logits over the whole
        vocabulary (-inf where its head does not score), then one-hot rows for hint tokens. None where
        verification never reads it (T = 0, or nothing proposed)."""
        vocab = self.steps.target.head.space.vocab
        if self.opts.temperature == 0 or p.gamma == 0:
            return None
        parts = []
        if p.drafted:
            parts.append(self.steps.draft.head.space.to_full(p.draft_logits))
        if p.hinted:
            hint = p.tokens[:, p.drafted:]
            one_hot = torch.full((batch, p.hinted, vocab), float("-inf"), device=self.device)
            parts.append(one_hot.scatter_(-1, hint[..., None], 0.0).to(parts[0].dtype if parts else one_hot.dtype))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def _num_draft_of(self, batch: int, gamma: int) -> torch.Tensor:
        key = (batch, gamma)  # the same few (rows, gamma) pairs recur: allocate each once
        if key not in self._num_draft:
            self._num_draft[key] = torch.full((batch,), gamma, dtype=torch.long, device=self.device)
        return self._num_draft[key]

    def _uniforms(self, batch: int, count: int) -> torch.Tensor | None:
        if self.opts.temperature == 0 or count == 0:
            return None
        return torch.rand((batch, count), dtype=torch.float64, device=self.device, generator=self.generator)

    # ------------------------------------------------------------------ 3. commit
    def commit(self, b: BatchState, p: Proposal, result: dict[str, torch.Tensor]) -> list[int]:
        """Read the step's outcome once, keep the common accepted prefix + 1 token; returns finished rows."""
        gamma = p.gamma
        host = self._read_step(result)
        active = b.active
        common = min(int(host[i][gamma + 1]) for i in active)  # drafts every active row accepted
        keep = common + 1
        finished = []
        for i in active:
            row = host[i]
            tokens = [int(t) for t in row[:keep]]
            if self._record(b, i, p, tokens, row[gamma + 2 : gamma + 2 + keep], int(row[gamma + 1])):
                finished.append(i)
        self._advance_tracker(b, p, host, [keep] * len(b.done))
        if p.drafted:
            self.policy.update(p.drafted, min(common, p.drafted))
        ws = self.steps.ws
        length = b.history.shape[1]
        kept = result["tokens"][:, :keep].clamp_min(0)  # a finished row's padding must stay a valid id
        b.history = torch.cat([b.history, kept], dim=1)
        b.rules = self.steps.target_rules.advance(b.rules, kept)
        b.generated += keep
        ws.target.rollback(length + common)
        if ws.draft is not None and ws.draft.length > length + common - self.draft_skip:
            ws.draft.rollback(length + common - self.draft_skip)
        return finished

    def _record(self, b: BatchState, i: int, p: Proposal, tokens: list[int], logprobs: list[float],
                accepted: int) -> bool:
        """Statistics and output of batch row i for this step; True when the row emitted EOS."""
        r = b.rows[i]
        st = b.stats[r]
        accepted = min(accepted, p.gamma)
        st.target_calls += 1
        st.drafted += p.drafted
        st.accepted += min(accepted, p.drafted)
        if p.hinted:
            st.hint_steps += 1
            st.hinted += p.hinted
            st.hint_accepted += max(0, accepted - p.drafted)
        if self.eos in tokens:
            tokens = tokens[: tokens.index(self.eos) + 1]
        b.out_tokens[r] += [t for t in tokens if t != self.eos]
        st.tokens_out += len(tokens)
        b.logprob_count[r] += len(tokens)
        b.logprob_sum[r] += sum(logprobs[: len(tokens)])
        return tokens[-1] == self.eos

    @staticmethod
    def _read_step(result: dict[str, torch.Tensor]) -> list[list[float]]:
        """The step's one device-to-host read: per row its tokens, accepted count and log-probabilities."""
        return torch.cat([result["tokens"].double(), result["num_accepted"][:, None].double(),
                          result["logprobs"].double()], dim=1).cpu().tolist()

    def _advance_tracker(self, b: BatchState, p: Proposal, host: list[list[float]], keeps: list[int]) -> None:
        """Follow each active row's kept tokens (`keeps[i]` of them) through its hint."""
        if b.tracker is None:
            return
        if p.hinted:
            b.hint_steps_left -= 1
        if b.hint_steps_left == 0:
            b.tracker = None  # the hint has had its steps: stop following the output
            return
        for i in b.active:
            b.tracker.advance(i, [int(t) for t in host[i][:keeps[i]]])

    # ------------------------------------------------------------------ 4. drop finished rows
    def drop_finished(self, b: BatchState, finished: list[int]) -> None:
        for i in finished:
            b.done[i] = True
        if not finished or not self.eager or not b.active:
            return
        alive = b.active
        index = torch.tensor(alive, dtype=torch.long, device=self.device)
        b.rows = [b.rows[i] for i in alive]
        b.done = [False] * len(alive)
        b.history, b.rules = b.history[index], b.rules.select(index)
        if b.tracker is not None:
            b.tracker.keep_rows(alive)
        ws = self.steps.ws
        ws.target.select(index)
        if ws.draft is not None:
            ws.draft.select(index)
