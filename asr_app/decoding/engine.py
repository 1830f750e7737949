"""The speculative decoding loop: draft proposes gamma tokens, target scores them in one pass, verify decides.

One loop serves every mode: `off` is the same loop with gamma = 0 (target only), `baseline`/`exact`/
`sigmoid` call `asr_app.kernels.verify`, `hf` hands over to transformers (see hf_mode.py).

Hints (every mode but `hf`): tokens the caller expects to follow the prompt, typically the previous
decode of a streaming buffer that has since grown by a second (the idea of Yang et al. 2023, "Inference
with Reference": copy a likely continuation and let the target check it in one pass). In `off` the
hint is a step's whole proposal; with a draft model, the draft proposes first and, where every row's
drafts equal its hint, the hint's continuation is appended, so a hint only ever lengthens a step.
After a disagreement the output is realigned with the hint (hints.py); at most HintTracker.MAX_STEPS
steps per decode use it. A hint is a deterministic draft, q = one-hot, verified exactly (greedily at
T = 0, with the exact rule at T > 0), so the tokens at T = 0 and their distribution at T > 0 are those
without it. (Comparing drafts with the hint reads the drafts on the host: one more sync per step on a
GPU, paid only by callers that pass hints.)

Batches: rows advance in lock-step so both KV caches keep one length for the whole batch. After a
verification each row has its own number of accepted drafts; the step keeps `m + 1` tokens for every
row, where `m` is the smallest acceptance among the active rows (rows that accepted more keep their
first m+1 tokens, all accepted drafts). This is exact: for greedy every kept token is the target's
argmax, and for sampling each kept token is a verification output whose stopping point does not
depend on its own value, so its distribution is still the target's. The cost is work thrown away:
drafts a row accepted beyond m are drafted and scored again next step. Rows that finish (EOS) are
dropped from the batch (caches, encoder output and rule state are index-selected), so a finished row
costs nothing afterwards and no longer holds the others back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from asr_app.decoding.gamma import GammaPolicy
from asr_app.decoding.hf_mode import decode_hf
from asr_app.decoding.hints import HintTracker
from asr_app.decoding.options import DecodingOptions, DecodingResult, DecodingStats
from asr_app.decoding.prompt import Prompt, build_prompt
from asr_app.decoding.rules import RuleState, WhisperLogitRules
from asr_app.decoding.text import decode_text, split_segments

SAMPLE_RATE = 16_000
MAX_WINDOW_S = 30.0
SPECULATIVE_MODES = ("baseline", "exact", "sigmoid")


def _decoder_step(model, ids: torch.Tensor, encoder_hidden: torch.Tensor, cache):
    """Run `model`'s decoder on `ids` (the tokens not yet in `cache`); hidden states + updated cache."""
    out = model.get_decoder()(input_ids=ids, encoder_hidden_states=encoder_hidden, past_key_values=cache,
                              use_cache=True)
    return out.last_hidden_state, out.past_key_values


def _output_logits(proj: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """`proj(hidden)` for hidden [B, L, d]: the output layer (V x d, tied to the token embeddings).

    On a CPU in fp32, `F.linear` with the few rows of a decoding step takes a path that reads the large
    weight several times (5.5 ms for tiny.en's 51864 x 384 at one row, 8-10 ms at 2-8 rows, 2 threads);
    `W @ hidden^T` streams it once (1.5-3 ms), and needs at least 2 columns to avoid the matrix-vector
    path. Same products, summed in another order: values agree to ~1e-5, argmaxes in every test."""
    rows = hidden.shape[0] * hidden.shape[1]
    weight = proj.weight
    if hidden.device.type != "cpu" or weight.dtype != torch.float32 or rows > 16 or proj.bias is not None:
        return proj(hidden)
    flat = hidden.reshape(rows, hidden.shape[-1])
    if rows == 1:
        flat = torch.cat([flat, flat])  # a real second row: a stride-0 view takes a slow path again
    return torch.mm(weight, flat.t()).t()[:rows].reshape(*hidden.shape[:-1], weight.shape[0])


def _one_hot_logits(tokens: torch.Tensor, vocab: int, temperature: float) -> torch.Tensor:
    """Draft logits [B, g, V] for a deterministic draft: 0 at the token, -inf elsewhere (q = one-hot).
    Greedy verification never reads draft logits, so at T = 0 a broadcast view stands in for them."""
    if temperature == 0:
        return torch.zeros((1, 1, 1), device=tokens.device).expand(*tokens.shape, vocab)
    logits = torch.full((*tokens.shape, vocab), float("-inf"), device=tokens.device)
    return logits.scatter_(-1, tokens[..., None], 0.0)


def _crop(cache, tokens_to_drop: int) -> None:
    if cache is not None and tokens_to_drop > 0:
        cache.crop(-tokens_to_drop)  # transformers 5.x: a negative count of tokens to remove


class _Timer:
    """Wall time per phase with no device syncs (on CUDA it measures launch time unless synced)."""

    def __init__(self) -> None:
        self.t = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt


class SpeculativeDecoder:
    def __init__(self, pair, options: DecodingOptions = DecodingOptions()) -> None:
        self.pair = pair
        self.options = options
        self.target = pair.target
        self.draft = pair.draft
        self.tokenizer = pair.processor.tokenizer
        self.feature_extractor = pair.processor.feature_extractor
        gc = self.target.generation_config
        self.generation_config = gc
        self.eos = gc.eos_token_id if isinstance(gc.eos_token_id, int) else gc.eos_token_id[0]
        self.timestamp_begin = gc.no_timestamps_token_id + 1
        self.no_speech_id = gc.no_timestamps_token_id - 1  # <|nospeech|> (<|nocaptions|> in .en models)
        self.vocab = self.target.config.vocab_size
        self.max_positions = self.target.config.max_target_positions

    # ------------------------------------------------------------------ public API
    def decode(self, audio: np.ndarray | list[np.ndarray], options: DecodingOptions | None = None,
               prompts: list[str | None] | None = None,
               hints: Sequence[Sequence[int] | None] | None = None) -> list[DecodingResult]:
        """Decode clips of at most 30 s. `prompts`: previous text per clip; `hints`: expected output tokens
        per clip (see the module docstring; they change the speed, never the result; `hf` ignores them)."""
        if isinstance(audio, np.ndarray | torch.Tensor):
            if audio.ndim != 1:  # never read an (N, C) array as N clips (DESIGN.md: that exhausts memory)
                raise ValueError(f"expected mono samples of shape (N,) or a list of clips, got an array of shape "
                                 f"{tuple(audio.shape)}; downmix and resample first (asr_app.audio.prepare_audio)")
            audio = [audio]
        clips = list(audio)
        if not clips:
            raise ValueError("no audio given: pass one clip or a non-empty list of clips")
        for i, clip in enumerate(clips):
            clip = np.asarray(clip)
            if clip.ndim != 1:
                raise ValueError(f"clip {i}: expected mono samples of shape (N,), got shape {clip.shape}")
            if clip.size == 0:
                raise ValueError(f"clip {i} is empty (0 samples)")
            if clip.size > MAX_WINDOW_S * SAMPLE_RATE:
                raise ValueError(f"clip {i} is {clip.size / SAMPLE_RATE:.1f} s long; decode takes windows of at "
                                 f"most {MAX_WINDOW_S:.0f} s (use asr_app.transcribe for long audio)")
            if not np.isfinite(clip).all():
                raise ValueError(f"clip {i} contains NaN or infinite samples")
        feats = self.feature_extractor([np.asarray(c, dtype=np.float32) for c in clips],
                                       sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        windows = [len(c) / SAMPLE_RATE for c in clips]
        return self._decode(feats, options, prompts, windows, hints)

    def decode_features(self, features: torch.Tensor, options: DecodingOptions | None = None,
                        prompts: list[str | None] | None = None,
                        hints: Sequence[Sequence[int] | None] | None = None) -> list[DecodingResult]:
        if features.dim() == 2:
            features = features[None]
        expected = (self.target.config.num_mel_bins, 2 * self.target.config.max_source_positions)
        if features.dim() != 3 or tuple(features.shape[1:]) != expected or features.shape[0] == 0:
            raise ValueError(f"features must have shape [B, {expected[0]}, {expected[1]}], got "
                             f"{tuple(features.shape)}")
        return self._decode(features, options, prompts, [MAX_WINDOW_S] * features.shape[0], hints)

    # ------------------------------------------------------------------ batching
    def _decode(self, feats, options, prompts, windows, hints=None) -> list[DecodingResult]:
        opts = options or self.options
        if opts.mode != "off" and self.draft is None:
            raise ValueError(f"mode '{opts.mode}' needs a draft model; load a pair with a draft or use mode 'off'")
        batch = feats.shape[0]
        if prompts is None:
            prompts = [None] * batch
        if len(prompts) != batch:
            raise ValueError(f"got {len(prompts)} prompts for {batch} clips")
        if hints is None:
            hints = [None] * batch
        if len(hints) != batch:
            raise ValueError(f"got {len(hints)} hints for {batch} clips")
        hints = [self._checked_hint(h, i) for i, h in enumerate(hints)]
        built = [build_prompt(self.generation_config, self.tokenizer, language=opts.language, task=opts.task,
                              timestamps=opts.timestamps, previous_text=p,
                              max_target_positions=self.max_positions) for p in prompts]
        feats = feats.to(device=self.pair.device, dtype=self.pair.dtype)
        results: list[DecodingResult | None] = [None] * batch
        if opts.mode == "hf":
            for i in range(batch):
                results[i] = self._decode_hf(feats[i : i + 1], built[i], opts, windows[i])
            return results  # type: ignore[return-value]
        # Rows of one lock-step batch need prompts of one length (the caches have one length).
        groups: dict[tuple[int, int], list[int]] = {}
        for i, p in enumerate(built):
            groups.setdefault((len(p.tokens), p.sot_index), []).append(i)
        for rows in groups.values():
            prompt_rows = [built[i] for i in rows]
            decoded = self._decode_batch(feats[rows], prompt_rows, opts, [windows[i] for i in rows],
                                         [hints[i] for i in rows])
            for i, res in zip(rows, decoded):
                results[i] = res
        return results  # type: ignore[return-value]

    def _checked_hint(self, hint, index: int) -> list[int] | None:
        if hint is None:
            return None
        tokens = [int(t) for t in hint]
        bad = [t for t in tokens if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"hint {index}: token ids must lie in [0, {self.vocab}), got {bad[:5]}")
        return tokens or None

    def _decode_hf(self, feats, prompt: Prompt, opts, window) -> DecodingResult:
        tokens, stats = decode_hf(self.target, self.draft, feats, prompt, opts,
                                  multilingual=bool(getattr(self.generation_config, "is_multilingual", False)),
                                  shared_encoder=self.pair.shared_encoder)
        if tokens and tokens[-1] == self.eos:
            tokens = tokens[:-1]
        return self._result(tokens, float("nan"), float("nan"), stats, opts, window)

    def _result(self, tokens, no_speech, avg_logprob, stats, opts, window) -> DecodingResult:
        return DecodingResult(
            tokens=tokens,
            text=decode_text(self.tokenizer, tokens, self.eos),
            segments=split_segments(self.tokenizer, tokens, self.eos,
                                    self.timestamp_begin if opts.timestamps else None, window),
            no_speech_prob=no_speech,
            avg_logprob=avg_logprob,
            stats=stats,
        )

    # ------------------------------------------------------------------ the loop
    def _choose(self, logits: torch.Tensor, opts: DecodingOptions, generator, draft: bool) -> torch.Tensor:
        """Next token [B] from processed logits [B, V]: argmax at T=0, else a sample from the distribution
        the verifier will use as q (draft) or from softmax(logits / T) (target only)."""
        if opts.temperature == 0:
            return logits.argmax(dim=-1)
        if draft:
            from asr_app.kernels import draft_probs_from_logits

            probs = draft_probs_from_logits(logits, mode=opts.mode, temperature=opts.temperature,
                                            alpha=opts.alpha, beta=opts.beta)
        else:
            probs = torch.softmax(logits.float() / opts.temperature, dim=-1)
        return torch.multinomial(probs.float(), 1, generator=generator)[:, 0]

    @torch.inference_mode()
    def _decode_batch(self, feats: torch.Tensor, prompts: Sequence[Prompt], opts: DecodingOptions,
                      windows: Sequence[float], hints: Sequence[list[int] | None]) -> list[DecodingResult]:
        batch, device = feats.shape[0], self.pair.device
        speculative = opts.mode in SPECULATIVE_MODES
        shared = self.pair.shared_encoder if speculative else False
        stats = [DecodingStats(mode=opts.mode, shared_encoder=shared) for _ in range(batch)]
        rules = WhisperLogitRules(self.generation_config, self.vocab, device, opts.timestamps)
        generator = None
        if opts.temperature > 0:
            generator = torch.Generator(device=device)
            generator.manual_seed(opts.seed)
        # Lock-step rows share each step's width: a hint step needs a proposal for every row.
        tracker = HintTracker([h for h in hints if h]) if hints and all(hints) else None
        hint_steps_left = HintTracker.MAX_STEPS
        if speculative or tracker is not None:
            from asr_app.kernels import verify

        t_begin = time.perf_counter()
        timer = _Timer()
        encoder_hidden = self.target.get_encoder()(feats).last_hidden_state
        draft_hidden = None
        if speculative:  # the draft may run in its own dtype (ModelPair.draft_dtype)
            draft_dtype = self.pair.draft_compute_dtype
            draft_hidden = (encoder_hidden.to(draft_dtype) if shared
                            else self.draft.get_encoder()(feats.to(draft_dtype)).last_hidden_state)
        encoder_s = timer.lap()
        draft_s = target_s = verify_s = 0.0
        verify_steps: list[tuple[int, float]] = []

        sot_index = prompts[0].sot_index
        history = torch.tensor([list(p.tokens) for p in prompts], dtype=torch.long, device=device)
        prompt_len = history.shape[1]
        max_len = min(opts.max_new_tokens, self.max_positions - prompt_len)
        if max_len < 1:
            raise ValueError(f"prompt of {prompt_len} tokens leaves no room in {self.max_positions} positions")
        rows = list(range(batch))  # original index of each active row
        rows_dev = torch.arange(batch, device=device)
        out_tokens: list[list[int]] = [[] for _ in range(batch)]
        logprob_sum = torch.zeros(batch, dtype=torch.float32, device=device)
        logprob_count = [0] * batch
        no_speech = torch.zeros(batch, dtype=torch.float32, device=device)
        state = RuleState.initial(batch, device)
        policy = GammaPolicy(opts.gamma)
        stop_at_eos = device.type == "cpu"
        num_draft_cache: dict[tuple[int, int], torch.Tensor] = {}
        t_cache = d_cache = None
        t_len = d_len = 0  # tokens of `history` already in each cache
        generated = 0

        while rows and generated < max_len:
            length = history.shape[1]
            proposals = tracker.proposals() if tracker is not None else None
            budget = max_len - generated - 1  # proposals this step may hold (one more token comes from the target)
            model_gamma = policy.next(budget) if speculative else 0
            drafted = hinted = 0  # this step's proposals: `drafted` from the draft model, then `hinted` from the hint
            draft_tokens = draft_logits = None
            if proposals is not None and not speculative:
                # ---- target only: the hint is the whole proposal
                hinted = min(min(len(p) for p in proposals), budget)
                if hinted > 0:
                    draft_tokens = torch.tensor([p[:hinted] for p in proposals], dtype=torch.long, device=device)
                    draft_logits = _one_hot_logits(draft_tokens, self.vocab, opts.temperature)
            elif model_gamma > 0:
                # ---- draft proposes gamma tokens, each from rule-processed logits with its own prefix
                draft_state, ids = state, history[:, d_len:]
                tokens_list, logits_list = [], []
                for _ in range(model_gamma):
                    hidden, d_cache = _decoder_step(self.draft, ids, draft_hidden, d_cache)
                    logits = rules.apply(_output_logits(self.draft.proj_out, hidden[:, -1:]), draft_state)
                    token = self._choose(logits[:, 0], opts, generator, draft=True)
                    draft_state = rules.advance(draft_state, token[:, None])
                    tokens_list.append(token)
                    logits_list.append(logits)
                    ids = token[:, None]
                    # Drafts after an EOS are never kept, so stop once every row has drafted EOS. Only on
                    # CPU, where reading the token costs nothing; on a GPU it would be a sync per draft.
                    if stop_at_eos and bool((token == self.eos).all()):
                        break
                drafted = len(tokens_list)
                d_len = length + drafted - 1  # the last draft token is proposed but not yet fed
                draft_tokens = torch.stack(tokens_list, dim=1)
                draft_logits = torch.cat(logits_list, dim=1)
                if proposals is not None:
                    # ---- where every row's drafts are what its hint says, the hint continues the proposal
                    # (so a hint only ever lengthens a step: a wrong hint costs nothing once the draft disagrees)
                    drafts_host = draft_tokens.tolist()
                    if all(p[:drafted] == d for p, d in zip(proposals, drafts_host)):
                        hinted = max(0, min(min(len(p) for p in proposals) - drafted, budget - drafted))
                    if hinted:
                        extra = torch.tensor([p[drafted : drafted + hinted] for p in proposals], dtype=torch.long,
                                             device=device)
                        draft_tokens = torch.cat([draft_tokens, extra], dim=1)
                        draft_logits = (_one_hot_logits(draft_tokens, self.vocab, 0.0) if opts.temperature == 0
                                        else torch.cat([draft_logits, _one_hot_logits(
                                            extra, self.vocab, opts.temperature).to(draft_logits.dtype)], dim=1))
                draft_s += timer.lap()
            gamma = drafted + hinted
            # ---- target scores the pending history token(s) and every draft in one pass
            ids = history[:, t_len:] if draft_tokens is None else torch.cat([history[:, t_len:], draft_tokens], 1)
            hidden, t_cache = _decoder_step(self.target, ids, encoder_hidden, t_cache)
            if generated == 0:
                # P(<|nospeech|>) at <|startoftranscript|>, scored in the same output-layer call as the step's
                # positions: on a CPU that layer is memory-bound (V x d weights read per call), so one call, not two.
                scored = torch.cat([hidden[:, sot_index : sot_index + 1], hidden[:, -(gamma + 1):]], dim=1)
                raw_logits = _output_logits(self.target.proj_out, scored)
                no_speech = torch.softmax(raw_logits[:, 0].float(), dim=-1)[:, self.no_speech_id]
                raw_logits = raw_logits[:, 1:]
            else:
                raw_logits = _output_logits(self.target.proj_out, hidden[:, -(gamma + 1):])
            target_logits = rules.apply(raw_logits, state, draft_tokens)
            target_s += timer.lap()
            # ---- verification (or a plain target choice when nothing was drafted)
            if gamma > 0:
                key = (len(rows), gamma)  # the same few (rows, gamma) pairs recur: allocate each once
                num_draft = num_draft_cache.get(key)
                if num_draft is None:
                    num_draft = num_draft_cache[key] = torch.full(key[:1], gamma, dtype=torch.long, device=device)
                if hinted and not drafted:  # the hint alone: a deterministic draft, verified exactly
                    res = verify(target_logits, draft_logits, draft_tokens, num_draft, mode="exact",
                                 temperature=opts.temperature, generator=generator)
                    new_tokens, num_accepted = res.tokens, res.num_accepted
                elif opts.profile_verify:
                    new_tokens, num_accepted, dt = self._profiled_verify(
                        verify, target_logits, draft_logits, draft_tokens, num_draft, opts, generator)
                    verify_steps.append((gamma, dt))
                else:
                    res = verify(target_logits, draft_logits, draft_tokens, num_draft, mode=opts.mode,
                                 temperature=opts.temperature, alpha=opts.alpha, beta=opts.beta,
                                 generator=generator)
                    new_tokens, num_accepted = res.tokens, res.num_accepted
                verify_s += timer.lap()
            else:
                new_tokens = self._choose(target_logits[:, -1], opts, generator, draft=False)[:, None]
                num_accepted = torch.zeros(len(rows), dtype=torch.long, device=device)
            # ---- the one device-to-host copy of the step
            host = torch.cat([new_tokens, num_accepted[:, None]], dim=1).cpu().tolist()
            common = min(row[-1] for row in host)  # drafts every active row accepted
            keep = common + 1
            # log p(token) of the kept tokens only (queued after the copy: no extra sync)
            kept_logits = target_logits[:, :keep].float()
            logprobs = kept_logits.gather(-1, new_tokens[:, :keep, None])[..., 0] - kept_logits.logsumexp(dim=-1)
            step_logprob = logprobs.sum(dim=1)
            finished: list[int] = []
            for i, r in enumerate(rows):
                toks = host[i][:keep]
                st = stats[r]
                st.target_calls += 1
                accepted = min(host[i][-1], gamma)
                st.draft_calls += drafted
                st.drafted += drafted
                st.accepted += min(accepted, drafted)
                if hinted:
                    st.hint_steps += 1
                    st.hinted += hinted
                    st.hint_accepted += max(0, accepted - drafted)
                if self.eos in toks:
                    k = toks.index(self.eos)
                    out_tokens[r] += toks[:k]
                    st.tokens_out += k + 1
                    logprob_count[r] += k + 1
                    if k + 1 < keep:
                        step_logprob[i] = logprobs[i, : k + 1].sum()
                    finished.append(i)
                else:
                    out_tokens[r] += toks
                    st.tokens_out += keep
                    logprob_count[r] += keep
            logprob_sum.index_add_(0, rows_dev, step_logprob)
            if tracker is not None:
                if hinted:
                    hint_steps_left -= 1
                if hint_steps_left == 0:
                    tracker = None  # the hint has had its steps: stop following the output
                else:
                    for i in range(len(rows)):
                        tracker.advance(i, host[i][:keep])
            if drafted:
                policy.update(drafted, min(common, drafted))
            # ---- advance: append kept tokens, crop both caches to what is now known to be right
            kept = new_tokens[:, :keep]
            history = torch.cat([history, kept], dim=1)
            state = rules.advance(state, kept)
            generated += keep
            _crop(t_cache, gamma - common)  # target holds length + gamma; keep length + common
            t_len = length + common
            if drafted and common < drafted - 1:  # the draft cache holds length + drafted - 1 tokens
                _crop(d_cache, drafted - 1 - common)
                d_len = length + common
            if finished:
                alive = [i for i in range(len(rows)) if i not in finished]
                rows = [rows[i] for i in alive]
                if not rows:
                    break
                if tracker is not None:
                    tracker.keep_rows(alive)
                index = torch.tensor(alive, dtype=torch.long, device=device)
                rows_dev = rows_dev[index]
                history, encoder_hidden, state = history[index], encoder_hidden[index], state.select(index)
                t_cache.reorder_cache(index)
                if speculative:
                    draft_hidden = draft_hidden[index]
                    if d_cache is not None:
                        d_cache.reorder_cache(index)
            timer.lap()

        total_s = time.perf_counter() - t_begin
        no_speech_host = no_speech.cpu().tolist()
        logprob_host = logprob_sum.cpu().tolist()
        results = []
        for r in range(batch):
            st = stats[r]
            st.encoder_s, st.draft_s, st.target_s, st.verify_s, st.total_s = (
                encoder_s, draft_s, target_s, verify_s, total_s)
            st.verify_steps = list(verify_steps)
            st.finalise()
            avg = logprob_host[r] / logprob_count[r] if logprob_count[r] else float("nan")
            results.append(self._result(out_tokens[r], no_speech_host[r], avg, st, opts, windows[r]))
        return results

    def _profiled_verify(self, verify, target_logits, draft_logits, draft_tokens, num_draft, opts, generator):
        """Verify inside the profiler label the evaluator sums, timed with syncs on both sides."""
        cuda = target_logits.is_cuda
        if cuda:
            torch.cuda.synchronize(target_logits.device)
        t0 = time.perf_counter()
        with torch.profiler.record_function("asr_app.verify"):
            res = verify(target_logits, draft_logits, draft_tokens, num_draft, mode=opts.mode,
                         temperature=opts.temperature, alpha=opts.alpha, beta=opts.beta, generator=generator)
        if cuda:
            torch.cuda.synchronize(target_logits.device)
        return res.tokens, res.num_accepted, time.perf_counter() - t0
