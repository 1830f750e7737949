"""The two device-side steps of speculative decoding, written to be captured in CUDA graphs.

`draft_step`: one draft forward pass, the draft's output head, Whisper's rules, the draft's choice and
the rule state after it. `target_step`: the target's forward pass over the pending token(s) and every
proposal, its head, the rules at each position, verification, and the log-probabilities of the
candidate tokens. Both take and return tensors only and read nothing back to the host (the runner's
`emulate` mode checks this), and both read the per-window decoder states through the workspace, whose
tensors live as long as the graphs that captured them. Everything else they depend on (shapes, mode,
temperature) is part of the key the runner captures them under.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asr_app.decoding.options import DecodingOptions
from asr_app.decoding.rules import RuleState, WhisperLogitRules
from asr_app.kernels import VerifyRandomness, verify
from asr_app.kernels.common import inverse_cdf_sample
from asr_app.runtime import DecoderRuntime, DecoderState, StepRunner


@dataclass
class Workspace:
    """Per batch: the target's and the draft's decoder states and the captured steps that use them."""

    target: DecoderState
    draft: DecoderState | None
    runner: StepRunner


def choose(logits: torch.Tensor, temperature: float, uniform: torch.Tensor | None) -> torch.Tensor:
    """Index [B] from processed logits [B, K]: argmax at T = 0, else an inverse-CDF draw from
    softmax(logits / T) with the row's uniform (graph-safe, unlike torch.multinomial with a generator)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return inverse_cdf_sample(probs, probs, uniform)


def no_speech_probability(sot_logits: torch.Tensor, no_speech_id: int) -> torch.Tensor:
    """[B]: P(<|nospeech|>) from the target's raw logits at <|startoftranscript|> [B, V]."""
    return torch.softmax(sot_logits.float(), dim=-1)[:, no_speech_id]


def rules_count(generated: int) -> int:
    """The generated-token count a captured step is given: 0 or 1. Whisper's rules only ask whether a token
    was generated yet (the blank and EOS at the start, the first timestamp, a timestamp pair's first half),
    and the steps are keyed apart at 0 (`first`); the count itself stays on the host. Passing it whole would
    bake one step's count into a graph that every later step replays (StepRunner refuses that)."""
    return min(generated, 1)


def rule_state(generated: int, last_is_ts, penult_is_ts, last_ts) -> RuleState:
    return RuleState(generated, last_is_ts, penult_is_ts, last_ts)


def options_key(options: DecodingOptions) -> tuple:
    """What a captured step bakes in of the decoding options (rules objects are cached per timestamps setting)."""
    return (options.mode, options.temperature, options.alpha, options.beta, options.timestamps)


def target_key(batch: int, length: int, proposals: int, mode: str, options: tuple) -> tuple:
    """The capture key of a target step over `length` tokens, the last `proposals` of them proposed, verified
    in `mode`, under `options_key(...)` = `options`: the loop's, the step timer's and the pre-capture's."""
    return ("target", batch, length, proposals, mode, *options)


def state_tensors(state: RuleState) -> dict[str, torch.Tensor]:
    return {"last_is_ts": state.last_is_ts, "penult_is_ts": state.penult_is_ts, "last_ts": state.last_ts}


class Steps:
    """The step functions of one decoding configuration over one workspace."""

    def __init__(self, target: DecoderRuntime, draft: DecoderRuntime | None, workspace: Workspace,
                 target_rules: WhisperLogitRules, draft_rules: WhisperLogitRules | None,
                 options: DecodingOptions, generator: torch.Generator | None) -> None:
        self.target, self.draft, self.ws = target, draft, workspace
        self.target_rules, self.draft_rules = target_rules, draft_rules
        self.options = options
        self.key = options_key(options)  # what a captured step bakes in besides its shapes
        self.generator = generator  # only mode baseline draws from it inside a step (never captured)

    def draft_step(self, *, positions, span, mask, ids, last_is_ts, penult_is_ts, last_ts, uniform=None,
                   last=None, generated: int) -> dict[str, torch.Tensor]:
        """ids [B, L] -> the next draft token [B] (vocabulary ids), its processed logits [B, K] over the
        draft's token space, and the rule state after it. `last` [B]: the column of each row's last real
        token where rows are padded on the right (decoding/ragged.py); None: the last column."""
        hidden = self.draft.forward(self.ws.draft, ids, positions, span, mask)
        hidden = (hidden[:, -1:] if last is None
                  else hidden[torch.arange(hidden.shape[0], device=hidden.device), last][:, None])
        state = rule_state(generated, last_is_ts, penult_is_ts, last_ts)
        logits = self.draft_rules.apply(self.draft.logits(hidden), state)[:, 0]
        token = self.draft.head.space.to_ids(choose(logits, self.options.temperature, uniform))
        after = self.draft_rules.advance(state, token[:, None])
        return {"token": token, "logits": logits, **state_tensors(after)}

    def score(self, *, positions, span, mask, ids, last_is_ts, penult_is_ts, last_ts, proposals: int,
              generated: int) -> torch.Tensor:
        """Processed target logits [B, g+1, V] at the last pending token and each of the g proposals
        (the last g entries of `ids`)."""
        hidden = self.target.forward(self.ws.target, ids, positions, span, mask)
        return self.score_hidden(hidden, ids, proposals, rule_state(generated, last_is_ts, penult_is_ts, last_ts))[0]

    def score_hidden(self, hidden: torch.Tensor, ids: torch.Tensor, proposals: int, state: RuleState,
                     sot_index: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(processed logits [B, g+1, V], raw logits [B, V] at `sot_index` or None). The prompt's step
        also scores <|startoftranscript|> for the no-speech probability, in the same output-layer call:
        the layer is memory-bound on a CPU, so one call reads its weights once for both."""
        length = ids.shape[1]
        scored = hidden[:, length - proposals - 1:]
        if sot_index is not None:
            scored = torch.cat([hidden[:, sot_index : sot_index + 1], scored], dim=1)
        logits = self.target.logits(scored)
        sot = None
        if sot_index is not None:
            sot, logits = logits[:, 0], logits[:, 1:]
        return self.target_rules.apply(logits, state, ids[:, length - proposals:]), sot

    def check(self, target_logits, drafts, num_draft, draft_logits=None, uniforms=None, *, mode: str
              ) -> dict[str, torch.Tensor]:
        """Verification plus the log-probability of every candidate token (padding reads id 0).
        `draft_logits` None: greedy verification, which never reads them (a broadcast view stands in)."""
        opts = self.options
        if draft_logits is None:
            batch, rows, vocab = target_logits.shape
            draft_logits = target_logits.new_zeros((1, 1, 1)).expand(batch, rows - 1, vocab)
        randomness = VerifyRandomness(uniforms) if uniforms is not None else None
        res = verify(target_logits, draft_logits, drafts, num_draft, mode=mode, temperature=opts.temperature,
                     alpha=opts.alpha, beta=opts.beta, generator=self.generator, randomness=randomness,
                     check_values=self.ws.runner.mode == "eager")
        # log_softmax + gather: on a CPU twice as fast as a logsumexp over the vocabulary
        logprobs = target_logits.float().log_softmax(dim=-1).gather(-1, res.tokens.clamp_min(0)[..., None])[..., 0]
        return {"tokens": res.tokens, "num_accepted": res.num_accepted, "logprobs": logprobs}

    def first_step(self, *, positions, span, mask, ids, last_is_ts, penult_is_ts, last_ts, num_draft,
                   draft_logits=None, uniforms=None, proposals: int, mode: str, sot_index: int, no_speech_id: int
                   ) -> dict[str, torch.Tensor]:
        """The prompt's target step (nothing generated yet): `target_step`'s outputs and `no_speech`, the
        target's P(<|nospeech|>) at <|startoftranscript|> [B]."""
        hidden = self.target.forward(self.ws.target, ids, positions, span, mask)
        logits, sot = self.score_hidden(hidden, ids, proposals, rule_state(0, last_is_ts, penult_is_ts, last_ts),
                                        sot_index)
        out = self.check(logits, ids[:, ids.shape[1] - proposals:], num_draft, draft_logits, uniforms, mode=mode)
        return {**out, "no_speech": no_speech_probability(sot, no_speech_id)}

    def target_step(self, *, positions, span, mask, ids, last_is_ts, penult_is_ts, last_ts, num_draft,
                    draft_logits=None, uniforms=None, proposals: int, generated: int, mode: str
                    ) -> dict[str, torch.Tensor]:
        """score + check in one function (what a CUDA graph captures)."""
        logits = self.score(positions=positions, span=span, mask=mask, ids=ids, last_is_ts=last_is_ts,
                            penult_is_ts=penult_is_ts, last_ts=last_ts, proposals=proposals, generated=generated)
        return self.check(logits, ids[:, ids.shape[1] - proposals:], num_draft, draft_logits, uniforms, mode=mode)
