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
from transformers.utils import logging as hf_logging

from asr_app.models import ct2
from asr_app.models.bundled import bundle_for, load_bundled_draft
from asr_app.models.defaults import choose_default, hub_offline, hub_reachable, is_cached
from asr_app.models.derive import derive_draft
from asr_app.models.device import resolve_device, resolve_draft_dtype, resolve_dtype
from asr_app.models.errors import ModelLoadError
from asr_app.models.offline import PACKAGED
from asr_app.models.presets import BUNDLED, PRESETS, preset_for_target

log = logging.getLogger(__name__)
HUB_CHECK_S = 1.5  # how long an uncached hub id may wait for the hub to answer

# Vocabulary sizes that identify a Whisper family; used to make mismatch errors readable.
_VOCAB_FAMILIES = {51864: "English-only (*.en)", 51865: "multilingual v1/v2", 51866: "multilingual large-v3"}


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


def _source(spec: str, role: str) -> tuple[Path | None, dict]:
    """(local folder or None, from_pretrained keywords). A hub id is read from the local cache when it is
    there; otherwise the hub must answer within HUB_CHECK_S, so an unreachable hub fails in a second or
    two with one line instead of after the hub client's retries."""
    local = _check_local(spec, role)
    if local is not None:
        if not (local / "config.json").is_file():
            raise ModelLoadError(f"{role} model folder '{spec}' has no config.json: not a transformers Whisper "
                                 "checkpoint (nor a CTranslate2 one: no model.bin)")
        return local, {}
    if is_cached(spec, role):
        return None, {"local_files_only": True}
    if hub_offline() or not hub_reachable(HUB_CHECK_S):
        raise _not_found(spec, role, ConnectionError("the Hugging Face Hub cannot be reached"))
    return None, {}


def _from_pretrained(cls, spec: str, role: str, **kwargs):
    """cls.from_pretrained with the errors a user can act on turned into one clear ModelLoadError."""
    try:
        return cls.from_pretrained(spec, **kwargs)
    except OSError as err:
        if Path(spec).expanduser().is_dir():   # the folder is there: what is in it is broken or missing
            raise ModelLoadError(f"{role} model folder '{spec}' cannot be read: {_first_line(err)}") from err
        raise _not_found(spec, role, err) from err
    except Exception as err:  # noqa: BLE001 - safetensors, torch and transformers raise their own kinds
        if "ignore_mismatched_sizes" in str(err):
            raise ModelLoadError(f"{role} model '{spec}' cannot be read: its weights do not have the shapes its "
                                 "config.json gives (an edited config.json, or weights of another model; "
                                 "transformers' load report above lists them)") from err
        raise ModelLoadError(f"{role} model '{spec}' cannot be read (its config.json and weights do not fit, or a "
                             f"file is corrupt or truncated): {_first_line(err)}") from err


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__


def _load_config(spec: str, role: str, **kwargs) -> WhisperConfig:
    config = _from_pretrained(WhisperConfig, spec, role, **kwargs)
    if getattr(config, "model_type", None) != "whisper":
        raise ModelLoadError(f"{role} model '{spec}' is not a Whisper model (model_type={config.model_type!r})")
    return config


def _is_decoder_only(config: WhisperConfig) -> bool:
    # Distil-Whisper drafts saved as decoder-only are WhisperForCausalLM (is_encoder_decoder False).
    return "WhisperForCausalLM" in (config.architectures or []) or not config.is_encoder_decoder


def packaged_fallback(spec: str) -> Path | None:
    """The folder an installed extra holds for hub id `spec`, when the hub cannot give it (not cached and
    offline or unreachable); None otherwise."""
    find = PACKAGED.get(spec)
    if find is None or _check_local(spec, "target") is not None or is_cached(spec):
        return None
    if not hub_offline() and hub_reachable(HUB_CHECK_S):
        return None
    return find()


def _load_target(spec: str, device: torch.device, dtype: torch.dtype):
    if ct2.is_ct2_dir(Path(spec).expanduser()):
        return ct2.load_ct2_whisper(Path(spec).expanduser(), dtype, device)
    _, kwargs = _source(spec, "target")
    if _is_decoder_only(_load_config(spec, "target", **kwargs)):
        raise ModelLoadError(f"target model '{spec}' is a decoder-only draft (it has no encoder): were --target "
                             "and --draft swapped?")
    model = _from_pretrained(WhisperForConditionalGeneration, spec, "target", dtype=dtype, **kwargs)
    processor = _from_pretrained(WhisperProcessor, spec, "target", **kwargs)
    _check_tokenizer(processor.tokenizer, model.config.vocab_size, spec)
    return model, processor


def _check_tokenizer(tokenizer, vocab_size: int, spec: str) -> None:
    """Refuse a tokenizer that cannot spell the model's tokens. Without its files transformers still builds
    one (of a single entry), and every transcript then comes out empty without a word of warning."""
    known = len(tokenizer)   # timestamp ids may be left out of it (tiny.en's: 50363 of 51864)
    if known < vocab_size // 2:
        raise ModelLoadError(f"target model '{spec}' has no usable tokenizer: it knows {known} tokens against the "
                             f"model's {vocab_size} (are tokenizer.json, or vocab.json and merges.txt, missing?)")


def _load_draft(spec: str, device: torch.device, dtype: torch.dtype):
    if ct2.is_ct2_dir(Path(spec).expanduser()):
        return ct2.load_ct2_whisper(Path(spec).expanduser(), dtype, device)[0]
    _, kwargs = _source(spec, "draft")
    config = _load_config(spec, "draft", **kwargs)
    cls = WhisperForCausalLM if _is_decoder_only(config) else WhisperForConditionalGeneration
    return _from_pretrained(cls, spec, "draft", dtype=dtype, **kwargs)


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


def _names(pair: str | None, target: str | None, draft: str | None, device: torch.device) -> tuple[str, str | None]:
    """(target spec, draft spec) from what the user named: a preset, a target, or neither (the default)."""
    preset = None
    if pair is not None:
        if pair not in PRESETS:
            raise ModelLoadError(f"unknown pair '{pair}'; presets: {', '.join(PRESETS)}")
        preset = PRESETS[pair]
    target_name = target or (preset.target if preset else None)
    if target_name is None:
        choice = choose_default(str(device))
        if choice.notice:
            log.warning(choice.notice)
        target_name = choice.target
        if draft == "auto":
            draft = choice.draft
    if draft == "auto":
        preset = preset or preset_for_target(target_name)
        draft = preset.draft if preset else "auto"  # an unknown target: decided once it is loaded
    if isinstance(draft, str) and draft.lower() == "none":
        draft = None
    return str(target_name), draft


def _build_draft(spec: str | None, target_model, target_name: str, device: torch.device, dtype: torch.dtype):
    """(draft model or None, its name). "auto" for a target no preset knows: the bundled draft made for the
    target if the package ships one, else none; "derived": decoder layers (0, last) of the target;
    "bundled": the draft shipped in the package for this target."""
    bundle = bundle_for(target_model) if spec in ("auto", BUNDLED) else None   # one embedding hash per load
    if spec == "auto":
        spec = BUNDLED if bundle is not None else None
    if spec is None:
        return None, None
    if spec == "derived":
        last = target_model.config.decoder_layers - 1
        return derive_draft(target_model, layers=(0, last) if last > 0 else (0,)), f"derived({target_name}, layers 0,{last})"
    if spec == BUNDLED:
        return load_bundled_draft(target_model, bundle), f"bundled {bundle.name.removesuffix('-draft')} draft"
    return _load_draft(spec, device, dtype).to(device=device, dtype=dtype).eval(), spec


def _warn_half_precision_on_cpu(dtype: torch.dtype) -> None:
    """The CPU runtime's fast paths (packed products, oneDNN attention) are fp32 ones (docs/runtime.md)."""
    from asr_app.runtime.ops import onednn_packing_works

    instead = (" keep float32 and pass --encoder-matmul-dtype bfloat16 for a faster encoder"
               if onednn_packing_works(torch.bfloat16) else " keep float32")
    log.warning("a %s model on a CPU runs outside the runtime's packed fp32 paths and is slower than float32:%s",
                str(dtype).removeprefix("torch."), instead)


def load_pair(
    pair: str | None = None,
    target: str | None = None,
    draft: str | None = "auto",
    device: str = "auto",
    dtype: str | torch.dtype | None = None,
    draft_dtype: str | torch.dtype | None = None,
) -> ModelPair:
    """Load target + draft. `draft="auto"`: the preset's draft, or the draft the package ships for the
    target, else none; `None`/"none": target-only; "derived": decoder layers (0, last) of the target;
    "bundled": the distilled draft shipped in the package for the target (tiny.en, base). `draft_dtype`: the
    draft's own dtype (default: the target's; see `resolve_draft_dtype`)."""
    hf_logging.disable_progress_bar()  # transformers' per-file "Loading weights" bars: noise for our users
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    draft_dt = resolve_draft_dtype(draft_dtype, dev, dt)
    if dev.type == "cpu" and dt != torch.float32:
        _warn_half_precision_on_cpu(dt)
    target_name, draft_spec = _names(pair, target, draft, dev)
    fallback = packaged_fallback(target_name)
    if fallback is not None:
        log.warning("%s is not cached and the hub is out of reach: using the copy installed from PyPI (%s)",
                    target_name, fallback)
        target_name = str(fallback)
    target_model, processor = _load_target(target_name, dev, dt)
    target_model = target_model.to(device=dev, dtype=dt).eval()
    draft_model, draft_name = _build_draft(draft_spec, target_model, target_name, dev, dt)
    if draft_model is not None:
        check_pair(target_model, draft_model, target_name, draft_name)
    shared = detect_shared_encoder(target_model, draft_model)  # before a cast (it may compare weights)
    if draft_model is not None and draft_dt != dt:
        draft_model = draft_model.to(dtype=draft_dt)
    return ModelPair(target=target_model, draft=draft_model, processor=processor, device=dev, dtype=dt,
                     shared_encoder=shared, target_name=target_name, draft_name=draft_name,
                     draft_dtype=draft_dt if draft_model is not None else None)
