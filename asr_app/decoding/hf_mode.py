"""Mode `hf`: transformers' own assisted generation, the anchor our loop is measured against.

Batch-1 only in transformers, so the caller loops over rows. The assistant's schedule is set to the
heuristic starting at 5 (transformers' defaults are 20/constant with a 0.4 confidence stop), the same
gamma policy as our loop, and restored afterwards.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from transformers.utils import logging as hf_logging

from asr_app.decoding.options import DecodingOptions, DecodingStats
from asr_app.decoding.prompt import Prompt


@contextmanager
def _assistant_schedule(draft, gamma: int | None):
    gc = draft.generation_config
    saved = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold)
    gc.num_assistant_tokens = gamma if gamma is not None else 5
    gc.num_assistant_tokens_schedule = "constant" if gamma is not None else "heuristic"
    gc.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = saved


class _CallCounter:
    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, *_args) -> None:
        self.calls += 1


def decode_hf(target, draft, features: torch.Tensor, prompt: Prompt, opts: DecodingOptions,
              multilingual: bool, shared_encoder: bool) -> tuple[list[int], DecodingStats]:
    """Tokens after the prompt (EOS included when generated) and stats for one row."""
    stats = DecodingStats(mode="hf", shared_encoder=shared_encoder)
    kwargs: dict = dict(
        input_features=features,
        assistant_model=draft,
        num_beams=1,
        max_new_tokens=opts.max_new_tokens,
        return_timestamps=opts.timestamps,
    )
    if opts.temperature > 0:
        kwargs.update(do_sample=True, temperature=opts.temperature, top_k=0, top_p=1.0)
        torch.manual_seed(opts.seed)
    else:
        kwargs.update(do_sample=False)
    if multilingual:
        kwargs.update(language=opts.language, task=opts.task)
    if prompt.sot_index > 0:
        kwargs["prompt_ids"] = torch.tensor(prompt.tokens[: prompt.sot_index], device=features.device)
    # Count decoder forward calls to derive steps/acceptance (hf exposes no statistics of its own).
    t_dec, d_dec = target.get_decoder(), draft.get_decoder()
    counters = [_CallCounter(t_dec)] + ([_CallCounter(d_dec)] if d_dec is not t_dec else [])
    hooks = [c.handle for c in counters]
    draft_dtype = next(draft.parameters()).dtype
    if draft_dtype != features.dtype:
        # A draft in its own dtype (ModelPair.draft_dtype) is handed the target's encoder output by
        # generate(); cast it on the way in, as our own loop does.
        def cast_encoder_states(_module, args, kwargs):
            states = kwargs.get("encoder_hidden_states")
            if states is not None and states.dtype != draft_dtype:
                kwargs["encoder_hidden_states"] = states.to(draft_dtype)
            return args, kwargs

        hooks.append(d_dec.register_forward_pre_hook(cast_encoder_states, with_kwargs=True))
    t0 = time.perf_counter()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # generate() warns about max_length/max_new_tokens on every call
    try:
        with _assistant_schedule(draft, opts.gamma), torch.inference_mode():
            out = target.generate(**kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        for hook in hooks:
            hook.remove()
    stats.total_s = time.perf_counter() - t0
    ids = out.sequences if hasattr(out, "sequences") else out
    tokens = [int(t) for t in ids[0].tolist()]
    # generate() returns what follows the prompt; drop any echoed prompt/special prefix
    if prompt.sot_index > 0 and tokens[: len(prompt.tokens)] == list(prompt.tokens):
        tokens = tokens[len(prompt.tokens):]
    # generate() drops the closing EOS; count it like our loop does when the row ended before the cap
    stats.tokens_out = len(tokens) + (1 if len(tokens) < opts.max_new_tokens else 0)
    if len(counters) == 2:
        stats.target_calls = counters[0].calls
        stats.drafted = counters[1].calls
        stats.accepted = max(0, stats.tokens_out - stats.target_calls)
    stats.finalise()
    return tokens, stats
