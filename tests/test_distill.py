"""asr-distill on a small random Whisper and a handful of real clips: it learns, its draft loads with --draft
and decodes greedy-identically to the target, the teacher cache is reused and follows the target, a killed
run resumes to the very weights of an uninterrupted one, and bad input gets one clear line."""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import LIBRISPEECH_DIR, LJSPEECH_DIR, TINY_EN_DIR
from transformers import WhisperConfig, WhisperForConditionalGeneration, WhisperProcessor

from asr_app.audio import load_audio
from asr_app.cli import distill as cli
from asr_app.decoding import DecodingOptions, SpeculativeDecoder
from asr_app.distill import DistillError, DistillOptions, EvalOptions, TeacherOptions, TrainOptions
from asr_app.distill.errors import Interrupted
from asr_app.distill.export import embed_sha256
from asr_app.distill.loss import kl_top_k
from asr_app.distill.options import RUNTIME_DRAFT_VOCAB
from asr_app.distill.pipeline import Reporter, distill
from asr_app.distill.voices import voice_installed
from asr_app.models import derive_draft, load_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRAIN_CLIPS = [LJSPEECH_DIR / "wavs" / f"LJ001-000{i}.flac" for i in range(1, 7)]
HELD_OUT = sorted(LIBRISPEECH_DIR.rglob("1089-134691-0000.flac")) + sorted(LIBRISPEECH_DIR.rglob("1089-134686-0001.flac"))
MAX_TOKENS = 24  # a random target never ends a transcript: short labels keep the test fast


def random_target(seed: int = 0) -> WhisperForConditionalGeneration:
    """A 4-decoder-layer random Whisper with tiny.en's vocabulary and rules; init_std 0.2 makes its
    transcripts depend on the audio (at the default 0.02 every clip gives the same tokens)."""
    torch.manual_seed(seed)
    real = WhisperConfig.from_pretrained(TINY_EN_DIR)
    config = WhisperConfig(
        vocab_size=real.vocab_size, d_model=32, encoder_layers=1, decoder_layers=4, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=80, init_std=0.2,
        max_source_positions=1500, max_target_positions=448, decoder_start_token_id=real.decoder_start_token_id,
        bos_token_id=real.bos_token_id, eos_token_id=real.eos_token_id, pad_token_id=real.pad_token_id,
        suppress_tokens=real.suppress_tokens, begin_suppress_tokens=real.begin_suppress_tokens)
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = copy.deepcopy(WhisperForConditionalGeneration.from_pretrained(TINY_EN_DIR).generation_config)
    return model


def save_target(model, folder) -> str:
    model.save_pretrained(folder)
    WhisperProcessor.from_pretrained(TINY_EN_DIR).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    for name, clips in (("train", TRAIN_CLIPS), ("held", HELD_OUT)):
        (root / name).mkdir()
        for clip in clips:
            shutil.copy(clip, root / name / clip.name)
    target = random_target()
    save_target(target, root / "target")
    derive_draft(target, (1, 2)).save_pretrained(root / "baseline")  # another draft to measure beside ours
    return root


def options(ws, out: str, steps: int = 6, **train) -> DistillOptions:
    """A cheap run: no held-out evaluation, the audio view of the encoder output."""
    return DistillOptions(target=str(ws / "target"), audio=(ws / "train",), out=ws / out, holdout=0.0,
                          cache=ws / "cache", device="cpu",
                          teacher=TeacherOptions(max_new_tokens=MAX_TOKENS, keep_capped=True),
                          train=TrainOptions(steps=steps, batch_size=4, lr=3e-3, min_lr=3e-4, warmup_steps=2,
                                             audio_view="audio", **train),
                          evaluation=EvalOptions(gammas=(1, 3)))


@pytest.fixture(scope="module")
def cli_run(workspace):
    """One whole run through the command line, held-out evaluation included."""
    ws = workspace
    argv = ["--target", str(ws / "target"), "--audio", str(ws / "train"), "--eval-audio", str(ws / "held"),
            "--out", str(ws / "draft"), "--cache", str(ws / "cache"), "--device", "cpu", "--threads", "1",
            "--steps", "16", "--batch-size", "4", "--lr", "3e-3", "--min-lr", "3e-4", "--warmup", "2",
            "--max-new-tokens", str(MAX_TOKENS), "--keep-capped", "--gammas", "1,3", "--quiet",
            "--baseline-draft", str(ws / "baseline")]
    code = cli.main(argv)
    return code, ws / "draft"


def test_distillation_learns(cli_run):
    code, out = cli_run
    assert code == 0
    card = json.loads((out / "card.json").read_text())
    assert card["teacher"]["computed"] == 8 and card["data"]["train"]["labels"] == 12  # 6 clips x (with, without) stamps
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "done" and not (out / "checkpoint.pt").exists()
    ev = card["evaluation"]
    assert ev["clips"] == 2 and ev["final"]["positions"] > 0
    assert ev["final"]["agreement"] > ev["initial"]["agreement"] + 0.05, ev  # held-out, teacher-forced
    assert ev["final"]["ce"] < ev["initial"]["ce"]
    train = card["training"]
    assert train["steps"] == 16 and train["final"]["loss"] < 0.85 * train["first"]["loss"], train
    assert train["final"]["agreement"] > train["first"]["agreement"], train
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "teacher-forced agreement" in (out / "README.md").read_text()
    assert ev["language"] == "en" and "decoded in English" in (out / "README.md").read_text()   # English-only
    dec = ev["decoder"]  # the timed runs' split: the loop is what a draft can shorten, the rest bounds the gain
    assert dec["off_split"]["encoder_s"] > 0 and dec["off_split"]["draft_s"] < dec["off_split"]["target_s"]
    assert dec["exact_split"]["draft_s"] > dec["off_split"]["draft_s"] and dec["ceiling"] > 1 and dec["loop_speedup"] > 0
    assert "no draft could make `exact` more than" in (out / "README.md").read_text()
    base = ev["baseline"]  # the other draft, on the same clips
    assert base["draft"].endswith("baseline") and base["decoder"]["identical"] == 2
    assert base["final"]["positions"] == ev["final"]["positions"] and f"baseline `{base['draft']}`" in (
        out / "README.md").read_text()


def test_draft_loads_with_draft_dir_and_decodes_like_the_target(cli_run, workspace):
    code, out = cli_run
    assert code == 0
    card = json.loads((out / "card.json").read_text())
    assert card["evaluation"]["decoder"]["identical"] == 2 and not card["evaluation"]["decoder"]["mismatched"]
    pair = load_pair(target=str(workspace / "target"), draft=str(out), device="cpu")
    assert pair.shared_encoder and pair.draft.config.decoder_layers == 2
    decoder = SpeculativeDecoder(pair)
    clips = [load_audio(p) for p in HELD_OUT]
    for timestamps in (False, True):
        off = decoder.decode(clips, DecodingOptions(mode="off", timestamps=timestamps, max_new_tokens=40))
        exact = decoder.decode(clips, DecodingOptions(mode="exact", gamma=3, timestamps=timestamps, max_new_tokens=40))
        assert [r.tokens for r in exact] == [r.tokens for r in off]
        assert sum(r.stats.accepted for r in exact) > 0  # the draft's proposals were kept, not just checked
    # the package's bundle form: the draft's own tensors, keyed to the target's token embedding
    from safetensors import safe_open

    with safe_open(str(out / "bundle" / "draft.safetensors"), "pt") as f:
        assert f.metadata()["embed_sha256"] == embed_sha256(pair.target.get_decoder().embed_tokens.weight)
        assert not any("embed" in k or "proj_out" in k for k in f.keys())


def test_labels_are_the_targets_greedy_transcripts_with_one_encoder_pass(workspace):
    from asr_app.distill.data import inventory
    from asr_app.distill.teacher import Teacher

    pair = load_pair(target=str(workspace / "target"), draft="none", device="cpu")
    teacher = Teacher(pair, TeacherOptions(max_new_tokens=MAX_TOKENS, top_k=5))
    calls = []
    real = teacher.encoder.encoder
    teacher.encoder.encoder = lambda feats: calls.append(feats.shape[0]) or real(feats)
    clips = inventory([workspace / "held"]).clips
    audio = [load_audio(c.path) for c in clips]
    records = teacher.label(clips, audio)
    assert calls == [2]  # once for both clips and both variants
    plain = SpeculativeDecoder(pair)
    for stamps in (False, True):
        want = [r.tokens for r in plain.decode(audio, DecodingOptions(mode="off", timestamps=stamps,
                                                                       max_new_tokens=MAX_TOKENS))]
        labels = [next(lab for lab in rec.labels if lab.variant.timestamps == stamps) for rec in records]
        assert [lab.tokens[lab.prompt_len :][: len(w)] for lab, w in zip(labels, want)] == want
        assert all(lab.topk_ids.shape == (lab.predicted, 5) for lab in labels)
    # the top-k along a label is the target's raw distribution, as transformers' own modules compute it
    features = pair.processor.feature_extractor(audio[0], sampling_rate=16_000, return_tensors="pt").input_features
    label = records[0].labels[0]
    with torch.no_grad():
        logits = pair.target(features, decoder_input_ids=torch.tensor([label.tokens[:-1]])).logits[0]
    logp = torch.log_softmax(logits[label.prompt_len - 1 :], -1)
    assert torch.allclose(logp.gather(-1, label.topk_ids.long()), label.topk_logp, atol=1e-4)
    assert (label.topk_logp[:, -1] >= logp.topk(5, -1).values[:, -1] - 1e-4).all()  # they are the top 5
    assert torch.allclose(records[0].encoder.float(), pair.target.model.encoder(features).last_hidden_state[0],
                          atol=1e-2)


@pytest.fixture(scope="module")
def whole_run(workspace, cli_run):
    """An uninterrupted run after the CLI's, on the same clips and cache."""
    return distill(options(workspace, "whole", steps=6, checkpoint_steps=2))


def test_teacher_cache_is_reused_and_follows_the_target(workspace, whole_run):
    ws, again = workspace, whole_run
    assert (again.teacher.computed, again.teacher.reused) == (0, 6)  # the CLI run labelled these clips
    changed = random_target()
    with torch.no_grad():
        changed.model.decoder.layers[1].fc1.weight[0, 0] += 0.5  # one weight: another target
    other = replace(options(ws, "other", steps=2), target=save_target(changed, ws / "target2"))
    result = distill(other)
    assert (result.teacher.computed, result.teacher.reused) == (6, 0)
    assert result.cache != again.cache and again.cache.is_dir()


def test_a_tokenizer_without_a_shipped_ranking_gets_one_from_the_labels(workspace, whole_run, monkeypatch):
    """Where the runtime ships no token ranking (a multilingual tokenizer, here the English one with its ranking
    hidden), the reduced head is the labels' most frequent text tokens; the draft carries that ranking in its
    config, and the runtime's head scores exactly the ids it was trained on."""
    import collections

    from safetensors import safe_open

    import asr_app.runtime.vocab as vocab
    from asr_app.distill.data import inventory

    monkeypatch.setattr(vocab, "ENGLISH_ONLY_VOCAB", -1)   # no shipped ranking fits this tokenizer
    ws, size = workspace, 2000
    result = distill(options(ws, "ranked", steps=2, draft_vocab=size))
    assert result.teacher.computed == 0   # the labels of the runs before
    config = json.loads((ws / "ranked" / "config.json").read_text())
    ranking = config[vocab.RANKING_ATTR]
    assert json.loads((ws / "ranked" / "bundle" / "config.json").read_text())[vocab.RANKING_ATTR] == ranking
    eos, full = 50256, 51864
    assert len(ranking) == size - (full - eos) and len(set(ranking)) == len(ranking) and max(ranking) < eos
    counts = collections.Counter()   # the predicted text tokens of the training clips' labels, read here directly
    for clip in inventory([ws / "train"]).clips:
        with safe_open(str(result.cache / f"{clip.key}.safetensors"), "pt") as record:
            for i, label in enumerate(json.loads(record.metadata()["labels"])):
                tokens = record.get_tensor(f"{i}.tokens").tolist()[label["prompt_len"] :]
                counts.update(t for t in tokens if t < eos)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    assert ranking[: len(ranked)] == ranked and ranking[len(ranked)] == min(set(range(eos)) - set(ranked))
    pair = load_pair(target=str(ws / "target"), draft=str(ws / "ranked"), device="cpu")
    decoder = SpeculativeDecoder(pair)
    assert decoder.draft_runtime.head.space.ids.tolist() == sorted(ranking) + list(range(eos, full))
    clip = load_audio(HELD_OUT[0])
    off, exact = (decoder.decode(clip, DecodingOptions(mode=m, gamma=3, max_new_tokens=MAX_TOKENS))[0]
                  for m in ("off", "exact"))
    assert exact.tokens == off.tokens


def test_a_baseline_draft_is_scored_through_its_own_head(workspace):
    """A draft measured beside the new one keeps its own reduced head: row r of its head weight is the token
    its map sends to r. (Its rows scored through the new draft's map made its agreement wrong where the two
    rankings differ, as a multilingual target's label rankings do.)"""
    from asr_app.distill.pipeline import head_of

    pair = load_pair(target=str(workspace / "target"), draft="derived", device="cpu")
    embed = pair.draft.model.decoder.embed_tokens.weight
    for ids in (torch.tensor([5, 3, 900, 50256]), torch.tensor([900, 7, 50256, 5]), None):
        head = head_of(pair, pair.draft, ids)
        chosen = torch.arange(embed.shape[0]) if ids is None else ids
        rows = head.to_head[chosen]
        assert torch.equal(head.weight[rows], embed[chosen])   # each id scored by its own row
        assert (head.to_head >= 0).sum() == chosen.numel()


class Killed(Exception):
    """Stands for the process dying: nothing of the run's exit path runs."""


class KillAt(Reporter):
    def __init__(self, step: int) -> None:
        self.at = step

    def step(self, log, result, total):
        if log.step == self.at:
            raise Killed


class InterruptAt(KillAt):
    def step(self, log, result, total):
        if log.step == self.at:
            os.kill(os.getpid(), signal.SIGINT)


def test_resume_after_a_kill_gives_the_same_weights(workspace, whole_run):
    ws, whole = workspace, whole_run
    run = options(ws, "killed", steps=6, checkpoint_steps=2)
    with pytest.raises(Killed):
        distill(run, KillAt(3))  # the last checkpoint: step 2
    with pytest.raises(DistillError, match="interrupted run .* --resume"):
        distill(run)
    with pytest.raises(DistillError, match="differs in train.seed"):
        distill(replace(options(ws, "killed", steps=6, checkpoint_steps=2, seed=1), resume=True))
    with pytest.raises(Interrupted, match="after step 5 of 6"):  # Ctrl-C: the step ends and is saved
        distill(replace(run, resume=True), InterruptAt(5))
    resumed = distill(replace(run, resume=True))
    assert resumed.training.resumed_at == 5 and resumed.teacher.computed == 0
    assert [h.loss for h in resumed.training.history] == [h.loss for h in whole.training.history]
    a, b = whole.student.state_dict(), resumed.student.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the weights did move: a resumed run that skipped its steps would still hold the initial layers
    first = random_target().model.decoder.layers[0].fc1.weight
    assert not torch.equal(first, resumed.student.model.decoder.layers[0].fc1.weight)


def no_teacher_pass(*args, **kwargs):
    raise AssertionError("the teacher pass ran")


def test_a_draft_trained_further_starts_from_its_own_weights(workspace, cli_run, whole_run, capsys, monkeypatch):
    """--init-draft: the student starts as the given draft (its layers, its head's ranking), not the target's
    first and last layers; the run's identity holds that draft's weights; a draft of another target's
    embeddings, or --layers beside it, is refused with one line before the teacher pass."""
    from transformers import WhisperForCausalLM

    from asr_app.distill.student import build_student
    from asr_app.distill.teacher import target_fingerprint

    code, first = cli_run   # 16 steps from the target's layers on these clips
    assert code == 0
    start = WhisperForCausalLM.from_pretrained(first)
    student = build_student(random_target(), None, start)
    a, b = start.state_dict(), student.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k].float(), b[k]) for k in a)
    assert not student.model.decoder.embed_tokens.weight.requires_grad and student.model.decoder.layers[0].fc1.weight.requires_grad

    further = distill(options(workspace, "further", steps=2, init_draft=str(first)))
    assert further.teacher.computed == 0
    # The first step's loss is the starting weights' (measured before the update): the trained draft's, far
    # below that of the target's untrained first and last layers on the same clips.
    assert further.training.history[0].loss < 0.8 * whole_run.training.history[0].loss, (
        further.training.history[0].loss, whole_run.training.history[0].loss)
    card = json.loads((workspace / "further" / "card.json").read_text())
    assert card["training"]["started_from"] == str(first) and card["training"]["layers"] is None
    assert f"the draft `{first}` trained further" in (workspace / "further" / "README.md").read_text()
    run = json.loads((workspace / "further" / "run.json").read_text())
    assert run["identity"]["start_draft"] == target_fingerprint(start)

    other = derive_draft(random_target(seed=1), (0, 3))   # same vocabulary and width, another target's embeddings
    other.save_pretrained(workspace / "other-target-draft")
    common = ["--target", str(workspace / "target"), "--audio", str(workspace / "train"), "--cache",
              str(workspace / "cache")]
    code, err = run_cli(capsys, *common, "--out", str(workspace / "o9"), "--init-draft",
                        str(workspace / "other-target-draft"))
    assert code == 2 and len(err.splitlines()) == 1 and "does not hold the target's embed tokens" in err, err
    assert not (workspace / "o9").exists()
    code, err = run_cli(capsys, *common, "--out", str(workspace / "o10"), "--init-draft", str(first), "--layers", "0,1")
    assert code == 2 and "exclude each other" in err
    # A draft whose head was trained on a ranking keeps it: the run must train a head of that size, and a
    # ranking the tokenizer cannot hold is named before the teacher pass.
    from asr_app.runtime.vocab import RANKING_ATTR
    for name, ranking in (("ranked", list(range(100, 2100))), ("bad-ranking", [50300, 7])):
        setattr(start.config, RANKING_ATTR, ranking)
        start.save_pretrained(workspace / name)
    monkeypatch.setattr("asr_app.distill.pipeline.teacher_pass", no_teacher_pass)
    code, err = run_cli(capsys, *common, "--out", str(workspace / "o11"), "--init-draft", str(workspace / "ranked"))
    assert code == 2 and "trained with a head of 3608 tokens" in err and "--draft-vocab 3608 (not 32768)" in err, err
    code, err = run_cli(capsys, *common, "--out", str(workspace / "o12"), "--init-draft", str(workspace / "bad-ranking"))
    assert code == 2 and len(err.splitlines()) == 1 and f"--init-draft {workspace / 'bad-ranking'}:" in err, err


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main([*argv, "--device", "cpu", "--quiet"])
    return code, capsys.readouterr().err


def test_bad_input_gets_one_clear_line(workspace, cli_run, capsys, monkeypatch):
    ws = workspace
    junk = ws / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("no audio here")
    (junk / "broken.wav").write_bytes(b"RIFF not really a wav file")
    common = ["--target", str(ws / "target"), "--cache", str(ws / "cache")]
    code, err = run_cli(capsys, *common, "--audio", str(junk), "--out", str(ws / "o1"))
    assert code == 2 and "no usable training audio" in err and "broken.wav" in err and len(err.splitlines()) == 1

    bare = ws / "no-tokenizer"
    shutil.copytree(ws / "target", bare, ignore=shutil.ignore_patterns("tokenizer*", "vocab*"))
    code, err = run_cli(capsys, "--target", str(bare), "--audio", str(ws / "train"), "--out", str(ws / "o2"))
    assert code == 2 and "has no tokenizer" in err and len(err.splitlines()) == 1

    code, err = run_cli(capsys, *common, "--audio", str(ws / "train"), "--out", str(ws / "o6"), "--tasks",
                        "transcribe,translate")
    assert code == 2 and "English-only: it cannot translate" in err
    code, err = run_cli(capsys, *common, "--audio", str(ws / "train"), "--out", str(ws / "o7"), "--baseline-draft",
                        "bundled")
    assert code == 2 and "distilled from Whisper base and Whisper tiny.en" in err and not (ws / "o7").exists()
    code, err = run_cli(capsys, *common, "--audio", str(ws / "train"), "--out", str(ws / "o8"), "--draft-vocab", "1000")
    assert code == 2 and "cannot hold the target's 1608 special" in err and not (ws / "o8" / "run.json").exists()
    code, err = run_cli(capsys, *common, "--audio", str(ws / "train"), "--out", str(ws / "o3"), "--resume")
    assert code == 2 and "nothing to resume" in err
    code, err = run_cli(capsys, *common, "--audio", str(ws / "train"), "--out", str(cli_run[1]))
    assert code == 2 and "already holds a finished draft" in err

    blocked = ws / "a-file"
    blocked.write_text("")
    code, err = run_cli(capsys, "--target", str(ws / "target"), "--cache", str(blocked / "cache"),
                        "--audio", str(ws / "train"), "--out", str(ws / "o4"))
    assert code == 2 and f"cannot write the teacher cache in {blocked}" in err and len(err.splitlines()) == 1

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("asr_app.distill.cache.save_file", full_disk)
    code, err = run_cli(capsys, "--target", str(ws / "target"), "--cache", str(ws / "empty-cache"),
                        "--audio", str(ws / "train"), "--out", str(ws / "o5"), "--max-new-tokens", "4")
    assert code == 2 and "No space left on device" in err and "--cache" in err
    assert not list((ws / "empty-cache").rglob("*.safetensors")) and not list((ws / "empty-cache").rglob(".tmp*"))


def forbid_model_loads(monkeypatch) -> None:
    """A model load fails the test: the checks under test must answer before any."""
    def load_pair(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("asr_app.distill.pipeline.load_pair", load_pair)


def test_an_unwritable_out_is_refused_before_any_model_loads(workspace, tmp_path, capsys, monkeypatch):
    """An --out that cannot be made (in /proc; below a file) is one line naming it and why, before any model
    loads (it was a traceback once the target had loaded); a file as --out keeps its own line."""
    forbid_model_loads(monkeypatch)
    (tmp_path / "a-file").write_text("")
    outs = {tmp_path / "a-file" / "draft": "Not a directory"}
    if Path("/proc/self").is_dir():   # no folder can be made in /proc, whoever runs the test
        outs[Path("/proc/asr-distill-test/draft")] = ""
    for out, why in outs.items():
        code, err = run_cli(capsys, "--target", str(workspace / "target"), "--audio", str(workspace / "train"),
                            "--out", str(out))
        assert code == 2 and len(err.splitlines()) == 1 and not out.exists(), err
        assert err.startswith(f"asr-distill: error: cannot write the draft to --out {out}: {why}"), err
    code, err = run_cli(capsys, "--target", str(workspace / "target"), "--audio", str(workspace / "train"),
                        "--out", str(tmp_path / "a-file"))
    assert code == 2 and "a-file exists and is not an empty folder" in err and len(err.splitlines()) == 1


def test_a_run_that_trained_is_never_started_over_without_resume(workspace):
    """A run back in its teacher stage (a resumed run passes through it again) that holds a checkpoint is
    refused without --resume: starting over would overwrite the training it did. Without a checkpoint it
    trained nothing and the same command may start it again."""
    from asr_app.distill.checkpoint import CHECKPOINT
    from asr_app.distill.pipeline import TEACHER_STAGE, check_out

    out = workspace / "stopped-in-teacher"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"status": TEACHER_STAGE}))
    check_out(options(workspace, "stopped-in-teacher"))   # nothing trained: allowed
    (out / CHECKPOINT).write_bytes(b"steps done")
    with pytest.raises(DistillError, match="holds an interrupted run .*while training.*--resume"):
        check_out(options(workspace, "stopped-in-teacher"))


def unusable_audio(folder: Path) -> Path:
    """A header claiming 1 Hz (16 samples would pass for 16 s), a text named .wav and an empty .wav."""
    import soundfile as sf

    folder.mkdir()
    sf.write(str(folder / "one-hz.wav"), np.zeros(16, np.int16), 1)
    (folder / "text.wav").write_text("not audio " * 100)
    (folder / "empty.wav").write_bytes(b"")
    return folder


def test_audio_with_nothing_usable_stops_before_any_model_loads(workspace, tmp_path, capsys, monkeypatch):
    """Each unusable file gets a line saying which and why, from its header alone; then one error, and --out is
    left untouched (no run.json to block the same command once the audio is fixed)."""
    forbid_model_loads(monkeypatch)
    bad = unusable_audio(tmp_path / "bad")
    common = ["--target", str(workspace / "target"), "--device", "cpu", "--cache", str(tmp_path / "cache")]
    for audio, held in ((bad, workspace / "held"), (workspace / "train", bad)):
        out = tmp_path / f"out-{audio.name}"
        code = cli.main([*common, "--audio", str(audio), "--eval-audio", str(held), "--out", str(out)])
        lines = capsys.readouterr().err.splitlines()
        assert code == 2 and not out.exists(), lines
        assert lines[-1].startswith("asr-distill: error: no usable ") and str(bad) in lines[-1]
        skipped = sorted(line for line in lines if line.startswith("skipped: "))
        assert len(skipped) == 3 and len(lines) == 4, lines
        assert f"{bad / 'empty.wav'}: file is empty" in skipped[0]
        assert f"{bad / 'one-hz.wav'}: sample rate 1 Hz is outside" in skipped[1]
        assert f"{bad / 'text.wav'}: not a readable audio file" in skipped[2]


def test_clips_that_fail_to_decode_are_named_and_do_not_block_a_rerun(workspace, tmp_path, capsys):
    """Headers that read well over audio that does not (NaN samples, a FLAC cut mid-stream) pass the check
    before the target loads; the teacher pass names each, and the error says the clips were unreadable (not
    that labels hit max_new_tokens). The run.json of a run that trained nothing does not block its command."""
    import soundfile as sf

    bad = tmp_path / "bad"
    bad.mkdir()
    samples = np.zeros(16_000, np.float32)
    samples[::2] = np.nan
    sf.write(str(bad / "nan.wav"), samples, 16_000, subtype="FLOAT")
    noise = 0.3 * np.random.default_rng(0).standard_normal(48_000).astype(np.float32)
    sf.write(str(tmp_path / "whole.flac"), noise, 16_000)
    whole = (tmp_path / "whole.flac").read_bytes()
    (bad / "cut.flac").write_bytes(whole[: len(whole) // 2])
    argv = ["--target", str(workspace / "target"), "--audio", str(bad), "--holdout", "0", "--out",
            str(tmp_path / "out"), "--cache", str(tmp_path / "cache"), "--device", "cpu", "--steps", "1"]
    for _ in range(2):   # the second time, the run.json of the first must not stand in its way
        code = cli.main(argv)
        lines = capsys.readouterr().err.splitlines()
        assert code == 2, lines
        assert lines[-1].startswith("asr-distill: error: none of the 2 training clip(s) could be read"), lines
        assert "max_new_tokens" not in lines[-1]
        assert any(f"skipped: {bad / 'nan.wav'}: 8000 samples are NaN" in line for line in lines)
        assert any(f"skipped: {bad / 'cut.flac'}: not a readable audio file" in line for line in lines)


def test_a_baseline_draft_that_does_not_fit_is_refused_before_the_teacher_pass(workspace, tmp_path, capsys,
                                                                                monkeypatch):
    """A baseline draft of another vocabulary is refused as --baseline-draft, naming its folder, before any clip
    is labelled (it was found only at the evaluation, after the training, and called the distilled draft)."""
    from transformers import WhisperForCausalLM

    from asr_app.distill.evaluate import in_decoder
    from asr_app.models.errors import ModelLoadError

    draft = WhisperForCausalLM.from_pretrained(workspace / "baseline")
    draft.resize_token_embeddings(draft.config.vocab_size + 1)
    draft.save_pretrained(tmp_path / "wide")

    def no_teacher_pass(*args, **kwargs):
        raise AssertionError("the teacher pass ran")

    monkeypatch.setattr("asr_app.distill.pipeline.teacher_pass", no_teacher_pass)
    code, err = run_cli(capsys, "--target", str(workspace / "target"), "--audio", str(workspace / "train"),
                        "--eval-audio", str(workspace / "held"), "--out", str(tmp_path / "out"),
                        "--baseline-draft", str(tmp_path / "wide"))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"--baseline-draft {tmp_path / 'wide'} does not fit the target" in err and "51865" in err
    assert not (tmp_path / "out").exists()
    # The evaluation names the draft it measures (a baseline no longer reaches it unchecked, another caller may).
    pair = load_pair(target=str(workspace / "target"), draft="none", device="cpu")
    with pytest.raises(ModelLoadError, match="draft 'the baseline draft wide' has 51865"):
        in_decoder(pair, draft, [], [], EvalOptions(), draft_name="the baseline draft wide")


def test_teacher_batches_hold_one_language_and_languages_take_turns():
    """--language folder: a batch decodes once per variant only if its clips share a language; the languages
    take turns, so a pass stopped part way has labelled a sample of each; within one, content-hash order with a
    file's windows together."""
    from types import SimpleNamespace

    from asr_app.distill.data import Clip
    from asr_app.distill.pipeline import _teacher_batches

    clips = [Clip(f"{digest}-w{w}", Path(f"{lang}/{digest}.flac"), w, 30.0, lang)
             for lang, digests in (("de", "c5a"), ("fr", "b4"), (None, "9"))
             for digest in digests for w in range(2 if digest == "a" else 1)]
    teacher = SimpleNamespace(given_language=lambda clip: clip.folder_language)
    batches = _teacher_batches(list(reversed(clips)), 2, teacher)
    assert [[c.key for c in b] for b in batches] == [
        ["9-w0"], ["5-w0", "a-w0"], ["4-w0", "b-w0"], ["a-w1", "c-w0"]]
    assert all(len({c.folder_language for c in b}) == 1 for b in batches)
    assert sorted(c.key for b in batches for c in b) == sorted(c.key for c in clips)


def test_per_language_figures_group_by_folder_and_say_what_the_target_heard():
    """Synthetic voices are sometimes heard as another language: the card groups held-out clips by the language
    their folder names (detected where none does) and says what the target detected where it differs."""
    from types import SimpleNamespace

    from asr_app.decoding.options import DecodingStats
    from asr_app.distill.card import _decoder_lines
    from asr_app.distill.evaluate import _by_language

    def stats(out, calls, drafted, accepted, seconds=0.0):
        return DecodingStats("exact", True, tokens_out=out, target_calls=calls, drafted=drafted, accepted=accepted,
                             total_s=seconds)

    offs = [SimpleNamespace(language=lang, stats=stats(0, 0, 0, 0, s)) for lang, s in (("de", 2.0), ("cy", 1.0),
                                                                                         ("en", 0.0), ("en", 0.0))]
    exacts = [SimpleNamespace(stats=s) for s in (stats(10, 4, 8, 6, 1.0), stats(10, 6, 8, 4, 1.5), stats(9, 3, 8, 6),
                                                 stats(6, 2, 4, 4))]
    rows = _by_language(offs, exacts, ["de", "de", None, "en"])
    assert rows["de"]["clips"] == 2 and rows["de"]["detected_as"] == {"de": 1, "cy": 1}
    assert rows["de"]["tokens_per_call"] == 2.0 and rows["de"]["acceptance"] == 10 / 16
    assert rows["de"]["speedup"] == 3.0 / 2.5   # off's 2 + 1 s against exact's 1 + 1.5 s
    assert rows["en"] == {"clips": 2, "acceptance": 10 / 12, "tokens_per_call": 3.0, "speedup": None}  # not timed
    lines = _decoder_lines({"identical": 4, "clips": 4, "by_language": rows}, "this draft")
    assert ("- de: 2 clips, acceptance 62.5%, 2.00 tokens per target call, `exact` 1.20x `off` "
            "(detected as cy 1, de 1)") in lines
    assert "- en: 2 clips, acceptance 83.3%, 3.00 tokens per target call" in lines


def test_the_card_bounds_the_speed_up_by_the_time_outside_the_token_loop():
    """`off` spent 10 s, 5 of them in its token loop (its decodes' 9.5 s less 4 s of encoder and 0.5 s of
    setup): a draft that made the loop free would give 2x, no more; `exact`'s loop (7 - 4 - 0.5 = 2.5 s; the
    steps' own timers, launches only on a GPU, are not what counts) is 2x faster than `off`'s."""
    from asr_app.distill.card import _decoder_lines
    from asr_app.distill.evaluate import InDecoder, TimeSplit, decoder_figures

    decoder = InDecoder(3, {}, {}, 3, off_s=10.0, exact_s=7.5, off_split=TimeSplit(4.0, 0.5, 0.0, 4.9, 9.5),
                        exact_split=TimeSplit(4.0, 0.5, 0.4, 1.0, 7.0))
    figures = decoder_figures(decoder)
    assert figures["ceiling"] == 2.0 and figures["loop_speedup"] == 2.0 and abs(figures["speedup"] - 4 / 3) < 1e-9
    lines = _decoder_lines(figures, "this draft")
    assert ("this draft: the token loop alone 2.00x; it was 50.0% of `off`'s time (the encoder 40.0%), so no draft "
            "could make `exact` more than 2.00x `off` on these clips.") in lines
    assert InDecoder(3, {}, {}, 3).ceiling is None  # not timed (--no-speed)


def test_kl_with_a_rest_bucket_is_the_kl_over_k_plus_one_outcomes():
    torch.manual_seed(0)
    teacher = torch.log_softmax(torch.randn(3, 10), -1)
    student = torch.log_softmax(torch.randn(3, 8), -1)   # the student's head: ids 0..7 of 10
    top = teacher.topk(4, -1)
    to_head = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, -1, -1])
    got = kl_top_k(student, to_head[top.indices], top.values)
    for row in range(3):
        ids = [int(i) for i in top.indices[row] if int(i) < 8]
        p = teacher[row, ids].exp()
        q = student[row, ids].exp()
        p_rest, q_rest = 1 - p.sum(), 1 - q.sum()
        want = (p * (p / q).log()).sum() + p_rest * (p_rest / q_rest).log()
        assert torch.allclose(got[row], want, atol=1e-5)
    same = kl_top_k(teacher, top.indices, top.values)  # a student that is the teacher (the whole vocabulary)
    assert torch.allclose(same, torch.zeros(3), atol=1e-6) and (got > 1e-3).all()


def test_runtime_head_default_is_the_decoders():
    from asr_app.decoding.options import DEFAULT_DRAFT_VOCAB

    assert RUNTIME_DRAFT_VOCAB == DEFAULT_DRAFT_VOCAB


def test_augmentation_does_what_it_says():
    from asr_app.distill import synth

    rng = np.random.default_rng(0)
    tone = (0.5 * np.sin(2 * np.pi * 220 * np.arange(16_000) / 16_000)).astype(np.float32)
    for colour in ("white", "pink", "brown"):
        noisy = synth.add_noise(tone, 10.0, rng, colour)
        snr = 10 * np.log10(np.mean(tone.astype(np.float64) ** 2) / np.mean((noisy - tone).astype(np.float64) ** 2))
        assert abs(snr - 10.0) < 0.1, (colour, snr)
    assert synth.change_speed(tone, 1.25).size == pytest.approx(tone.size / 1.25, abs=2)
    assert np.max(np.abs(synth.set_level(tone, -6.0))) == pytest.approx(10 ** (-6 / 20), rel=1e-5)
    wet = synth.reverb(tone, 0.3, rng)
    assert wet.size == tone.size + int(0.3 * 16_000) - 1 and np.abs(wet[tone.size :]).max() > 0.01  # a tail
    a, done_a = synth.augment(tone, np.random.default_rng(5))
    b, done_b = synth.augment(tone, np.random.default_rng(5))
    assert done_a == done_b and np.array_equal(a, b) and "peak_dbfs" in done_a  # the seed decides


@pytest.mark.skipif(not shutil.which("espeak-ng"), reason="espeak-ng is not installed (apt-get install espeak-ng)")
def test_synthetic_speech_in_several_languages(tmp_path):
    import soundfile as sf

    from asr_app.distill import synth

    written = synth.generate([("en", "Good morning."), ("de", "Guten Morgen."), ("ru", "Доброе утро.")], tmp_path)
    assert [p.parent.name for p in written] == ["en", "de", "ru"]
    for path in written:
        audio, rate = sf.read(str(path))
        assert rate == 16_000 and 0.3 < audio.size / rate < 5 and np.abs(audio).max() > 0.01
    manifest = [json.loads(line) for line in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    assert [m["text"] for m in manifest] == ["Good morning.", "Guten Morgen.", "Доброе утро."]
    assert {m["language"] for m in manifest} == {"en", "de", "ru"} and all("wpm" in m for m in manifest)


@pytest.mark.skipif(not voice_installed("festival", "pc_diphone"),
                    reason="festival's Italian voice is not installed (apt-get install festival festvox-itapc16k)")
def test_a_sentence_a_voice_cannot_speak_is_skipped_and_the_rest_go_on(tmp_path):
    """festival's Italian voices give no audio for "45%": that sentence is reported, the others are written."""
    from asr_app.distill import synth

    skipped = []
    written = synth.generate([("it", "Il 45% ha votato."), ("it", "Buongiorno a tutti.")], tmp_path,
                             engines=("festival",), skip=lambda *row: skipped.append(row))
    assert [p.name for p in written] == ["it-0-000001.flac"]
    assert len(skipped) == 1 and skipped[0][:2] == ("it", "Il 45% ha votato.") and "gave no audio" in skipped[0][2]
    manifest = [json.loads(line) for line in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    assert [(m["text"], m["engine"]) for m in manifest] == [("Buongiorno a tutti.", "festival")]


def test_festival_gets_text_in_the_encoding_its_voice_reads(tmp_path, monkeypatch):
    """Italian voices read ISO-8859-1: typographic marks become ASCII (not "?", which festival would speak),
    accents stay, and a letter ISO-8859-1 cannot hold skips the sentence; a voice without rate control is
    not given a stretch."""
    from asr_app.distill import voices

    wav = tmp_path / "speech.wav"
    italian = voices.Voice("it", "pc_diphone", "", 170, 50, voices.FESTIVAL)
    command = voices._festival("L’ho detto: “città” – 5 €", italian, wav)
    assert wav.with_suffix(".txt").read_bytes() == 'L\'ho detto: "città" - 5  euro '.encode("latin-1")
    assert "(Parameter.set 'Duration_Stretch 1.000)" in command
    with pytest.raises(voices.SpeakError, match="latin-1"):
        voices._festival("Доброе утро", italian, wav)
    russian = voices.Voice("ru", "msu_ru_nsh_clunits", "", 0, 50, voices.FESTIVAL)
    command = voices._festival("Доброе утро", russian, wav)
    assert wav.with_suffix(".txt").read_text(encoding="utf-8") == "Доброе утро" and not any("Stretch" in c for c in command)
    monkeypatch.setattr(voices, "voice_installed", lambda engine, name: True)   # the draw, wherever festival is missing
    assert voices.random_voice("ru", np.random.default_rng(0), engines=(voices.FESTIVAL,)).wpm == 0
    assert voices.random_voice("it", np.random.default_rng(0), engines=(voices.FESTIVAL,)).wpm > 0


def test_every_command_line_option_reaches_the_options():
    """Each option of asr-distill changes the DistillOptions it builds (--threads and --quiet act in main)."""
    parser = cli.build_parser()
    base = ["--target", "t", "--audio", "a", "--out", "o"]
    probes = {"target": ["--target", "u"], "audio": ["--audio", "a", "b"], "out": ["--out", "p"],
              "eval_audio": ["--eval-audio", "e"], "holdout": ["--holdout", "0.2"], "cache": ["--cache", "c"],
              "resume": ["--resume"], "device": ["--device", "cpu"], "dtype": ["--dtype", "float16"],
              "language": ["--language", "German"], "tasks": ["--tasks", "transcribe,translate"],
              "timestamps": ["--timestamps", "mixed"], "top_k": ["--top-k", "20"],
              "max_new_tokens": ["--max-new-tokens", "100"], "keep_capped": ["--keep-capped"],
              "teacher_batch": ["--teacher-batch", "2"], "steps": ["--steps", "5"], "batch_size": ["--batch-size", "4"],
              "lr": ["--lr", "1e-4"], "min_lr": ["--min-lr", "1e-6"], "warmup": ["--warmup", "5"],
              "kl_weight": ["--kl-weight", "2"], "ce_weight": ["--ce-weight", "1"], "layers": ["--layers", "0,1"],
              "draft_vocab": ["--draft-vocab", "0"], "audio_view": ["--audio-view", "audio"], "seed": ["--seed", "3"],
              "checkpoint_minutes": ["--checkpoint-minutes", "1"], "checkpoint_steps": ["--checkpoint-steps", "10"],
              "gammas": ["--gammas", "2,4"], "eval_max_clips": ["--eval-max-clips", "3"],
              "eval_timestamps": ["--eval-timestamps"], "eval_task": ["--eval-task", "translate"],
              "no_speed": ["--no-speed"], "baseline_draft": ["--baseline-draft", "bundled"],
              "init_draft": ["--init-draft", "bundled"],
              "eval_language": ["--eval-language", "given"]}
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests - set(probes) == {"threads", "quiet"}
    default = cli.options_from_args(parser.parse_args(base))
    for dest, argv in probes.items():
        assert cli.options_from_args(parser.parse_args(base + argv)) != default, dest
    assert cli.options_from_args(parser.parse_args(base + ["--language", "German"])).teacher.language == "de"
    assert cli.options_from_args(parser.parse_args(base + ["--language", "folder"])).teacher.language == "folder"
    assert cli.main(base + ["--holdout", "1.5"]) == 2  # a bad value: one line, before torch work


def test_audio_folders_reached_through_links_are_found_once(tmp_path):
    """A data folder made of links to corpora is read through them; a link back up does not loop; a folder
    reached through two links is read once, and the same audio under two names is one clip."""
    import soundfile as sf

    from asr_app.distill.data import audio_files, inventory

    corpus = tmp_path / "corpus" / "speaker"
    corpus.mkdir(parents=True)
    for i, name in enumerate(("a.flac", "b.flac")):
        sf.write(str(corpus / name), np.full(16_000, 0.1 * (i + 1), np.float32), 16_000)
    data = tmp_path / "data"
    data.mkdir()
    (data / "linked").symlink_to(tmp_path / "corpus", target_is_directory=True)
    (data / "linked-again").symlink_to(tmp_path / "corpus", target_is_directory=True)
    (data / "a-by-link.flac").symlink_to(corpus / "a.flac")
    (data / "linked" / "speaker" / "loop").symlink_to(data, target_is_directory=True)
    files, missing = audio_files([data])
    assert not missing
    assert [p.relative_to(data).as_posix() for p in files] == \
        ["a-by-link.flac", "linked/speaker/a.flac", "linked/speaker/b.flac"]
    assert [c.path.name for c in inventory([data]).clips] == ["a-by-link.flac", "b.flac"]


def test_real_recordings_get_augmented_copies(tmp_path):
    import soundfile as sf

    from asr_app.distill import synth

    stereo = np.stack([np.sin(np.arange(8000) / 5), np.cos(np.arange(8000) / 5)], axis=1).astype(np.float32) * 0.5
    sf.write(str(tmp_path / "take.wav"), stereo, 8000)
    out = tmp_path / "out"
    copies = synth.augment_files([tmp_path / "take.wav"], out, copies=3, seed=1)
    assert len(copies) == 3 and len({p.read_bytes() for p in copies}) == 3  # three different versions
    for path in copies:
        audio, rate = sf.read(str(path))
        assert rate == 16_000 and audio.ndim == 1 and 0.8 < audio.size / 16_000 < 3.0  # 1 s, sped or padded
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [m["source"] for m in manifest] == [str(tmp_path / "take.wav")] * 3
    twin = tmp_path / "other" / "take.wav"          # the same name in another folder keeps its own copies
    twin.parent.mkdir()
    sf.write(str(twin), stereo[:4000], 8000)
    assert not set(synth.augment_files([twin], out, copies=3, seed=1)) & set(copies)
    assert all(p.is_file() for p in copies)
    (tmp_path / "bad.wav").write_bytes(b"not audio")
    (tmp_path / "empty.wav").write_bytes(b"")
    for bad in ("bad.wav", "empty.wav"):
        with pytest.raises(synth.SynthError, match=bad):
            synth.augment_files([tmp_path / bad], out, copies=1)


def test_training_text_lines_are_speakable_and_bounded():
    import importlib.util
    import random

    spec = importlib.util.spec_from_file_location("make_training_text",
                                                  Path(__file__).parents[1] / "tools" / "make_training_text.py")
    text_tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(text_tool)
    rng = random.Random(0)
    passage = "One two three four five. " * 40 + "def f(x): return x[0] == {}"
    lines = list(text_tool.lines_of(passage, rng))
    assert lines and all(len(line.split()) <= text_tool.MAX_WORDS for line in lines)
    assert text_tool.speakable("A gift of a flower will soon be made to you.")
    assert not text_tool.speakable("def f(x): return x[0] == {}") and not text_tool.speakable("two words")
    assert text_tool.clean("Be yourself.\n\t\t-- Oscar Wilde") == "Be yourself."
    assert [text_tool.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]
    templates = list(text_tool.template_passages(random.Random(1), 200))
    assert len(set(templates)) > 150 and all(text_tool.MIN_WORDS <= len(t.split()) <= text_tool.MAX_WORDS
                                             for t in templates)
    roff = ".SH NOM\nUtilisation des \\('etiquettes de \\fBsymbole\\fP, \\[u00E0] la fa\\(,con\n.PP\nDeux mots ici"
    assert text_tool.roff_text(roff) == "Utilisation des étiquettes de symbole, à la façon\n\nDeux mots ici"
    assert text_tool.speakable("Der Hund und die Katze sind nicht hier.", "de")
    assert not text_tool.speakable("The dog and the cat are not here.", "de")      # English quoted in German
    assert text_tool.speakable("И слепой обидится, если сказать ему.", "ru")
    assert not text_tool.speakable("God is Real, unless declared as Integer.", "ru")
    assert not text_tool.speakable("x = {a: b} und [c] ist", "de")                  # code, in any language
    prose = ["A gift of a flower will soon be made to you.", "if (a == b) { return c; }",
             "A gift of a flower will soon be made to you."]
    lines = text_tool.collect(random.Random(2), templates=50, passages=prose)
    assert lines[0] == prose[0] and prose[1] not in lines and lines.count(prose[0]) == 1
    kept = [line for line in lines if line.startswith(("The meeting moved", "Call me at", "Flight ", "We counted"))]
    assert len(lines) == len(set(lines)) and len(kept) >= 30   # 4 of the 5 shapes; the phone and flight lines too
    assert any(line.startswith(("Call me at", "Flight ")) for line in kept)


def test_every_option_field_is_read_by_the_recipe():
    """Each field the front end fills (above) is read somewhere in the recipe: a field stored and never read
    would be an option accepted and ignored."""
    import ast
    import dataclasses

    from asr_app.distill import options as opts

    package = Path(opts.__file__).parent
    read: set[str] = set()
    for path in package.glob("*.py"):
        if path.name not in ("options.py", "synth.py"):   # synth.py (audio making) is not the recipe
            read |= {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
    for cls in (opts.DistillOptions, opts.TeacherOptions, opts.TrainOptions, opts.EvalOptions):
        unread = {f.name for f in dataclasses.fields(cls)} - read
        assert not unread, f"{cls.__name__}: {sorted(unread)} set by asr-distill and read nowhere in the recipe"
