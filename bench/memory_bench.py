"""Memory and throughput on long files: `asr-transcribe` on a 1-minute and a 2-hour recording.

The recordings are real speech laid end to end with 0.4 s pauses (jfk, 4 LibriSpeech test-clean and
32 LJSpeech clips, 4.6 min with references, repeated to the length asked for), written block by
block as 16 kHz mono FLAC so that making them needs little memory. Each run is one `asr-transcribe`
process (tiny.en + the bundled draft, greedy, default mode, `--threads 1`); its peak RSS comes from
the kernel's accounting of that child alone (`os.wait4`).

Reported per file: peak RSS, wall seconds, audio-s/s, WER of the whole transcript against the joined
references, and how many 30 s stretches of the timeline got no text although every one holds speech
(lost speech shows up there).

    python bench/memory_bench.py --minutes 1 120
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
from report_io import result_path, save_results

from asr_app.audio import SAMPLE_RATE, load_audio
from asr_app.wer import PACKAGED_SPELLING, corpus_wer, english_normalizer

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PAUSE_S = 0.4
STRETCH_S = 30.0


@dataclass
class Run:
    minutes: float
    audio_s: float
    wall_s: float
    audio_s_per_s: float
    peak_rss_mib: float
    wer: float
    stretches: int
    stretches_without_text: int


def clips(shared: Path) -> list[tuple[np.ndarray, str]]:
    audio = shared / "audio"
    out = [(load_audio(audio / "jfk" / "jfk.flac"), (audio / "jfk" / "jfk.txt").read_text().strip())]
    for trans in sorted((audio / "librispeech").rglob("*.trans.txt")):
        for line in trans.read_text().splitlines():
            key, text = line.split(" ", 1)
            out.append((load_audio(trans.parent / f"{key}.flac"), text))
    lj = dict(line.split("|", 1) for line in (audio / "ljspeech" / "metadata.csv").read_text().splitlines())
    for key in sorted(lj):
        wav = audio / "ljspeech" / "wavs" / f"{key}.wav"
        if wav.exists():
            out.append((load_audio(wav), lj[key]))
    return out


def write_recording(path: Path, speech: list[tuple[np.ndarray, str]], seconds: float) -> str:
    """Tile the clips (with pauses) up to `seconds`, cutting the last one at a clip boundary; the joined
    reference of what was written."""
    pause = np.zeros(int(PAUSE_S * SAMPLE_RATE), dtype=np.float32)
    written, words = 0, []
    with sf.SoundFile(path, "w", samplerate=SAMPLE_RATE, channels=1, format="FLAC", subtype="PCM_16") as out:
        while True:
            for audio, text in speech:
                if written + len(audio) > seconds * SAMPLE_RATE:
                    return " ".join(words)
                out.write(audio)
                out.write(pause)
                written += len(audio) + len(pause)
                words.append(text)


def transcribe(path: Path, out_dir: Path, threads: int) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one asr-transcribe process."""
    cmd = [sys.executable, "-m", "asr_app.cli.transcribe", str(path), "-o", str(out_dir), "-f", "json",
           "--device", "cpu", "--threads", str(threads), "--quiet"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"asr-transcribe failed on {path} (exit {proc.returncode})")
    return wall, usage.ru_maxrss / 1024


def stretches_without_text(segments: list[dict], audio_s: float) -> tuple[int, int]:
    count = int(audio_s // STRETCH_S)
    covered = {int(s["start"] // STRETCH_S) for s in segments if s["text"].strip()}
    covered |= {int(s["end"] // STRETCH_S) for s in segments if s["text"].strip()}
    return count, sum(1 for i in range(count) if i not in covered)


def measure(minutes: float, speech, work: Path, threads: int, normalize) -> Run:
    path = work / f"speech_{minutes:g}min.flac"
    reference = write_recording(path, speech, minutes * 60)
    audio_s = sf.info(str(path)).duration
    wall, rss = transcribe(path, work / "out", threads)
    result = json.loads((work / "out" / f"{path.stem}.json").read_text())
    wer = corpus_wer([normalize(reference)], [normalize(result["text"])]).wer
    count, empty = stretches_without_text(result["segments"], audio_s)
    path.unlink()
    return Run(minutes, audio_s, wall, audio_s / wall, rss, wer, count, empty)


def table(runs: list[Run]) -> str:
    head = "| recording | audio s | wall s | audio-s/s | peak RSS MiB | WER % | 30 s stretches without text |"
    rows = [f"| {r.minutes:g} min | {r.audio_s:.0f} | {r.wall_s:.1f} | {r.audio_s_per_s:.1f} | {r.peak_rss_mib:.0f} "
            f"| {100 * r.wer:.2f} | {r.stretches_without_text} / {r.stretches} |" for r in runs]
    return "\n".join([head, "|---|---|---|---|---|---|---|", *rows])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, nargs="+", default=[1.0, 120.0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--work", type=Path, default=Path("/tmp/asr-memory-bench"))
    ap.add_argument("--out", type=Path, default=None,
                    help="default: bench/results/<cpu>/<date>/memory_bench.json")
    args = ap.parse_args(argv)
    args.out = args.out or result_path("memory_bench")
    args.work.mkdir(parents=True, exist_ok=True)
    speech = clips(args.shared)
    normalize = english_normalizer(json.loads(PACKAGED_SPELLING.read_text()))
    runs = []
    for minutes in args.minutes:
        runs.append(measure(minutes, speech, args.work, args.threads, normalize))
        print(table(runs[-1:]).splitlines()[-1], flush=True)
    text = table(runs)
    if len(runs) >= 2:
        text += f"\n\npeak RSS difference, longest vs shortest: {runs[-1].peak_rss_mib - runs[0].peak_rss_mib:+.0f} MiB"
    save_results(args.out, {"threads": args.threads, "runs": [asdict(r) for r in runs]}, text)


if __name__ == "__main__":
    main()
