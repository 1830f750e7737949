"""Long-form transcription, writers and the asr-transcribe CLI on real audio with tiny.en."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jiwer
import numpy as np
import pytest
import soundfile as sf
from conftest import (
    DISTIL_DRAFT_DIR,
    JFK_FLAC,
    LIBRISPEECH_DIR,
    LJSPEECH_DIR,
    REPO_ROOT,
    TINY_EN_DIR,
    lj_clip,
    lj_text,
    normalise,
)

from asr_app.audio import SAMPLE_RATE, AudioLoadError, load_audio
from asr_app.cli import transcribe as cli
from asr_app.decoding import Segment
from asr_app.fileio import write_atomic
from asr_app.longform import (
    TranscribeOptions,
    Transcript,
    compression_ratio,
    needs_fallback,
    split_window,
    transcribe,
    transcribe_many,
)
from asr_app.writers import format_timestamp, parse_formats, to_srt, to_vtt

LJ = LJSPEECH_DIR / "wavs"
MODEL_ARGS = ["--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR), "--device", "cpu"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def decoder(tiny_en_pair):
    from asr_app.decoding import DecodingOptions, SpeculativeDecoder

    return SpeculativeDecoder(tiny_en_pair, DecodingOptions(mode="exact"))


@pytest.fixture
def reuse_decoder(monkeypatch, decoder):
    """The CLI would load tiny.en again for every in-process run; hand it the loaded one instead,
    after checking the CLI asked for what this decoder is."""
    def from_args(args):
        assert args.target == str(TINY_EN_DIR) and args.mode == decoder.options.mode
        return decoder
    monkeypatch.setattr("asr_app.arguments.decoder_from_args", from_args)


# -- Whisper's window segmentation (token logic only) ---------------------------------------

TS = 50363  # <|0.00|> for tiny.en


def ts(seconds: float) -> int:
    return TS + int(round(seconds / 0.02))


def fake_decode(ids):
    return " ".join(f"w{i}" for i in ids)


def test_split_window_consecutive_timestamps_seek_to_last_closed_segment():
    tokens = [ts(0), 1, 2, ts(2.0), ts(2.0), 3, ts(5.5), ts(5.5), 4, 5]  # last segment unfinished
    segments, advance = split_window(tokens, TS, 30.0, fake_decode)
    assert [(s.start, s.end, s.text) for s in segments] == [(0.0, 2.0, "w1 w2"), (2.0, 5.5, "w3")]
    assert advance == pytest.approx(5.5)


def test_split_window_single_timestamp_ending_consumes_window():
    tokens = [ts(0), 1, ts(3.0), ts(3.0), 2, ts(7.0)]
    segments, advance = split_window(tokens, TS, 12.0, fake_decode)
    assert [(s.start, s.end) for s in segments] == [(0.0, 3.0), (3.0, 7.0)]
    assert advance == 12.0
    segments, advance = split_window([ts(0), 1, 2, ts(4.0)], TS, 30.0, fake_decode)
    assert [(s.start, s.end, s.text) for s in segments] == [(0.0, 4.0, "w1 w2")] and advance == 30.0


# -- writers -----------------------------------------------------------------------------

SRT_TIME = r"\d\d:\d\d:\d\d,\d\d\d"
VTT_TIME = r"\d\d:\d\d:\d\d\.\d\d\d"


def to_seconds(stamp: str) -> float:
    h, m, s = stamp.replace(",", ".").split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def check_srt(text: str) -> list[tuple[float, float]]:
    cues = []
    blocks = text.strip().split("\n\n")
    for number, block in enumerate(blocks, start=1):
        lines = block.split("\n")
        assert lines[0] == str(number)
        match = re.fullmatch(f"({SRT_TIME}) --> ({SRT_TIME})", lines[1])
        assert match, lines[1]
        assert len(lines) >= 3 and lines[2].strip()
        cues.append((to_seconds(match[1]), to_seconds(match[2])))
    check_monotone(cues)
    return cues


def check_vtt(text: str) -> list[tuple[float, float]]:
    assert text.startswith("WEBVTT\n\n")
    cues = []
    for block in text[len("WEBVTT\n\n"):].strip().split("\n\n"):
        lines = block.split("\n")
        match = re.fullmatch(f"({VTT_TIME}) --> ({VTT_TIME})", lines[0])
        assert match, lines[0]
        assert lines[1].strip()
        cues.append((to_seconds(match[1]), to_seconds(match[2])))
    check_monotone(cues)
    return cues


def check_monotone(cues):
    assert cues
    for (start, end), (next_start, _) in zip(cues, cues[1:] + [(float("inf"), None)]):
        assert start < end <= next_start


def test_timestamp_format_and_writers(tmp_path):
    assert format_timestamp(3725.0456) == "01:02:05,046"
    assert format_timestamp(0.5, ".") == "00:00:00.500"
    transcript = Transcript("x.wav", 10.0, "a b", [Segment(0.0, 1.5, " Hello\n\nthere ", []),
                                                   Segment(1.5, 4.0, "general", [])], "en", "exact")
    assert check_srt(to_srt(transcript)) == [(0.0, 1.5), (1.5, 4.0)]
    assert "Hello there" in to_srt(transcript)  # a blank line inside a cue would end it
    assert check_vtt(to_vtt(transcript)) == [(0.0, 1.5), (1.5, 4.0)]
    assert parse_formats("all") == ["txt", "srt", "vtt", "tsv", "json"] and parse_formats("json,txt") == ["txt", "json"]
    with pytest.raises(ValueError, match="unknown output format"):
        parse_formats("docx")
    target = write_atomic(tmp_path / "out.txt", "complete\n")
    assert target.read_text() == "complete\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


# -- long-form ---------------------------------------------------------------------------

def test_long_form_over_30s_has_monotone_timestamps(decoder):
    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    parts = [load_audio(lj_clip("LJ001-0001")), gap, load_audio(JFK_FLAC), gap, load_audio(lj_clip("LJ001-0003"))]
    audio = np.concatenate(parts)
    assert len(audio) / SAMPLE_RATE > 31.0
    result = transcribe(decoder, audio, TranscribeOptions())
    starts = [s.start for s in result.segments]
    assert starts == sorted(starts)
    assert all(s.start < s.end and s.text for s in result.segments)
    assert all(a.end <= b.start for a, b in zip(result.segments, result.segments[1:]))
    # The last window was reached: text from the third clip, timed after 30 s... of the 31+ s.
    assert result.segments[-1].end > 25.0 and result.segments[-1].end <= result.duration + 0.01
    reference = " ".join([lj_text("LJ001-0001"), (JFK_FLAC.parent / "jfk.txt").read_text(), lj_text("LJ001-0003")])
    assert jiwer.wer(normalise(reference), normalise(result.text)) < 0.2, result.text
    assert result.stats["windows"] >= 2 and result.stats["mode"] == "exact"
    assert 0.0 < result.stats["acceptance_rate"] <= 1.0
    # clean speech needs no temperature fallback
    assert result.stats["temperature_fallbacks"] == 0
    assert result.stats["window_temperatures"] == [0.0] * result.stats["windows"]


def test_dense_speech_keeps_its_timestamps_window_after_window(decoder):
    """The prompt carries the earlier windows' timestamps: with a text-only prompt tiny.en stopped giving
    timestamps after the first window, each window was taken whole, and the speech after its text was lost."""
    clips = [JFK_FLAC, *sorted(LIBRISPEECH_DIR.rglob("*.flac")), *[lj_clip(f"LJ001-{i:04d}") for i in range(1, 9)]]
    gap = np.zeros(int(0.4 * SAMPLE_RATE), dtype=np.float32)
    audio = np.concatenate([part for c in clips for part in (load_audio(c), gap)])
    assert len(audio) / SAMPLE_RATE > 80
    result = transcribe(decoder, audio, TranscribeOptions())
    assert result.stats["windows"] >= 4
    assert max(s.end - s.start for s in result.segments) < 20.0  # no window swallowed whole
    reference = " ".join([(JFK_FLAC.parent / "jfk.txt").read_text()] + [
        line.split(" ", 1)[1] for t in sorted(LIBRISPEECH_DIR.rglob("*.trans.txt")) for line in t.read_text().splitlines()
    ] + [lj_text(f"LJ001-{i:04d}") for i in range(1, 9)])
    assert jiwer.wer(normalise(reference), normalise(result.text)) < 0.12, result.text


def test_fallback_rule_flags_loops_and_improbable_text_but_not_silence():
    from types import SimpleNamespace

    speech = (JFK_FLAC.parent / "jfk.txt").read_text()
    loop = "I'm going to go to the store. " * 12
    assert compression_ratio(speech) < 2.4 < compression_ratio(loop) and compression_ratio("") == 0.0
    options = TranscribeOptions()

    def result(text, avg_logprob=-0.3, no_speech_prob=0.01):
        return SimpleNamespace(text=text, avg_logprob=avg_logprob, no_speech_prob=no_speech_prob)

    assert not needs_fallback(result(speech), options)
    assert needs_fallback(result(loop), options)                       # a repetition loop
    assert needs_fallback(result(speech, avg_logprob=-1.4), options)   # improbable
    assert not needs_fallback(result(speech, avg_logprob=float("nan")), options)  # mode hf reports none
    assert not needs_fallback(result(loop, avg_logprob=-1.4, no_speech_prob=0.9), options)  # silence
    assert not needs_fallback(result(loop), TranscribeOptions(compression_ratio_threshold=None))


class RecordingDecoder:
    """The real decoder, recording each decode's temperature and prompt (`calls`) and seed (`seeds`)."""

    def __init__(self, inner):
        self.inner, self.calls, self.seeds = inner, [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode(self, audio, options=None, prompts=None, hints=None):
        self.calls.append((options.temperature, list(prompts or [])))
        self.seeds.append(options.seed)
        return self.inner.decode(audio, options, prompts, hints)


def test_temperature_fallback_retries_then_drops_the_prompt(decoder):
    from asr_app.decoding import DecodingOptions

    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    parts = [load_audio(lj_clip("LJ001-0001")), gap, load_audio(JFK_FLAC), gap, load_audio(lj_clip("LJ001-0003"))]
    audio = np.concatenate(parts)  # 2 windows
    off = DecodingOptions(mode="off", seed=1)
    normal = RecordingDecoder(decoder)
    plain = transcribe(normal, audio, TranscribeOptions(decoding=off))
    assert [t for t, _ in normal.calls] == [0.0, 0.0] and normal.calls[1][1][0]  # window 2 has a prompt
    # Every window "fails" (mean log-prob is always below 0): each is retried at every temperature of the
    # schedule, the most probable attempt is kept, and after a window kept from above T = 0.5 the next one
    # gets no prompt. Three steps instead of Whisper's six: the same rules, half the sampled decodes.
    forced = RecordingDecoder(decoder)
    schedule = [0.0, 0.4, 1.0]
    result = transcribe(forced, audio, TranscribeOptions(decoding=off, logprob_threshold=0.0,
                                                         temperature_fallback=tuple(schedule[1:])))
    assert [t for t, _ in forced.calls] == schedule * 2
    kept = result.stats["window_temperatures"]
    assert len(kept) == 2 and set(kept) <= set(schedule)
    assert (forced.calls[len(schedule)][1] == [None]) == (kept[0] > 0.5)
    assert result.stats["temperature_fallbacks"] == 4
    # Greedy decodes keep the seed; every sampled retry draws its own stream: one seed for all would give
    # window 2's retry at T = 0.4 the uniforms of window 1's.
    assert [forced.seeds[i] for i in (0, 3)] == [1, 1]
    sampled = [forced.seeds[i] for i in (1, 2, 4, 5)]
    assert len(set(sampled)) == 4 and 1 not in sampled
    assert TranscribeOptions().temperature_fallback == (0.2, 0.4, 0.6, 0.8, 1.0)   # Whisper's, by default
    assert result.text and plain.stats["temperature_fallbacks"] == 0
    # sampling at T = 1 from tiny.en still transcribes this clean speech roughly
    assert jiwer.wer(normalise(plain.text), normalise(result.text)) < 0.6, result.text


def test_sampled_windows_draw_their_own_streams_whatever_came_before(decoder):
    # At T > 0 each window decodes with a seed of its own, derived from the job's seed and the window's audio:
    # two windows never share uniforms, and a file transcribes alike alone or after another file.
    from asr_app.decoding import DecodingOptions

    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    audio = np.concatenate([load_audio(lj_clip("LJ001-0001")), gap, load_audio(JFK_FLAC), gap,
                            load_audio(lj_clip("LJ001-0003"))])  # 2 windows
    options = TranscribeOptions(decoding=DecodingOptions(mode="exact", temperature=0.5, seed=3), temperature_fallback=())
    alone = RecordingDecoder(decoder)
    text = transcribe(alone, audio, options).text
    assert len(alone.seeds) == 2 and len(set(alone.seeds)) == 2 and 3 not in alone.seeds
    after = RecordingDecoder(decoder)
    outcomes = dict(transcribe_many(after, [("jfk", JFK_FLAC), ("long", audio)], options))
    assert after.seeds[1:] == alone.seeds and outcomes["long"].text == text


class PromptSilencedDecoder(RecordingDecoder):
    """The real decoder, except that a window decoded with a prompt comes back judged silent: what a prompt
    did to 30 s of clear speech in a 2-hour recording (a case too long to decode in a test)."""

    def decode(self, audio, options=None, prompts=None, hints=None):
        results = super().decode(audio, options, prompts, hints)
        for result, prompt in zip(results, prompts or [None] * len(results)):
            if prompt:
                result.no_speech_prob, result.avg_logprob = 0.9, -1.5
        return results


def test_speech_dropped_for_its_prompt_is_decoded_again_without_it(decoder):
    from asr_app.decoding import DecodingOptions

    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    parts = [load_audio(lj_clip("LJ001-0001")), gap, load_audio(JFK_FLAC), gap, load_audio(lj_clip("LJ001-0003"))]
    silenced = PromptSilencedDecoder(decoder)
    options = TranscribeOptions(decoding=DecodingOptions(mode="off"), temperature_fallback=())
    result = transcribe(silenced, np.concatenate(parts), options)
    prompts = [p[0] for _, p in silenced.calls]
    assert prompts[0] is None and prompts[1] and prompts[2] is None  # window 2 retried without its prompt
    assert result.stats["prompt_retries"] == 1
    assert "country" in normalise(result.text) and "exhibition" in normalise(result.text)  # nothing lost


def test_when_every_temperature_fails_the_most_probable_attempt_is_kept():
    from types import SimpleNamespace

    from asr_app.longform import _best_attempt

    def attempt(text, logprob):
        return SimpleNamespace(text=text, avg_logprob=logprob)

    speech, loop = "and so my fellow americans ask not", "la la la la la la la la la la la la la la la la la la"
    options = TranscribeOptions()
    attempts = [(attempt(speech, -1.5), 0.0), (attempt(speech, -1.2), 0.4), (attempt(loop, -0.3), 0.6),
                (attempt(speech, float("nan")), 1.0)]
    assert _best_attempt(attempts, options)[1] == 0.4  # the loop is more probable but a loop
    assert _best_attempt([(attempt(loop, -2.0), 0.0), (attempt(loop, -0.5), 0.2)], options)[1] == 0.2


def test_batched_files_match_one_by_one(decoder):
    missing = Path("/nonexistent/missing.wav")
    clips = [lj_clip("LJ001-0002"), lj_clip("LJ001-0008"), missing]
    progress = []
    outcomes = dict(transcribe_many(decoder, [(c.name, c) for c in clips], TranscribeOptions(batch_size=2),
                                    on_progress=progress.append))
    assert isinstance(outcomes[missing.name], AudioLoadError) and "file not found" in str(outcomes[missing.name])
    for clip in clips[:2]:
        alone = transcribe(decoder, clip)
        assert outcomes[clip.name].text == alone.text and alone.text
        assert [(s.start, s.end) for s in outcomes[clip.name].segments] == [(s.start, s.end) for s in alone.segments]
    assert sum(progress) == pytest.approx(sum(len(load_audio(c)) for c in clips[:2]) / SAMPLE_RATE)


# -- the CLI -----------------------------------------------------------------------------

def make_folder(root: Path) -> Path:
    folder = root / "in"
    (folder / "nested").mkdir(parents=True)
    (folder / "jfk.flac").symlink_to(JFK_FLAC)
    (folder / "nested" / "lj2.wav").symlink_to(lj_clip("LJ001-0002"))
    (folder / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk" * 10)
    (folder / "readme.txt").write_text("not audio, must be ignored")
    return folder


def test_cli_folder_all_formats_errors_and_skip_existing(tmp_path, capsys, reuse_decoder):
    folder = make_folder(tmp_path)
    out = tmp_path / "out"
    status = cli.main([str(folder), "-o", str(out), "--format", "all", "--recursive", "--quiet", *MODEL_ARGS])
    err = capsys.readouterr().err
    assert status == 1
    assert re.search(r"broken\.wav: not a readable audio file", err)
    assert "2 transcribed, 1 failed" in err
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(f"{stem}.{fmt}" for stem in ("jfk", "nested/lj2") for fmt in ("json", "srt", "tsv", "txt", "vtt"))
    assert "ask not what your country can do for you" in (out / "jfk.txt").read_text().lower()
    check_srt((out / "jfk.srt").read_text())
    check_vtt((out / "nested" / "lj2.vtt").read_text())
    data = json.loads((out / "jfk.json").read_text())
    assert data["segments"] and data["segments"][-1]["end"] <= 11.0 + 0.01
    assert data["stats"]["mode"] == "exact" and 0.0 < data["stats"]["acceptance_rate"] <= 1.0
    assert data["timings"]["decode_s"] > 0 and data["duration"] == pytest.approx(11.0, abs=0.01)

    # Rerun: existing outputs are left alone; only the still-failing file is attempted again.
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    status = cli.main([str(folder), "-o", str(out), "--format", "all", "--recursive", "--skip-existing",
                       "--quiet", *MODEL_ARGS])
    err = capsys.readouterr().err
    assert status == 1 and "0 transcribed, 1 failed, 2 skipped" in err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    (folder / "broken.wav").unlink()
    assert cli.main([str(folder), "-o", str(out), "--format", "all", "--recursive", "--skip-existing",
                     *MODEL_ARGS]) == 0
    assert "nothing to do" in capsys.readouterr().err


def test_cli_without_output_dir_prints_transcript(capsys, reuse_decoder):
    assert cli.main([str(JFK_FLAC), "--quiet", *MODEL_ARGS]) == 0
    captured = capsys.readouterr()
    assert "ask not what your country can do for you" in captured.out.lower()
    assert "1 transcribed, 0 failed" in captured.err


@pytest.mark.parametrize("flag", [[], ["--no-fallback"]])
def test_cli_fallback_switch(capsys, reuse_decoder, monkeypatch, flag):
    import asr_app.longform as module

    seen = []
    real = module.transcribe_many

    def recording(decoder, items, options, on_progress=None):
        seen.append(options)
        return real(decoder, items, options, on_progress)

    monkeypatch.setattr(module, "transcribe_many", recording)
    assert cli.main([str(JFK_FLAC), "--quiet", *MODEL_ARGS, *flag]) == 0
    assert "ask not what your country" in capsys.readouterr().out.lower()
    assert seen[0].temperature_fallback == (() if flag else (0.2, 0.4, 0.6, 0.8, 1.0))


def test_output_names_keep_the_extension_only_where_it_tells_files_apart(tmp_path):
    from asr_app.cli.transcribe import collect_jobs

    for name in ("one/a.wav", "one/a.flac", "one/b.wav", "one/sub/c.wav", "two/a.wav"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    jobs, errors = collect_jobs([str(tmp_path / "one"), str(tmp_path / "one" / "b.wav")], recursive=True)
    assert sorted(j.stem for j in jobs) == ["a.flac", "a.wav", "b", "sub/c"] and errors == []
    # the same name from two folders given: the extension does not tell them apart, so the second is skipped
    jobs, errors = collect_jobs([str(tmp_path / "one" / "b.wav"), str(tmp_path / "two"), str(tmp_path / "one")],
                                recursive=False)
    assert sorted(j.stem for j in jobs) == ["a.flac", "a.wav", "b"]
    assert len(errors) == 1 and "two/a.wav: output name 'a.wav' already used by" not in errors[0]
    assert "one/a.wav: output name 'a.wav' already used by" in errors[0] and errors[0].endswith("two/a.wav; skipped")


def test_cli_files_that_share_a_name_are_all_transcribed_under_their_full_names(tmp_path, capsys, reuse_decoder):
    """a.wav beside a.flac: both are transcribed, into a.wav.txt and a.flac.txt (one used to be skipped, even
    when printing to the terminal); a file listed twice is decoded once; other names are left as they were."""
    import soundfile as sf

    folder = tmp_path / "same"
    folder.mkdir()
    audio, rate = sf.read(str(lj_clip("LJ001-0002")))
    sf.write(str(folder / "a.wav"), audio, rate)
    sf.write(str(folder / "a.flac"), audio, rate)
    (folder / "b.wav").symlink_to(lj_clip("LJ001-0008"))
    out = tmp_path / "out"
    status = cli.main([str(folder), str(folder / "b.wav"), "-o", str(out), "--quiet", *MODEL_ARGS])
    err = capsys.readouterr().err
    assert status == 0 and "3 transcribed, 0 failed" in err and "skipped" not in err
    assert sorted(p.name for p in out.iterdir()) == ["a.flac.txt", "a.wav.txt", "b.txt"]
    assert (out / "a.wav.txt").read_text() == (out / "a.flac.txt").read_text() != ""
    assert cli.main([str(folder / "a.wav"), str(folder / "a.flac"), "--quiet", *MODEL_ARGS]) == 0
    assert "2 transcribed, 0 failed" in capsys.readouterr().err


def test_cli_non_recursive_ignores_nested_and_reports_missing(tmp_path, capsys, reuse_decoder):
    folder = tmp_path / "only_nested"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.wav").symlink_to(lj_clip("LJ001-0002"))
    assert cli.main([str(folder), str(tmp_path / "missing.flac"), "-o", str(tmp_path / "o"), *MODEL_ARGS]) == 1
    err = capsys.readouterr().err
    assert "no audio files found (try --recursive)" in err and "missing.flac: no such file or folder" in err
    assert not (tmp_path / "o" / "sub").exists()


SIX_CLIPS = ["LJ001-0002", "LJ001-0008", "LJ001-0006", "LJ001-0004", "LJ001-0005", "LJ001-0007"]


def _folder_run_stopped_by(sig: int, tmp_path: Path, formats: str) -> tuple[subprocess.Popen, Path, Path, str]:
    """asr-transcribe over a folder of six clips in a child process, sent `sig` once the first file is written
    -> (the process, the input folder, the output folder, its stderr)."""
    folder = tmp_path / "in"
    folder.mkdir()
    for clip in SIX_CLIPS:
        (folder / f"{clip}.flac").symlink_to(lj_clip(clip))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "asr_app.cli.transcribe", str(folder), "-o", str(out), "--format", formats,
               "--quiet", "--mode", "off", *MODEL_ARGS]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("*.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    return proc, folder, out, err.decode()


def test_sigkill_mid_run_leaves_no_partial_outputs(tmp_path):
    clips = SIX_CLIPS
    proc, folder, out, err = _folder_run_stopped_by(signal.SIGKILL, tmp_path, "all")
    assert proc.returncode == -signal.SIGKILL, err
    survivors = {p.name: p.read_bytes() for p in out.iterdir()}
    assert 0 < len(survivors) < 4 * len(clips)  # killed after the first file and before the last
    assert not [name for name in survivors if name.startswith(".")]  # no temporary leftovers

    # Resume: only what is missing is done, and every file the killed run left is complete
    # (byte-identical to what the resumed run writes for files it had to redo).
    assert cli.main([str(folder), "-o", str(out), "--format", "all", "--skip-existing", "--quiet",
                     "--mode", "off", *MODEL_ARGS]) == 0
    finished = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(finished) == sorted(f"{c}.{fmt}" for c in clips for fmt in ("json", "srt", "tsv", "txt", "vtt"))
    for name, content in survivors.items():
        stem, fmt = name.rsplit(".", 1)
        if f"{stem}.json" in survivors:
            # JSON is written last, so this file's outputs were all complete: they must parse.
            text = content.decode()
            {"json": json.loads, "srt": check_srt, "vtt": check_vtt, "txt": lambda t: t.endswith("\n"),
             "tsv": lambda t: t.startswith("start\tend\ttext\n")}[fmt](text)
        else:
            # Killed between formats: the resumed run redid the file; greedy decoding is
            # deterministic, so a complete survivor is byte-identical to the redone one.
            assert finished[name] == content, name
    for clip in clips:
        text = (out / f"{clip}.txt").read_text()
        assert jiwer.wer(normalise(lj_text(clip)), normalise(text)) < 0.35, (clip, text)


def test_ctrl_c_mid_run_is_one_line_and_leaves_complete_files(tmp_path):
    """SIGINT (Ctrl-C) while a folder is transcribed: exit 130 with one line, no traceback (it was 48 lines
    into torch), and only complete outputs."""
    proc, _, out, err = _folder_run_stopped_by(signal.SIGINT, tmp_path, "txt,json")
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "asr-transcribe: interrupted" in err, err
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]   # no temporary leftovers
    for done in out.glob("*.json"):   # JSON is written last: its file's other outputs are complete
        assert json.loads(done.read_text())["text"].strip() == done.with_suffix(".txt").read_text().strip()


def test_duration_probe_handles_bad_file(tmp_path):
    bad = tmp_path / "x.wav"
    bad.write_text("nope")
    assert cli._duration(bad) == 0.0
    assert cli._duration(lj_clip("LJ001-0002")) == pytest.approx(sf.info(str(lj_clip("LJ001-0002"))).duration)


def test_silence_is_skipped_not_transcribed(decoder):
    # tiny.en says "you" when it decodes 2 s of digital zeros; the energy gate must stop that, in a
    # file of pure silence and in the silent stretch between two real clips.
    silent = transcribe(decoder, np.zeros(2 * SAMPLE_RATE, dtype=np.float32))
    assert silent.text == "" and silent.segments == []
    speech = load_audio(lj_clip("LJ001-0002"))
    gap = np.zeros(65 * SAMPLE_RATE, dtype=np.float32)  # at least one whole 30 s window of pure silence
    padded = transcribe(decoder, np.concatenate([speech, gap, speech]))
    alone = transcribe(decoder, speech)
    words = padded.text.lower().split()
    assert words.count("comparatively") == 2, padded.text
    assert "you" not in alone.text.lower().split() and "you" not in words
    assert padded.stats["windows"] == 2  # decoded windows: the two with speech; the silent ones were skipped
    starts = [s.start for s in padded.segments]
    assert starts == sorted(starts) and padded.segments[-1].start >= 60.0


def test_a_cancelled_job_stops_between_silent_windows_and_closes_its_file(decoder, tmp_path, monkeypatch):
    """Silent windows are read and skipped without a decode, so no decoder ever sees a cancellation there:
    transcribe_many looks at `cancelled` itself each round (a server's client that left a long silent upload
    had it read to its end). The file is closed on the way out."""
    import threading

    import asr_app.longform as longform

    path = tmp_path / "silence.flac"
    sf.write(str(path), np.zeros(10 * 60 * 8000, dtype=np.int16), 8000, subtype="PCM_16")   # 20 windows
    cancelled, windows, closed = threading.Event(), [], []
    opened = longform._open

    def tracked_open(key, src):
        job = opened(key, src)
        close = job.audio.close
        job.audio.close = lambda: (closed.append(key), close())
        return job

    def progress(seconds: float) -> None:
        windows.append(seconds)
        if len(windows) == 3:
            cancelled.set()

    monkeypatch.setattr(longform, "_open", tracked_open)
    outcomes = longform.transcribe_many(decoder, [("silence", path)], on_progress=progress, cancelled=cancelled)
    with pytest.raises(ConnectionAbortedError, match="went away"):
        list(outcomes)
    assert windows == [30.0] * 3 and closed == ["silence"], (windows, closed)
