"""Shared test setup.

Triton kernels run on the CPU through Triton's interpreter when no GPU is present;
the variable must be set before the first `import triton`, so it is set here.
The real checkpoints and audio live in ``../shared`` (never copied into the repo);
``ASR_SHARED_DIR`` points elsewhere if needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = Path(os.environ.get("ASR_SHARED_DIR", REPO_ROOT.parent / "shared")).resolve()
MODELS_DIR = SHARED_DIR / "models"
AUDIO_DIR = SHARED_DIR / "audio"
TINY_EN_DIR = MODELS_DIR / "whisper-tiny.en"
DISTIL_DRAFT_DIR = MODELS_DIR / "distil-tiny.en-draft"
JFK_FLAC = AUDIO_DIR / "jfk" / "jfk.flac"
LIBRISPEECH_DIR = AUDIO_DIR / "librispeech"
LJSPEECH_DIR = AUDIO_DIR / "ljspeech"
TEST_OTHER_DIR = AUDIO_DIR / "librispeech-test-other-audio"


def lj_text(clip_id: str) -> str:
    """The LJSpeech transcript of one clip (metadata.csv: id|text)."""
    for line in (LJSPEECH_DIR / "metadata.csv").read_text().splitlines():
        if line.startswith(clip_id + "|"):
            return line.split("|", 1)[1]
    raise KeyError(clip_id)


def normalise(text: str) -> str:
    """Lower-case words of letters, digits and apostrophes: enough to compare two transcripts."""
    return " ".join("".join(c for c in " ".join(text.split()).lower() if c.isalnum() or c in " '").split())


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's tests on one torch thread, then restore the count.

    tiny.en's small matrices gain nothing from a second thread on the 2-core test machines, and two
    threads that mostly wait on each other were measured several times slower when the box is busy.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_en_pair():
    """The real tiny.en target with the real distilled decoder-only draft, fp32 on the CPU, loaded once."""
    import torch

    from asr_app.models import load_pair

    return load_pair(target=str(TINY_EN_DIR), draft=str(DISTIL_DRAFT_DIR), device="cpu", dtype=torch.float32)


def pytest_configure(config: pytest.Config) -> None:
    if not TINY_EN_DIR.is_dir() or not AUDIO_DIR.is_dir():
        raise pytest.UsageError(
            f"shared test data not found at {SHARED_DIR}; set ASR_SHARED_DIR to the folder "
            "holding models/ and audio/"
        )
