"""asr-eval's data side: dataset loaders on the test clips (tests/data), WER against jiwer, bad input."""

from __future__ import annotations

import json
import shutil

import jiwer
import pytest
from conftest import JFK_FLAC, LIBRISPEECH_DIR, LJSPEECH_DIR, TINY_EN_DIR, lj_clip

from asr_app.eval.datasets import DatasetError, load_dataset
from asr_app.wer import corpus_wer, english_normalizer, spelling_map_from_dir

SPLIT_DIR = LIBRISPEECH_DIR / "LibriSpeech" / "test-clean"


@pytest.fixture(scope="module")
def normalizer():
    spelling = spelling_map_from_dir(TINY_EN_DIR)
    assert spelling and spelling["colour"] == "color"
    return english_normalizer(spelling)


@pytest.mark.parametrize("data_dir", [LIBRISPEECH_DIR, LIBRISPEECH_DIR / "LibriSpeech", SPLIT_DIR])
def test_librispeech_layout_from_any_level(data_dir):
    utts = load_dataset("librispeech", data_dir, split="test-clean")
    assert [u.id for u in utts] == ["1089-134686-0000", "1089-134686-0001", "1089-134691-0000", "1089-134691-0001"]
    assert utts[2].reference == "HE COULD WAIT NO LONGER"
    assert all(u.audio_path.is_file() and u.audio_path.name == f"{u.id}.flac" for u in utts)
    assert [u.id for u in load_dataset("librispeech", data_dir, max_samples=2)] == [u.id for u in utts[:2]]


def test_librispeech_wrong_split_names_where_it_looked():
    with pytest.raises(DatasetError, match="test-other.*looked in"):
        load_dataset("librispeech", LIBRISPEECH_DIR, split="test-other")
    with pytest.raises(DatasetError, match="is LibriSpeech split 'test-clean' but --split is 'test-other'"):
        load_dataset("librispeech", SPLIT_DIR, split="test-other")


def test_missing_data_dir_says_where_and_how(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetError) as err:
        load_dataset("librispeech", missing)
    msg = str(err.value)
    assert str(missing) in msg and "does not exist" in msg and "openslr" in msg.lower()
    with pytest.raises(DatasetError, match="metadata.csv"):
        load_dataset("ljspeech", missing)
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset("folder", missing)


def test_no_data_dir_and_no_datasets_package_is_clear(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("ASR_EVAL_DATA_DIR", raising=False)
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)  # import fails as if not installed
    with pytest.raises(DatasetError, match="looked in .*`datasets` package is not installed"):
        load_dataset("librispeech", None)


def test_ljspeech_metadata():
    utts = load_dataset("ljspeech", LJSPEECH_DIR)
    assert len(utts) == 8  # the clips tests/data holds (FLAC: the corpus's WAV names are looked up first)
    assert utts[0].id == "LJ001-0001" and utts[0].audio_path == lj_clip("LJ001-0001")
    assert utts[1].reference == "in being comparatively modern."
    assert all(u.audio_path.is_file() and u.reference for u in utts)


def test_folder_with_same_name_txt():
    utts = load_dataset("folder", JFK_FLAC.parent)
    assert [u.id for u in utts] == ["jfk"]
    assert utts[0].reference.startswith("And so my fellow Americans")
    assert utts[0].audio_path == JFK_FLAC


def test_folder_manifests_tsv_and_jsonl(tmp_path):
    (tmp_path / "m.tsv").write_text(f"path\ttext\n{JFK_FLAC}\task not\n", encoding="utf-8")
    (tmp_path / "m.jsonl").write_text(json.dumps({"audio_filepath": str(JFK_FLAC), "text": "ask what"}) + "\n")
    tsv = load_dataset("folder", tmp_path / "m.tsv")
    jsonl = load_dataset("folder", tmp_path / "m.jsonl")
    assert (tsv[0].audio_path, tsv[0].reference) == (JFK_FLAC, "ask not")
    assert (jsonl[0].audio_path, jsonl[0].reference) == (JFK_FLAC, "ask what")
    (tmp_path / "bad.jsonl").write_text('{"audio": "x.wav"}\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:1: needs"):
        load_dataset("folder", tmp_path / "bad.jsonl")


def test_folder_relative_manifest_paths(tmp_path):
    shutil.copy(JFK_FLAC, tmp_path / "a.flac")
    (tmp_path / "manifest.tsv").write_text("a.flac\thello\n")
    utts = load_dataset("folder", tmp_path)
    assert utts[0].audio_path == tmp_path / "a.flac" and utts[0].reference == "hello"


def test_whisper_normaliser_applies_spelling_map(normalizer):
    assert normalizer("The COLOUR, Mr. Smith!") == "the color mister smith"


def test_tool_wer_equals_jiwer_on_normalised_strings(normalizer):
    refs = [u.reference for u in load_dataset("librispeech", LIBRISPEECH_DIR)]
    hyps = ["He hoped there would be stew for dinner, turnips and carrots and bruised potatoes",
            "Stuff it into you, his belly counselled him.",
            "He couldn't wait no longer.",
            "For a full hour he had paced up and down waiting, but he could wait no longer, yes."]
    r = [normalizer(x) for x in refs]
    h = [normalizer(x) for x in hyps]
    result = corpus_wer(r, h)
    expected = jiwer.process_words(r, h)
    assert result.wer == pytest.approx(jiwer.wer(r, h), abs=1e-12)
    assert (result.substitutions, result.deletions, result.insertions, result.hits) == (
        expected.substitutions, expected.deletions, expected.insertions, expected.hits)
    assert result.wer > 0 and result.reference_words == sum(len(x.split()) for x in r)


def test_empty_reference_counts_insertions_and_is_reported():
    result = corpus_wer(["a b c", ""], ["a b c", "x y"])
    assert result.empty_references == 1
    assert (result.insertions, result.reference_words) == (2, 3)
    assert result.wer == pytest.approx(2 / 3)
    only_empty = corpus_wer([""], ["x"])
    assert only_empty.wer is None and only_empty.insertions == 1
