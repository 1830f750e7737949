"""Evaluation datasets: utterances with reference transcripts.

Every loader returns a list of `Utterance` records in a stable order (sorted ids), so
`--max-samples N` picks the same N utterances on every run and every machine.
Audio is read later, one utterance at a time, so a corrupt file costs one utterance
(reported and counted by the runner) instead of the whole run.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr_app.folders import files_under

DATASETS = ("librispeech", "ljspeech", "folder", "local")
AUDIO_SUFFIXES = (".flac", ".wav", ".mp3", ".ogg", ".opus", ".m4a", ".aiff", ".aif")
MANIFEST_NAMES = ("manifest.jsonl", "manifest.tsv")
LIBRISPEECH_HF_ID = "openslr/librispeech_asr"
LIBRISPEECH_HOWTO = (
    "download the split from OpenSLR resource 12 (https://www.openslr.org/12, e.g. test-clean.tar.gz), "
    "unpack it and pass --data-dir pointing at the folder holding LibriSpeech/ (or at the split itself); "
    "or install the Hugging Face `datasets` package and run online without --data-dir"
)


class DatasetError(RuntimeError):
    """A dataset that cannot be found or read; the message says where we looked and what to do."""


@dataclass(frozen=True)
class Utterance:
    id: str
    reference: str
    audio_path: Path | None = None
    # In-memory audio (Hugging Face `datasets` rows); `audio_path` is None then.
    samples: np.ndarray | None = None
    sample_rate: int | None = None

    @property
    def source(self) -> str:
        return str(self.audio_path) if self.audio_path is not None else f"<in-memory {self.id}>"


def _is_audio(path: Path) -> bool:
    return path.suffix.lower() in AUDIO_SUFFIXES


def load_dataset(
    name: str, data_dir: str | Path | None = None, split: str = "test-clean", max_samples: int | None = None
) -> list[Utterance]:
    """Utterances of dataset `name` ("librispeech", "ljspeech" or "folder")."""
    loaders: dict[str, Callable[..., list[Utterance]]] = {
        "librispeech": load_librispeech,
        "ljspeech": load_ljspeech,
        "folder": load_folder,
        "local": load_local,
    }
    if name not in loaders:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if name == "librispeech":
        utterances = load_librispeech(data_dir, split=split, max_samples=max_samples)
    elif name == "local":
        utterances = load_local(data_dir)
    else:
        if data_dir is None:
            raise DatasetError(f"dataset {name!r} needs --data-dir (a local folder)")
        utterances = loaders[name](data_dir)
    if max_samples is not None:
        utterances = utterances[:max_samples]
    if not utterances:
        raise DatasetError(f"dataset {name!r} at {data_dir}: no utterances found")
    return utterances


# --- LibriSpeech ---------------------------------------------------------------------------------


def _is_librispeech_split(folder: Path) -> bool:
    return folder.is_dir() and next(folder.glob("*/*/*.trans.txt"), None) is not None


def librispeech_candidates(data_dir: str | Path | None, split: str) -> list[Path]:
    """Folders that may be the split, in the order they are tried."""
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        return [root, root / "LibriSpeech" / split, root / split]
    roots = [Path(p) for p in os.environ.get("ASR_EVAL_DATA_DIR", "").split(os.pathsep) if p]
    roots += [Path.cwd() / "data", Path.home() / ".cache" / "asr_app" / "data"]
    return [c for r in roots for c in (r / "LibriSpeech" / split, r / split)]


def load_librispeech(
    data_dir: str | Path | None = None, split: str = "test-clean", max_samples: int | None = None
) -> list[Utterance]:
    """LibriSpeech from a local folder in the standard layout, else from Hugging Face `datasets`.

    With `data_dir` given only that folder is tried (as the split itself, `LibriSpeech/<split>` or
    `<split>` under it). Without it, the default local places are tried, then the hub.
    """
    candidates = librispeech_candidates(data_dir, split)
    for folder in candidates:
        if _is_librispeech_split(folder):
            if folder.name in _HF_SPLITS and folder.name != split:
                raise DatasetError(f"--data-dir {folder} is LibriSpeech split {folder.name!r} but --split is {split!r}; "
                                   f"pass --split {folder.name} or the folder holding {split}")
            return read_librispeech_split(folder)
    looked = ", ".join(str(c) for c in candidates)
    if data_dir is not None:
        if not Path(data_dir).expanduser().exists():
            raise DatasetError(f"LibriSpeech data dir {data_dir} does not exist (looked in {looked}); {LIBRISPEECH_HOWTO}")
        raise DatasetError(
            f"no LibriSpeech split {split!r} (<speaker>/<chapter>/*.trans.txt) under {data_dir}; "
            f"looked in {looked}; {LIBRISPEECH_HOWTO}"
        )
    return load_librispeech_hf(split, max_samples=max_samples, looked=looked)


def read_librispeech_split(folder: Path) -> list[Utterance]:
    utterances = []
    for trans in sorted(folder.glob("*/*/*.trans.txt")):
        for line in trans.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            utt_id, _, text = line.strip().partition(" ")
            # A missing or corrupt .flac is reported per utterance by the runner, not here.
            utterances.append(Utterance(id=utt_id, reference=text.strip(), audio_path=trans.parent / f"{utt_id}.flac"))
    return sorted(utterances, key=lambda u: u.id)


_HF_SPLITS = {
    "test-clean": ("clean", "test"), "test-other": ("other", "test"),
    "dev-clean": ("clean", "validation"), "dev-other": ("other", "validation"),
    "train-clean-100": ("clean", "train.100"), "train-clean-360": ("clean", "train.360"),
    "train-other-500": ("other", "train.500"),
}


def load_librispeech_hf(split: str, max_samples: int | None = None, looked: str = "") -> list[Utterance]:
    """LibriSpeech rows streamed from the Hugging Face hub (only `max_samples` rows are fetched)."""
    where = f"no local LibriSpeech found (looked in {looked}) and "
    try:
        import datasets  # optional: not a dependency of the project
    except ImportError:
        raise DatasetError(where + f"the `datasets` package is not installed; {LIBRISPEECH_HOWTO}") from None
    if split not in _HF_SPLITS:
        raise DatasetError(f"unknown LibriSpeech split {split!r}; choose one of {', '.join(_HF_SPLITS)}")
    config, hf_split = _HF_SPLITS[split]
    try:
        rows = datasets.load_dataset(LIBRISPEECH_HF_ID, config, split=hf_split, streaming=True)
        utterances = []
        for row in rows:
            samples, rate = _hf_audio(row["audio"])
            utterances.append(Utterance(id=str(row["id"]), reference=row["text"], samples=samples, sample_rate=rate))
            if max_samples is not None and len(utterances) >= max_samples:
                break
    except Exception as exc:  # offline, hub errors, missing audio decoder: all end the same way
        raise DatasetError(
            where + f"loading {LIBRISPEECH_HF_ID} ({config}/{hf_split}) from the hub failed: "
            f"{type(exc).__name__}: {exc}; {LIBRISPEECH_HOWTO}"
        ) from exc
    return utterances


def _hf_audio(audio: object) -> tuple[np.ndarray, int]:
    if isinstance(audio, dict):
        return np.asarray(audio["array"], dtype=np.float32), int(audio["sampling_rate"])
    decoded = audio.get_all_samples()  # datasets >= 4 returns a torchcodec AudioDecoder
    return decoded.data.numpy().T.astype(np.float32), int(decoded.sample_rate)


# --- LJSpeech ------------------------------------------------------------------------------------


def load_ljspeech(data_dir: str | Path) -> list[Utterance]:
    """LJSpeech: `metadata.csv` (`id|text` or `id|text|normalized_text`) and `wavs/<id>.wav` (or another
    audio format under the same name, e.g. a copy converted to FLAC)."""
    root = Path(data_dir).expanduser()
    candidates = [root, root / "LJSpeech-1.1"]
    metadata = next((c / "metadata.csv" for c in candidates if (c / "metadata.csv").is_file()), None)
    if metadata is None:
        raise DatasetError(
            f"no LJSpeech metadata.csv in {' or '.join(str(c) for c in candidates)}; download LJSpeech-1.1 "
            "(https://keithito.com/LJ-Speech-Dataset/), unpack it and pass --data-dir pointing at it"
        )
    utterances = []
    with metadata.open(encoding="utf-8", newline="") as fh:
        for line_no, row in enumerate(csv.reader(fh, delimiter="|", quoting=csv.QUOTE_NONE), start=1):
            if not row or not row[0].strip():
                continue
            if len(row) < 2:
                raise DatasetError(f"{metadata}:{line_no}: expected 'id|text', got {'|'.join(row)!r}")
            # The third column (when present) spells numbers out as spoken; prefer it.
            text = row[2] if len(row) >= 3 and row[2].strip() else row[1]
            utt_id = row[0].strip()
            utterances.append(Utterance(id=utt_id, reference=text.strip(), audio_path=_lj_audio(metadata.parent, utt_id)))
    return sorted(utterances, key=lambda u: u.id)


def _lj_audio(root: Path, utt_id: str) -> Path:
    wav = root / "wavs" / f"{utt_id}.wav"
    if wav.exists():
        return wav
    other = next((root / "wavs" / f"{utt_id}{suffix}" for suffix in AUDIO_SUFFIXES
                  if (root / "wavs" / f"{utt_id}{suffix}").exists()), None)
    return other or wav  # a missing file is reported when it is read, like any other


# --- folder / manifest ---------------------------------------------------------------------------


def load_folder(data_dir: str | Path) -> list[Utterance]:
    """Audio files with same-name `.txt` transcripts, or a manifest.

    `data_dir` may be a `.tsv`/`.jsonl` manifest, or a folder holding `manifest.jsonl`/`manifest.tsv`,
    or a folder of audio files (searched recursively) each with a `.txt` beside it.
    """
    path = Path(data_dir).expanduser()
    if not path.exists():
        raise DatasetError(f"folder dataset {path} does not exist; pass --data-dir with audio files and same-name .txt transcripts, or a .tsv/.jsonl manifest")
    if path.is_file():
        return read_manifest(path)
    for name in MANIFEST_NAMES:
        if (path / name).is_file():
            return read_manifest(path / name)
    utterances = []
    audio_files = files_under(path, _is_audio)
    for audio in audio_files:
        transcript = audio.with_suffix(".txt")
        if transcript.is_file():
            utt_id = str(audio.relative_to(path).with_suffix(""))
            utterances.append(Utterance(id=utt_id, reference=transcript.read_text(encoding="utf-8").strip(), audio_path=audio))
    if not utterances:
        raise DatasetError(
            f"no audio file with a same-name .txt transcript under {path} (found {len(audio_files)} audio files) "
            f"and no {' or '.join(MANIFEST_NAMES)}"
        )
    return utterances


def read_manifest(manifest: Path) -> list[Utterance]:
    """TSV (`path<TAB>text`, optional header) or JSONL (`audio`/`audio_filepath`/`path` + `text`).

    Relative audio paths are relative to the manifest's folder.
    """
    suffix = manifest.suffix.lower()
    rows: list[tuple[int, str, str, str | None]] = []  # line, audio, text, id
    lines = manifest.read_text(encoding="utf-8").splitlines()
    if suffix == ".jsonl":
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{manifest}:{line_no}: not valid JSON ({exc.msg})") from None
            audio = next((record[k] for k in ("audio", "audio_filepath", "path", "file") if k in record), None)
            text = next((record[k] for k in ("text", "sentence", "transcript") if k in record), None)
            if not isinstance(audio, str) or not isinstance(text, str):
                raise DatasetError(f"{manifest}:{line_no}: needs an audio path ('audio') and a 'text' string")
            rows.append((line_no, audio, text, record.get("id")))
    elif suffix == ".tsv":
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            audio, sep, text = line.partition("\t")
            if line_no == 1 and audio.strip().lower() in ("path", "audio", "file", "audio_filepath"):
                continue
            if not sep:
                raise DatasetError(f"{manifest}:{line_no}: expected 'path<TAB>text'")
            rows.append((line_no, audio.strip(), text, None))
    else:
        raise DatasetError(f"{manifest}: unknown manifest type {suffix!r}; use .tsv or .jsonl")
    utterances = []
    for _line_no, audio, text, utt_id in rows:
        audio_path = Path(audio).expanduser()
        if not audio_path.is_absolute():
            audio_path = manifest.parent / audio_path
        utterances.append(Utterance(id=str(utt_id or Path(audio).with_suffix("")), reference=text.strip(), audio_path=audio_path))
    if not utterances:
        raise DatasetError(f"{manifest}: no entries")
    return utterances


# --- local: every clip the project has ----------------------------------------------------------


def local_roots(data_dir: str | Path | None = None) -> list[Path]:
    """The folders `local` reads: `data_dir` (several joined with os.pathsep), else the repository's
    tests/data/audio and the team's ../shared/audio beside the repository (either may be absent)."""
    if data_dir is not None:
        return [Path(p).expanduser() for p in str(data_dir).split(os.pathsep) if p]
    repo = Path(__file__).resolve().parents[2]
    return [repo / "tests" / "data" / "audio", repo.parent / "shared" / "audio"]


def load_local(data_dir: str | Path | None = None) -> list[Utterance]:
    """Every audio file under the roots, once per id (the file name without its suffix; the first root
    holding an id wins, so a clip copied into tests/data is not counted twice), with its transcript where
    one is found (`local_transcripts`); a clip without one gets an empty reference."""
    roots = local_roots(data_dir)
    present = [r for r in roots if r.is_dir()]
    if not present:
        raise DatasetError(f"dataset 'local': none of {', '.join(str(r) for r in roots)} exists; pass --data-dir "
                           "with folders of audio (joined with os.pathsep)")
    found: dict[str, Utterance] = {}
    for root in present:
        texts = local_transcripts(root)
        for audio in files_under(root, _is_audio):
            found.setdefault(audio.stem, Utterance(id=audio.stem, reference=texts.get(audio.stem, ""), audio_path=audio))
    return sorted(found.values(), key=lambda u: u.id)


def local_transcripts(root: Path) -> dict[str, str]:
    """Transcripts by clip id under `root`: LibriSpeech `*.trans.txt` (`id text`), `metadata.csv` and
    `sentences.txt` tables (`id|text[|normalised text]`, the last column preferred as in LJSpeech), and a
    `.txt` beside an audio file of the same name."""
    texts: dict[str, str] = {}
    # One walk of the tree (it may be large, behind links) for all three kinds of transcript file.
    found = files_under(root, lambda p: p.suffix == ".txt" or p.name == "metadata.csv")
    for trans in (f for f in found if f.name.endswith(".trans.txt")):
        for line in trans.read_text(encoding="utf-8").splitlines():
            utt_id, _, text = line.strip().partition(" ")
            if utt_id:
                texts[utt_id] = text.strip()
    for table in (f for f in found if f.name in ("metadata.csv", "sentences.txt")):
        with table.open(encoding="utf-8", newline="") as fh:
            for row in csv.reader(fh, delimiter="|", quoting=csv.QUOTE_NONE):
                if len(row) >= 2 and row[0].strip():
                    texts[row[0].strip()] = (row[2] if len(row) >= 3 and row[2].strip() else row[1]).strip()
    for txt in (f for f in found if f.suffix == ".txt"):
        if any(txt.with_suffix(suffix).is_file() for suffix in AUDIO_SUFFIXES):
            texts.setdefault(txt.stem, txt.read_text(encoding="utf-8").strip())
    return texts
