"""Options in, results out (openai/whisper decoding.py style): plain data, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

DecodingMode = Literal["off", "hf", "baseline", "exact", "sigmoid"]
MODES: tuple[str, ...] = ("off", "hf", "baseline", "exact", "sigmoid")
# Modes offered by the web app and the service. "hf" (transformers' assisted generation) stays a CLI/evaluator anchor.
UI_MODES: tuple[str, ...] = tuple(m for m in MODES if m != "hf")
SPECULATIVE_MODES: tuple[str, ...] = ("baseline", "exact", "sigmoid")  # our loop with a draft model
GraphSetting = Literal["auto", "off", "emulate"]
GammaSetting = Literal["cost", "heuristic"]
# bench/peers_bench.py on a CPU, int8 draft matrices: the shortest decoding loop of 16384, 32768 and all ids
DEFAULT_DRAFT_VOCAB = 32768
DRAFT_MATMUL_DTYPES: tuple[str, ...] = ("bfloat16", "int8", "same")
ENCODER_MATMUL_DTYPES: tuple[str, ...] = ("same", "bfloat16")


@dataclass(frozen=True)
class DecodingOptions:
    mode: DecodingMode = "exact"
    temperature: float = 0.0  # 0 = greedy for every mode
    gamma: int | None = None  # drafts per step; None = chosen per step by `gamma_policy`
    gamma_policy: GammaSetting = "cost"  # cost: most tokens per second at T = 0 (decoding/gamma.py); heuristic: transformers'
    alpha: float = -1e3
    beta: float = 1e3
    seed: int = 0
    max_new_tokens: int = 224  # generated tokens, the closing <|endoftext|> included (as in generate())
    timestamps: bool = False
    language: str | None = "en"
    task: str = "transcribe"
    word_timestamps: bool = False  # word start/end from the target's cross-attention (decoding/alignment.py)
    # With word_timestamps: each word's mean token probability, from one more pass over the whole vocabulary
    # per window (about 6 ms of a 147 ms live re-decode on a 2-core CPU). Streaming, whose words carry no
    # probability, leaves it out: Word.probability is then NaN.
    word_probabilities: bool = True
    profile_verify: bool = False  # time the verification step (adds syncs; off in production)
    # Encode only the window's audio plus this many seconds of its padding (whisper.cpp's audio_ctx), not
    # the whole 30 s window: a short buffer's encoder work shrinks with it. Changes the output (docs/serving.md,
    # "Less work per re-decode"); eager steps only (captured graphs keep the whole window). None: all 30 s.
    encoder_context_s: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown decoding mode '{self.mode}'; choose one of {', '.join(MODES)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.gamma is not None and self.gamma < 1:
            raise ValueError(f"gamma must be >= 1 (or None to let gamma_policy choose), got {self.gamma}")
        if self.gamma_policy not in ("cost", "heuristic"):
            raise ValueError(f"gamma_policy must be 'cost' or 'heuristic', got {self.gamma_policy!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got '{self.task}'")
        if self.encoder_context_s is not None and not 0 <= self.encoder_context_s <= 30:
            raise ValueError(f"encoder_context_s must lie in [0, 30] seconds or be None, got {self.encoder_context_s}")
        if self.mode == "sigmoid" and not self.beta > self.alpha:
            raise ValueError(f"sigmoid mode needs beta > alpha, got alpha={self.alpha}, beta={self.beta}")


@dataclass(frozen=True)
class RuntimeOptions:
    """How the decoder runs (fixed when a SpeculativeDecoder is built), never what it outputs."""

    draft_vocab: int | None = DEFAULT_DRAFT_VOCAB  # token ids the draft's output head scores; None: all
    cuda_graphs: GraphSetting = "auto"   # auto: captured steps on a GPU, eager elsewhere; emulate: for tests
    # Batch sizes (with drafts or without) whose caches and graphs stay allocated, graphs only. None: 4, raised
    # by a scheduler to the sizes it forms; a number: that bound, always (each holds its rows' caches).
    max_workspaces: int | None = None
    # Captured steps each workspace keeps (graphs only; the least recently used goes to make room): keys
    # multiply by batch x gamma x mode x temperature x timestamps. runtime.graphs.DEFAULT_MAX_GRAPHS.
    max_graphs: int = 128
    # Projection weights pre-packed for oneDNN on a CPU in fp32 (runtime.ops.pack), and the encoder's attention
    # through oneDNN (runtime.ops.full_attention): a faster encoder and output layer, for a second copy of the
    # encoder's and decoders' matrices in memory. False: PyTorch's own products on the models' own weights.
    packed_weights: bool = True
    # Set glibc's malloc to keep freed memory for reuse (runtime.allocator, process-wide, once): a process
    # that maps and unmaps its activations at every window and step spends its time in the kernel.
    keep_freed_memory: bool = True
    # The draft's matrices on a CPU: "int8" (the default: int8 values with a scale per row, bf16 activations,
    # where the CPU and torch build run it, else bf16), "bfloat16" (packed in bf16 where the CPU multiplies it
    # natively), or "same" (the draft's own dtype). Its activations, caches and attention stay in its dtype.
    # The draft's precision changes its acceptance and the speed, never the output (verification decides).
    draft_matmul_dtype: str = "int8"
    # The encoders' products on a CPU in fp32: "same" (fp32), or "bfloat16" (weights packed in bf16, each
    # product's inputs and outputs rounded to bf16, the first MLP projection's GELU with it, where the CPU
    # multiplies bf16 natively: AVX512-BF16 or AMX; elsewhere, and with packed_weights off, as "same"). The
    # encoder over a whole window is most of a short clip's time on a CPU, and bf16 products halve its cost
    # per multiply; norms, softmax, residuals and the decoders stay fp32. Unlike the draft's dtype, this
    # changes the output, to bf16 rounding of the encoder (docs/runtime.md, "bf16 encoder"): every mode but
    # `hf` (transformers' own encoder) reads the same encoder output, so `exact` still equals `off`.
    encoder_matmul_dtype: str = "same"
    # Where steps run eagerly, the draft cross-attends only to the window's audio plus this margin (seconds),
    # not to the padding that fills a short clip's window to 30 s: its cross K/V are computed for those
    # frames only, and each draft step reads fewer bytes. None: the whole window. The target always sees the
    # whole window; the draft's view changes its acceptance and the speed, never the output. Captured graphs
    # keep the whole window (their shapes are fixed).
    draft_audio_margin_s: float | None = 1.0
    # Each decoder layer (target and draft) through the fused Triton kernels of runtime.fused: a layer's
    # norms, biases, GELU, residual adds and cache writes inside its projections' launches. True: every step;
    # None: where it was measured faster (docs/runtime.md, "Fused layers"): steps of at most
    # fused.AUTO_MAX_ROWS rows replayed from CUDA graphs on a Hopper GPU with Triton; False, or a CPU unasked
    # (Triton runs there only in its interpreter): never. Changes speed, and values to float rounding.
    fused_layers: bool | None = None
    # Where steps run eagerly on unfused layers (a CPU), each row of a batch keeps every draft it accepted
    # (decoding/ragged.py); False: every row keeps the fewest any row accepted (the lock-step loop, which
    # captured graphs need). Changes speed, and at T > 0 which random numbers a row's draws use.
    ragged_batches: bool = True

    def __post_init__(self) -> None:
        if self.cuda_graphs not in ("auto", "off", "emulate"):
            raise ValueError(f"cuda_graphs must be auto, off or emulate, got {self.cuda_graphs!r}")
        if self.draft_matmul_dtype not in DRAFT_MATMUL_DTYPES:
            raise ValueError(f"draft_matmul_dtype must be one of {', '.join(DRAFT_MATMUL_DTYPES)}, "
                             f"got {self.draft_matmul_dtype!r}")
        if self.encoder_matmul_dtype not in ENCODER_MATMUL_DTYPES:
            raise ValueError(f"encoder_matmul_dtype must be one of {', '.join(ENCODER_MATMUL_DTYPES)}, "
                             f"got {self.encoder_matmul_dtype!r}")
        if self.draft_audio_margin_s is not None and not self.draft_audio_margin_s >= 0:
            raise ValueError(f"draft_audio_margin_s must be >= 0 seconds or None, got {self.draft_audio_margin_s}")
        if self.max_graphs < 1:
            raise ValueError(f"max_graphs must be >= 1, got {self.max_graphs}")
        if self.max_workspaces is not None and self.max_workspaces < 1:
            raise ValueError(f"max_workspaces must be >= 1, got {self.max_workspaces}")
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise ValueError(f"draft_vocab must be a positive token count or None, got {self.draft_vocab}")

    def use_fused_layers(self, device) -> bool:
        """Whether decoder layers run fused on `device` (`fused_layers`, or its default there), for steps of
        at most `fused_max_rows()` rows."""
        if self.fused_layers is not None:
            return self.fused_layers
        # imported here: this module loads without torch (asr_app/decoding/__init__.py)
        from asr_app.runtime import fused

        return self.graph_mode(device) == "cuda" and fused.default_on(device)

    def fused_max_rows(self) -> int | None:
        """Rows (batch x tokens) per step up to which fused layers run: every step when asked for."""
        from asr_app.runtime import fused

        return None if self.fused_layers else fused.AUTO_MAX_ROWS

    def graph_mode(self, device) -> str:
        if self.cuda_graphs == "emulate":
            return "emulate"
        return "cuda" if self.cuda_graphs == "auto" and device.type == "cuda" else "eager"


@dataclass
class Word:
    word: str            # as decoded, with its leading space
    start: float         # seconds, relative to the decoded window's start (like the segment's)
    end: float
    probability: float   # the target's mean probability of the word's tokens
    tokens: list[int] = field(default_factory=list, repr=False, metadata={"json": False})


@dataclass
class Segment:
    start: float  # seconds, relative to the decoded window's start
    end: float
    text: str
    tokens: list[int]
    words: list[Word] | None = None  # with DecodingOptions(word_timestamps=True)
    # Long-form: where the segment's 30 s window started, in 10 ms frames (openai-whisper's `seek`; the API's
    # verbose_json). Not in the files asr-transcribe writes.
    seek: int = field(default=0, metadata={"json": False})


_SUMMED = ("tokens_out", "target_calls", "drafted", "accepted", "hint_steps", "hinted", "hint_accepted",
           "setup_s", "encoder_s", "draft_s", "target_s", "verify_s", "verify_cpu_s", "total_s", "windows",
           "context_retries")


def loop_seconds(total_s: float, setup_s: float, encoder_s: float) -> float:
    """A decode's token loop: its synchronised total less its encoder and one-time work, so the figure holds
    the device's time on a GPU too (the step timers there hold only launches)."""
    return max(total_s - setup_s - encoder_s, 0.0)


@dataclass
class DecodingStats:
    mode: str
    shared_encoder: bool
    tokens_out: int = 0
    target_calls: int = 0
    drafted: int = 0         # tokens the draft model proposed (one draft step each)
    accepted: int = 0
    hint_steps: int = 0      # target calls whose proposal held hint tokens (see loop.py)
    hinted: int = 0          # hint tokens offered
    hint_accepted: int = 0   # hint tokens kept
    acceptance_rate: float | None = None         # None when nothing was drafted
    mean_accepted_per_step: float | None = None  # accepted drafts per target call; None as above
    setup_s: float = 0.0     # one-time work: step-cost timing, graph captures before or in the loop (in total_s)
    encoder_s: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0
    verify_s: float = 0.0
    verify_cpu_s: float = 0.0  # process CPU time of the verify calls, measured only with profile_verify
    total_s: float = 0.0
    windows: int = 1         # decodes summed into this record
    context_retries: int = 0  # a lost decode over a shortened encoder input: the decodes done again (1-2)
    verify_steps: list[tuple[int, float]] = field(default_factory=list)

    @property
    def loop_s(self) -> float:
        """The token loop's seconds (language detection included): the total less encoder and one-time work."""
        return loop_seconds(self.total_s, self.setup_s, self.encoder_s)

    def finalise(self) -> None:
        drafted = self.drafted > 0
        self.acceptance_rate = self.accepted / self.drafted if drafted else None
        self.mean_accepted_per_step = self.accepted / self.target_calls if drafted and self.target_calls else None

    @classmethod
    def total(cls, parts: list[DecodingStats]) -> DecodingStats:
        """The statistics of several decodes (windows, steps of a stream, a session) as one record."""
        if not parts:
            raise ValueError("no statistics to add up")
        out = cls(mode=parts[0].mode, shared_encoder=parts[-1].shared_encoder, windows=0)
        for part in parts:
            for name in _SUMMED:
                setattr(out, name, getattr(out, name) + getattr(part, name))
            out.verify_steps += part.verify_steps
        out.finalise()
        return out


@dataclass
class DecodingResult:
    tokens: list[int]  # generated ids after the prompt, timestamps included, no EOS
    text: str  # decoded text without special tokens
    segments: list[Segment]  # one per timestamp pair; one whole-window segment without timestamps
    no_speech_prob: float  # target's P(<|nospeech|>) at the first position
    avg_logprob: float  # mean target log-prob of the emitted tokens (EOS included)
    stats: DecodingStats
    language: str | None = None  # the spoken language's code: as given, or detected (multilingual models)
    language_probability: float | None = None  # the detection's probability (None when it was given)
