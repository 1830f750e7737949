"""The teacher pass: the target's encoder output, its own greedy transcripts and its top-k distribution.

Labels come from the project's own decoder in mode `off` (SpeculativeDecoder with no draft), so they carry
exactly the rules every transcript carries (suppressed tokens, timestamp rules, language detection). The
distribution along each label is the target's raw log-softmax (before the rules), teacher-forced through
the same decoder runtime (one cache per clip, its cross-attention computed once): the student's raw
distribution is what is matched to it.
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from asr_app.audio import SAMPLE_RATE
from asr_app.decoding.engine import SpeculativeDecoder
from asr_app.decoding.options import DecodingOptions, RuntimeOptions
from asr_app.decoding.prompt import build_prompt, eos_token
from asr_app.distill.data import Clip
from asr_app.distill.options import FOLDER_LANGUAGE, TeacherOptions, Variant

# Config entries that say how a checkpoint was stored or named, not what it computes.
_NOT_FINGERPRINTED = ("dtype", "torch_dtype", "transformers_version", "_name_or_path", "architectures")


def target_fingerprint(model) -> str:
    """SHA-256 of what the target computes: its configs and every tensor, as float16 (so a float32 copy on
    a CPU and a float16 copy on a GPU of one checkpoint share a cache)."""
    digest = hashlib.sha256()
    for config in (model.config.to_dict(), model.generation_config.to_dict()):
        kept = {k: v for k, v in config.items() if k not in _NOT_FINGERPRINTED}
        digest.update(json.dumps(kept, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float16).contiguous().numpy().tobytes())
    return digest.hexdigest()


@dataclass
class Label:
    """One label sequence: the prompt, the target's greedy output and <|endoftext|> (unless capped)."""

    variant: Variant
    tokens: list[int]
    prompt_len: int
    topk_ids: torch.Tensor    # int32 [n, k]: the target's top-k ids at each of the n predicted positions
    topk_logp: torch.Tensor   # float32 [n, k]: their log-probabilities
    capped: bool              # the output reached max_new_tokens without ending

    @property
    def predicted(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass
class Record:
    """What the teacher pass keeps of one clip."""

    encoder: torch.Tensor     # float16 [frames, d_model]: the target's encoder output over the 30 s window
    seconds: float
    language: str | None
    labels: list[Label]       # capped ones included (the cache keeps them; training may leave them out)


def clip_variants(clip: Clip, options: TeacherOptions) -> tuple[Variant, ...]:
    """The prompts this clip is labelled with; `mixed` keeps one timestamp setting, chosen by its hash."""
    variants = options.variants()
    if options.timestamps != "mixed":
        return variants
    stamped = int(hashlib.sha256(clip.key.encode()).hexdigest(), 16) % 2 == 1
    return tuple(v for v in variants if v.timestamps == stamped)


class KnownEncoder:
    """The decoder's encoder, answering from the outputs already computed for this batch's features.

    A clip is decoded once per variant, and each decode runs the encoder (half of a short clip's decoding
    time); its output for the cache is computed once, so each decode looks its rows up here instead (by
    equal features). Rows it does not know go to the real encoder."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder
        self.features: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None

    def __getattr__(self, name: str):
        return getattr(self.encoder, name)

    def remember(self, features: torch.Tensor) -> torch.Tensor:
        self.features, self.hidden = features, self.encoder(features)
        return self.hidden

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        if self.features is None:
            return self.encoder(features)
        rows = []
        for row in features:
            match = next((i for i, known in enumerate(self.features) if torch.equal(known, row)), None)
            if match is None:
                return self.encoder(features)
            rows.append(match)
        return self.hidden[rows]


class Teacher:
    def __init__(self, pair, options: TeacherOptions) -> None:
        self.pair = pair
        self.options = options
        self.target = pair.target
        # Target-only decoding: no draft, whole-vocabulary head; the labels are the target's greedy output.
        self.decoder = SpeculativeDecoder(pair, DecodingOptions(mode="off"), RuntimeOptions(draft_vocab=None))
        self.encoder = self.decoder.target_encoder = KnownEncoder(self.decoder.target_encoder)
        gc = self.target.generation_config
        self.multilingual = bool(getattr(gc, "is_multilingual", False))
        self.eos = eos_token(gc)
        self.known_languages = {t.removeprefix("<|").removesuffix("|>") for t in getattr(gc, "lang_to_id", None) or {}}

    @torch.inference_mode()
    def label(self, clips: Sequence[Clip], audio: Sequence[np.ndarray]) -> list[Record]:
        feats = self.decoder.feature_extractor([np.asarray(a, dtype=np.float32) for a in audio],
                                               sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        feats = feats.to(device=self.pair.device, dtype=self.pair.dtype)
        hidden = self.encoder.remember(feats)
        outputs = self._transcribe(clips, feats)
        records = []
        for row, clip in enumerate(clips):
            language, decoded = outputs[row]
            # One cache per clip: the cross-attention keys and values are computed once for all its labels.
            state = self.decoder.target_runtime.new_state(hidden[row : row + 1])
            labels = [self._label(state, variant, language, tokens) for variant, tokens in decoded]
            records.append(Record(hidden[row].to("cpu", torch.float16).contiguous(), clip.seconds, language, labels))
        return records

    def _decode(self, feats: torch.Tensor, variant: Variant, language: str | None):
        """Greedy tokens of whole-window features (the window's length only shapes segments, not tokens)."""
        opts = DecodingOptions(mode="off", language=language, task=variant.task, timestamps=variant.timestamps,
                               max_new_tokens=self.options.max_new_tokens)
        return self.decoder.decode_features(feats, opts)

    def given_language(self, clip: Clip) -> str | None:
        """The language a clip is labelled in before the target hears it (None: the target detects it): a
        folder's language the target does not know is detected instead (folder_summary says so)."""
        if not self.multilingual:
            return "en"
        if self.options.language == FOLDER_LANGUAGE:
            return clip.folder_language if clip.folder_language in self.known_languages else None
        return self.options.language

    def folder_summary(self, clips: Sequence[Clip]) -> str:
        """One line: how many clips each folder language labels, and how many the target detects (and why)."""
        given = collections.Counter(self.given_language(c) for c in clips)
        unknown = collections.Counter(c.folder_language for c in clips
                                      if c.folder_language and self.given_language(c) is None)
        named = ", ".join(f"{lang} {n}" for lang, n in sorted(given.items(), key=lambda kv: str(kv[0])) if lang)
        line = f"languages from folders: {named or 'none'}; detected by the target: {given[None]} clips"
        if unknown:
            line += " (" + ", ".join(f"{n} under {lang}/, not a language of this target" for lang, n in
                                     sorted(unknown.items())) + ")"
        return line

    def _transcribe(self, clips: Sequence[Clip], feats: torch.Tensor):
        """Per clip: (language, [(variant, output tokens)]). Each clip's first variant is decoded in the
        language given for it (None: detected by the target), the others in the language found then."""
        plans = [clip_variants(c, self.options) for c in clips]
        given = [self.given_language(c) for c in clips]
        languages: list[str | None] = list(given)
        decoded: list[list[tuple[Variant, list[int]]]] = [[] for _ in clips]
        firsts = sorted({(p[0], given[i] or "") for i, p in enumerate(plans)},
                        key=lambda k: (k[0].task, k[0].timestamps, k[1]))
        for variant, language in firsts:
            rows = [i for i, p in enumerate(plans) if p[0] == variant and (given[i] or "") == language]
            for i, result in zip(rows, self._decode(feats[rows], variant, language or None)):
                languages[i] = result.language or given[i]
                decoded[i].append((variant, result.tokens))
        later = sorted({(v, languages[i]) for i, p in enumerate(plans) for v in p[1:]},
                       key=lambda k: (k[0].task, k[0].timestamps, k[1] or ""))
        for variant, language in later:
            rows = [i for i, p in enumerate(plans) if variant in p[1:] and languages[i] == language]
            for i, result in zip(rows, self._decode(feats[rows], variant, language)):
                decoded[i].append((variant, result.tokens))
        return list(zip(languages, decoded))

    def _label(self, state, variant: Variant, language: str | None, output: list[int]) -> Label:
        gc = self.target.generation_config
        prompt = build_prompt(gc, self.decoder.tokenizer, language=language if self.multilingual else None,
                              task=variant.task, timestamps=variant.timestamps, previous_text=None,
                              max_target_positions=self.target.config.max_target_positions).tokens
        capped = len(output) >= self.options.max_new_tokens
        tokens = [*prompt, *output] + ([] if capped else [self.eos])
        ids, logp = self._top_k(state, tokens, len(prompt))
        return Label(variant, tokens, len(prompt), ids, logp, capped)

    def _top_k(self, state, tokens: list[int], prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's top-k (ids, log-probabilities) at each position that predicts an output token,
        teacher-forced through the project's decoder runtime (the one that made the label)."""
        runtime = self.decoder.target_runtime
        state.rollback(0)
        hidden = runtime.step(state, torch.tensor([tokens[:-1]], device=self.pair.device))
        logp = torch.log_softmax(runtime.logits(hidden[:, prompt_len - 1 :])[0].float(), dim=-1)
        top = logp.topk(min(self.options.top_k, logp.shape[-1]), dim=-1)
        return top.indices.to("cpu", torch.int32), top.values.cpu()
