"""Options of a distillation run: plain data, checked on construction, no torch (the CLI imports them first).

The defaults are the recipe the shipped tiny.en draft was trained with (its README in the team's shared
models folder): top-50 teacher distribution plus a rest bucket, KL + 0.5 x cross-entropy, AdamW (betas
0.9/0.98, eps 1e-6, weight decay 0.01 on matrices), peak learning rate 3e-4 after 100 warm-up steps, cosine
decay to 3e-5, gradient norm clipped at 1.0, 16 length-bucketed clips per batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

TimestampSetting = Literal["both", "with", "without", "mixed"]
AudioView = Literal["window", "audio"]
TIMESTAMP_SETTINGS: tuple[str, ...] = ("both", "with", "without", "mixed")
# The runtime's default draft head (decoding/options.DEFAULT_DRAFT_VOCAB), repeated here so that this module
# loads without torch; tests/test_distill.py checks the two agree.
RUNTIME_DRAFT_VOCAB = 32768


@dataclass(frozen=True)
class Variant:
    """One prompt the target transcribes a clip with; each gives the clip one label sequence."""

    task: str = "transcribe"
    timestamps: bool = False

    @property
    def name(self) -> str:
        return f"{self.task}{'+timestamps' if self.timestamps else ''}"


FOLDER_LANGUAGE = "folder"


@dataclass(frozen=True)
class TeacherOptions:
    top_k: int = 50                    # teacher probabilities kept per position (the rest is one bucket)
    # Labels with and without timestamps: "both" (two per clip), "with", "without", or "mixed" (one per clip,
    # alternating by the clip's hash: half the decoding cost of "both").
    timestamps: TimestampSetting = "both"
    tasks: tuple[str, ...] = ("transcribe",)   # add "translate" for a multilingual target's translations
    # None: detected per clip (multilingual), "en" for English-only targets; FOLDER_LANGUAGE: the language a
    # clip's folder is named by (data.folder_language), detected where no folder names one.
    language: str | None = None
    max_new_tokens: int = 224
    keep_capped: bool = False          # keep labels that reached max_new_tokens without ending (a looping teacher)
    batch_size: int = 8                # clips the teacher decodes together

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.timestamps not in TIMESTAMP_SETTINGS:
            raise ValueError(f"timestamps must be one of {', '.join(TIMESTAMP_SETTINGS)}, got {self.timestamps!r}")
        if not self.tasks or any(t not in ("transcribe", "translate") for t in self.tasks):
            raise ValueError(f"tasks must be transcribe and/or translate, got {self.tasks}")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("max_new_tokens and batch_size must be >= 1")

    def variants(self) -> tuple[Variant, ...]:
        """Every prompt a clip may be labelled with (`mixed` picks one timestamp setting per clip)."""
        stamps = {"both": (False, True), "with": (True,), "without": (False,), "mixed": (False, True)}
        return tuple(Variant(task, ts) for task in self.tasks for ts in stamps[self.timestamps])

    def cache_key(self) -> dict:
        """What a cached record depends on besides the target and the audio."""
        key = asdict(self)
        for name in ("batch_size", "keep_capped"):  # capped labels are cached all the same
            key.pop(name)
        key["tasks"] = list(self.tasks)
        return key


@dataclass(frozen=True)
class TrainOptions:
    steps: int = 3000
    batch_size: int = 16               # label sequences per step, bucketed by length
    lr: float = 3e-4
    min_lr: float = 3e-5               # where the cosine decay ends
    warmup_steps: int = 100
    weight_decay: float = 0.01         # on matrices only (not on norms and biases)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    clip_norm: float = 1.0
    kl_weight: float = 1.0
    ce_weight: float = 0.5
    layers: tuple[int, ...] | None = None   # target decoder layers the student starts from; None: first and last
    # An existing draft the student starts from instead ("bundled" or a folder): more training of a draft on new
    # audio, without labelling again what it was trained on. Its layers and its head's ranking are kept.
    init_draft: str | None = None
    # Token ids the student's head scores while training: the runtime's default draft head (tiny.en: the
    # 32768 most frequent ids; the whole vocabulary for tokenizers without a ranking); None: all ids.
    draft_vocab: int | None = RUNTIME_DRAFT_VOCAB
    # The encoder frames the student reads: the whole 30 s window (as a captured GPU step does), or only the
    # clip's audio plus the margin and the window's end (as an eager CPU step does: cheaper to train).
    audio_view: AudioView = "window"
    seed: int = 0
    checkpoint_minutes: float = 5.0
    checkpoint_steps: int | None = None     # also every this many steps (None: by time only)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be >= 1")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(f"need 0 < min_lr <= lr, got lr {self.lr}, min_lr {self.min_lr}")
        if self.warmup_steps < 0 or self.clip_norm <= 0:
            raise ValueError("warmup_steps must be >= 0 and clip_norm > 0")
        if self.kl_weight < 0 or self.ce_weight < 0 or self.kl_weight + self.ce_weight == 0:
            raise ValueError("kl_weight and ce_weight must be >= 0, not both 0")
        if self.audio_view not in ("window", "audio"):
            raise ValueError(f"audio_view must be window or audio, got {self.audio_view!r}")
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise ValueError(f"draft_vocab must be a positive token count or None, got {self.draft_vocab}")
        if self.layers is not None and self.init_draft is not None:
            raise ValueError("--layers and --init-draft exclude each other: a draft brings its own layers")
        if self.checkpoint_minutes <= 0 or (self.checkpoint_steps is not None and self.checkpoint_steps < 1):
            raise ValueError("checkpoint_minutes must be > 0 and checkpoint_steps >= 1")

    def identity(self) -> dict:
        """What makes two runs the same run (resuming needs it equal); how often to checkpoint does not."""
        key = asdict(self)
        for name in ("checkpoint_minutes", "checkpoint_steps"):
            key.pop(name)
        return key


EVAL_LANGUAGES = ("detect", "given")


@dataclass(frozen=True)
class EvalOptions:
    gammas: tuple[int, ...] = (1, 2, 3, 4, 5, 6)   # fixed drafts per step measured on held-out audio
    timestamps: bool = False           # decode the held-out clips with timestamps
    task: str = "transcribe"           # or translate (a multilingual target)
    speed: bool = True                 # also time exact against off end to end (the cost-aware gamma)
    max_clips: int | None = None       # at most this many held-out clips (None: all)
    baseline_draft: str | None = None  # another draft measured beside the new one ("bundled" or a folder)
    language: str = "detect"           # or "given": each clip in its folder's language, as `--language xx` decodes

    def __post_init__(self) -> None:
        if self.language not in EVAL_LANGUAGES:
            raise ValueError(f"the evaluation language must be one of {', '.join(EVAL_LANGUAGES)}, got {self.language!r}")
        if any(g < 1 for g in self.gammas):
            raise ValueError(f"gammas must be >= 1, got {self.gammas}")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"the evaluation task must be transcribe or translate, got {self.task!r}")


@dataclass(frozen=True)
class DistillOptions:
    target: str                        # hub id or local folder of the Whisper to distil
    audio: tuple[Path, ...]            # folders (or files) of training audio; no transcripts needed
    out: Path                          # the draft's folder (transformers format, card, plot, checkpoint)
    eval_audio: tuple[Path, ...] = ()  # held-out audio; none: `holdout` of the training files are set aside
    holdout: float = 0.1
    cache: Path | None = None          # teacher cache; None: ~/.cache/asr-app/distill (XDG_CACHE_HOME)
    device: str = "auto"
    dtype: str | None = None           # the target's dtype for the teacher pass (auto: fp16 on CUDA, fp32 on CPU)
    resume: bool = False
    teacher: TeacherOptions = field(default_factory=TeacherOptions)
    train: TrainOptions = field(default_factory=TrainOptions)
    evaluation: EvalOptions = field(default_factory=EvalOptions)

    def __post_init__(self) -> None:
        if not self.audio:
            raise ValueError("no training audio given")
        if not 0 <= self.holdout < 1:
            raise ValueError(f"holdout must be in [0, 1), got {self.holdout}")
