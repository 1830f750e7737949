"""Run every mode on the same utterances and collect per-utterance records and per-mode summaries.

Order: utterance outer, modes inner, so slow drift on a shared machine (other processes, clocks)
hits every mode alike. Each (utterance, mode) is decoded once untouched for its latency, then once
more under the PyTorch profiler with `profile_verify=True` for the verification-step time, because
the profiler and the decoder's extra syncs would otherwise inflate the latency being reported.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from asr_app.audio import SAMPLE_RATE, WINDOW_SECONDS, AudioLoadError, load_audio, prepare_audio
from asr_app.decoding.options import MODES, SPECULATIVE_MODES, DecodingOptions, DecodingStats
from asr_app.decoding.protocol import Decoder
from asr_app.decoding.seeds import reseeded
from asr_app.eval.datasets import Utterance
from asr_app.eval.metrics import ModeRun, ModeSummary, UtteranceRecord, add_verify_deltas, summarize_mode
from asr_app.eval.profiling import CPU_CLOCK, PeakMemory, profile_verify_step
from asr_app.wer import Normalizer

log = logging.getLogger(__name__)

PAPER_MODES = SPECULATIVE_MODES  # the paper compares the three verification modes
ProfileHow = Literal["separate", "inline", "off"]


@dataclass(frozen=True)
class ModeSpec:
    label: str
    options: DecodingOptions


def scale_label(scale: float) -> str:
    return f"sigmoid@{scale:.0e}".replace("e+0", "e").replace("e+", "e")


def mode_specs(base: DecodingOptions, modes: Sequence[str], sweep_scales: Sequence[float] = ()) -> list[ModeSpec]:
    """One spec per requested mode, plus sigmoid with alpha=-s, beta=s per sweep scale.

    A sweep needs the baseline to compare against, so it is added when missing.
    """
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    modes = list(dict.fromkeys(modes))
    if sweep_scales and "baseline" not in modes:
        modes.insert(0, "baseline")
    specs = [ModeSpec(m, dataclasses.replace(base, mode=m, profile_verify=False)) for m in modes]
    for s in sweep_scales:
        if not s > 0:
            raise ValueError(f"sweep scale must be positive, got {s}")
        specs.append(ModeSpec(scale_label(s), dataclasses.replace(base, mode="sigmoid", alpha=-float(s), beta=float(s),
                                                                  profile_verify=False)))
    return specs


@dataclass
class EvalRun:
    records: list[UtteranceRecord]
    summaries: list[ModeSummary]
    specs: list[ModeSpec]
    memory_kind: str
    verify_clock: str | None
    warmup_utterances: int
    profile: str
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[UtteranceRecord]:
        return [r for r in self.records if r.error is not None]


def read_utterance_audio(utt: Utterance) -> np.ndarray:
    """16 kHz mono float32; raises asr_app.audio.AudioLoadError naming the file and the reason."""
    if utt.audio_path is not None:
        return load_audio(utt.audio_path)
    return prepare_audio(utt.samples, utt.sample_rate)


def _stats_dict(stats: DecodingStats) -> dict:
    data = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(vars(stats))
    data.pop("verify_steps", None)  # kept separately (from the profiled pass)
    return data


class _Clock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self.device = device

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def run_evaluation(
    decoder: Decoder,
    utterances: Sequence[Utterance],
    specs: Sequence[ModeSpec],
    normalizer: Normalizer,
    *,
    warmup: int = 1,
    profile: ProfileHow = "separate",
    progress: bool = True,
    max_audio_s: float = WINDOW_SECONDS,
) -> EvalRun:
    device = torch.device(getattr(getattr(decoder, "pair", None), "device", "cpu"))
    clock, memory = _Clock(device), PeakMemory(device)
    records: list[UtteranceRecord] = []
    verify_clock: str | None = None
    warmed = 0
    notes: list[str] = []
    bar = tqdm(total=len(utterances) * len(specs), desc="asr-eval", unit="decode", disable=not progress, mininterval=1.0)
    for utt in utterances:
        ref_norm = normalizer(utt.reference)
        record = UtteranceRecord(id=utt.id, reference=utt.reference, reference_normalized=ref_norm, source=utt.source)
        records.append(record)
        try:
            audio = read_utterance_audio(utt)
        except AudioLoadError as exc:
            record.error = f"audio: {exc}"
        else:
            record.duration_s = len(audio) / SAMPLE_RATE
            if record.duration_s > max_audio_s:
                record.error = f"audio: {record.duration_s:.1f} s is longer than the decoder's {max_audio_s:.0f} s window"
        if record.error is not None:
            log.warning("excluded %s (%s): %s", utt.id, utt.source, record.error)
            bar.update(len(specs))
            continue
        if not ref_norm.strip():
            log.warning("%s: empty reference after normalisation; its hypothesis words count as insertions", utt.id)
        if warmed < warmup:
            # Warm-up decodes (lazy init, allocator, Triton compile) are not measured.
            for spec in specs:
                decoder.decode([audio], options=spec.options)
            warmed += 1
        for spec in specs:
            bar.set_postfix_str(f"{utt.id} {spec.label}", refresh=False)
            # At T > 0 each clip its own random stream (the same for every mode: modes stay paired per clip).
            clip_spec = dataclasses.replace(spec, options=reseeded(spec.options, utt.id))
            run, run_clock = _decode_one(decoder, audio, clip_spec, profile, clock, memory, normalizer)
            if run_clock is not None:
                verify_clock = run_clock
            record.runs[spec.label] = run
            bar.update(1)
    bar.close()

    summaries = [summarize_mode(s.label, s.options, records, memory.kind, verify_clock,
                                baseline_label="baseline" if any(x.label == "baseline" for x in specs) else None)
                 for s in specs]
    add_verify_deltas(summaries)
    diverged = sorted({label for r in records for label, m in r.runs.items() if m.profiled_same_tokens is False})
    if diverged:
        notes.append(f"the profiled decode did not retrace the timed one (different tokens) for mode(s) "
                     f"{', '.join(diverged)}: their verify time comes from a different token path")
    if profile == "inline":
        notes.append("latency measured with the profiler attached (--profile inline): it includes profiling overhead")
    return EvalRun(records, summaries, list(specs), memory.kind, verify_clock, warmed, profile, notes)


def _decode_one(decoder, audio, spec: ModeSpec, profile: ProfileHow, clock: _Clock, memory: PeakMemory,
                normalizer: Normalizer) -> tuple[ModeRun, str | None]:
    # Modes without our verification step (target alone, transformers' own loop) have nothing to profile.
    profilable = profile != "off" and getattr(spec.options, "mode", "") not in ("off", "hf")
    profiled_options = dataclasses.replace(spec.options, profile_verify=True)
    memory.reset()
    if profile == "inline" and profilable:
        with profile_verify_step(clock.device) as prof:
            start = clock.now()
            result = decoder.decode([audio], options=profiled_options)[0]
            seconds = clock.now() - start
        profiled_result = result
        peak = memory.read()
    else:
        start = clock.now()
        result = decoder.decode([audio], options=spec.options)[0]
        seconds = clock.now() - start
        peak = memory.read()  # before the profiler's own buffers can count
        profiled_result, prof = None, None
        if profilable:
            with profile_verify_step(clock.device) as prof:
                profiled_result = decoder.decode([audio], options=profiled_options)[0]
    run = ModeRun(
        tokens=[int(t) for t in result.tokens],
        hypothesis=result.text,
        hypothesis_normalized=normalizer(result.text),
        seconds=seconds,
        stats=_stats_dict(result.stats),
        peak_memory_bytes=peak,
    )
    if profilable and prof is not None and prof.calls > 0:
        run.verify_profiled_s = prof.seconds
        if prof.clock == "cpu":
            # The profiler's CPU ranges are wall time and swing with other programs' load; the
            # process CPU time of the same calls does not.
            prof.clock = CPU_CLOCK
            run.verify_profiled_s = profiled_result.stats.verify_cpu_s
        run.verify_profiled_calls = prof.calls
        run.verify_steps = [(int(g), float(s)) for g, s in profiled_result.stats.verify_steps]
        # Same seed, same options but profile_verify: the profiled decode should retrace the timed one.
        run.profiled_same_tokens = [int(t) for t in profiled_result.tokens] == run.tokens
        return run, prof.clock
    return run, None
