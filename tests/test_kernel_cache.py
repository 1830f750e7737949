"""The services' bound on oneDNN's cache of compiled CPU kernels (asr_app/kernel_cache.py): which bound wins,
that oneDNN takes it only before its first kernel, and that a real `asr-serve` sets it in time.

oneDNN prints one line per kernel it compiles when started with ONEDNN_VERBOSE=profile_create
("create:cache_miss"); a kernel found in the cache prints "create:cache_hit". Counting the misses is how
these tests see the cache's size from outside."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import DISTIL_DRAFT_DIR, JFK_FLAC, REPO_ROOT, TINY_EN_DIR
from test_serve import KEY, client, start_server
from test_ui_server import free_port, stop

from asr_app.kernel_cache import SERVICE_DEFAULT, VARIABLES, bound_kernel_cache, kernel_cache_problem
from asr_app.runtime.ops import onednn_packing_works

ONEDNN, DNNL = VARIABLES
MISS = "create:cache_miss"
needs_onednn = pytest.mark.skipif(not onednn_packing_works(),
                                  reason="torch runs no packed oneDNN kernels on this CPU: no cache to bound")


def test_the_flag_wins_then_the_environment_then_the_service_default():
    env: dict[str, str] = {}
    bound = bound_kernel_cache(None, env)
    assert str(bound) == f"{SERVICE_DEFAULT} (default)" and env == {ONEDNN: str(SERVICE_DEFAULT)}
    env = {DNNL: "200"}
    bound = bound_kernel_cache(None, env)
    assert str(bound) == f"200 (${DNNL})" and env == {DNNL: "200"} and (bound.entries, bound.variable) == (200, DNNL)
    env = {ONEDNN: "300", DNNL: "200"}
    assert str(bound_kernel_cache(None, env)) == f"300 (${ONEDNN})" and env == {ONEDNN: "300", DNNL: "200"}
    env = {ONEDNN: "", "OTHER": "1"}   # set but empty: oneDNN would use its own default, so ours applies
    assert str(bound_kernel_cache(None, env)) == f"{SERVICE_DEFAULT} (default)" and env[ONEDNN] == str(SERVICE_DEFAULT)
    env = {ONEDNN: "300", DNNL: "200", "OTHER": "1"}
    bound = bound_kernel_cache(16, env)
    assert str(bound) == "16 (--cpu-kernel-cache)" and env == {ONEDNN: "16", "OTHER": "1"}


def test_a_cache_of_nothing_is_refused_from_the_flag_or_the_environment():
    assert kernel_cache_problem(None, {}) is None and kernel_cache_problem(1, {ONEDNN: "0"}) is None
    assert kernel_cache_problem(None, {ONEDNN: "", DNNL: "32"}) is None
    assert kernel_cache_problem(0, {}) == "--cpu-kernel-cache must be at least 1, got 0"
    assert kernel_cache_problem(-3, {}) == "--cpu-kernel-cache must be at least 1, got -3"
    # oneDNN reads what is not a number as 0: no cache at all
    assert kernel_cache_problem(None, {ONEDNN: "0"}) == f"${ONEDNN} must be a whole number of at least 1, got '0'"
    assert kernel_cache_problem(None, {DNNL: "lots"}) == f"${DNNL} must be a whole number of at least 1, got 'lots'"
    assert kernel_cache_problem(None, {ONEDNN: "-5"}) is not None
    assert kernel_cache_problem(None, {ONEDNN: "2\u00b2"}) is not None   # a digit to str.isdigit, not to int()
    assert kernel_cache_problem(None, {ONEDNN: " 32 "}) is None


def test_the_service_refuses_a_bad_bound_in_its_environment_in_one_line(monkeypatch, capsys):
    from asr_app.serve.cli import main
    monkeypatch.setenv(ONEDNN, "none")
    assert main(["--target", "nowhere"]) == 2
    assert capsys.readouterr().err == f"asr-serve: error: ${ONEDNN} must be a whole number of at least 1, got 'none'\n"


def test_a_ray_replica_sets_the_bound_in_its_own_process_before_it_loads_the_models(monkeypatch):
    """A replica decides as asr-serve does, from its own environment (its node's and the job's runtime_env),
    and only then loads the pair; a bad value there stops it with the sentence asr-serve would give."""
    from types import SimpleNamespace

    import asr_app.arguments
    from asr_app.serve import ray_engine

    seen = []
    monkeypatch.setattr(asr_app.arguments, "decoder_from_args", lambda args: seen.append(dict(os.environ)) or "pair")
    for name in VARIABLES:   # registered, so that what the replica sets here is undone after the test
        monkeypatch.setenv(name, "1")
        monkeypatch.delenv(name)
    monkeypatch.setenv(DNNL, "48")   # the job's runtime_env or the node
    assert ray_engine.replica_decoder(SimpleNamespace(cpu_kernel_cache=None)) == "pair"
    assert seen[-1].get(DNNL) == "48" and ONEDNN not in seen[-1]
    assert ray_engine.replica_decoder(SimpleNamespace(cpu_kernel_cache=12)) == "pair"   # asr-serve's flag wins
    assert seen[-1].get(ONEDNN) == "12" and DNNL not in seen[-1]
    monkeypatch.delenv(ONEDNN)
    monkeypatch.setenv(DNNL, "0")
    with pytest.raises(ValueError, match=f"\\${DNNL} must be a whole number of at least 1, got '0'"):
        ray_engine.replica_decoder(SimpleNamespace(cpu_kernel_cache=None))
    assert len(seen) == 2   # refused before loading


PROBE = textwrap.dedent("""
    import sys
    import torch
    from asr_app.kernel_cache import bound_kernel_cache
    from asr_app.runtime import ops

    bound, when = sys.argv[1], sys.argv[2]
    if when == "late":   # one kernel compiled before the bound is set
        ops.linear(torch.randn(4, 64), ops.pack(torch.randn(8, 64)))
    if bound != "none":
        bound_kernel_cache(int(bound))
    torch.set_num_threads(1)
    weight = ops.pack(torch.randn(48, 64))
    print("START", flush=True)
    for _ in range(2):   # twelve shapes, twice: a cache of fewer than twelve compiles each of them again
        for rows in range(4, 16):
            ops.linear(torch.randn(rows, 64), weight)
""")


def _environment_without_a_bound() -> dict[str, str]:
    """This process's environment for a child, without a kernel-cache bound the developer may have set."""
    return {k: v for k, v in os.environ.items() if k not in VARIABLES}


def _misses_after_start(bound: str, when: str) -> int:
    env = _environment_without_a_bound()
    env["ONEDNN_VERBOSE"] = "profile_create"
    out = subprocess.run([sys.executable, "-c", PROBE, bound, when], capture_output=True, text=True, env=env,
                         cwd=REPO_ROOT, timeout=300, check=True).stdout
    return out.split("START", 1)[1].count(MISS)


@needs_onednn
def test_onednn_takes_the_bound_set_before_its_first_kernel_and_only_then():
    assert _misses_after_start("none", "first") == 12          # oneDNN's 1024: each shape compiled once
    assert _misses_after_start("4", "first") == 24             # a cache of 4: every shape compiled twice
    assert _misses_after_start("4", "late") == 12              # too late: the cache was already made


@needs_onednn
def test_asr_serve_sets_the_bound_before_it_loads_the_models(tmp_path):
    """With a bound of 2 a request repeated word for word compiles its kernels again (with oneDNN's own
    1024, or a bound set after the models' first kernels, it would find them in the cache)."""
    port, log_path = free_port(), tmp_path / "server.log"
    env = _environment_without_a_bound()
    env.update(GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path),
               ONEDNN_VERBOSE="profile_create")
    cmd = [sys.executable, "-m", "asr_app.serve.cli", "--target", str(TINY_EN_DIR), "--draft", str(DISTIL_DRAFT_DIR),
           "--device", "cpu", "--threads", "1", "--port", str(port), "--api-key", KEY, "--no-ui",
           "--cpu-kernel-cache", "2"]
    proc, url = start_server(cmd, env, log_path, port)
    try:
        api, compiled = client(url), []
        for _ in range(2):
            before = log_path.read_text().count(MISS)
            with open(JFK_FLAC, "rb") as f:
                text = api.audio.transcriptions.create(model="whisper-1", file=f).text
            compiled.append(log_path.read_text().count(MISS) - before)
            assert "ask not what your country can do for you" in text.lower(), text
    finally:
        stop(proc)
    log = log_path.read_text()
    assert "CPU kernel cache 2 (--cpu-kernel-cache)" in log, log[-2000:]
    assert compiled[1] >= 10, compiled
