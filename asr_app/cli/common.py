"""Model and decoding arguments shared by asr-transcribe, asr-stream, asr-eval and app.py."""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from asr_app.decoding import MODES, DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.decoding.options import DEFAULT_DRAFT_VOCAB
from asr_app.models import PRESETS, load_pair

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


def add_model_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("model and decoding")
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
    group.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    group.add_argument("--gamma", type=parse_gamma, default="auto",
                       help="drafts per step: 'auto' (default: the most tokens per second for the measured step "
                            "costs and acceptance, greedy decoding; sampling uses the heuristic), 'heuristic' "
                            "(transformers' schedule) or a fixed integer")
    group.add_argument("--draft-vocab", type=int, default=DEFAULT_DRAFT_VOCAB,
                       help=f"token ids the draft's output layer scores (default {DEFAULT_DRAFT_VOCAB}; 0 = all). "
                            "Changes speed and acceptance, never the output")
    group.add_argument("--no-cuda-graphs", action="store_true",
                       help="on a GPU, launch every decoding step eagerly instead of replaying CUDA graphs")
    group.add_argument("--alpha", type=float, default=-1e3, help="sigmoid mode: lower logit bound (default -1e3)")
    group.add_argument("--beta", type=float, default=1e3, help="sigmoid mode: upper logit bound (default 1e3)")
    group.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    group.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default: torch's choice; 1 is often fastest for tiny models on a "
                            "small or busy CPU)")
    return parser


def options_from_args(args: argparse.Namespace, **overrides) -> DecodingOptions:
    gamma = args.gamma
    policy = "heuristic" if gamma == "heuristic" else "cost"
    fields = dict(mode=args.mode, temperature=args.temperature, gamma=gamma if isinstance(gamma, int) else None,
                  gamma_policy=policy, alpha=args.alpha, beta=args.beta, seed=args.seed)
    fields.update(overrides)
    return DecodingOptions(**fields)  # ValueError with a readable message on bad values


def decoder_from_args(args: argparse.Namespace) -> SpeculativeDecoder:
    """Load the pair named by the arguments and build a decoder.

    Raises `ModelLoadError` (a RuntimeError: missing model, mismatched pair) or `ValueError` (bad option
    values) with a message meant for the user; the CLIs print it instead of a traceback."""
    threads = getattr(args, "threads", None)
    if threads is not None:
        torch.set_num_threads(max(1, threads))
    options = options_from_args(args)
    draft = args.draft
    if options.mode == "off" and draft == "auto":
        draft = None  # target-only decoding: do not load a draft nobody will run
    pair = load_pair(pair=args.pair, target=args.target, draft=draft, device=args.device, dtype=args.dtype,
                     draft_dtype=getattr(args, "draft_dtype", None))
    if pair.draft is None and options.mode != "off":
        log.warning("no draft model for '%s': decoding with the target only (mode off)", pair.target_name)
        options = options_from_args(args, mode="off")
    runtime = RuntimeOptions(draft_vocab=getattr(args, "draft_vocab", DEFAULT_DRAFT_VOCAB) or None,
                             cuda_graphs="off" if getattr(args, "no_cuda_graphs", False) else "auto")
    return SpeculativeDecoder(pair, options, runtime)


def load_decoder_or_report(args: argparse.Namespace, prog: str) -> SpeculativeDecoder | None:
    """`decoder_from_args` for a command-line tool: on a model problem print one clear line, return None."""
    try:
        return decoder_from_args(args)
    except (OSError, ValueError, RuntimeError) as exc:  # ModelLoadError is a RuntimeError
        print(f"{prog}: error: cannot load the models: {exc}", file=sys.stderr)
        return None
