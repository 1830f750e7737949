"""Word error rate (jiwer) after normalising both sides: Whisper's English normaliser, or a basic one.
One home for every WER the project computes: the evaluator, the web app's Compare tab, the benchmarks."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import jiwer
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

Normalizer = Callable[[str], str]
PACKAGED_SPELLING = Path(__file__).with_name("data") / "english_spelling.json"
_PUNCT = re.compile(r"[^\w\s']")


def basic_normalize(text: str) -> str:
    """Lower case, punctuation dropped, whitespace collapsed (fallback when no tokenizer normaliser)."""
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


def word_error_rate(reference: str, hypothesis: str, normalize: Normalizer | None = None) -> float:
    """WER of one pair after normalising both sides (default `basic_normalize`); an empty reference is an error."""
    normalize = normalize or basic_normalize
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref.strip():
        raise ValueError("the reference text is empty after normalisation")
    return float(jiwer.wer(ref, hyp))


def spelling_map_from_dir(model_dir: str | Path) -> dict[str, str] | None:
    """Whisper's British->American spelling map (`normalizer.json`) from a model folder, if it has one."""
    path = Path(model_dir) / "normalizer.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def english_normalizer(spelling_map: dict[str, str] | None = None) -> EnglishTextNormalizer:
    return EnglishTextNormalizer(spelling_map or {})


def normalizer_for_tokenizer(tokenizer: object, model_dir: str | Path | None = None) -> tuple[EnglishTextNormalizer, bool]:
    """Whisper's English normaliser with the spelling map the tokenizer loaded, the model folder has, or
    the package ships (eval/data: CTranslate2 folders carry none).

    Returns (normaliser, has_spelling_map). Without the map "colour" and "color" count as different
    words, so a missing map is warned about and recorded in the summary rather than ignored.
    """
    spelling = getattr(tokenizer, "english_spelling_normalizer", None)
    if not spelling and model_dir is not None:
        spelling = spelling_map_from_dir(model_dir)
    if not spelling and PACKAGED_SPELLING.is_file():
        spelling = json.loads(PACKAGED_SPELLING.read_text(encoding="utf-8"))
    if not spelling:
        warnings.warn("Whisper's spelling map (normalizer.json) not found: British/American spellings count as errors",
                      stacklevel=2)
    return english_normalizer(spelling), bool(spelling)


@dataclass
class WerResult:
    wer: float | None          # None when the references hold no words at all
    substitutions: int
    deletions: int
    insertions: int
    hits: int
    reference_words: int
    utterances: int
    empty_references: int      # references with no words after normalisation (their words are all insertions)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def utterance_errors(reference: str, hypothesis: str) -> tuple[int, int, int, int]:
    """(substitutions, deletions, insertions, hits) of one *normalised* pair."""
    out = jiwer.process_words(reference, hypothesis)
    return out.substitutions, out.deletions, out.insertions, out.hits


def corpus_wer(references: Sequence[str], hypotheses: Sequence[str]) -> WerResult:
    """Corpus WER over already-normalised strings: total errors / total reference words.

    Empty references are legal: every hypothesis word on them is an insertion. If no reference has
    a word the WER is undefined and reported as None.
    """
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    subs = dels = ins = hits = ref_words = empty = 0
    for ref, hyp in zip(references, hypotheses):
        n_ref = len(ref.split())
        if n_ref == 0:
            empty += 1
            ins += len(hyp.split())
            continue
        s, d, i, h = utterance_errors(ref, hyp)
        subs, dels, ins, hits, ref_words = subs + s, dels + d, ins + i, hits + h, ref_words + n_ref
    wer = (subs + dels + ins) / ref_words if ref_words else None
    return WerResult(wer, subs, dels, ins, hits, ref_words, len(references), empty)
