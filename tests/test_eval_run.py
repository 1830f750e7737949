"""asr-eval end to end on the LibriSpeech test clips with the real tiny.en and its distilled draft."""

from __future__ import annotations

import json

import jiwer
import pytest
from conftest import DISTIL_DRAFT_DIR, LIBRISPEECH_DIR, TINY_EN_DIR

from asr_app.eval.cli import main
from asr_app.eval.datasets import load_dataset
from asr_app.eval.runner import mode_specs, run_evaluation
from asr_app.wer import english_normalizer, spelling_map_from_dir

SPLIT = LIBRISPEECH_DIR / "LibriSpeech" / "test-clean"
SHORT_IDS = ("1089-134686-0001", "1089-134691-0000")  # the two shortest test clips (3.3 s, 2.1 s)
MODEL_ARGS = ["--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR), "--device", "cpu", "--dtype", "float32"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _references() -> dict[str, str]:
    return {u.id: u.reference for u in load_dataset("librispeech", LIBRISPEECH_DIR)}


def librispeech_subset(root, ids, references=None, corrupt=()):
    """A LibriSpeech layout under `root` with only `ids`: the test .flac files are linked, not copied;
    ids in `corrupt` get a file of garbage bytes instead."""
    references = references or _references()
    for utt_id in ids:
        spk, chapter, _ = utt_id.split("-")
        folder = root / "LibriSpeech" / "test-clean" / spk / chapter
        folder.mkdir(parents=True, exist_ok=True)
        flac = folder / f"{utt_id}.flac"
        if utt_id in corrupt:
            flac.write_bytes(b"fLaC" + b"\x00garbage" * 50)
        else:
            flac.symlink_to(SPLIT / spk / chapter / f"{utt_id}.flac")
        with (folder / f"{spk}-{chapter}.trans.txt").open("a") as fh:
            fh.write(f"{utt_id} {references[utt_id]}".rstrip() + "\n")
    return root


@pytest.fixture(scope="module")
def decoder(tiny_en_pair):
    from asr_app.decoding import DecodingOptions, SpeculativeDecoder

    return SpeculativeDecoder(tiny_en_pair, DecodingOptions(temperature=0.0, seed=0))


@pytest.fixture(scope="module")
def normalizer():
    return english_normalizer(spelling_map_from_dir(TINY_EN_DIR))


def test_two_mode_sampling_run_writes_all_outputs(tmp_path, capsys):
    out = tmp_path / "eval"
    data = librispeech_subset(tmp_path / "data", SHORT_IDS)
    # baseline and exact both sample from the target's distribution; sampled sigmoid runs in test_eval_study.py
    # (here it runs greedy, below).
    rc = main(["--dataset", "librispeech", "--data-dir", str(data), "--modes", "baseline,exact",
               "--max-samples", "2", "--temperature", "1.0", "--seed", "0",
               "--output-dir", str(out), "--no-progress", *MODEL_ARGS])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "WER baseline" in printed and "Δ% profiling time exact" in printed

    lines = (out / "utterances.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    assert [r["id"] for r in records] == list(SHORT_IDS)
    labels = ["baseline", "exact"]
    for r in records:
        assert r["error"] is None and r["duration_s"] > 1.0
        assert sorted(r["runs"]) == sorted(labels)
        for run in r["runs"].values():
            assert run["hypothesis"].strip() and run["tokens"] and run["seconds"] > 0
            # Every verification step the decoder reported was seen by the profiler, and only those.
            assert run["verify_profiled_calls"] == len(run["verify_steps"]) > 0
            assert run["verify_profiled_s"] > 0
            assert run["profiled_same_tokens"] is True  # the seeded profiled decode retraced the timed one
            assert run["stats"]["drafted"] >= run["stats"]["accepted"] >= 0

    summary = json.loads((out / "summary.json").read_text())
    assert summary["modes"] == labels and summary["utterances_evaluated"] == 2
    assert summary["temperature"] == 1.0 and summary["spelling_map"] is True
    for label in labels:
        s = summary["summaries"][label]
        # The tool's corpus WER equals jiwer's on the normalised strings it wrote out.
        refs = [r["reference_normalized"] for r in records]
        hyps = [r["runs"][label]["hypothesis_normalized"] for r in records]
        assert refs[0] == english_normalizer(spelling_map_from_dir(TINY_EN_DIR))(records[0]["reference"])
        assert s["wer"]["wer"] == pytest.approx(jiwer.wer(refs, hyps), abs=1e-12)
        assert 0 <= s["acceptance_rate"] <= 1 and s["latency_p90_s"] >= s["latency_p50_s"] > 0
        assert s["verify_profiled_s"] == pytest.approx(sum(r["runs"][label]["verify_profiled_s"] for r in records))
        assert s["peak_memory_bytes"] > 0
    base = summary["summaries"]["baseline"]["verify_profiled_s"]
    exact = summary["summaries"]["exact"]["verify_profiled_s"]
    assert summary["summaries"]["exact"]["verify_delta_pct"] == pytest.approx((exact - base) / base * 100)
    assert summary["summaries"]["baseline"]["verify_delta_pct"] == pytest.approx(0.0)

    report = (out / "report.md").read_text()
    assert "## Table 1 (paper shape)" in report and "Sigmoid scale sweep" not in report
    assert "LibriSpeech test-clean (2 utt.)" in report
    # On CPU the verify time is the process CPU time of the verify calls, and the report says so.
    assert summary["summaries"]["exact"]["verify_clock"] == "process-cpu" and "process CPU time" in report
    for png in ("wer_vs_latency.png", "verify_time_vs_gamma.png", "acceptance_histogram.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"]({png})" in report


def test_greedy_gives_identical_hypotheses_across_modes(decoder, normalizer, tmp_path):
    utts = load_dataset("librispeech", librispeech_subset(tmp_path, SHORT_IDS))
    specs = mode_specs(decoder.options, ["off", "baseline", "exact", "sigmoid"])
    run = run_evaluation(decoder, utts, specs, normalizer, warmup=0, profile="off", progress=False)
    for record in run.records:
        texts = {label: m.hypothesis for label, m in record.runs.items()}
        tokens = {label: m.tokens for label, m in record.runs.items()}
        assert len(set(texts.values())) == 1, texts
        assert all(t == tokens["off"] for t in tokens.values())
    by = {s.label: s for s in run.summaries}
    assert [by[m].equal_to_baseline for m in ("off", "exact", "sigmoid")] == [1.0, 1.0, 1.0]
    assert len({by[m].wer.wer for m in by}) == 1
    # tiny.en reads these two clips nearly perfectly; a broken pipeline would not.
    assert by["baseline"].wer.wer < 0.3


class OptionsLog:
    """The real decoder, with the options of every decode it was asked for written down."""

    def __init__(self, decoder) -> None:
        self.decoder, self.options_seen = decoder, []

    pair = property(lambda self: self.decoder.pair)
    options = property(lambda self: self.decoder.options)

    def decode(self, clips, options=None, prompts=None, hints=None):
        self.options_seen.append(options)
        return self.decoder.decode(clips, options, prompts=prompts, hints=hints)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_each_utterance_samples_from_its_own_stream(decoder, normalizer, tmp_path, temperature):
    # One seed for every clip would give every clip the same uniforms at the same step, and a seed's corpus
    # WER would swing with that one stream (docs/eval.md, run D). At T = 0 the seed is left alone.
    import dataclasses

    from asr_app.decoding.seeds import derive_seed

    utts = load_dataset("librispeech", librispeech_subset(tmp_path, SHORT_IDS))
    options = dataclasses.replace(decoder.options, temperature=temperature, seed=3, max_new_tokens=6)
    log = OptionsLog(decoder)
    run_evaluation(log, utts, mode_specs(options, ["off", "exact"]), normalizer, warmup=0, profile="off",
                   progress=False)
    seeds = [o.seed for o in log.options_seen]
    expected = [derive_seed(3, u.id) for u in utts] if temperature > 0 else [3, 3]
    assert seeds == [expected[0], expected[0], expected[1], expected[1]]   # the modes of one clip stay paired
    assert temperature == 0 or expected[0] != expected[1]


def test_corrupt_audio_empty_reference_and_greedy_sweep(tmp_path, capsys):
    refs = _references() | {"1089-134691-0000": ""}
    ids = ("1089-134686-0001", "1089-134691-0000", "1089-134691-0001")
    data = librispeech_subset(tmp_path / "data", ids, references=refs, corrupt={"1089-134686-0001"})
    corrupt = data / "LibriSpeech" / "test-clean" / "1089" / "134686" / "1089-134686-0001.flac"
    out = tmp_path / "out"
    rc = main(["--data-dir", str(data), "--modes", "baseline", "--sweep-scale", "1e1", "--temperature", "0", "--profile", "inline", "--warmup", "0", "--output-dir", str(out),
               "--no-progress", *MODEL_ARGS])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["utterances_total"] == 3 and summary["utterances_excluded"] == 1
    assert summary["utterances_evaluated"] == 2
    [excluded] = summary["excluded"]
    assert excluded["id"] == "1089-134686-0001" and str(corrupt) in excluded["reason"]
    assert summary["empty_references"] == ["1089-134691-0000"]
    records = {json.loads(x)["id"]: json.loads(x) for x in (out / "utterances.jsonl").read_text().splitlines()}
    assert records["1089-134686-0001"]["runs"] == {}
    empty_hyp_words = len(records["1089-134691-0000"]["runs"]["baseline"]["hypothesis_normalized"].split())
    assert empty_hyp_words > 0  # the clip has speech: its words count as insertions
    wer = summary["summaries"]["baseline"]["wer"]
    assert wer["empty_references"] == 1 and wer["utterances"] == 2
    assert wer["reference_words"] == len(records["1089-134691-0001"]["reference_normalized"].split())
    assert wer["insertions"] >= empty_hyp_words
    report = (out / "report.md").read_text()
    assert "## Excluded utterances" in report and "1089-134686-0001" in report
    assert "(2 utt.)" in report and "(3 utt.)" not in report  # the table counts what was evaluated
    # The sweep brought in the baseline it is compared with; greedy makes every variant agree with it.
    assert summary["modes"] == ["baseline", "sigmoid@1e1"]
    sweep = summary["summaries"]["sigmoid@1e1"]
    assert (sweep["alpha"], sweep["beta"], sweep["equal_to_baseline"]) == (-10.0, 10.0, 1.0)
    assert sweep["verify_delta_pct"] is not None and "Sigmoid scale sweep" in report and "| 1e+01 |" in report
    assert "1 utterance(s) excluded" in capsys.readouterr().out


def test_missing_data_dir_is_a_clear_cli_error(tmp_path, capsys):
    rc = main(["--data-dir", str(tmp_path / "none"), "--output-dir", str(tmp_path / "o"), *MODEL_ARGS])
    assert rc == 2
    err = capsys.readouterr().err
    assert "asr-eval: error:" in err and str(tmp_path / "none") in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_an_unwritable_output_dir_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    """Found out only when the results were written, the whole evaluation was lost (a traceback)."""
    monkeypatch.setattr("asr_app.eval.cli.load_decoder_or_report",
                        lambda *_: pytest.fail("the models loaded before the output folder was checked"))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    rc = main(["--data-dir", str(LIBRISPEECH_DIR), "--max-samples", "1", "--output-dir", str(blocker / "out"),
               *MODEL_ARGS])
    err = capsys.readouterr().err
    assert rc == 2 and f"cannot write to the output folder {blocker / 'out'}" in err and "Traceback" not in err


def test_unknown_mode_is_rejected(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--modes", "baseline,fast", "--data-dir", str(LIBRISPEECH_DIR), *MODEL_ARGS])
    assert exc.value.code == 2 and "fast" in capsys.readouterr().err


def test_sweep_specs_add_baseline_and_scale_labels(decoder):
    specs = mode_specs(decoder.options, ["sigmoid"], [1e1, 1e5])
    assert [s.label for s in specs] == ["baseline", "sigmoid", "sigmoid@1e1", "sigmoid@1e5"]
    assert (specs[3].options.mode, specs[3].options.alpha, specs[3].options.beta) == ("sigmoid", -1e5, 1e5)
    assert all(not s.options.profile_verify for s in specs)
