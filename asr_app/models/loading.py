"""Load a Whisper target and its draft (hub id or local directory) with checks that fail clearly."""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    WhisperConfig,
    WhisperForCausalLM,
    WhisperForConditionalGeneration,
    WhisperProcessor,
)

from asr_app.models.derive import derive_draft
from asr_app.models.presets import PRESETS, preset_for_target

log = logging.getLogger(__name__)

# Vocabulary sizes that identify a Whisper family; used to make mismatch errors readable.
_VOCAB_FAMILIES = {51864: "English-only (*.en)", 51865: "multilingual v1/v2", 51866: "multilingual large-v3"}


class ModelLoadError(RuntimeError):
    """A model could not be loaded or the target/draft pair is unusable (message says why and what to do)."""


@dataclass
class ModelPair:
    target: WhisperForConditionalGeneration
    draft: WhisperForCausalLM | WhisperForConditionalGeneration | None
    processor: WhisperProcessor
    device: torch.device
    dtype: torch.dtype
    shared_encoder: bool
    target_name: str
    draft_name: str | None
    draft_dtype: torch.dtype | None = None  # None: the target's dtype

    @property
    def draft_compute_dtype(self) -> torch.dtype:
        return self.draft_dtype or self.dtype


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if isinstance(device, torch.device):
        return device
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device '{device}' requested but CUDA is not available; use --device cpu")
    return dev


_DTYPES = {
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
}


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """fp16 on CUDA and fp32 on CPU unless told otherwise (fp16 convolutions fail on CPU)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "", "auto"):
        return torch.float16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ModelLoadError(f"unknown dtype '{dtype}'; use one of: auto, {', '.join(sorted(_DTYPES))}") from None


def resolve_draft_dtype(draft_dtype: str | torch.dtype | None, device: torch.device,
                        target_dtype: torch.dtype) -> torch.dtype:
    """The draft's dtype: the target's unless told otherwise (None, "", "auto" and "same" all mean the target's).

    The draft only proposes tokens and verification decides what is kept, so its precision changes its
    acceptance rate and the speed, never the output (greedy tokens, or the sampling distribution). Measured on
    a CPU with native bf16 (bench/decode_bench.py): a bf16 draft next to the fp32 tiny.en is no faster (3.5 ms
    a step vs 3.3 ms in fp32, whose output layer the engine already reads once per step), so it is not the
    default anywhere.
    """
    if draft_dtype in (None, "", "auto", "same"):
        return target_dtype
    return resolve_dtype(draft_dtype, device)


def _not_found(spec: str, role: str, err: Exception) -> ModelLoadError:
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME") or "~/.cache/huggingface/hub"
    how = (
        f"To get it: (1) run once with network access and HF_HUB_OFFLINE unset, or "
        f"`hf download {spec}` (it is then cached under {cache}); (2) or pass a local directory holding a "
        "transformers Whisper checkpoint (config.json + weights + tokenizer files)."
    )
    state = "offline mode (HF_HUB_OFFLINE=1) is on and it is" if offline else "it is"
    return ModelLoadError(
        f"{role} model '{spec}' not found: no such local directory, and {state} not in the Hugging Face "
        f"cache (or the hub is unreachable). {how} [{type(err).__name__}: {str(err).splitlines()[0][:200]}]"
    )


def _check_local(spec: str, role: str) -> Path | None:
    """A local directory for `spec`, None for a hub id; a path-like spec that does not exist is an error."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelLoadError(f"{role} model '{spec}' is a file; expected a directory or a hub id")
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelLoadError(f"{role} model directory '{spec}' does not exist")
    return None


def _load_config(spec: str, role: str) -> WhisperConfig:
    try:
        config = WhisperConfig.from_pretrained(spec)
    except (OSError, ValueError) as err:
        raise _not_found(spec, role, err) from err
    if getattr(config, "model_type", None) != "whisper":
        raise ModelLoadError(f"{role} model '{spec}' is not a Whisper model (model_type={config.model_type!r})")
    return config


def _load_target(spec: str, device: torch.device, dtype: torch.dtype):
    local = _check_local(spec, "target")
    if local is not None and (local / "model.bin").is_file():
        from asr_app.models import ct2  # lazy: only CTranslate2 directories need it

        if ct2.is_ct2_dir(local):
            return ct2.load_ct2_whisper(local, dtype, device)
    _load_config(spec, "target")
    try:
        model = WhisperForConditionalGeneration.from_pretrained(spec, dtype=dtype)
        processor = WhisperProcessor.from_pretrained(spec)
    except OSError as err:
        raise _not_found(spec, "target", err) from err
    return model, processor


def _load_draft(spec: str, device: torch.device, dtype: torch.dtype):
    local = _check_local(spec, "draft")
    if local is not None and (local / "model.bin").is_file():
        from asr_app.models import ct2

        if ct2.is_ct2_dir(local):
            return ct2.load_ct2_whisper(local, dtype, device)[0]
    config = _load_config(spec, "draft")
    # Distil-Whisper drafts saved as decoder-only are WhisperForCausalLM (is_encoder_decoder False).
    decoder_only = "WhisperForCausalLM" in (config.architectures or []) or not config.is_encoder_decoder
    cls = WhisperForCausalLM if decoder_only else WhisperForConditionalGeneration
    try:
        return cls.from_pretrained(spec, dtype=dtype)
    except OSError as err:
        raise _not_found(spec, "draft", err) from err


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def check_pair(target, draft, target_name: str, draft_name: str | None) -> None:
    """Vocabulary and special-token agreement (a mismatched pair decodes garbage); warn if draft >= target."""
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise ModelLoadError(
            f"vocabulary mismatch: target '{target_name}' has {tv} tokens ({_VOCAB_FAMILIES.get(tv, 'unknown')}) "
            f"but draft '{draft_name}' has {dv} ({_VOCAB_FAMILIES.get(dv, 'unknown')}); pick a draft distilled "
            "from this target (see --pair presets)"
        )
    for key in ("decoder_start_token_id", "eos_token_id"):
        a, b = getattr(target.config, key, None), getattr(draft.config, key, None)
        if a is not None and b is not None and a != b:
            raise ModelLoadError(
                f"tokenizer mismatch: target '{target_name}' {key}={a} but draft '{draft_name}' {key}={b}"
            )
    if target.config.d_model != draft.config.d_model and isinstance(draft, WhisperForCausalLM):
        raise ModelLoadError(
            f"draft '{draft_name}' is decoder-only with d_model={draft.config.d_model} but the target's encoder "
            f"outputs d_model={target.config.d_model}: it cannot run on the target's encoder output"
        )
    if draft is not target and _n_params(draft) >= _n_params(target):
        warnings.warn(
            f"draft '{draft_name}' ({_n_params(draft) / 1e6:.1f}M parameters) is not smaller than target "
            f"'{target_name}' ({_n_params(target) / 1e6:.1f}M): speculative decoding will be slower than "
            "target-only decoding",
            stacklevel=3,
        )


def encoders_equal(target, draft) -> bool:
    """True when `draft` (an encoder-decoder) has exactly the target's encoder weights."""
    if draft is target:
        return True
    a, b = target.model.encoder.state_dict(), draft.model.encoder.state_dict()
    if a.keys() != b.keys():
        return False
    return all(a[k].shape == b[k].shape and torch.equal(a[k], b[k].to(a[k].device)) for k in a)


def detect_shared_encoder(target, draft) -> bool:
    if draft is None:
        return False
    if isinstance(draft, WhisperForCausalLM):
        return True
    return encoders_equal(target, draft)


def load_pair(
    pair: str | None = None,
    target: str | None = None,
    draft: str | None = "auto",
    device: str = "auto",
    dtype: str | torch.dtype | None = None,
    draft_dtype: str | torch.dtype | None = None,
) -> ModelPair:
    """Load target + draft. `draft="auto"`: the preset's draft (none for an unknown target);
    `None`/"none": target-only; "derived": decoder layers (0, last) of the target.
    `draft_dtype`: the draft's own dtype (default: the target's; see `resolve_draft_dtype`)."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    draft_dt = resolve_draft_dtype(draft_dtype, dev, dt)
    preset = None
    if pair is not None:
        if pair not in PRESETS:
            raise ModelLoadError(f"unknown pair '{pair}'; presets: {', '.join(PRESETS)}")
        preset = PRESETS[pair]
    target_name = target or (preset.target if preset else None)
    if target_name is None:
        from asr_app.models.defaults import choose_default  # lazy: only needed without --pair/--target

        choice = choose_default(str(dev))
        if choice.notice:
            log.warning(choice.notice)
        target_name = choice.target
        if draft == "auto":
            draft = choice.draft
    if draft == "auto":
        if preset is None:
            preset = preset_for_target(target_name)
        draft = preset.draft if preset else None
    if isinstance(draft, str) and draft.lower() == "none":
        draft = None

    target_model, processor = _load_target(str(target_name), dev, dt)
    target_model = target_model.to(device=dev, dtype=dt).eval()

    draft_model = None
    draft_name = None
    if isinstance(draft, str) and draft == "derived":
        last = target_model.config.decoder_layers - 1
        draft_model = derive_draft(target_model, layers=(0, last) if last > 0 else (0,))
        draft_name = f"derived({target_name}, layers 0,{last})"
    elif draft is not None:
        draft_name = str(draft)
        draft_model = _load_draft(draft_name, dev, dt).to(device=dev, dtype=dt).eval()
    if draft_model is not None:
        check_pair(target_model, draft_model, str(target_name), draft_name)
    shared = detect_shared_encoder(target_model, draft_model)  # before a cast (it may compare weights)
    if draft_model is not None and draft_dt != dt:
        draft_model = draft_model.to(dtype=draft_dt)
    return ModelPair(
        target=target_model,
        draft=draft_model,
        processor=processor,
        device=dev,
        dtype=dt,
        shared_encoder=shared,
        target_name=str(target_name),
        draft_name=draft_name,
        draft_dtype=draft_dt if draft_model is not None else None,
    )
