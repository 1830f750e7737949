"""Measure what a draft step and a target step cost on this machine, for the cost-aware gamma policy.

Run once per decoder, on a synthetic window (a random encoder output of the real shape, batch 1): the
draft step and the target step over k tokens go through the same step functions, runner and capture
keys as the decoding loop, so on a GPU this also captures the batch-1 graphs the loop will replay. Each
figure is a median over repeats, with the device synchronised around every target call, and around a few
draft calls in a row on a GPU (the loop queues a step's drafts without syncs). bench/runtime_bench.py uses the same
timer for its per-step table.

With captured steps (CUDA graphs, or their emulation) the target step is timed at every width the policy can
choose, not two: that captures each width's graph here, once, before any decode. Captured lazily, a width
the policy first picks mid-decode costs that decode two warm-up calls, a capture and, on a GPU, a Triton
compile at that width, enough to make greedy `exact` slower than `off` on a GPU (docs/runtime.md).
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from asr_app.decoding.gamma import CostAwareGamma, StepCosts
from asr_app.decoding.options import DecodingOptions
from asr_app.decoding.rules import RuleState
from asr_app.decoding.steps import Steps, options_key, state_tensors, target_key

GAMMA = 5  # the wider target step measured: its cost over the 1-token step gives the per-token slope
DRAFT_CHAIN = 4  # draft steps timed in a row (a typical step's drafts)


def _random_encoder_output(model, device, dtype) -> torch.Tensor:
    config = model.config
    generator = torch.Generator().manual_seed(0)
    return torch.randn(1, config.max_source_positions, config.d_model, generator=generator).to(device, dtype)


class StepTimer:
    """Times one draft step and one target step of a chosen width for `decoder`: by default batch 1, greedy
    `exact`; for other rows or greedy options, the steps a decode of them runs (the same capture keys)."""

    @torch.inference_mode()
    def __init__(self, decoder, repeats: int = 5, batch: int = 1, options: DecodingOptions | None = None,
                 prime: bool = True) -> None:
        """`prime`: run the prompt's step first, so timed steps read a cache like a decode's (a capture alone
        needs only the shapes)."""
        pair = decoder.pair
        self.options = options or DecodingOptions(mode="exact")
        self.device, self.repeats, self.batch = pair.device, repeats, batch
        hidden = _random_encoder_output(pair.target, self.device, pair.dtype).expand(batch, -1, -1).contiguous()
        draft_hidden = None
        if decoder.draft_runtime is not None:
            draft_hidden = (hidden.to(pair.draft_compute_dtype) if pair.shared_encoder
                            else _random_encoder_output(pair.draft, self.device, pair.draft_compute_dtype)
                            .expand(batch, -1, -1).contiguous())
        self.ws = decoder._workspace(hidden, draft_hidden)
        timestamps = self.options.timestamps
        self.steps = Steps(decoder.target_runtime, decoder.draft_runtime, self.ws, decoder._rules_for(timestamps, False),
                           decoder._rules_for(timestamps, True) if draft_hidden is not None else None,
                           self.options, None)
        gc = decoder.generation_config
        prompt = torch.tensor([[gc.decoder_start_token_id, gc.no_timestamps_token_id]] * batch, device=self.device)
        if prime:
            decoder.target_runtime.step(self.ws.target, prompt)
            if draft_hidden is not None:
                decoder.draft_runtime.step(self.ws.draft, prompt)
        self.start = prompt.shape[1]
        self.state = state_tensors(RuleState.initial(batch, self.device))
        self.tokens = torch.full((batch, 64), 262, dtype=torch.long, device=self.device)  # " the": any text token

    def _timed(self, fn, chained: int = 1) -> float:
        """Median seconds per call of `fn`, run `chained` times in a row between two syncs."""
        def sync():
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()

        with torch.inference_mode():
            fn()  # warm-up (and capture, with graphs)
            times = []
            for _ in range(self.repeats):
                sync()
                t0 = time.perf_counter()
                for _ in range(chained):
                    fn()
                sync()
                times.append((time.perf_counter() - t0) / chained)
        return statistics.median(times)

    def draft(self, chained: int | None = None) -> float:
        """One draft step. The loop queues a step's drafts back to back with no sync between them, so on a GPU a
        draft costs its device time once the host runs ahead, not its latency: timed `chained` in a row
        (default DRAFT_CHAIN on a GPU, 1 elsewhere: a CPU runs each call to its end, there is no queue)."""
        if chained is None:
            chained = DRAFT_CHAIN if self.device.type == "cuda" else 1
        return self._timed(self.draft_call(), chained)

    def target(self, width: int) -> float:
        """A target step over `width` tokens (the pending one and width - 1 proposals), verification included."""
        return self._timed(self.target_call(width))

    def draft_call(self):
        """One draft step as the loop runs it (batch 1, one token), as a function of no arguments."""
        ws, steps = self.ws, self.steps

        def run():
            ws.draft.length = self.start
            ws.runner.run(("draft", self.batch, 1, False, *steps.key), steps.draft_step,
                          {"ids": self.tokens[:, :1], **self.state}, self.start, 1, generated=1)
        return run

    def target_call(self, width: int):
        """One target step over `width` tokens as the loop runs it, as a function of no arguments."""
        ws, steps = self.ws, self.steps
        num_draft = torch.full((self.batch,), width - 1, dtype=torch.long, device=self.device)
        key, mode = width_key(self.batch, width, self.options), width_mode(width, self.options)

        def run():
            ws.target.length = self.start
            ws.runner.run(key, steps.target_step,
                          {"ids": self.tokens[:, :width], **self.state, "num_draft": num_draft}, self.start, width,
                          proposals=width - 1, generated=1, mode=mode)
        return run


PINNED_ENV = "ASR_APP_STEP_COSTS"  # "draft,target,per_token" in seconds: fixed costs instead of measured ones


def costs_pinned() -> bool:
    """Whether ASR_APP_STEP_COSTS fixes the costs: then gamma choices must repeat from decode to decode."""
    return bool(os.environ.get(PINNED_ENV))


def width_mode(width: int, options: DecodingOptions) -> str:
    """The verification mode of a target step over the pending token and width - 1 drafts: a step without
    drafts verifies as `exact` (loop.score_and_verify)."""
    return options.mode if width > 1 else "exact"


def width_key(batch: int, width: int, options: DecodingOptions) -> tuple:
    """The loop's capture key of that step."""
    return target_key(batch, width, width - 1, width_mode(width, options), options_key(options))


def capture_target_widths(decoder, batch: int, options: DecodingOptions, top_gamma: int) -> None:
    """Capture the target step at every width up to `top_gamma` + 1 (the gammas the decode's policy can
    choose) for `batch` rows decoded greedily with `options`, unless the workspace of that batch size holds
    them all already (see the module doc). Uses, and refills, that workspace: call it before the decode
    loads its window."""
    widths = range(1, top_gamma + 2)
    ws = decoder._workspaces.get((batch, True))
    if ws is not None and all(width_key(batch, w, options) in ws.runner.captured for w in widths):
        return
    timer = StepTimer(decoder, repeats=0, batch=batch, options=options, prime=False)
    for width in widths:
        timer.target_call(width)()


def measure_step_costs(decoder, repeats: int = 5) -> StepCosts:
    """Seconds per draft step and per target step (1 token, and per extra token) for `decoder`. Set
    ASR_APP_STEP_COSTS to pin them (repeatable gamma choices for tests and comparisons across machines)."""
    pinned = os.environ.get(PINNED_ENV)
    if pinned:
        try:
            draft, target, per_token = (float(v) for v in pinned.split(","))
        except ValueError:
            raise ValueError(f"{PINNED_ENV} must be 'draft,target,per_token' in seconds, got {pinned!r}") from None
        return StepCosts(draft, target, per_token)
    timer = StepTimer(decoder, repeats)
    captured = decoder.graph_mode != "eager"
    widths = range(1, CostAwareGamma.MAX_GAMMA + 2) if captured else (1, GAMMA + 1)
    seconds = {width: timer.target(width) for width in widths}
    one, wide = seconds[1], seconds[GAMMA + 1]
    return StepCosts(draft=timer.draft(), target=one, per_token=max(0.0, (wide - one) / GAMMA),
                     widths=tuple(seconds.values()) if captured else ())
