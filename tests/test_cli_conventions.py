"""What users of openai-whisper / faster-whisper expect from asr-transcribe, and its behaviour on a fresh
machine: their flags, option errors before any model loads, ordinary file modes, clean progress output when
stderr is not a terminal, clear lines for an unreachable hub, a corrupt checkpoint or swapped models."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import DISTIL_DRAFT_DIR, JFK_FLAC, REPO_ROOT, TINY_EN_DIR, lj_clip

from asr_app import fileio
from asr_app.arguments import add_model_args, check_args, parse_temperatures
from asr_app.audio import ArrayAudio
from asr_app.cli import transcribe as cli
from asr_app.decoding import Segment
from asr_app.languages import LANGUAGES, language_code
from asr_app.longform import Transcript
from asr_app.models import ModelLoadError, load_pair
from asr_app.writers import to_tsv

MODEL_ARGS = ["--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR), "--device", "cpu", "--threads", "1"]


def run_cli(*argv: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """asr-transcribe in a fresh process, stderr piped (not a terminal)."""
    base = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "asr_app.cli.transcribe", *argv], cwd=REPO_ROOT,
                          env={**base, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def test_parsing_and_help_import_neither_torch_nor_transformers():
    # --help must answer at once: the command-line modules import the heavy libraries only after parsing.
    code = ("import sys, asr_app.cli.transcribe, asr_app.cli.stream, asr_app.arguments;"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
    help_text = run_cli("--help")
    assert help_text.returncode == 0
    for flag in ("--model", "--output_dir", "--output_format", "--language", "--task", "--initial_prompt",
                 "--temperature", "--temperature_increment_on_fallback", "--beam_size", "--draft-vocab"):
        assert flag in help_text.stdout, flag


def test_whisper_flags_map_onto_ours(tmp_path):
    parser = cli.build_parser()
    args = parser.parse_args(["a.wav", "--model", "tiny.en", "--output_dir", str(tmp_path), "-f", "tsv",
                              "--language", "English", "--task", "transcribe", "--initial_prompt", "Kennedy."])
    check_args(args)
    assert (args.pair, args.target, args.output_dir, args.format, args.language, args.initial_prompt) == (
        "tiny.en", None, tmp_path, "tsv", "en", "Kennedy.")
    check_args(args)  # checking twice is harmless
    folder = parser.parse_args(["a.wav", "--model", str(TINY_EN_DIR)])
    check_args(folder)
    assert (folder.pair, folder.target) == (None, str(TINY_EN_DIR))
    ours = parser.parse_args(["a.wav", "-o", str(tmp_path), "--format", "all"])
    assert ours.output_dir == tmp_path and ours.format == "all"
    assert language_code("<|fr|>") == "fr" and language_code("french") == "fr" and len(LANGUAGES) == 100


def test_languages_table_is_transformers_own():
    from transformers.models.whisper.tokenization_whisper import LANGUAGES as TRANSFORMERS_LANGUAGES

    assert LANGUAGES == TRANSFORMERS_LANGUAGES and list(LANGUAGES) == list(TRANSFORMERS_LANGUAGES)


@pytest.mark.parametrize("argv, message", [
    (["--language", "xx"], "unknown language 'xx'"),
    (["--model", "tiny.en", "--language", "fr"], "English-only model; it cannot transcribe language 'fr'"),
    (["--model", "tiny.en", "--task", "translate"], "--task translate needs a multilingual model"),
    (["--beam_size", "5"], "beam search is not supported"),
    (["--temperature", "50"], "in [0, 1]"),
    (["--temperature", "nan"], "finite numbers"),
    (["--temperature", "0,inf"], "finite numbers"),
    (["--model", "tiny.en", "--target", "x"], "not both"),
])
def test_bad_options_fail_in_one_line_before_any_model_loads(argv, message):
    out = run_cli(str(JFK_FLAC), *argv, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "loaded" not in out.stderr.lower()
    assert "cannot load the models" not in out.stderr  # an option problem is not a model problem


def test_temperature_schedules():
    assert parse_temperatures("0") == (0.0,) and parse_temperatures("0,0.5,1") == (0.0, 0.5, 1.0)
    assert cli.fallback_schedule((0.0,), 0.2, True) == (0.2, 0.4, 0.6, 0.8, 1.0)  # openai/whisper's default
    assert cli.fallback_schedule((0.0, 0.5, 1.0), 0.2, True) == (0.5, 1.0)  # a given list wins
    assert cli.fallback_schedule((0.5,), 0.25, True) == (0.75, 1.0)
    assert cli.fallback_schedule((0.0,), 0.2, False) == () and cli.fallback_schedule((1.0,), 0.2, True) == ()
    assert cli.fallback_schedule((0.3,), 0.2, True) == (0.5, 0.7, 0.9)  # never past 1.0 (it gave 1.1)
    parser = add_model_args(__import__("argparse").ArgumentParser())
    assert parser.parse_args(["--temperature", "0.2,0.4"]).temperature == (0.2, 0.4)


def test_tsv_is_openai_whispers():
    transcript = Transcript("x.wav", 3.0, "", [Segment(0.0, 1.234, " Hello\tthere ", []),
                                                Segment(1.5, 2.9995, " again", [])], "en", "exact")
    assert to_tsv(transcript) == "start\tend\ttext\n0\t1234\tHello there\n1500\t3000\tagain\n"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_outputs_get_the_mode_the_umask_allows(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        written = fileio.write_atomic(tmp_path / "out.txt", "hello\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(written.stat().st_mode) == mode and written.read_text() == "hello\n"


def test_a_full_disk_writes_none_of_a_files_outputs(tmp_path, monkeypatch):
    # The third staged file hits ENOSPC: nothing is renamed, and no temporary file is left behind.
    real_stage, calls = fileio._stage, []

    def stage(path, text):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_stage(path, text)

    monkeypatch.setattr(fileio, "_stage", stage)
    files = {tmp_path / f"a.{ext}": ext for ext in ("txt", "srt", "vtt", "json")}
    with pytest.raises(OSError, match="No space"):
        fileio.write_all_atomic(files)
    assert list(tmp_path.iterdir()) == []


def test_batch_goes_on_when_one_files_outputs_cannot_be_written(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    for clip in ("LJ001-0002", "LJ001-0008"):
        (folder / f"{clip}.flac").symlink_to(lj_clip(clip))
    real = fileio.write_all_atomic

    def full_for_one(files):
        if any("LJ001-0002" in p.name for p in files):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(files)

    monkeypatch.setattr("asr_app.writers.write_all_atomic", full_for_one)
    out = tmp_path / "out"
    code = cli.main([str(folder), "-o", str(out), "--format", "all", "--mode", "off", "--quiet", *MODEL_ARGS])
    err = capsys.readouterr().err
    assert code == 1 and "LJ001-0002.flac: cannot write its outputs" in err and "No space left" in err
    assert sorted(p.name for p in out.iterdir()) == [f"LJ001-0008.{f}" for f in ("json", "srt", "tsv", "txt", "vtt")]
    data = json.loads((out / "LJ001-0008.json").read_text())
    assert data["model"]["dtype"] == "float32"  # a plain string, not "torch.float32"


def test_an_output_folder_that_cannot_exist_stops_before_decoding(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    out = run_cli(str(JFK_FLAC), "-o", str(blocker / "out"), *MODEL_ARGS, timeout=60)
    assert out.returncode == 2 and "cannot write to the output folder" in out.stderr and "Traceback" not in out.stderr
    assert "decoded with" not in out.stderr  # no model was run


def test_progress_when_stderr_is_not_a_terminal(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "jfk.flac").symlink_to(JFK_FLAC)
    (folder / "lj.flac").symlink_to(lj_clip("LJ001-0002"))
    (folder / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" * 20)
    out = run_cli(str(folder), "-o", str(tmp_path / "out"), "--mode", "exact", *MODEL_ARGS)
    assert out.returncode == 1, out.stderr
    progress = [line for line in out.stderr.splitlines() if "s audio," in line]
    # one final line, not a redrawn bar (on a slow machine a line every 10 s before it, never a second 100%)
    assert progress[-1].startswith("100%") and not [p for p in progress[:-1] if p.startswith("100%")], out.stderr
    assert "Tqdm" not in out.stderr and "<-" not in out.stderr and "ETA -" not in out.stderr
    assert "\r" not in out.stderr and "Loading weights" not in out.stderr
    assert "broken.wav: not a readable audio file" in out.stderr
    assert "draft acceptance" in out.stderr and "tokens per target call" in out.stderr


def test_an_unreachable_hub_fails_at_once_in_one_line(tmp_path):
    env = {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens on the discard port: refused at once
    out = run_cli(str(JFK_FLAC), "--model", "openai/whisper-small", env=env, timeout=60)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "not in the local Hugging Face cache" in lines[0] and "cannot be reached" in lines[0]


def test_corrupt_empty_and_swapped_checkpoints_are_clear_errors(tmp_path):
    corrupt = tmp_path / "corrupt"
    shutil.copytree(TINY_EN_DIR, corrupt)
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 1 << 20])  # truncated
    with pytest.raises(ModelLoadError, match="cannot be read"):
        load_pair(target=str(corrupt), draft=None, device="cpu")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_pair(target=str(empty), draft=None, device="cpu")
    with pytest.raises(ModelLoadError, match="swapped"):
        load_pair(target=str(DISTIL_DRAFT_DIR), draft=str(TINY_EN_DIR), device="cpu")
    out = run_cli(str(JFK_FLAC), "--target", str(corrupt), "--draft", "none", "--device", "cpu", timeout=120)
    assert out.returncode == 2 and "cannot be read" in out.stderr and "Traceback" not in out.stderr


def test_initial_prompt_leads_every_windows_prompt():
    from asr_app.longform import TranscribeOptions, _LongForm

    job = _LongForm("k", "x", ArrayAudio(np.zeros(16_000, dtype=np.float32)))
    job.initial_tokens = [11, 12]
    options = TranscribeOptions(initial_prompt="Glossary: Kennedy.", prompt_tokens=5)
    assert job.prompt(options) == [11, 12]
    job.context += [[50363, 1, 2, 50400], [50363, 3, 50380]]  # earlier windows' tokens, timestamps included
    assert job.prompt(options) == [11, 12, 50363, 3, 50380]  # the initial prompt first, then the latest tokens
    job.initial_tokens = []
    assert job.prompt(TranscribeOptions()) == [50363, 1, 2, 50400, 50363, 3, 50380]
    job.prompt_from = 2
    assert job.prompt(TranscribeOptions()) is None


def test_readme_commands_are_the_ones_ci_runs():
    readme = (REPO_ROOT / "README.md").read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    blocks = [line.strip() for line in readme.splitlines() if line.startswith("    ")][:2]
    assert "asr-transcribe asr_app/samples/sample.flac" in blocks[0] and ".[offline]" in blocks[0]
    assert "pytest" in blocks[1] and ".[dev]" in blocks[1]
    assert blocks[1] in ci  # CI runs the README's test command verbatim
    assert not Path(REPO_ROOT / "tests" / "conftest.py").read_text().count("../shared")


def _staged(folder: Path, owner: str, age_s: float = 0.0) -> Path:
    """A staged file as `owner` (e.g. 'p123h0a1b2c3d') would have left it, `age_s` old."""
    path = folder / f"{fileio.TEMP_PREFIX}{owner}.clip-{len(list(folder.iterdir()))}.txt.x1y2z3"
    path.write_text("half")
    if age_s:
        stamp = path.stat().st_mtime - age_s
        os.utime(path, (stamp, stamp))
    return path


def test_only_stale_temporary_files_are_removed(tmp_path):
    from asr_app.writers import remove_stale_temps

    here = fileio.host_tag()
    other = "0" * 8 if here != "0" * 8 else "1" * 8  # another host's tag
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # a process that has exited (its id is not reused this quickly)
    live = _staged(tmp_path, f"p{os.getpid()}h{here}")                # this process, staging right now
    live_aged = _staged(tmp_path, f"p{os.getpid()}h{here}", 1)        # same, written a second ago
    reused = _staged(tmp_path, f"p{os.getpid()}h{here}", 10 * 24 * 3600)  # older than this process: id reused
    dead = _staged(tmp_path, f"p{dead_pid}h{here}")                   # its run was killed
    elsewhere = _staged(tmp_path, f"p{os.getpid()}h{other}")          # another host's: only its age tells
    elsewhere_old = _staged(tmp_path, f"p1h{other}", 2 * 24 * 3600)
    unnamed = tmp_path / f"{fileio.TEMP_PREFIX}clip.txt.abc"          # the older form: no owner in the name
    unnamed.write_text("half")
    (tmp_path / "sub").mkdir()
    unnamed_old = tmp_path / "sub" / f"{fileio.TEMP_PREFIX}old.txt.abc"
    unnamed_old.write_text("half")
    stamp = unnamed_old.stat().st_mtime - 2 * 24 * 3600
    os.utime(unnamed_old, (stamp, stamp))
    removed = set(remove_stale_temps(tmp_path))
    assert removed == {reused, dead, elsewhere_old, unnamed_old}
    assert all(p.exists() for p in (live, live_aged, elsewhere, unnamed))


def test_a_second_run_leaves_a_live_runs_staged_files_alone(tmp_path):
    from asr_app.writers import remove_stale_temps

    staged = fileio._stage(tmp_path / "clip.txt", "hello\n")  # run A staged its file, not renamed yet
    assert fileio.temp_owner(staged.name) == (os.getpid(), fileio.host_tag())
    # run B (another process, this host) starts in the same folder and cleans up before writing
    code = "import sys; from asr_app.writers import remove_stale_temps; print(len(remove_stale_temps(sys.argv[1])))"
    other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                           cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=60)
    assert other.stdout.strip() == "0", other.stderr
    assert staged.exists() and remove_stale_temps(tmp_path) == []
    os.replace(staged, tmp_path / "clip.txt")  # run A goes on
    assert (tmp_path / "clip.txt").read_text() == "hello\n"


def test_the_folder_is_synced_after_the_renames(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", stat.S_ISDIR(os.fstat(fd).st_mode)))
                        or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append(("replace", Path(b).name)) or real_replace(a, b))
    (tmp_path / "sub").mkdir()
    fileio.write_all_atomic({tmp_path / "a.txt": "a", tmp_path / "a.json": "{}", tmp_path / "sub" / "b.txt": "b"})
    renames = [i for i, c in enumerate(calls) if c[0] == "replace"]
    folder_syncs = [i for i, c in enumerate(calls) if c == ("fsync", True)]
    assert len(renames) == 3 and len(folder_syncs) == 2  # each folder once, after every rename
    assert min(folder_syncs) > max(renames)
    assert [c for c in calls[: min(renames)] if c[0] == "fsync"] == [("fsync", False)] * 3  # the files' contents first


def test_a_warning_is_one_line_naming_the_tool():
    """The target given as its own draft: a warning (it is allowed), one line like the errors, without the
    file and source line Python's own format adds."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "asr_app.cli.transcribe", str(JFK_FLAC), "--target", str(TINY_EN_DIR),
                           "--draft", str(TINY_EN_DIR), "--device", "cpu", "--quiet"],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300)
    warned = [line for line in done.stderr.splitlines() if "warning" in line.lower()]
    assert done.returncode == 0 and len(warned) == 1, done.stderr
    assert warned[0].startswith("asr-transcribe: warning: draft") and "is not smaller than target" in warned[0]
    assert "warnings.warn" not in done.stderr and ".py:" not in done.stderr, done.stderr


def test_a_failed_model_load_leaves_no_output_folder_behind(tmp_path, capsys):
    """The output folder is checked before the models load, but made only with the first outputs: a run
    that stops at the models leaves no empty folders."""
    empty_draft = tmp_path / "empty-draft"
    empty_draft.mkdir()
    out = tmp_path / "new" / "sub"
    code = cli.main([str(JFK_FLAC), "--target", str(TINY_EN_DIR), "--draft", str(empty_draft), "-o", str(out),
                     "--device", "cpu"])
    assert code == 2 and "has no config.json" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
