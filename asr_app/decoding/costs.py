"""Measure what a draft step and a target step cost on this machine, for the cost-aware gamma policy.

Run once per decoder, on a synthetic window (a random encoder output of the real shape, batch 1): the
draft step and the target step over 1 and 1 + GAMMA tokens go through the same step functions, runner
and capture keys as the decoding loop, so on a GPU this also captures the batch-1 graphs the loop will
replay. Each figure is a median over repeats, with the device synchronised around every call.
"""

from __future__ import annotations

import statistics
import time

import torch

from asr_app.decoding.gamma import StepCosts
from asr_app.decoding.options import DecodingOptions
from asr_app.decoding.rules import RuleState
from asr_app.decoding.steps import Steps, state_tensors

GAMMA = 5  # the wider target step measured: its cost over the 1-token step gives the per-token slope


def _timed(fn, device: torch.device, repeats: int) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()  # warm-up (and capture, with graphs)
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _random_encoder_output(model, device, dtype) -> torch.Tensor:
    config = model.config
    generator = torch.Generator().manual_seed(0)
    return torch.randn(1, config.max_source_positions, config.d_model, generator=generator).to(device, dtype)


@torch.inference_mode()
def measure_step_costs(decoder, repeats: int = 5) -> StepCosts:
    """Seconds per draft step and per target step (1 token, and per extra token) for `decoder`."""
    pair = decoder.pair
    device = pair.device
    hidden = _random_encoder_output(pair.target, device, pair.dtype)
    draft_hidden = (hidden.to(pair.draft_compute_dtype) if pair.shared_encoder
                    else _random_encoder_output(pair.draft, device, pair.draft_compute_dtype))
    options = DecodingOptions(mode="exact")
    ws = decoder._workspace(hidden, draft_hidden)
    steps = Steps(decoder.target_runtime, decoder.draft_runtime, ws, decoder._rules_for(False, False),
                  decoder._rules_for(False, True), options, None)
    gc = decoder.generation_config
    prompt = torch.tensor([[gc.decoder_start_token_id, gc.no_timestamps_token_id]], device=device)
    decoder.target_runtime.step(ws.target, prompt)
    decoder.draft_runtime.step(ws.draft, prompt)
    start = prompt.shape[1]
    state = state_tensors(RuleState.initial(1, device))
    token = torch.full((1, GAMMA + 1), 262, dtype=torch.long, device=device)  # " the": any text token serves

    def draft():
        ws.draft.length = start
        ws.runner.run(("draft", 1, 1, *steps.key), steps.draft_step, {"ids": token[:, :1], **state}, start, 1,
                      generated=1)

    def target(width: int):
        def run():
            ws.target.length = start
            num_draft = torch.full((1,), width - 1, dtype=torch.long, device=device)
            ws.runner.run(("target", 1, width, width - 1, "exact", *steps.key), steps.target_step,
                          {"ids": token[:, :width], **state, "num_draft": num_draft}, start, width,
                          proposals=width - 1, generated=1, mode="exact")
        return run

    one = _timed(target(1), device, repeats)
    wide = _timed(target(GAMMA + 1), device, repeats)
    return StepCosts(draft=_timed(draft, device, repeats), target=one, per_token=max(0.0, (wide - one) / GAMMA))
