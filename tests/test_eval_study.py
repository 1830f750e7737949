"""asr-eval's sampling study: the `local` dataset, the paired tests, and a small study end to end."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import DISTIL_DRAFT_DIR, LIBRISPEECH_DIR, REPO_ROOT, TINY_EN_DIR

from asr_app.eval.cli import main
from asr_app.eval.datasets import load_dataset
from asr_app.eval.significance import clip_bootstrap_ratio, wilcoxon_pvalue
from asr_app.eval.study import EncoderMemo, shared_encoder_outputs

MODEL_ARGS = ["--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR), "--device", "cpu", "--dtype", "float32"]
SHORT_IDS = ("1089-134686-0001", "1089-134691-0000")  # the two shortest LibriSpeech test clips (3.3 s, 2.1 s)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_local_dataset_reads_every_layout_once_with_its_transcript(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    chapter = first / "LibriSpeech" / "test-clean" / "1" / "2"
    chapter.mkdir(parents=True)
    (chapter / "1-2-0000.flac").write_bytes(b"x")
    (chapter / "1-2.trans.txt").write_text("1-2-0000 HELLO THERE\n")
    (first / "wavs").mkdir()
    (first / "wavs" / "LJ1.wav").write_bytes(b"x")
    (first / "metadata.csv").write_text("LJ1|Dr. Smith|Doctor Smith\n")
    (first / "jfk.flac").write_bytes(b"x")
    (first / "jfk.txt").write_text("ask not\n")
    (first / "README.txt").write_text("not a transcript\n")
    second.mkdir()
    (second / "jfk.wav").write_bytes(b"x")  # the same id in a later root: the first root's copy counts
    (second / "untranscribed.flac").write_bytes(b"x")
    utts = load_dataset("local", f"{first}:{second}")
    assert [(u.id, u.reference) for u in utts] == [
        ("1-2-0000", "HELLO THERE"), ("LJ1", "Doctor Smith"), ("jfk", "ask not"), ("untranscribed", "")]
    assert utts[2].audio_path == first / "jfk.flac" and utts[3].audio_path == second / "untranscribed.flac"


def test_local_dataset_defaults_to_the_repository_clips():
    utts = {u.id: u for u in load_dataset("local")}
    for clip in ("jfk", "1089-134686-0000", "LJ001-0001", "de"):  # tests/data holds these (shared/ may add more)
        assert clip in utts and utts[clip].reference
    assert utts["jfk"].reference.startswith("And so my fellow Americans")


def test_wilcoxon_and_clip_bootstrap():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, 60)
    assert wilcoxon_pvalue(a, a) == 1.0  # no differences: nothing to test
    assert wilcoxon_pvalue(a + rng.integers(1, 3, 60), a) < 1e-6  # one mode always worse
    assert wilcoxon_pvalue(a + rng.integers(-1, 2, 60), a) > 1e-3  # noise around zero
    assert wilcoxon_pvalue([1], [0]) is None
    errors, words = rng.integers(0, 10, 40).astype(float), np.full(40, 20.0)
    lo, hi = clip_bootstrap_ratio(errors, words)
    assert lo < errors.sum() / words.sum() < hi and hi - lo < 0.1
    assert clip_bootstrap_ratio(errors[:1], words[:1]) is None


def test_encoder_memo_reuses_only_the_same_features():
    import torch

    calls = []
    memo = EncoderMemo(lambda f: calls.append(1) or f * 2)
    x = torch.ones(1, 3)
    assert torch.equal(memo(x), x * 2) and torch.equal(memo(x.clone()), x * 2) and len(calls) == 1
    assert torch.equal(memo(x + 1), (x + 1) * 2) and len(calls) == 2 and memo.reuses == 1


def test_study_end_to_end(tmp_path, tiny_en_pair, capsys):
    from asr_app.decoding import DecodingOptions, SpeculativeDecoder

    data = tmp_path / "data"
    data.mkdir()
    for utt in load_dataset("librispeech", LIBRISPEECH_DIR):
        if utt.id in SHORT_IDS:
            (data / f"{utt.id}.flac").symlink_to(utt.audio_path)
            (data / f"{utt.id}.txt").write_text(utt.reference)
    short = data / f"{SHORT_IDS[1]}.flac"
    (data / "untranscribed.flac").symlink_to(short.resolve())
    out = tmp_path / "out"
    rc = main(["--dataset", "local", "--data-dir", str(data), "--modes", "exact,sigmoid", "--alpha", "-3", "--beta", "3",
               "--seeds", "2", "--temperatures", "1.0", "--gamma", "3", "--max-new-tokens", "24", "--no-progress",
               "--output-dir", str(out), *MODEL_ARGS])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| 1 | sigmoid (α=-3, β=3) |" in printed and "Wilcoxon" in printed
    study = json.loads((out / "study.json").read_text())
    items = [json.loads(x) for x in (out / "study_items.jsonl").read_text().splitlines()]
    labels = ["exact", "sigmoid"]
    assert [m["label"] for m in study["modes"]] == labels and study["wer_reference"] == "greedy"
    assert len(items) == 3 * 1 * 2 * len(labels) and study["encoder_reuses"] >= len(items) - 3
    assert {(it["clip"], it["seed"]) for it in items} == {(c, s) for c in (*SHORT_IDS, "untranscribed") for s in (0, 1)}
    figures = {f["label"]: f for f in study["figures"]}
    for label in labels:
        mine = [it for it in items if it["label"] == label]
        assert figures[label]["wer"] == pytest.approx(sum(it["errors"] for it in mine) / sum(it["ref_words"] for it in mine))
        assert figures[label]["text_items"] == 4  # the untranscribed clip has no text WER
        assert all(it["verify_calls"] > 0 and it["verify_s"] > 0 for it in mine)
        assert 0 <= figures[label]["acceptance"] <= 1 and figures[label]["tokens_per_call"] >= 1
    assert (figures["sigmoid"]["alpha"], figures["sigmoid"]["beta"], figures["exact"]["alpha"]) == (-3, 3, None)
    # "untranscribed" is the same audio as SHORT_IDS[1]: with one stream per seed for every clip its items
    # would repeat that clip's exactly; each clip draws its own stream.
    twin = {(it["label"], it["seed"]): it for it in items if it["clip"] == SHORT_IDS[1]}
    counts = lambda it: (it["hypothesis"], it["drafted"], it["accepted"], it["target_calls"])  # noqa: E731
    assert study["seed_streams"] == "per-clip"
    assert any(counts(it) != counts(twin[(it["label"], it["seed"])]) for it in items if it["clip"] == "untranscribed")
    [comp] = study["comparisons"]
    assert (comp["label"], comp["against"], comp["pairs"]) == ("sigmoid", "exact", 6)
    assert comp["delta_wer"] == pytest.approx(figures["sigmoid"]["wer"] - figures["exact"]["wer"])
    png = (out / "study.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    _merged_parts_are_one_study(out, tmp_path, study, items)

    # The shared encoder output changes no token: one item decoded again without the memo.
    decoder = SpeculativeDecoder(tiny_en_pair)
    item = next(it for it in items if it["label"] == "sigmoid" and it["clip"] == "untranscribed" and it["seed"] == 1)
    from asr_app.audio import load_audio
    from asr_app.decoding.seeds import reseeded
    from asr_app.wer import english_normalizer, spelling_map_from_dir

    options = reseeded(DecodingOptions(mode="sigmoid", temperature=1.0, seed=1, gamma=3, max_new_tokens=24,
                                       alpha=-3, beta=3), "untranscribed")  # the clip's own stream
    audio = load_audio(short)
    plain = decoder.decode([audio], options=options)[0].text
    with shared_encoder_outputs(decoder) as memos:
        decoder.decode([audio], options=dataclasses.replace(options, seed=0))
        memo = decoder.decode([audio], options=options)[0].text
    assert memos[0].reuses == 1
    assert memo == plain and english_normalizer(spelling_map_from_dir(TINY_EN_DIR))(plain) == item["hypothesis"]


def test_seed_permutation_test_and_derived_seeds():
    from asr_app.decoding import DecodingOptions
    from asr_app.decoding.seeds import derive_seed, reseeded
    from asr_app.eval.significance import seed_permutation_pvalue

    a = [0.30, 0.25, 0.41, 0.28, 0.33, 0.36, 0.29, 0.31, 0.27, 0.35]
    assert seed_permutation_pvalue(a, a) == 1.0
    assert seed_permutation_pvalue([x + 0.05 for x in a], a) == pytest.approx(2 / 1024)  # every seed worse
    noisy = [x + d for x, d in zip(a, (0.01, -0.02, 0.015, -0.01, 0.0, 0.02, -0.015, 0.01, -0.01, 0.005))]
    assert seed_permutation_pvalue(noisy, a) > 0.3
    assert seed_permutation_pvalue([1.0], [0.0]) is None
    many = seed_permutation_pvalue([x + 0.05 for x in a * 2], a * 2, draws=999)  # 20 seeds: sampled patterns
    assert many == pytest.approx(1 / 1000)  # the observed pattern counts: never 0
    # derived seeds: distinct per place, stable across processes (not Python's salted hash)
    seeds = {derive_seed(0, clip) for clip in ("jfk", "1089-134686-0000", "de", "fr")} | {derive_seed(1, "jfk")}
    assert len(seeds) == 5 and all(0 <= s < 2**63 for s in seeds)
    code = "from asr_app.decoding.seeds import derive_seed; print(derive_seed(0, 'jfk', 3))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": h}).stdout for h in ("1", "2")}
    assert outs == {f"{derive_seed(0, 'jfk', 3)}\n"}
    import numpy as np

    from asr_app.decoding.seeds import batch_options

    assert derive_seed(0, "x", 5) == derive_seed(0, "x", np.int64(5))
    greedy = DecodingOptions(seed=5)
    assert reseeded(greedy, "jfk") is greedy  # draws nothing: options unchanged (they can share a batch)
    # rows of a batch draw from one generator anyway: requests differing only in their seed share batches
    assert batch_options(DecodingOptions(seed=5, temperature=0.6)) == batch_options(DecodingOptions(temperature=0.6))
    sampled = DecodingOptions(seed=5, temperature=0.6)
    assert reseeded(sampled, "jfk").seed == derive_seed(5, "jfk") != reseeded(sampled, "de").seed


def test_a_published_study_renders_again_from_its_items_with_the_seed_level_test(tmp_path):
    # docs/eval_study/ keeps each study's items: tools/render_study.py rewrites its JSON, table and plot with
    # this version's report. Run B predates per-clip streams: it reads as shared and its table says so.
    import importlib.util
    import shutil

    for suffix in (".json", "_items.jsonl.gz"):
        shutil.copyfile(REPO_ROOT / "docs" / "eval_study" / f"sweep{suffix}", tmp_path / f"sweep{suffix}")
    (tmp_path / "sweep.json").write_text(json.dumps({k: v for k, v in json.loads((tmp_path / "sweep.json").read_text())
                                                     .items() if k != "seed_streams"}))
    spec = importlib.util.spec_from_file_location("render_study", REPO_ROOT / "tools" / "render_study.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([str(tmp_path / "sweep")]) == 0
    study = json.loads((tmp_path / "sweep.json").read_text())
    assert study["seed_streams"] == "shared" and len(study["comparisons"]) == 12
    assert all(c["seed_wer_pvalue"] is not None for c in study["comparisons"])
    assert "Seed streams shared across clips" in (tmp_path / "sweep.md").read_text()
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert tool.main([str(tmp_path / "missing")]) == 2


def test_study_options_are_checked(capsys):
    for argv, message in ((["--temperatures", "0.6"], "give --seeds N too"), (["--seeds", "0"], "--seeds must be >= 1"),
                          (["--seeds", "2", "--temperatures", "x"], "--temperatures wants numbers")):
        with pytest.raises(SystemExit) as exc:
            main([*argv, *MODEL_ARGS])
        assert exc.value.code == 2 and message in capsys.readouterr().err


def _merged_parts_are_one_study(out, tmp_path, study: dict, items: list[dict]) -> None:
    """tools/merge_study.py joins parts that differ only in their seeds into the study one run would give:
    here the real part above and a copy of it under seeds 2 and 3 (its items, relabelled)."""
    import importlib.util

    from asr_app.eval.study_merge import read_study
    from asr_app.eval.study_report import write_study

    spec = importlib.util.spec_from_file_location("merge_study", REPO_ROOT / "tools" / "merge_study.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    run, meta = read_study(out)
    assert len(run.items) == len(items) and run.seeds == [0, 1]
    later = tmp_path / "later"
    run.seeds = [2, 3]
    for item in run.items:
        item.seed += 2
    write_study(run, meta, later)
    merged = tmp_path / "merged"
    assert tool.main([str(out), str(later), "--out", str(merged)]) == 0
    whole = json.loads((merged / "study.json").read_text())
    assert whole["seeds"] == [0, 1, 2, 3] and whole["clips"] == study["clips"]
    assert len((merged / "study_items.jsonl").read_text().splitlines()) == 2 * len(items)
    before = {f["label"]: f for f in study["figures"]}
    for figure in whole["figures"]:   # the same items twice: the same rates, twice the pairs
        assert figure["wer"] == pytest.approx(before[figure["label"]]["wer"])
    assert [c["pairs"] for c in whole["comparisons"]] == [12]
    assert whole["seed_streams"] == "per-clip" and 0 < whole["comparisons"][0]["seed_wer_pvalue"] <= 1
    assert tool.main([str(out), str(out), "--out", str(tmp_path / "twice")]) == 2          # a seed counted twice
    (later / "study.json").write_text(json.dumps({**json.loads((later / "study.json").read_text()),
                                                  "temperatures": [0.6]}))
    assert tool.main([str(out), str(later), "--out", str(tmp_path / "other")]) == 2         # not one study
    older = json.loads((out / "study.json").read_text())
    del older["seed_streams"]  # a study written before each clip had its own stream
    (later / "study.json").write_text(json.dumps({**older, "seeds": [2, 3]}))
    assert read_study(later)[0].seed_streams == "shared"
    assert tool.main([str(out), str(later), "--out", str(tmp_path / "mixed")]) == 2         # shared + per-clip
