"""asr-distill's core: a decoder-only draft distilled from any Whisper target (docs/distill.md).

The teacher pass (`teacher.py`, cached on disk by `cache.py`) labels unlabelled audio with the target's own
greedy transcripts and keeps its top-k distribution; `student.py` builds the draft from the target's layers;
`train.py` fits it (`loss.py`, `batching.py`, `checkpoint.py`); `evaluate.py` measures it on held-out audio;
`export.py` and `card.py` write it; `pipeline.distill` runs the whole recipe.

Names are imported on first use (asr_app/lazy.py): the options load without torch."""

from asr_app.lazy import lazy_exports

_HOMES = {
    "DistillError": "errors", "DistillOptions": "options", "TeacherOptions": "options", "TrainOptions": "options",
    "EvalOptions": "options", "distill": "pipeline", "DistillResult": "pipeline",
}
__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
