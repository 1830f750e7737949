"""The sampling study: every mode at several temperatures and seeds on the same clips, paired.

At T > 0 one seed's WER on a few clips is mostly noise (exact and baseline follow the same
distribution, yet one run gives them points apart), so comparing modes needs many (clip, seed)
items and a paired test. The study decodes every clip at every temperature with every seed and
every mode (modes innermost, so load on a shared machine hits them alike), keeps per-item counts,
and `summarize_study` turns them into per-mode figures and pairwise comparisons
(`significance.py`). Seed s decodes clip c with its own stream (`decoding.seeds.reseeded`): one seed for all
clips would give every clip the same uniforms, and the clips would not be independent samples.

WER reference: by default each clip's greedy transcript from the target alone (mode `off`, T = 0),
so clips without a transcript count and WER measures how far sampling moves the text from what the
target would say (issue 31's measure); `reference="text"` uses the dataset's transcripts and leaves
out clips without one. The WER against the transcript is recorded beside it wherever there is one.

Verification time (decoded with `profile_verify=True`): on a CPU the process CPU time of the verify
calls (`DecodingStats.verify_cpu_s`), as `asr-eval` reports it, so other programs' load does not
count; on CUDA the wall time of each verify call between device syncs (`verify_steps`). All decodes of one clip share the clip's encoder output (`EncoderMemo`): the
encoder is a pure function of the features and ~70% of a short clip's decode on a CPU, so this
changes no token and no verification time, only how long the study takes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from asr_app.audio import SAMPLE_RATE, WINDOW_SECONDS, AudioLoadError
from asr_app.decoding.options import DecodingOptions
from asr_app.decoding.protocol import Decoder
from asr_app.decoding.seeds import reseeded
from asr_app.eval.datasets import Utterance
from asr_app.eval.runner import ModeSpec, read_utterance_audio
from asr_app.wer import Normalizer, utterance_errors

log = logging.getLogger(__name__)


@dataclass
class StudyItem:
    """One clip decoded by one mode at one temperature with one seed."""

    clip: str
    temperature: float
    seed: int
    label: str
    hypothesis: str            # normalised
    errors: int                # word errors against the study's reference (greedy transcript or text)
    ref_words: int
    text_errors: int | None    # against the clip's transcript, where it has one
    text_words: int | None
    drafted: int
    accepted: int
    target_calls: int
    tokens_out: int
    verify_s: float | None     # process CPU time of the verify calls (None: mode without verification)
    verify_calls: int


@dataclass
class StudyClip:
    id: str
    source: str
    duration_s: float | None = None
    reference: str = ""        # normalised: the greedy transcript or the text, whichever the study uses
    text: str = ""             # normalised transcript ("" where the clip has none)
    error: str | None = None   # why the clip was left out


@dataclass
class StudyRun:
    specs: list[ModeSpec]
    temperatures: list[float]
    seeds: list[int]
    reference: str
    clips: list[StudyClip]
    items: list[StudyItem] = field(default_factory=list)
    verify_clock: str = "process-cpu"   # or "cuda-wall"
    encoder_reuses: int = 0
    # "per-clip": each (clip, seed) decodes with its own stream (derive_seed); "shared": runs before that fix,
    # where seed s gave every clip the same stream, so only the seeds are independent samples (docs/eval.md).
    seed_streams: str = "per-clip"


class EncoderMemo:
    """Wraps an encoder callable: the same features as the previous call give the previous output."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder
        self.features: torch.Tensor | None = None
        self.output = None
        self.reuses = 0

    def __call__(self, features: torch.Tensor):
        if self.features is not None and self.features.shape == features.shape and torch.equal(self.features, features):
            self.reuses += 1
            return self.output
        self.output = self.encoder(features)
        self.features = features.clone()
        return self.output


@contextmanager
def shared_encoder_outputs(decoder: Decoder) -> Iterator[list[EncoderMemo]]:
    """Memoise the decoder's encoders (`SpeculativeDecoder.target_encoder`/`draft_encoder`) for the block."""
    saved = {name: getattr(decoder, name) for name in ("target_encoder", "draft_encoder")
             if getattr(decoder, name, None) is not None}
    memos = []
    for name, encoder in saved.items():
        memos.append(EncoderMemo(encoder))
        setattr(decoder, name, memos[-1])
    try:
        yield memos
    finally:
        for name, encoder in saved.items():
            setattr(decoder, name, encoder)


def _counts(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word errors, reference words) of one normalised pair; an empty reference makes every word an insertion."""
    words = len(reference.split())
    if words == 0:
        return len(hypothesis.split()), 0
    s, d, i, _ = utterance_errors(reference, hypothesis)
    return s + d + i, words


def run_study(decoder: Decoder, utterances: Sequence[Utterance], specs: Sequence[ModeSpec],
              temperatures: Sequence[float], seeds: Sequence[int], normalizer: Normalizer, *,
              reference: str = "greedy", progress: bool = True, max_audio_s: float = WINDOW_SECONDS) -> StudyRun:
    if reference not in ("greedy", "text"):
        raise ValueError(f"reference must be 'greedy' or 'text', got {reference!r}")
    cuda = torch.device(getattr(getattr(decoder, "pair", None), "device", "cpu")).type == "cuda"
    run = StudyRun(list(specs), list(temperatures), list(seeds), reference, [],
                   verify_clock="cuda-wall" if cuda else "process-cpu")
    total = len(utterances) * len(temperatures) * len(seeds) * len(specs)
    bar = tqdm(total=total, desc="asr-eval study", unit="decode", disable=not progress, mininterval=5.0)
    with shared_encoder_outputs(decoder) as memos:
        for utt in utterances:
            clip, audio = _prepare_clip(decoder, utt, specs[0].options, normalizer, reference, max_audio_s)
            run.clips.append(clip)
            if clip.error is not None:
                log.warning("left out %s: %s", clip.id, clip.error)
                bar.update(len(temperatures) * len(seeds) * len(specs))
                continue
            for temperature in temperatures:
                for seed in seeds:
                    for spec in specs:
                        run.items.append(_decode_item(decoder, audio, clip, spec, temperature, seed, normalizer,
                                                      cuda))
                        bar.update(1)
        run.encoder_reuses = sum(m.reuses for m in memos)
    bar.close()
    return run


def _prepare_clip(decoder, utt: Utterance, options: DecodingOptions, normalizer: Normalizer, reference: str,
                  max_audio_s: float):
    clip = StudyClip(id=utt.id, source=utt.source, text=normalizer(utt.reference) if utt.reference else "")
    try:
        audio = read_utterance_audio(utt)
    except AudioLoadError as exc:
        clip.error = f"audio: {exc}"
        return clip, None
    clip.duration_s = len(audio) / SAMPLE_RATE
    if clip.duration_s > max_audio_s:
        clip.error = f"audio: {clip.duration_s:.1f} s is longer than the decoder's {max_audio_s:.0f} s window"
    elif reference == "text" and not clip.text.strip():
        clip.error = "no transcript (the study's WER reference is the text)"
    elif reference == "text":
        clip.reference = clip.text
    else:
        greedy = dataclasses.replace(options, mode="off", temperature=0.0, profile_verify=False)
        clip.reference = normalizer(decoder.decode([audio], options=greedy)[0].text)
    return clip, audio


def _decode_item(decoder, audio, clip: StudyClip, spec: ModeSpec, temperature: float, seed: int,
                 normalizer: Normalizer, cuda: bool) -> StudyItem:
    # Each clip its own stream (the same for every mode and temperature: the modes stay paired per clip).
    options = reseeded(dataclasses.replace(spec.options, temperature=temperature, seed=seed, profile_verify=True),
                       clip.id)
    result = decoder.decode([audio], options=options)[0]
    hypothesis = normalizer(result.text)
    errors, words = _counts(clip.reference, hypothesis)
    text_errors, text_words = _counts(clip.text, hypothesis) if clip.text.strip() else (None, None)
    st = result.stats
    verifies = len(st.verify_steps)
    verify_s = sum(seconds for _, seconds in st.verify_steps) if cuda else st.verify_cpu_s
    return StudyItem(
        clip=clip.id, temperature=temperature, seed=seed, label=spec.label, hypothesis=hypothesis,
        errors=errors, ref_words=words, text_errors=text_errors, text_words=text_words,
        drafted=st.drafted, accepted=st.accepted, target_calls=st.target_calls, tokens_out=st.tokens_out,
        verify_s=float(verify_s) if verifies else None, verify_calls=verifies,
    )
