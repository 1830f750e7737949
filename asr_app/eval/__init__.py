"""asr-eval: datasets, WER, latency, verification-step profiling, reports and plots."""

from asr_app.eval.datasets import DatasetError, Utterance, load_dataset
from asr_app.eval.runner import EvalRun, ModeSpec, mode_specs, run_evaluation
from asr_app.wer import WerResult, corpus_wer, english_normalizer, normalizer_for_tokenizer

__all__ = [
    "DatasetError", "EvalRun", "ModeSpec", "Utterance", "WerResult", "corpus_wer", "english_normalizer",
    "load_dataset", "mode_specs", "normalizer_for_tokenizer", "run_evaluation",
]
