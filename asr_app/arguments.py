"""Model and decoding arguments shared by asr-transcribe, asr-stream, asr-eval and app.py."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import warnings
from pathlib import Path

from asr_app.decoding.options import (
    DEFAULT_DRAFT_VOCAB,
    DRAFT_MATMUL_DTYPES,
    ENCODER_MATMUL_DTYPES,
    MODES,
    DecodingOptions,
    RuntimeOptions,
)
from asr_app.languages import language_code
from asr_app.models.defaults import hub_offline, hub_reachable, is_cached
from asr_app.models.errors import ModelLoadError
from asr_app.models.offline import PACKAGED
from asr_app.models.presets import PRESETS

MAX_TEMPERATURE = 1.0  # Whisper's fallback schedule ends here; far above it a model emits noise

log = logging.getLogger(__name__)


def parse_gamma(value: str) -> int | str:
    """`auto` (the cost-aware policy), `heuristic` (transformers' schedule: start 5, +2 / -1) or a fixed
    number of drafts per step."""
    if value.lower() in ("heuristic", "auto"):
        return value.lower()
    try:
        gamma = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--gamma must be 'auto', 'heuristic' or an integer >= 1, got '{value}'") from None
    if gamma < 1:
        raise argparse.ArgumentTypeError(f"--gamma must be >= 1, got {gamma}")
    return gamma


def parse_bool(value: str) -> bool:
    """openai-whisper's booleans: True/False (any case), also yes/no and 1/0."""
    text = value.strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


def parse_temperatures(value: str) -> tuple[float, ...]:
    """'0' or a comma-separated schedule '0,0.2,0.4' (the first, then the fallback ones); each finite, in [0, 1]."""
    try:
        temps = tuple(float(t) for t in value.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--temperature wants a number or a list like 0,0.2,0.4, got '{value}'") from None
    if not temps or any(not math.isfinite(t) or not 0 <= t <= MAX_TEMPERATURE for t in temps):
        raise argparse.ArgumentTypeError(
            f"--temperature values must be finite numbers in [0, {MAX_TEMPERATURE:g}], got '{value}'")
    return temps


def one_temperature(why: str):
    """`parse_temperatures` for a front end without a fallback: a list is refused with `why`."""
    def parse(value: str) -> tuple[float, ...]:
        temps = parse_temperatures(value)
        if len(temps) > 1:
            raise argparse.ArgumentTypeError(f"'{value}' is a fallback schedule; {why}")
        return temps
    return parse


FALLBACK_INCREMENT = 0.2  # openai/whisper's --temperature_increment_on_fallback


def fallback_schedule(temperatures: tuple[float, ...], increment: float = FALLBACK_INCREMENT,
                      enabled: bool = True) -> tuple[float, ...]:
    """The temperatures a failed window is retried at, wherever a window can fail (asr-transcribe, the web
    app's File and Compare tabs): the rest of a given list, or steps of `increment` from the first
    temperature up to 1.0 (openai/whisper's rule: numpy.arange(t, 1.0 + 1e-6, increment)[1:])."""
    if not enabled:
        return ()
    if len(temperatures) > 1:
        return tuple(temperatures[1:])
    if not 0 < increment <= 1:
        return ()
    steps = int(math.floor((MAX_TEMPERATURE - temperatures[0]) / increment + 1e-6))
    return tuple(round(temperatures[0] + increment * (i + 1), 6) for i in range(steps))


def add_model_args(parser: argparse.ArgumentParser, no_fallback: str | None = None) -> argparse.ArgumentParser:
    """The model and decoding options every front end shares. `no_fallback`: why this front end decodes at
    one temperature (a list given to --temperature is refused with it); None: a list is the fallback
    schedule (`fallback_schedule`)."""
    group = parser.add_argument_group("model and decoding")
    group.add_argument("--model", default=None,
                       help=f"model as openai-whisper names it: a preset ({', '.join(PRESETS)}), a hub id or a "
                            "local (transformers or CTranslate2) directory; its preset's draft comes along")
    group.add_argument("--pair", choices=sorted(PRESETS), default=None,
                       help="target/draft preset (default: the device's preset, large-v3 on CUDA or small.en on CPU, when it "
                            "is cached or the hub is reachable; else the offline tiny.en)")
    group.add_argument("--target", default=None, help="target Whisper model: hub id or local directory")
    group.add_argument("--draft", default="auto",
                       help="draft model: hub id or local directory, 'none' (target only), 'derived' (decoder "
                            "layers of the target), or 'auto' (the preset's draft; default)")
    group.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    group.add_argument("--dtype", default="auto", help="auto (fp16 on CUDA, fp32 on CPU) | float16 | bfloat16 | float32")
    group.add_argument("--draft-dtype", default="same",
                       help="the draft's dtype: same (the target's; default) | float16 | bfloat16 | float32. It "
                            "changes speed and acceptance, never the output")
    group.add_argument("--mode", choices=MODES, default="exact",
                       help="off: target only; hf: transformers' assisted generation; baseline/exact/sigmoid: our "
                            "loop with the PyTorch reference / exact / sigmoid verification (default: exact)")
    if no_fallback is None:
        group.add_argument("--temperature", type=parse_temperatures, default=(0.0,),
                           help="0 = greedy (default); a list such as 0,0.2,0.4,0.6,0.8,1 also sets the fallback "
                                "schedule (a failed window is decoded again at the next temperatures)")
    else:
        group.add_argument("--temperature", type=one_temperature(no_fallback), default=(0.0,),
                           help=f"0 = greedy (default), or one sampling temperature up to 1 (no list: {no_fallback})")
    group.add_argument("--language", default=None,
                       help="spoken language: a code or name Whisper knows (en, fr, French...); default: English "
                            "for English-only models, detected for multilingual ones")
    group.add_argument("--task", choices=("transcribe", "translate"), default="transcribe",
                       help="transcribe (default), or translate into English (multilingual models)")
    group.add_argument("--beam_size", "--beam-size", type=int, default=1,
                       help="1 only: speculative decoding is greedy (or sampled), not beam search")
    group.add_argument("--gamma", type=parse_gamma, default="auto",
                       help="drafts per step: 'auto' (default: the most tokens per second for the measured step "
                            "costs and acceptance, greedy decoding; sampling uses the heuristic), 'heuristic' "
                            "(transformers' schedule) or a fixed integer")
    group.add_argument("--draft-vocab", type=int, default=DEFAULT_DRAFT_VOCAB,
                       help=f"token ids the draft's output layer scores (default {DEFAULT_DRAFT_VOCAB}; 0 = all). "
                            "Changes speed and acceptance, never the output")
    group.add_argument("--draft-matmul-dtype", choices=DRAFT_MATMUL_DTYPES, default=RuntimeOptions.draft_matmul_dtype,
                       help=f"on a CPU, the draft's matrices: {', '.join(DRAFT_MATMUL_DTYPES)} (default "
                            f"{RuntimeOptions.draft_matmul_dtype}, where the CPU supports it). Changes speed and "
                            "acceptance, never the output")
    group.add_argument("--encoder-matmul-dtype", choices=ENCODER_MATMUL_DTYPES,
                       default=RuntimeOptions.encoder_matmul_dtype,
                       help="on a CPU, the encoder's products: same (fp32, the default) or bfloat16 (where the CPU "
                            "multiplies bf16 natively: a faster encoder; changes the output to bf16 rounding, "
                            "docs/runtime.md)")
    group.add_argument("--no-cuda-graphs", action="store_true",
                       help="on a GPU, launch every decoding step eagerly instead of replaying CUDA graphs")
    group.add_argument("--fused-layers", action=argparse.BooleanOptionalAction, default=None,
                       help="each decoder layer through our fused Triton kernels (8 launches instead of ~20). Default: "
                            "on a GPU with CUDA graphs, where it was measured faster (docs/runtime.md); a CPU runs "
                            "them only in Triton's interpreter")
    group.add_argument("--no-weight-packing", action="store_true",
                       help="on a CPU, run the projections on the model's own weights instead of a copy packed for "
                            "oneDNN (slower; saves that copy's memory, about the model's size), and the encoder's "
                            "attention with PyTorch's own kernel")
    group.add_argument("--default-allocator", action="store_true",
                       help="leave glibc's malloc as it is: give freed memory back to the system at once (slower; "
                            "by default freed memory is kept for reuse, so the process stays at its peak size)")
    group.add_argument("--alpha", type=float, default=None,
                       help=f"sigmoid mode: lower logit bound (default {DecodingOptions.alpha:g})")
    group.add_argument("--beta", type=float, default=None,
                       help=f"sigmoid mode: upper logit bound (default {DecodingOptions.beta:g})")
    group.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    group.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default: torch's choice; 1 is often fastest for tiny models on a "
                            "small or busy CPU)")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Everything that can be checked before loading a model; ValueError with a message for the user.
    Normalises `--language` to its code and resolves `--model`."""
    if getattr(args, "beam_size", 1) != 1:
        raise ValueError(f"--beam_size {args.beam_size}: beam search is not supported (speculative decoding is "
                         "greedy, or sampled with --temperature); use --beam_size 1")
    if getattr(args, "language", None):
        args.language = language_code(args.language)
    _check_sigmoid_bounds(args)
    model = getattr(args, "model", None)
    if model:
        if args.pair or args.target:
            raise ValueError("--model names the model: give it, or --pair / --target, not both")
        args.pair, args.target = (model, None) if model in PRESETS else (None, model)
        args.model = None  # resolved: checking again is a no-op
    named = args.pair or args.target or ""
    if named.rstrip("/").endswith(".en"):  # presets and OpenAI's English-only checkpoints say so in their name
        _check_english_only(args, named)
    target = args.target or (PRESETS[args.pair].target if args.pair in PRESETS else None)
    if target:
        check_reachable(target)


def _check_sigmoid_bounds(args: argparse.Namespace) -> None:
    """--alpha/--beta are the sigmoid mode's; given to a run that decodes no sigmoid mode they are refused.
    A front end that offers several modes at once names them in `args.modes` (asr-eval, the web app)."""
    given = [f"--{name}" for name in ("alpha", "beta") if getattr(args, name, None) is not None]
    modes = getattr(args, "modes", None) or [getattr(args, "mode", None)]
    if given and "sigmoid" not in modes:
        raise ValueError(f"{' and '.join(given)} set the sigmoid mode's logit bounds, and this run decodes no "
                         "sigmoid mode (--mode sigmoid)")


HUB_CHECK_S = 1.5


def check_reachable(spec: str) -> None:
    """A hub id that is neither cached nor reachable fails here, before torch loads (ModelLoadError)."""
    path = Path(spec).expanduser()
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        return  # a local path (its problems are reported when it loads)
    if spec in PACKAGED:
        return  # an installed extra holds it when the hub cannot (models/offline.py)
    if not is_cached(spec) and (hub_offline() or not hub_reachable(HUB_CHECK_S)):
        why = "HF_HUB_OFFLINE is set" if hub_offline() else "the Hugging Face Hub cannot be reached"
        raise ModelLoadError(f"model '{spec}' is not in the local Hugging Face cache and {why}; download it once "
                             "with network access, or pass a local model folder")


def _check_english_only(args: argparse.Namespace, name: str) -> None:
    if getattr(args, "language", None) not in (None, "en"):
        raise ValueError(f"{name} is an English-only model; it cannot transcribe language '{args.language}' "
                         "(choose a multilingual model with --model, e.g. base)")
    if getattr(args, "task", "transcribe") == "translate":
        raise ValueError(f"{name} is an English-only model; --task translate needs a multilingual model")


def options_from_args(args: argparse.Namespace, **overrides) -> DecodingOptions:
    gamma = args.gamma
    policy = "heuristic" if gamma == "heuristic" else "cost"
    temperatures = args.temperature if isinstance(args.temperature, tuple) else (float(args.temperature),)
    fields = dict(mode=args.mode, temperature=temperatures[0], gamma=gamma if isinstance(gamma, int) else None,
                  gamma_policy=policy, seed=args.seed,
                  language=getattr(args, "language", None) or "en", task=getattr(args, "task", "transcribe"))
    fields.update({name: getattr(args, name) for name in ("alpha", "beta") if getattr(args, name, None) is not None})
    fields.update(overrides)
    return DecodingOptions(**fields)  # ValueError with a readable message on bad values


def decoder_from_args(args: argparse.Namespace):
    """Load the pair named by the arguments and build a `SpeculativeDecoder`.

    Raises `ModelLoadError` (a RuntimeError: missing model, mismatched pair) or `ValueError` (bad option
    values) with a message meant for the user; the CLIs print it instead of a traceback."""
    # Imported here, after argument parsing: torch and transformers take seconds to import.
    import torch

    from asr_app.decoding.engine import SpeculativeDecoder
    from asr_app.models.loading import load_pair

    check_args(args)
    threads = getattr(args, "threads", None)
    if threads is not None:
        torch.set_num_threads(max(1, threads))
    options = options_from_args(args)
    draft = args.draft
    if options.mode == "off" and draft == "auto":
        draft = None  # target-only decoding: do not load a draft nobody will run
    pair = load_pair(pair=args.pair, target=args.target, draft=draft, device=args.device, dtype=args.dtype,
                     draft_dtype=getattr(args, "draft_dtype", None))
    multilingual = bool(getattr(pair.target.generation_config, "is_multilingual", False))
    if not multilingual:
        _check_english_only(args, pair.target_name)
    elif not getattr(args, "language", None):
        options = options_from_args(args, language=None)  # detected per window
    if pair.draft is None and options.mode != "off":
        log.warning("no draft model for '%s': decoding with the target only (mode off)", pair.target_name)
        options = options_from_args(args, mode="off", language=options.language)
    runtime = RuntimeOptions(draft_vocab=getattr(args, "draft_vocab", DEFAULT_DRAFT_VOCAB) or None,
                             draft_matmul_dtype=getattr(args, "draft_matmul_dtype", RuntimeOptions.draft_matmul_dtype),
                             encoder_matmul_dtype=getattr(args, "encoder_matmul_dtype",
                                                          RuntimeOptions.encoder_matmul_dtype),
                             cuda_graphs="off" if getattr(args, "no_cuda_graphs", False) else "auto",
                             packed_weights=not getattr(args, "no_weight_packing", False),
                             fused_layers=getattr(args, "fused_layers", None),
                             keep_freed_memory=not getattr(args, "default_allocator", False))
    return SpeculativeDecoder(pair, options, runtime)


def report(exc: Exception, prog: str) -> None:
    """One line for a problem with the options (ValueError) or the models (anything else)."""
    if isinstance(exc, ValueError):
        print(f"{prog}: error: {exc}", file=sys.stderr)
    else:
        print(f"{prog}: error: cannot load the models: {exc}", file=sys.stderr)


def check_args_or_report(args: argparse.Namespace, prog: str) -> bool:
    """`check_args` for a command-line tool: False (after one clear line) when it fails. From here on the
    tool's warnings are one line each, as its errors are (Python's own format adds the file and source line
    that raised them)."""
    warnings.formatwarning = lambda message, category, *_args, **_kw: f"{prog}: warning: {message}\n"
    try:
        check_args(args)
    except (ValueError, ModelLoadError) as exc:
        report(exc, prog)
        return False
    return True


def load_decoder_or_report(args: argparse.Namespace, prog: str):
    """`decoder_from_args` for a command-line tool: on a problem print one clear line, return None."""
    try:
        return decoder_from_args(args)
    except (ValueError, OSError, RuntimeError) as exc:  # ModelLoadError is a RuntimeError
        report(exc, prog)
    return None
