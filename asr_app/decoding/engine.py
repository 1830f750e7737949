"""SpeculativeDecoder: the public entry point of decoding (options in, results out).

It validates the input, builds Whisper's prompt, runs the encoder once per window (shared by target and
draft when the draft is decoder-only), groups rows whose prompts have one length into lock-step batches
and hands each to the loop (loop.py) with its workspace: the per-window decoder states of our own decoder
runtime (asr_app/runtime) and, on a GPU, the CUDA graphs captured over them. Mode `hf` hands over to
transformers instead (hf_mode.py). docs/ARCHITECTURE.md shows where each piece lives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from asr_app.audio import SAMPLE_RATE, WINDOW_SECONDS
from asr_app.decoding.alignment import (
    FRAMES_PER_SECOND,
    add_batch_word_timestamps,
    add_word_timestamps,
    alignment_heads,
)
from asr_app.decoding.context import (
    encoder_input,
    feature_samples,
    lost_end_of_audio,
    pad_features,
    retry_contexts,
    token_cap,
)
from asr_app.decoding.costs import capture_target_widths, costs_pinned, measure_step_costs
from asr_app.decoding.gamma import (
    AcceptanceEstimate,
    AcceptanceMemory,
    CostAwareGamma,
    GammaPolicy,
    StepCosts,
)
from asr_app.decoding.hf_mode import decode_hf
from asr_app.decoding.hints import HintTracker, as_hint
from asr_app.decoding.loop import MAX_CAPTURED_PROPOSALS, BatchState, SpeculativeLoop
from asr_app.decoding.options import (
    SPECULATIVE_MODES,
    DecodingOptions,
    DecodingResult,
    DecodingStats,
    RuntimeOptions,
)
from asr_app.decoding.prompt import Prompt, build_prompt, eos_token
from asr_app.decoding.ragged import RaggedLoop
from asr_app.decoding.rules import RuleState, WhisperLogitRules
from asr_app.decoding.seeds import reseeded
from asr_app.decoding.steps import Steps, Workspace
from asr_app.decoding.text import decode_text, split_segments
from asr_app.decoding.workspaces import WorkspacePool, WorkspaceStats
from asr_app.runtime import DecoderRuntime, EncoderRuntime, StepRunner, draft_vocabulary
from asr_app.runtime.allocator import keep_freed_memory
from asr_app.runtime.vocab import draft_ranking

# The window's last encoder frames stay in the draft's view however short the audio (see _draft_view).
DRAFT_END_FRAMES = 16


def draft_runtime(draft, head_ids: torch.Tensor | None, runtime: RuntimeOptions) -> DecoderRuntime:
    """The draft's decoder runtime: its head over `head_ids` (None: every id), its matrices packed in
    `runtime.draft_matmul_dtype` where the device supports it (`ops.pack`)."""
    matmul_dtype = {"bfloat16": torch.bfloat16, "int8": torch.int8}.get(runtime.draft_matmul_dtype)
    fused = runtime.use_fused_layers(next(draft.parameters()).device)
    return DecoderRuntime.from_model(draft, head_ids, runtime.packed_weights, matmul_dtype, fused,
                                     runtime.fused_max_rows())


class SpeculativeDecoder:
    def __init__(self, pair, options: DecodingOptions = DecodingOptions(),
                 runtime: RuntimeOptions = RuntimeOptions()) -> None:
        self.pair = pair
        self.options = options
        self.runtime = runtime
        self.target = pair.target
        self.draft = pair.draft
        self.tokenizer = pair.processor.tokenizer
        self.feature_extractor = pair.processor.feature_extractor
        gc = self.target.generation_config
        self.generation_config = gc
        self.eos = eos_token(gc)
        self.timestamp_begin = gc.no_timestamps_token_id + 1
        self.no_speech_id = gc.no_timestamps_token_id - 1  # <|nospeech|> (<|nocaptions|> in .en models)
        self.vocab = self.target.config.vocab_size
        self.max_positions = self.target.config.max_target_positions
        self._multilingual = bool(getattr(gc, "is_multilingual", False))
        self.graph_mode = runtime.graph_mode(pair.device)
        if runtime.keep_freed_memory:
            keep_freed_memory()
        packed = runtime.packed_weights
        encoder_dtype = torch.bfloat16 if runtime.encoder_matmul_dtype == "bfloat16" else None
        self.target_encoder = EncoderRuntime.from_model(self.target, packed, encoder_dtype)
        self.target_runtime = DecoderRuntime.from_model(self.target, packed=packed,
                                                        fused_layers=runtime.use_fused_layers(pair.device),
                                                        fused_max_rows=runtime.fused_max_rows())
        self.draft_runtime = self.draft_encoder = None
        if self.draft is not None:
            head_ids = (draft_vocabulary(self.tokenizer, self.vocab, self.eos, runtime.draft_vocab,
                                         draft_ranking(self.draft))
                        if runtime.draft_vocab else None)
            self.draft_runtime = draft_runtime(self.draft, head_ids, runtime)
            if not pair.shared_encoder:
                self.draft_encoder = EncoderRuntime.from_model(self.draft, packed, encoder_dtype)
        self._rules: dict[tuple, WhisperLogitRules] = {}
        self._workspaces = WorkspacePool(runtime.max_workspaces)
        self._step_costs: StepCosts | None = None
        # The draft's acceptance over recent decodes: the prior of the next one (decoding/gamma.py).
        self._acceptance_memory = AcceptanceMemory()
        self.alignment_heads = alignment_heads(gc, self.target.config.decoder_layers,
                                               self.target.config.decoder_attention_heads)

    # ------------------------------------------------------------------ public API
    def decode(self, audio: np.ndarray | list[np.ndarray], options: DecodingOptions | None = None,
               prompts: list[str | Sequence[int] | None] | None = None,
               hints: Sequence[Sequence[int] | None] | None = None) -> list[DecodingResult]:
        """Decode clips of at most 30 s. `prompts`: previous text per clip; `hints`: expected output tokens
        per clip (see the module docstring; they change the speed, never the result; `hf` ignores them)."""
        if isinstance(audio, np.ndarray | torch.Tensor):
            if audio.ndim != 1:  # never read an (N, C) array as N clips (docs/ARCHITECTURE.md: that exhausts memory)
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
            if clip.size > WINDOW_SECONDS * SAMPLE_RATE:
                raise ValueError(f"clip {i} is {clip.size / SAMPLE_RATE:.1f} s long; decode takes windows of at "
                                 f"most {WINDOW_SECONDS:.0f} s (use asr_app.longform for long audio)")
            if not np.isfinite(clip).all():
                raise ValueError(f"clip {i} contains NaN or infinite samples")
        windows = [len(c) / SAMPLE_RATE for c in clips]
        return self._decode(self._features(clips, options or self.options, windows), options, prompts, windows, hints)

    def _features(self, clips: list[np.ndarray], opts: DecodingOptions, windows: list[float]) -> torch.Tensor:
        """Log-mel features [B, mels, 3000], computed over the longest clip, the encoder's context past it and a
        margin only, the rest filled in (`feature_samples`: the same values)."""
        samples = feature_samples(opts.encoder_context_s, windows, WINDOW_SECONDS, SAMPLE_RATE)
        extra = {} if samples is None else {"max_length": samples}
        feats = self.feature_extractor([np.asarray(c, dtype=np.float32) for c in clips], sampling_rate=SAMPLE_RATE,
                                       return_tensors="pt", **extra).input_features
        return pad_features(feats, 2 * self.target.config.max_source_positions)

    def decode_features(self, features: torch.Tensor, options: DecodingOptions | None = None,
                        prompts: list[str | Sequence[int] | None] | None = None,
                        hints: Sequence[Sequence[int] | None] | None = None) -> list[DecodingResult]:
        if features.dim() == 2:
            features = features[None]
        expected = (self.target.config.num_mel_bins, 2 * self.target.config.max_source_positions)
        if features.dim() != 3 or tuple(features.shape[1:]) != expected or features.shape[0] == 0:
            raise ValueError(f"features must have shape [B, {expected[0]}, {expected[1]}], got "
                             f"{tuple(features.shape)}")
        return self._decode(features, options, prompts, [WINDOW_SECONDS] * features.shape[0], hints)

    def batch_key(self, options: DecodingOptions | None, prompt: str | Sequence[int] | None) -> tuple[int, int]:
        """Rows whose keys (and options) are equal decode in one lock-step batch: their prompts have one length
        and the same start position. A scheduler groups requests by it (asr_app/scheduler.py)."""
        built = self.prompt_for(options or self.options, prompt)
        return len(built.tokens), built.sot_index

    def prompt_for(self, opts: DecodingOptions, previous_text: str | Sequence[int] | None = None) -> Prompt:
        """The decoder prompt of a window decoded with `opts` after `previous_text` (`prompt.build_prompt`)."""
        return build_prompt(self.generation_config, self.tokenizer, language=opts.language, task=opts.task,
                            timestamps=opts.timestamps, previous_text=previous_text,
                            max_target_positions=self.max_positions)

    # ------------------------------------------------------------------ batching
    def _decode(self, feats, options, prompts, windows, hints=None, redo: bool = True) -> list[DecodingResult]:
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
        built = [self.prompt_for(opts, p) for p in prompts]
        feats = feats.to(device=self.pair.device, dtype=self.pair.dtype)
        results: list[DecodingResult | None] = [None] * batch
        if opts.mode == "hf":
            for i in range(batch):  # one row at a time, each its own stream (the first keeps the seed)
                results[i] = self._decode_hf(feats[i : i + 1], built[i], reseeded(opts, "row", i) if i else opts,
                                             windows[i])
            return results  # type: ignore[return-value]
        # Rows of one lock-step batch need prompts of one length (the caches have one length).
        groups: dict[tuple[int, int], list[int]] = {}
        for i, p in enumerate(built):
            groups.setdefault((len(p.tokens), p.sot_index), []).append(i)
        for k, rows in enumerate(groups.values()):
            prompt_rows = [built[i] for i in rows]
            # each group its own stream (the first keeps the seed: a lone row draws as transformers would)
            group_opts = reseeded(opts, "prompt group", k) if k else opts
            decoded = self._decode_batch(feats[rows], prompt_rows, group_opts, [windows[i] for i in rows],
                                         [hints[i] for i in rows])
            for i, res in zip(rows, decoded):
                results[i] = res
        if opts.encoder_context_s is not None and redo:
            self._redo_lost_rows(results, feats, opts, prompts, windows, hints)
        return results  # type: ignore[return-value]

    def _redo_lost_rows(self, results, feats, opts, prompts, windows, hints) -> None:
        """Rows decoded over a shortened encoder input that went wrong (a repetition loop, a decode that ran to
        the token limit, text placed past the audio: the end of the audio was not visible enough) are decoded
        again, over twice the context, then if still lost over the whole window (`retry_contexts`), so the
        option costs speed there, never a transcript. `context_retries` counts the decodes done again."""
        if self.graph_mode != "eager":
            return
        for i, result in enumerate(results):
            if lost_end_of_audio(result, windows[i], opts.encoder_context_s):
                # a row shorter than its batch's longest saw that much more of the padding
                seen = max(windows) + opts.encoder_context_s - windows[i]
                row = (feats[i : i + 1], [prompts[i]], [windows[i]], [hints[i]])
                results[i] = self._redo_row(result, row, opts, retry_contexts(seen, windows[i], WINDOW_SECONDS))

    def _redo_row(self, lost: DecodingResult, row: tuple, opts: DecodingOptions,
                  contexts: tuple[float | None, ...]) -> DecodingResult:
        """One row decoded again with each context in turn until one is not lost (None, the whole window, last);
        the kept decode's time figures include the discarded ones'."""
        feats, prompts, windows, hints = row
        spent = [lost]
        for retries, context in enumerate(contexts, 1):
            result = self._decode(feats, replace(opts, encoder_context_s=context), prompts, windows, hints, redo=False)[0]
            result.stats.context_retries = retries
            if context is None or not lost_end_of_audio(result, windows[0], context):
                break
            spent.append(result)
        for discarded in spent:
            _add_costs(result, discarded)
        return result

    def _checked_hint(self, hint, index: int) -> list[int] | None:
        if as_hint(hint) is None:
            return None
        tokens = [int(t) for t in hint]
        bad = [t for t in tokens if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"hint {index}: token ids must lie in [0, {self.vocab}), got {bad[:5]}")
        return tokens

    def _decode_hf(self, feats, prompt: Prompt, opts, window) -> DecodingResult:
        tokens, stats = decode_hf(self.target, self.draft, feats, prompt, opts,
                                  multilingual=bool(getattr(self.generation_config, "is_multilingual", False)),
                                  shared_encoder=self.pair.shared_encoder)
        if tokens and tokens[-1] == self.eos:
            tokens = tokens[:-1]
        result = self._result(tokens, float("nan"), float("nan"), stats, opts, window)
        if opts.word_timestamps:
            with torch.inference_mode():
                self._add_words(result, self.target.get_encoder()(feats).last_hidden_state, prompt, window,
                                opts.word_probabilities)
        return result

    def _result(self, tokens, no_speech, avg_logprob, stats, opts, window) -> DecodingResult:
        language = opts.language.strip("<|>") if opts.language else ("en" if not self._multilingual else None)
        return DecodingResult(
            language=language,
            tokens=tokens,
            text=decode_text(self.tokenizer, tokens, self.eos),
            segments=split_segments(self.tokenizer, tokens, self.eos,
                                    self.timestamp_begin if opts.timestamps else None, window),
            no_speech_prob=no_speech,
            avg_logprob=avg_logprob,
            stats=stats,
        )

    # ------------------------------------------------------------------ one lock-step batch
    @property
    def step_costs(self) -> StepCosts:
        """What a draft step and a target step cost here (measured on first use; decoding/costs.py)."""
        if self._step_costs is None:
            self._step_costs = measure_step_costs(self)
        return self._step_costs

    def _gamma_policy(self, opts: DecodingOptions, speculative: bool):
        """Cost-aware for greedy decoding, starting from the acceptance of this decoder's recent decodes (the
        gammas change, never the tokens). A sampled decode must be reproducible from its seed, and which
        random numbers it draws depends on the gammas chosen, so sampling uses the heuristic, whose choices
        depend only on the decode itself (not on timings or earlier decodes). Pinned costs (tests) keep
        the fixed prior, so that a decode's gammas do not depend on the decodes before it either."""
        if not speculative or opts.gamma is not None or opts.gamma_policy == "heuristic" or opts.temperature > 0:
            return GammaPolicy(opts.gamma)
        if costs_pinned():
            return CostAwareGamma(self.step_costs, AcceptanceEstimate())
        memory = self._acceptance_memory
        return CostAwareGamma(self.step_costs, AcceptanceEstimate(prior=memory.value), memory)

    def _capture_widths(self, batch: int, opts: DecodingOptions, policy) -> None:
        """Before a greedy decode of `batch` rows, capture their target step at every width `policy` may
        choose that the workspace lacks (new, or evicted since), so that no decode pays a capture mid-loop
        (decoding/costs.py). Wider steps than MAX_CAPTURED_PROPOSALS run eagerly anyway."""
        top = min(policy.max_gamma or MAX_CAPTURED_PROPOSALS, MAX_CAPTURED_PROPOSALS)
        if top + 1 <= self.runtime.max_graphs:  # else the captures would evict one another
            capture_target_widths(self, batch, opts, top)

    def _rules_for(self, timestamps: bool, draft: bool) -> WhisperLogitRules:
        """Rules per (timestamps, head): built once, so captured steps keep reading the same tensors."""
        key = (timestamps, draft)
        if key not in self._rules:
            space = (self.draft_runtime if draft else self.target_runtime).head.space
            self._rules[key] = WhisperLogitRules(self.generation_config, self.vocab, self.pair.device, timestamps,
                                                 space)
        return self._rules[key]

    def _encode(self, feats: torch.Tensor, speculative: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target's encoder output and, for a speculative mode, the draft's (shared when it can be)."""
        encoder_hidden = self.target_encoder(feats)
        if not speculative:
            return encoder_hidden, None
        draft_dtype = self.pair.draft_compute_dtype  # the draft may run in its own dtype
        if self.draft_encoder is None:
            return encoder_hidden, encoder_hidden.to(draft_dtype)
        return encoder_hidden, self.draft_encoder(feats.to(draft_dtype))

    def _encoder_input(self, feats: torch.Tensor, opts: DecodingOptions, windows: Sequence[float]) -> torch.Tensor:
        """Shortened by `encoder_context_s` where steps run eagerly (captured graphs keep the whole window)."""
        return encoder_input(feats, opts.encoder_context_s if self.graph_mode == "eager" else None, windows)

    def _draft_view(self, draft_hidden: torch.Tensor | None, windows: Sequence[float]) -> torch.Tensor | None:
        """The encoder frames the draft attends to: the batch's longest audio plus the margin
        (`RuntimeOptions.draft_audio_margin_s`) and the window's last DRAFT_END_FRAMES, where steps run
        eagerly; else all of them. Attention does not depend on the order of its keys, and the encoder
        output carries its positions, so a view of the frames is a valid (shorter) window.

        The window's end stays in view because the draft reads it: without it, its proposals changed even
        with 20 of the 30 s in view (docs/runtime.md); with its last frame they were the same again."""
        margin = self.runtime.draft_audio_margin_s
        if draft_hidden is None or margin is None or self.graph_mode != "eager":
            return draft_hidden
        total = draft_hidden.shape[1]
        frames = math.ceil((max(windows) + margin) * FRAMES_PER_SECOND)
        if frames + DRAFT_END_FRAMES >= total:
            return draft_hidden
        return torch.cat([draft_hidden[:, :frames], draft_hidden[:, total - DRAFT_END_FRAMES:]], dim=1)

    def keep_workspaces(self, count: int) -> None:
        """Keep at least `count` workspaces (batch size, drafts or not; their caches and graphs) between
        decodes, unless `RuntimeOptions.max_workspaces` fixed the bound: a scheduler that forms batches of n
        sizes asks for room for them, so none is recaptured in turn."""
        self._workspaces.keep(count)

    def workspace_stats(self) -> WorkspaceStats:
        """Workspaces held, dropped, and the graph captures they made (all zero where steps run eagerly).
        Read it from the thread that decodes."""
        return self._workspaces.stats()

    def _workspace(self, encoder_hidden: torch.Tensor, draft_hidden: torch.Tensor | None) -> Workspace:
        """Decoder states for this window. Eagerly new ones; with graphs one persistent workspace per
        (batch size, draft or not), refilled in place, since captured steps read those very tensors
        (decoding/workspaces.py: the least recently used goes beyond the pool's bound)."""
        batch = encoder_hidden.shape[0]
        if self.graph_mode == "eager":
            return Workspace(self.target_runtime.new_state(encoder_hidden),
                             self.draft_runtime.new_state(draft_hidden) if draft_hidden is not None else None,
                             StepRunner("eager", self.max_positions))
        key = (batch, draft_hidden is not None)
        ws = self._workspaces.use(key)
        if ws is None:
            return self._workspaces.add(key, Workspace(
                self.target_runtime.new_state(encoder_hidden),
                self.draft_runtime.new_state(draft_hidden) if draft_hidden is not None else None,
                StepRunner(self.graph_mode, self.max_positions, self.runtime.max_graphs)))
        self.target_runtime.load_encoder(ws.target, encoder_hidden)
        if ws.draft is not None:
            self.draft_runtime.load_encoder(ws.draft, draft_hidden)
        return ws

    @torch.inference_mode()
    def _decode_batch(self, feats: torch.Tensor, prompts: Sequence[Prompt], opts: DecodingOptions,
                      windows: Sequence[float], hints: Sequence[list[int] | None]) -> list[DecodingResult]:
        batch, device = feats.shape[0], self.pair.device
        speculative = opts.mode in SPECULATIVE_MODES
        generator = None
        if opts.temperature > 0:
            generator = torch.Generator(device=device)
            generator.manual_seed(opts.seed)
        prompt_len = len(prompts[0].tokens)
        max_len = min(opts.max_new_tokens, self.max_positions - prompt_len)
        if max_len < 1:
            raise ValueError(f"prompt of {prompt_len} tokens leaves no room in {self.max_positions} positions")
        if opts.encoder_context_s is not None and self.graph_mode == "eager":
            max_len = min(max_len, token_cap(max(windows)))   # past it the row is redone over the whole window

        t_setup = time.perf_counter()
        policy = self._gamma_policy(opts, speculative)  # first: measuring costs reuses the batch-1 workspace
        if speculative and self.graph_mode != "eager" and opts.temperature == 0 and not opts.profile_verify:
            self._capture_widths(batch, opts, policy)  # before this window is loaded: it refills the workspace
        t_begin = time.perf_counter()
        setup_s = t_begin - t_setup  # the first decodes' cost measurement and captures: the caller waited too
        encoder_hidden, draft_hidden = self._encode(self._encoder_input(feats, opts, windows), speculative)
        draft_hidden = self._draft_view(draft_hidden, windows)
        workspace = self._workspace(encoder_hidden, draft_hidden)
        if device.type == "cuda":  # else the encoder's queued GPU work would be timed as the loop's
            torch.cuda.current_stream(device).synchronize()
        encoder_s = time.perf_counter() - t_begin
        steps = Steps(self.target_runtime, self.draft_runtime if speculative else None, workspace,
                      self._rules_for(opts.timestamps, False),
                      self._rules_for(opts.timestamps, True) if speculative else None, opts, generator)
        detected = self._detect_languages(workspace) if prompts[0].detect_language else None
        if detected is not None:
            prompts = [p.with_language(token) for p, (token, _) in zip(prompts, detected)]
        loop = self._loop_class(batch)(steps, opts, self.eos, max_len, prompts[0].sot_index, self.no_speech_id,
                                       generator, policy)
        shared = self.pair.shared_encoder if speculative else False
        state = BatchState(
            rows=list(range(batch)), done=[False] * batch,
            history=torch.tensor([list(p.tokens) for p in prompts], dtype=torch.long, device=device),
            rules=RuleState.initial(batch, device),
            stats=[DecodingStats(mode=opts.mode, shared_encoder=shared) for _ in range(batch)],
            out_tokens=[[] for _ in range(batch)], logprob_sum=[0.0] * batch, logprob_count=[0] * batch,
            # Lock-step rows share each step's width: a hint step needs a proposal for every row.
            tracker=HintTracker([h for h in hints if h]) if hints and all(hints) else None,
        )
        captured_s = workspace.runner.capture_s
        # the window's cross K/V, for word alignment after the loop (finished rows leave the state's views);
        # kept only when words are asked for, else finished rows' K/V are freed as the loop drops them
        cross = (workspace.target.cross_k, workspace.target.cross_v) if opts.word_timestamps else None
        loop.run(state)
        setup_s += workspace.runner.capture_s - captured_s  # steps first captured in the loop: one-time work too
        total_s = time.perf_counter() - t_setup
        no_speech = state.no_speech.cpu().tolist() if state.no_speech is not None else [float("nan")] * batch
        results = []
        for r in range(batch):
            st = state.stats[r]
            t = loop.timings
            st.setup_s, st.encoder_s, st.draft_s, st.target_s, st.verify_s, st.total_s = (
                setup_s, encoder_s, t.draft_s, t.target_s, t.verify_s, total_s)
            st.verify_steps = list(loop.verify_steps)
            st.verify_cpu_s = loop.verify_cpu_s
            st.finalise()
            count = state.logprob_count[r]
            avg = state.logprob_sum[r] / count if count else float("nan")
            result = self._result(state.out_tokens[r], no_speech[r], avg, st, opts, windows[r])
            if detected is not None:
                result.language, result.language_probability = self._language_code(detected[r][0]), detected[r][1]
            results.append(result)
        if opts.word_timestamps:
            add_batch_word_timestamps([r.segments for r in results], self.target_runtime, encoder_hidden,
                                      [self._alignment_sot(p) for p in prompts], self.eos, windows,
                                      self.alignment_heads, self.tokenizer, opts.word_probabilities, cross)
        return results

    def _loop_class(self, batch: int) -> type[SpeculativeLoop]:
        """Rows that keep their own accepted drafts (ragged.py) where steps run eagerly on unfused layers."""
        unfused = not self.target_runtime.fused_layers and not (self.draft_runtime and self.draft_runtime.fused_layers)
        ragged = self.runtime.ragged_batches and batch > 1 and self.graph_mode == "eager" and unfused
        return RaggedLoop if ragged else SpeculativeLoop

    def _add_words(self, result: DecodingResult, encoder_hidden: torch.Tensor, prompt: Prompt, window: float,
                   probabilities: bool) -> None:
        add_word_timestamps(result.segments, self.target_runtime, encoder_hidden, self._alignment_sot(prompt),
                            self.eos, window, self.alignment_heads, self.tokenizer, probabilities)

    def _alignment_sot(self, prompt: Prompt) -> list[int]:
        """The tokens word alignment puts before the text: the prompt from <|startoftranscript|> on, ending in
        <|notimestamps|>."""
        sot_sequence = list(prompt.tokens[prompt.sot_index :])
        if sot_sequence[-1] != self.generation_config.no_timestamps_token_id:
            sot_sequence.append(self.generation_config.no_timestamps_token_id)
        return sot_sequence

    def _detect_languages(self, workspace: Workspace) -> list[tuple[int, float]]:
        """(language token, probability) per row, as openai/whisper detects it: the target's scores after
        <|startoftranscript|> alone, over the language tokens only. Scored in the window's own cache, then
        rolled back, so the encoder output and the cross-attention keys are reused."""
        gc = self.generation_config
        ids = torch.tensor(sorted(gc.lang_to_id.values()), device=self.pair.device)
        sot = torch.full((workspace.target.batch, 1), gc.decoder_start_token_id, dtype=torch.long,
                         device=self.pair.device)
        hidden = self.target_runtime.step(workspace.target, sot)
        workspace.target.rollback(0)
        probs = torch.softmax(self.target_runtime.logits(hidden)[:, -1, ids].float(), dim=-1)
        best = probs.max(dim=-1)
        return [(int(ids[i]), float(p)) for i, p in zip(best.indices.tolist(), best.values.tolist())]

    def _language_code(self, token: int) -> str:
        return next(key for key, value in self.generation_config.lang_to_id.items() if value == token).strip("<|>")


def _add_costs(result: DecodingResult, discarded: DecodingResult) -> None:
    """Count a decode that was done again (`discarded`) in `result`'s time figures."""
    result.stats.setup_s += discarded.stats.setup_s
    result.stats.encoder_s += discarded.stats.encoder_s
    result.stats.total_s += discarded.stats.total_s
