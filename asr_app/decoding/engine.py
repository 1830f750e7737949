"""The speculative decoding loop: draft proposes gamma tokens, target scores them in one pass, verify decides.

One loop serves every mode: `off` is the same loop with gamma = 0 (target only), `baseline`/`exact`/
`sigmoid` call `asr_app.kernels.verify`, `hf` hands over to transformers (see hf_mode.py).

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
               prompts: list[str | None] | None = None) -> list[DecodingResult]:
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
        return self._decode(feats, options, prompts, windows)

    def decode_features(self, features: torch.Tensor, options: DecodingOptions | None = None,
                        prompts: list[str | None] | None = None) -> list[DecodingResult]:
        if features.dim() == 2:
            features = features[None]
        expected = (self.target.config.num_mel_bins, 2 * self.target.config.max_source_positions)
        if features.dim() != 3 or tuple(features.shape[1:]) != expected or features.shape[0] == 0:
            raise ValueError(f"features must have shape [B, {expected[0]}, {expected[1]}], got "
                             f"{tuple(features.shape)}")
        return self._decode(features, options, prompts, [MAX_WINDOW_S] * features.shape[0])

    # ------------------------------------------------------------------ batching
    def _decode(self, feats, options, prompts, windows) -> list[DecodingResult]:
        opts = options or self.options
        if opts.mode != "off" and self.draft is None:
            raise ValueError(f"mode '{opts.mode}' needs a draft model; load a pair with a draft or use mode 'off'")
        batch = feats.shape[0]
        if prompts is None:
            prompts = [None] * batch
        if len(prompts) != batch:
            raise ValueError(f"got {len(prompts)} prompts for {batch} clips")
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
            for i, res in zip(rows, self._decode_batch(feats[rows], prompt_rows, opts, [windows[i] for i in rows])):
                results[i] = res
        return results  # type: ignore[return-value]

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
                      windows: Sequence[float]) -> list[DecodingResult]:
        batch, device = feats.shape[0], self.pair.device
        speculative = opts.mode in SPECULATIVE_MODES
        shared = self.pair.shared_encoder if speculative else False
        stats = [DecodingStats(mode=opts.mode, shared_encoder=shared) for _ in range(batch)]
        rules = WhisperLogitRules(self.generation_config, self.vocab, device, opts.timestamps)
        generator = None
        if opts.temperature > 0:
            generator = torch.Generator(device=device)
            generator.manual_seed(opts.seed)
        if speculative:
            from asr_app.kernels import verify

        t_begin = time.perf_counter()
        timer = _Timer()
        encoder_hidden = self.target.get_encoder()(feats).last_hidden_state
        draft_hidden = None
        if speculative:
            draft_hidden = encoder_hidden if shared else self.draft.get_encoder()(feats).last_hidden_state
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
            gamma = policy.next(max_len - generated - 1) if speculative else 0
            # ---- draft proposes gamma tokens, each from rule-processed logits with its own prefix
            draft_tokens = draft_logits = None
            if gamma > 0:
                draft_state, ids = state, history[:, d_len:]
                tokens_list, logits_list = [], []
                for _ in range(gamma):
                    hidden, d_cache = _decoder_step(self.draft, ids, draft_hidden, d_cache)
                    logits = rules.apply(self.draft.proj_out(hidden[:, -1:]), draft_state)
                    token = self._choose(logits[:, 0], opts, generator, draft=True)
                    draft_state = rules.advance(draft_state, token[:, None])
                    tokens_list.append(token)
                    logits_list.append(logits)
                    ids = token[:, None]
                    # Drafts after an EOS are never kept, so stop once every row has drafted EOS. Only on
                    # CPU, where reading the token costs nothing; on a GPU it would be a sync per draft.
                    if stop_at_eos and bool((token == self.eos).all()):
                        break
                gamma = len(tokens_list)
                d_len = length + gamma - 1  # the last draft token is proposed but not yet fed
                draft_tokens = torch.stack(tokens_list, dim=1)
                draft_logits = torch.cat(logits_list, dim=1)
                draft_s += timer.lap()
            # ---- target scores the pending history token(s) and every draft in one pass
            ids = history[:, t_len:] if draft_tokens is None else torch.cat([history[:, t_len:], draft_tokens], 1)
            hidden, t_cache = _decoder_step(self.target, ids, encoder_hidden, t_cache)
            if generated == 0:
                first = self.target.proj_out(hidden[:, sot_index]).float()
                no_speech = torch.softmax(first, dim=-1)[:, self.no_speech_id]
            target_logits = rules.apply(self.target.proj_out(hidden[:, -(gamma + 1):]), state, draft_tokens)
            target_s += timer.lap()
            # ---- verification (or a plain target choice when nothing was drafted)
            if gamma > 0:
                key = (len(rows), gamma)  # the same few (rows, gamma) pairs recur: allocate each once
                num_draft = num_draft_cache.get(key)
                if num_draft is None:
                    num_draft = num_draft_cache[key] = torch.full(key[:1], gamma, dtype=torch.long, device=device)
                if opts.profile_verify:
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
                st.draft_calls += gamma
                st.drafted += gamma
                st.accepted += min(host[i][-1], gamma)
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
            policy.update(gamma, common)
            # ---- advance: append kept tokens, crop both caches to what is now known to be right
            kept = new_tokens[:, :keep]
            history = torch.cat([history, kept], dim=1)
            state = rules.advance(state, kept)
            generated += keep
            _crop(t_cache, gamma - common)  # target holds length + gamma; keep length + common
            t_len = length + common
            if gamma > 0 and common < gamma - 1:
                _crop(d_cache, gamma - 1 - common)
                d_len = length + common
            if finished:
                alive = [i for i in range(len(rows)) if i not in finished]
                rows = [rows[i] for i in alive]
                if not rows:
                    break
                index = torch.tensor(alive, dtype=torch.long, device=device)
                rows_dev = rows_dev[index]
                history, encoder_hidden, state = history[index], encoder_hidden[index], state.select(index)
                t_cache.reorder_cache(index)
                if speculative:
                    draft_hidden = draft_hidden[index] if not shared else encoder_hidden
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
