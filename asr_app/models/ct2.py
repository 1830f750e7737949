"""Load CTranslate2 (faster-whisper) Whisper checkpoints into transformers, in memory.

A CTranslate2 model directory holds ``model.bin`` (all weights, one binary file),
``config.json`` (suppressed tokens, language ids, alignment heads), ``tokenizer.json``
and optionally ``vocabulary.txt`` and ``preprocessor_config.json``. This module reads
``model.bin`` itself (no ``ctranslate2`` dependency), renames the variables to the
transformers Whisper layout, splits CTranslate2's fused projections, dequantises
int8/int16 weights and builds a ``WhisperForConditionalGeneration`` + ``WhisperProcessor``.

``model.bin`` layout (little-endian; written by CTranslate2's ``ModelSpec._serialize``):

    u32 binary_version                      (1..6 understood here)
    str spec_name, u32 spec_revision         (binary_version >= 2)
    u32 n, then n times:
        str name, u8 rank, u32 dims[rank],
        u8 dtype_id, u32 num_bytes, bytes     (binary_version >= 4;
                                               older: u8 item_size, u32 num_items)
    u32 n_aliases, then (str alias, str target) pairs   (binary_version >= 3)

where ``str`` is a u16 length (including a trailing NUL) followed by UTF-8 bytes.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import (
    GenerationConfig,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
    WhisperTokenizer,
)

from asr_app.models import offline
from asr_app.models.device import resolve_device, resolve_dtype
from asr_app.models.errors import ModelLoadError

CT2_MODEL_FILE = "model.bin"
SUPPORTED_BINARY_VERSION = 6
WHISPER_SPEC = "WhisperSpec"

# Order of CTranslate2's DataType enum (include/ctranslate2/types.h).
_DTYPE_IDS: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    5: np.dtype("<u2"),  # bfloat16: numpy has none; reinterpreted in torch below
}
_BFLOAT16_ID = 5
# Binary versions < 4 stored an item size instead of a dtype id.
_DTYPE_BY_ITEM_SIZE = {4: 0, 2: 2, 1: 1}
# CTranslate2's Activation enum value for exact GELU, the one Whisper uses.
_ACTIVATION_GELU = 3


def _load_error(path: Path, reason: str) -> Exception:
    return ModelLoadError(f"{path}: {reason}")


@dataclass
class Ct2Checkpoint:
    """The raw content of a ``model.bin``: named tensors, aliases resolved."""

    path: Path
    binary_version: int
    spec_name: str
    spec_revision: int
    variables: dict[str, torch.Tensor]  # aliases point at the same tensor object
    aliases: dict[str, str]


def is_ct2_dir(path: str | Path) -> bool:
    """True for a directory holding a CTranslate2 ``model.bin``."""
    p = Path(path)
    return p.is_dir() and (p / CT2_MODEL_FILE).is_file()


class _Reader:
    """Bounds-checked little-endian reader over a byte buffer, naming the file in errors."""

    def __init__(self, path: Path, buf: mmap.mmap | bytes):
        self.path, self.buf, self.pos, self.size = path, buf, 0, len(buf)

    def _take(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise _load_error(
                self.path,
                f"file is truncated or corrupt: needed {n} bytes for {what} at offset {start}, "
                f"but the file has {self.size} bytes",
            )
        self.pos += n
        return start

    def unpack(self, fmt: str, what: str) -> int:
        start = self._take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, start)[0]

    def string(self, what: str) -> str:
        length = self.unpack("<H", f"the length of {what}")
        start = self._take(length, what)
        raw = bytes(self.buf[start : start + length])
        if length == 0 or raw[-1] != 0:
            raise _load_error(self.path, f"corrupt {what} at offset {start}: not NUL-terminated")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise _load_error(self.path, f"corrupt {what} at offset {start}: not UTF-8") from None

    def array(self, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        start = self._take(count * dtype.itemsize, what)
        # Copy so the tensor outlives the memory map.
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).copy()


def read_model_bin(path: str | Path, check: Callable[[mmap.mmap], None] | None = None) -> Ct2Checkpoint:
    """Parse a CTranslate2 ``model.bin`` (or the directory holding it). `check(buffer)` sees the mapped
    bytes before they are parsed (the packaged models' SHA-256, models/offline.py)."""
    path = Path(path)
    if path.is_dir():
        path = path / CT2_MODEL_FILE
    if not path.is_file():
        raise _load_error(path, "no such file")
    with open(path, "rb") as f:
        if path.stat().st_size == 0:
            raise _load_error(path, "file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if check is not None:
                check(buf)
            return _parse(path, buf)


def _parse(path: Path, buf: mmap.mmap) -> Ct2Checkpoint:
    r = _Reader(path, buf)
    version = r.unpack("<I", "the binary version")
    if not 1 <= version <= SUPPORTED_BINARY_VERSION:
        raise _load_error(
            path,
            f"not a CTranslate2 model file, or written by an unsupported CTranslate2 version "
            f"(binary version {version}; this loader reads 1..{SUPPORTED_BINARY_VERSION})",
        )
    spec, revision = "", 1
    if version >= 2:
        spec = r.string("the model spec name")
        revision = r.unpack("<I", "the spec revision")

    variables: dict[str, torch.Tensor] = {}
    for i in range(r.unpack("<I", "the variable count")):
        name = r.string(f"the name of variable #{i}")
        rank = r.unpack("<B", f"the rank of {name}")
        if rank > 8:
            raise _load_error(path, f"corrupt variable {name!r}: rank {rank}")
        shape = [r.unpack("<I", f"the shape of {name}") for _ in range(rank)]
        if version >= 4:
            dtype_id = r.unpack("<B", f"the dtype of {name}")
            num_bytes = r.unpack("<I", f"the size of {name}")
        else:
            item_size = r.unpack("<B", f"the item size of {name}")
            dtype_id = _DTYPE_BY_ITEM_SIZE.get(item_size, -1)
            num_bytes = r.unpack("<I", f"the size of {name}") * item_size
        if dtype_id not in _DTYPE_IDS:
            raise _load_error(path, f"corrupt variable {name!r}: unknown dtype id {dtype_id}")
        dtype = _DTYPE_IDS[dtype_id]
        count = int(np.prod(shape, dtype=np.int64))
        if count * dtype.itemsize != num_bytes:
            raise _load_error(
                path,
                f"corrupt variable {name!r}: shape {shape} of {dtype.name} needs "
                f"{count * dtype.itemsize} bytes, the file says {num_bytes}",
            )
        tensor = torch.from_numpy(r.array(dtype, count, f"the data of {name}")).reshape(shape)
        if dtype_id == _BFLOAT16_ID:
            tensor = tensor.view(torch.int16).view(torch.bfloat16)
        variables[name] = tensor

    aliases: dict[str, str] = {}
    if version >= 3:
        for i in range(r.unpack("<I", "the alias count")):
            alias = r.string(f"alias #{i}")
            target = r.string(f"the target of alias {alias!r}")
            if target not in variables:
                raise _load_error(path, f"corrupt alias {alias!r}: no variable named {target!r}")
            aliases[alias] = target
            variables[alias] = variables[target]
            # An aliased weight shares its quantisation scale too.
            if target + "_scale" in variables:
                variables[alias + "_scale"] = variables[target + "_scale"]
    if r.pos != r.size:
        raise _load_error(path, f"corrupt file: {r.size - r.pos} unexpected bytes after the last record")
    return Ct2Checkpoint(path, version, spec, revision, variables, aliases)


# ---------------------------------------------------------------------------
# Whisper: CTranslate2 names -> transformers names


class _Weights:
    """Hands out weights by CTranslate2 name (int8/int16 dequantised), remembering which were used."""

    def __init__(self, ckpt: Ct2Checkpoint):
        self.ckpt, self.used = ckpt, set()

    def has(self, name: str) -> bool:
        return name in self.ckpt.variables

    def scalar(self, name: str) -> int:
        self.used.add(name)
        value = self.ckpt.variables.get(name)
        if value is None or value.numel() != 1:
            raise _load_error(self.ckpt.path, f"missing or malformed attribute {name!r}")
        return int(value.item())

    def get(self, name: str) -> torch.Tensor:
        value = self.ckpt.variables.get(name)
        if value is None:
            raise _load_error(self.ckpt.path, f"missing variable {name!r} (incomplete Whisper checkpoint)")
        self.used.add(name)
        if value.dtype in (torch.int8, torch.int16):
            scale = self.ckpt.variables.get(name + "_scale")
            if scale is None:
                raise _load_error(self.ckpt.path, f"quantised variable {name!r} has no {name}_scale")
            self.used.add(name + "_scale")
            # CTranslate2 stores round(w * scale): per output row for int8, one scalar for int16.
            scale = scale.float()
            if scale.dim() == 1 and value.dim() >= 2:
                scale = scale.reshape(-1, *([1] * (value.dim() - 1)))
            return value.float() / scale
        if value.dtype == torch.int32:
            raise _load_error(self.ckpt.path, f"variable {name!r} is int32, not a weight")
        # Floats stay as stored; the caller casts once to the requested dtype (no float32
        # detour that would double a float16 large-v3 in memory).
        return value


def _linear(w: _Weights, src: str, dst: str, out: dict, bias: bool = True) -> None:
    out[f"{dst}.weight"] = w.get(f"{src}/weight")
    if bias:
        out[f"{dst}.bias"] = w.get(f"{src}/bias")


def _layer_norm(w: _Weights, src: str, dst: str, out: dict) -> None:
    out[f"{dst}.weight"] = w.get(f"{src}/gamma")
    out[f"{dst}.bias"] = w.get(f"{src}/beta")


def _split_fused(w: _Weights, src: str, dsts: list[str], out: dict) -> None:
    """Split a fused projection (q|k|v or k|v) stacked along the output dimension.

    Whisper's k_proj has no bias; CTranslate2 fills that slice of the fused bias with zeros.
    """
    weights = w.get(f"{src}/weight").chunk(len(dsts), dim=0)
    biases = w.get(f"{src}/bias").chunk(len(dsts), dim=0)
    for dst, weight, b in zip(dsts, weights, biases, strict=True):
        out[f"{dst}.weight"] = weight
        if dst.endswith("k_proj"):
            if b.abs().max() > 0:
                raise _load_error(w.ckpt.path, f"{src}/bias has a non-zero key bias, which Whisper has not")
        else:
            out[f"{dst}.bias"] = b


def _ffn(w: _Weights, src: str, dst: str, out: dict) -> None:
    _layer_norm(w, f"{src}/layer_norm", f"{dst}.final_layer_norm", out)
    _linear(w, f"{src}/linear_0", f"{dst}.fc1", out)
    _linear(w, f"{src}/linear_1", f"{dst}.fc2", out)


def _count_layers(w: _Weights, prefix: str) -> int:
    n = 0
    while w.has(f"{prefix}/layer_{n}/ffn/linear_0/weight"):
        n += 1
    return n


def _check_variant(ckpt: Ct2Checkpoint, w: _Weights) -> None:
    """Refuse what is not plain Whisper (another spec, low-rank layers, other norms or activations)."""
    if ckpt.spec_name != WHISPER_SPEC:
        kind = ckpt.spec_name or "an unnamed (binary version 1)"
        raise _load_error(ckpt.path, f"is a CTranslate2 {kind} model, not Whisper ({WHISPER_SPEC})")
    if w.has("encoder/layer_0/self_attention/linear_0/weight_a") or w.has(
        "encoder/layer_0/self_attention/linear_0/weight_b"
    ):
        raise _load_error(ckpt.path, "low-rank (Lite-Whisper) checkpoints are not supported")
    for flag, expected in (("decoder/pre_norm", 1), ("decoder/activation", _ACTIVATION_GELU)):
        if w.has(flag) and w.scalar(flag) != expected:
            raise _load_error(ckpt.path, f"unsupported Whisper variant: {flag} = {w.scalar(flag)}")
    for flag in ("decoder/scale_embeddings", "decoder/alibi"):
        if w.has(flag) and w.scalar(flag) != 0:
            raise _load_error(ckpt.path, f"unsupported Whisper variant: {flag} is set")
    # Attributes that only steer CTranslate2's own runtime.
    w.used.update(
        n for n in ckpt.variables if n.split("/")[-1] in ("alignment_heads", "alignment_layer", "start_from_zero_embedding")
    )


def _encoder(w: _Weights, out: dict) -> int:
    enc = "model.encoder"
    _linear(w, "encoder/conv1", f"{enc}.conv1", out)
    _linear(w, "encoder/conv2", f"{enc}.conv2", out)
    out[f"{enc}.embed_positions.weight"] = w.get("encoder/position_encodings/encodings")
    _layer_norm(w, "encoder/layer_norm", f"{enc}.layer_norm", out)
    n_enc = _count_layers(w, "encoder")
    for i in range(n_enc):
        src, dst = f"encoder/layer_{i}", f"{enc}.layers.{i}"
        attn = f"{dst}.self_attn"
        _layer_norm(w, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm", out)
        _split_fused(w, f"{src}/self_attention/linear_0", [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"], out)
        _linear(w, f"{src}/self_attention/linear_1", f"{attn}.out_proj", out)
        _ffn(w, f"{src}/ffn", dst, out)
    return n_enc


def _decoder(w: _Weights, out: dict) -> int:
    dec = "model.decoder"
    out[f"{dec}.embed_tokens.weight"] = w.get("decoder/embeddings/weight")
    out[f"{dec}.embed_positions.weight"] = w.get("decoder/position_encodings/encodings")
    _layer_norm(w, "decoder/layer_norm", f"{dec}.layer_norm", out)
    n_dec = _count_layers(w, "decoder")
    for i in range(n_dec):
        src, dst = f"decoder/layer_{i}", f"{dec}.layers.{i}"
        attn, cross = f"{dst}.self_attn", f"{dst}.encoder_attn"
        _layer_norm(w, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm", out)
        _split_fused(w, f"{src}/self_attention/linear_0", [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"], out)
        _linear(w, f"{src}/self_attention/linear_1", f"{attn}.out_proj", out)
        _layer_norm(w, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm", out)
        _linear(w, f"{src}/attention/linear_0", f"{cross}.q_proj", out)
        _split_fused(w, f"{src}/attention/linear_1", [f"{cross}.k_proj", f"{cross}.v_proj"], out)
        _linear(w, f"{src}/attention/linear_2", f"{cross}.out_proj", out)
        _ffn(w, f"{src}/ffn", dst, out)
    return n_dec


def whisper_state_dict(ckpt: Ct2Checkpoint) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Map a WhisperSpec checkpoint to transformers' ``WhisperForConditionalGeneration`` names.

    Returns the tensors (floats as stored, quantised ones dequantised to float32) and the
    model dimensions read from the checkpoint.
    """
    w = _Weights(ckpt)
    _check_variant(ckpt, w)
    out: dict[str, torch.Tensor] = {}
    n_enc, n_dec = _encoder(w, out), _decoder(w, out)
    projection = w.get("decoder/projection/weight")
    if w.has("decoder/projection/bias") and w.get("decoder/projection/bias").abs().max() > 0:
        raise _load_error(ckpt.path, "decoder/projection has a bias, which Whisper's output layer has not")
    out["proj_out.weight"] = projection
    leftover = sorted(n for n in ckpt.variables if n not in w.used and not ckpt.variables[n].dim() == 0)
    if leftover:
        raise _load_error(
            ckpt.path, f"unexpected variables for a Whisper model: {', '.join(leftover[:5])}"
            + (f" and {len(leftover) - 5} more" if len(leftover) > 5 else "")
        )
    enc, dec = "model.encoder", "model.decoder"
    embed = out[f"{dec}.embed_tokens.weight"]
    dims = {
        "vocab_size": embed.shape[0],
        "d_model": embed.shape[1],
        "num_mel_bins": out[f"{enc}.conv1.weight"].shape[1],
        "encoder_layers": n_enc,
        "decoder_layers": n_dec,
        "encoder_attention_heads": w.scalar("encoder/num_heads"),
        "decoder_attention_heads": w.scalar("decoder/num_heads"),
        "encoder_ffn_dim": out[f"{enc}.layers.0.fc1.weight"].shape[0] if n_enc else 4 * embed.shape[1],
        "decoder_ffn_dim": out[f"{dec}.layers.0.fc1.weight"].shape[0] if n_dec else 4 * embed.shape[1],
        "max_source_positions": out[f"{enc}.embed_positions.weight"].shape[0],
        "max_target_positions": out[f"{dec}.embed_positions.weight"].shape[0],
        "tie_word_embeddings": bool(projection is embed or torch.equal(projection, embed)),
    }
    return out, dims


# ---------------------------------------------------------------------------
# Config, tokenizer, processor


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _load_error(path, f"unreadable JSON ({exc})") from None


def _read_ct2_vocabulary(model_dir: Path) -> tuple[Path, list[str] | None]:
    """CTranslate2 writes vocabulary.json (a list) since 3.x and vocabulary.txt (one per line) before."""
    as_json, as_txt = model_dir / "vocabulary.json", model_dir / "vocabulary.txt"
    if as_json.is_file():
        tokens = _read_json(as_json)
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise _load_error(as_json, "expected a JSON list of tokens")
        return as_json, tokens
    if as_txt.is_file():
        return as_txt, as_txt.read_text(encoding="utf-8").rstrip("\n").split("\n")
    return as_txt, None


def _load_tokenizer(model_dir: Path, vocab_size: int):

    tok_file = model_dir / "tokenizer.json"
    if not tok_file.is_file():
        raise _load_error(
            model_dir, "tokenizer.json is missing (CTranslate2 Whisper conversions copy it next to model.bin)"
        )
    special = "<|endoftext|>"  # Whisper's bos, eos, unk and pad are all <|endoftext|>.
    try:
        tokenizer = WhisperTokenizer(
            tokenizer_file=str(tok_file),
            bos_token=special,
            eos_token=special,
            unk_token=special,
            pad_token=special,
            add_prefix_space=False,
        )
    except Exception as exc:  # tokenizers raises plain Exceptions on malformed JSON
        raise _load_error(tok_file, f"not a valid tokenizer file ({exc})") from None
    vocab_file, tokens = _read_ct2_vocabulary(model_dir)
    if tokens is not None:
        # CTranslate2's own vocabulary: id -> token, timestamps included. It must agree with
        # tokenizer.json on every id the tokenizer knows, and with the embedding size.
        if len(tokens) != vocab_size:
            raise _load_error(vocab_file, f"has {len(tokens)} tokens but the model's vocabulary is {vocab_size}")
        known = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        bad = next((i for i, t in enumerate(known) if tokens[i] != t), None)
        if bad is not None:
            raise _load_error(vocab_file, f"token {bad} is {tokens[bad]!r} but tokenizer.json says {known[bad]!r}")
    return tokenizer


def _token_id(tokenizer, token: str, model_dir: Path) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id and token != tokenizer.unk_token:
        raise _load_error(model_dir, f"tokenizer.json has no {token} token; is this a Whisper tokenizer?")
    return int(token_id)


def _build_configs(model_dir: Path, dims: dict, tokenizer):

    ct2_config = _read_json(model_dir / "config.json") if (model_dir / "config.json").is_file() else {}
    ids = {name: _token_id(tokenizer, f"<|{name}|>", model_dir)
           for name in ("endoftext", "startoftranscript", "notimestamps", "startofprev", "transcribe", "translate")}
    suppress = ct2_config.get("suppress_ids", [])
    begin_suppress = ct2_config.get("suppress_ids_begin", [220, ids["endoftext"]])
    # The model config and the generation config must agree on these.
    special = dict(
        decoder_start_token_id=ids["startoftranscript"],
        bos_token_id=ids["endoftext"],
        eos_token_id=ids["endoftext"],
        pad_token_id=ids["endoftext"],
        suppress_tokens=suppress,
        begin_suppress_tokens=begin_suppress,
    )
    config = WhisperConfig(**dims, architectures=["WhisperForConditionalGeneration"], **special)
    # English-only Whisper has 51864 tokens; every multilingual release has more.
    multilingual = dims["vocab_size"] > 51864
    generation = GenerationConfig(
        max_length=dims["max_target_positions"],
        **special,
        no_timestamps_token_id=ids["notimestamps"],
        prev_sot_token_id=ids["startofprev"],
        max_initial_timestamp_index=50,
        return_timestamps=False,
        is_multilingual=multilingual,
    )
    if ct2_config.get("alignment_heads"):
        generation.alignment_heads = [list(h) for h in ct2_config["alignment_heads"]]
    if multilingual:
        lang_ids = ct2_config.get("lang_ids") or []
        generation.lang_to_id = {tokenizer.convert_ids_to_tokens(i): i for i in lang_ids}
        generation.task_to_id = {"transcribe": ids["transcribe"], "translate": ids["translate"]}
    else:
        generation.forced_decoder_ids = [[1, ids["notimestamps"]]]
    return config, generation


def _load_processor(model_dir: Path, num_mel_bins: int, tokenizer):

    pre = model_dir / "preprocessor_config.json"
    settings = _read_json(pre) if pre.is_file() else {}
    settings.pop("feature_extractor_type", None)
    settings.pop("processor_class", None)
    settings["feature_size"] = num_mel_bins  # large-v3 uses 128 mel bins, the rest 80
    return WhisperProcessor(feature_extractor=WhisperFeatureExtractor(**settings), tokenizer=tokenizer)


def _packaged_check(model_dir: Path) -> Callable[[mmap.mmap], None] | None:
    """For a folder of the offline/multilingual extras: its small files are checked now, before they are read,
    and the returned check compares model.bin's mapped bytes with the SHA-256 kept in our package."""
    known = offline.packaged_digests(model_dir)
    if known is None:
        return None
    package, digests = known
    offline.verify(package, model_dir, [n for n in digests if n != CT2_MODEL_FILE], digests)

    def check(buf: mmap.mmap) -> None:
        if offline.sha256_of(buf) != digests[CT2_MODEL_FILE]:
            raise offline.mismatch(package, CT2_MODEL_FILE, model_dir)

    return check


def load_ct2_whisper(path: str | Path, dtype: torch.dtype | str | None = None, device: str | torch.device = "cpu"):
    """Load a CTranslate2 Whisper directory as ``(WhisperForConditionalGeneration, WhisperProcessor)``.

    ``dtype=None`` picks float32 on the CPU and float16 elsewhere; quantised int8/int16 weights
    are dequantised with their stored scales first.
    """


    model_dir = Path(path)
    if not is_ct2_dir(model_dir):
        raise _load_error(model_dir, f"not a CTranslate2 model directory (no {CT2_MODEL_FILE})")
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    state, dims = whisper_state_dict(read_model_bin(model_dir / CT2_MODEL_FILE, _packaged_check(model_dir)))
    tokenizer = _load_tokenizer(model_dir, dims["vocab_size"])
    config, generation = _build_configs(model_dir, dims, tokenizer)
    processor = _load_processor(model_dir, dims["num_mel_bins"], tokenizer)

    # Build on the meta device and assign the loaded tensors: random initialisation of a
    # large-v3 would cost longer than reading its weights.
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    state = {k: v.to(dtype) for k, v in state.items()}
    if dims["tie_word_embeddings"]:
        state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise _load_error(model_dir, f"weights do not fit a Whisper model: {exc}") from None
    model.generation_config = generation
    model.name_or_path = str(model_dir)
    return model.to(device).eval(), processor
