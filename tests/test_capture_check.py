"""The capture-safety check (runtime/graphs.py, `cuda_graphs="emulate"`) misses no host synchronisation: each
one a CUDA graph cannot hold is injected into a real captured step (the draft step, the prompt's target step
and the target step with verification, as the loop replays them) and must raise under emulation, while the
same steps run to their end with the check switched off. A check that cannot fail proves nothing, so every
case is shown to fail it.

Tiny random Whisper models keep the 2 x 29 decodes cheap; the real tiny.en pair's steps passing the check
is tests/test_runtime.py's (every mode, timestamps on and off, batched rows, sampling)."""

from __future__ import annotations

import contextlib
import gc

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_decoding_greedy import FULL_VOCAB, make_pair, perturbed_copy, processor, tiny_target  # noqa: F401

from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.decoding.steps import Steps
from asr_app.runtime import HostReadError, graphs, no_host_reads

SOURCE_POSITIONS = 25  # a 50-frame window: the encoder costs nothing
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: a second thread only waits


def _masked_write(t: torch.Tensor) -> None:
    t.clone()[t > 0] = 0


def _index_put(t: torch.Tensor) -> None:
    t.clone().index_put_((t > 0,), t.new_zeros(()))


def _python_if(t: torch.Tensor) -> None:
    if (t >= 0).all():
        pass


# Every host synchronisation the issue names, and the ones PyTorch tags as reading data or sizing by it. Each
# takes an output tensor of the step (int64 token ids, [B] or [B, g+1]).
HOST_SYNCS = {
    "Tensor.item": lambda t: t.flatten()[0].item(),
    "Tensor.tolist": lambda t: t.tolist(),
    "Tensor.cpu": lambda t: t.cpu(),
    "Tensor.to('cpu')": lambda t: t.to("cpu"),
    "Tensor.to(device=...)": lambda t: t.to(device=t.device, dtype=torch.float32),
    "Tensor.numpy": lambda t: t.numpy(),
    "numpy.asarray(tensor)": lambda t: np.asarray(t),
    "bool(tensor)": lambda t: bool(t.flatten()[0]),
    "if tensor.all(): (all() into Python)": _python_if,
    "builtin any() over a tensor": lambda t: any(t.flatten() > 0),
    "int(tensor)": lambda t: int(t.flatten()[0]),
    "float(tensor)": lambda t: float(t.flatten()[0]),
    "tensor as a Python index": lambda t: [0, 1, 2][t.flatten()[0] % 3],
    "Tensor.nonzero": lambda t: t.nonzero(),
    "torch.nonzero": lambda t: torch.nonzero(t),
    "torch.where(condition)": lambda t: torch.where(t > 0),
    "Tensor.argwhere": lambda t: t.argwhere(),
    "boolean-mask read": lambda t: t[t > 0],
    "boolean-mask write": _masked_write,
    "index_put_ with a mask": _index_put,
    "Tensor.masked_select": lambda t: t.masked_select(t > 0),
    "torch.equal": lambda t: torch.equal(t, t),
    "torch.allclose": lambda t: torch.allclose(t.float(), t.float()),
    "torch.unique": lambda t: torch.unique(t),
    "Tensor.unique_consecutive": lambda t: t.unique_consecutive(),
    "torch.bincount": lambda t: torch.bincount(t.flatten().clamp_min(0)),
    "repeat_interleave by a tensor": lambda t: t.flatten().repeat_interleave(t.flatten().clamp(0, 2)),
    "one_hot without num_classes": lambda t: F.one_hot(t.clamp_min(0)),
    "torch.tensor of host data": lambda t: torch.tensor([1, 2]) + t.flatten()[:1],
}
STEPS = ("draft_step", "first_step", "target_step")


@pytest.fixture(scope="module")
def tiny_pair(processor):  # noqa: F811
    target = tiny_target(seed=0, source_positions=SOURCE_POSITIONS)
    return make_pair(target, perturbed_copy(target, 0.05, seed=1), processor)


def decode(pair, graphs: str) -> None:
    # unpacked weights: packing them for oneDNN costs ~0.5 s a decoder, and the steps' code path is the same
    runtime = RuntimeOptions(draft_vocab=None, cuda_graphs=graphs, packed_weights=False)
    decoder = SpeculativeDecoder(pair, runtime=runtime)
    features = torch.randn(1, 80, 2 * SOURCE_POSITIONS, generator=torch.Generator().manual_seed(0))
    decoder.decode_features(features, DecodingOptions(mode="exact", gamma=2, max_new_tokens=6))


def inject(monkeypatch, step: str, sync) -> list[int]:
    """Make Steps.<step> run `sync` on its first output; returns a list that counts the calls."""
    calls, original = [], getattr(Steps, step)

    def with_sync(self, **kwargs):
        out = original(self, **kwargs)
        sync(next(iter(out.values())))
        calls.append(1)  # reached only when the sync did not raise
        return out

    monkeypatch.setattr(Steps, step, with_sync)
    return calls


# each sync in one of the three steps, in turn (all 3 x 29 pass too, at three times the time)
CASES = [(name, STEPS[i % len(STEPS)]) for i, name in enumerate(HOST_SYNCS)]


@pytest.mark.parametrize(("name", "step"), CASES)
def test_emulation_catches_every_host_sync_in_a_captured_step(tiny_pair, monkeypatch, name, step):
    calls = inject(monkeypatch, step, HOST_SYNCS[name])
    with monkeypatch.context() as unchecked:  # the control: the same replays with the check switched off
        unchecked.setattr(graphs, "no_host_reads", contextlib.nullcontext)
        decode(tiny_pair, "emulate")
    assert calls, f"{step} was never replayed"
    calls.clear()
    with pytest.raises(HostReadError, match="inside a captured step"):
        decode(tiny_pair, "emulate")
    assert calls == []  # it raised inside the step, at the sync


def test_real_captured_steps_pass_the_check(tiny_pair, monkeypatch):
    # No false alarm: the untouched steps replay under the check, each of the three captured at least once.
    counts = {step: inject(monkeypatch, step, lambda t: None) for step in STEPS}
    decode(tiny_pair, "emulate")
    assert all(counts[step] for step in STEPS), {step: len(c) for step, c in counts.items()}


def test_what_a_captured_step_may_do_passes_the_check():
    # The graph-safe forms of the operations above: a dtype cast, integer indexing, where with three
    # arguments, masked_fill, a tensor made from a tensor, slicing, a filled constant.
    x = torch.arange(6.0)
    with no_host_reads():
        x.to(torch.float64), x[x.long()[:2]], torch.where(x > 1, x, 0.0), x.masked_fill(x > 2, 0.0)
        torch.as_tensor(x), x[1:3], torch.full((2,), 3.0), (x > 2).any()
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # the check ends with its block


def test_the_check_holds_only_on_its_own_thread():
    # The web app decodes several sessions in threads: one thread's check must not fail another's reads.
    import threading

    x, seen = torch.arange(3), []
    with no_host_reads():
        worker = threading.Thread(target=lambda: seen.append(x.tolist()))
        worker.start()
        worker.join()
        with pytest.raises(HostReadError):
            x.tolist()
    assert seen == [[0, 1, 2]]


class _Finalised:
    """An object in a reference cycle that records when the collector frees it."""

    def __init__(self, log: list[str]) -> None:
        self.me, self.log = self, log

    def __del__(self) -> None:
        self.log.append("freed")


def test_no_collection_runs_while_a_capture_has_the_collector_paused():
    log: list[str] = []
    gc.collect()
    _Finalised(log)  # garbage only the cyclic collector can free
    with graphs.cyclic_gc_paused():
        assert not gc.isenabled()
        kept = [[] for _ in range(50_000)]  # tracked containers, far more than a collection waits for
        assert log == [] and len(kept) == 50_000
    assert gc.isenabled()
    gc.collect()
    assert log == ["freed"]  # the garbage was only waiting


def test_the_collector_resumes_after_the_last_of_nested_and_concurrent_pauses():
    import threading

    assert gc.isenabled()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def second() -> None:
        first_in.wait(10)
        with graphs.cyclic_gc_paused():
            second_in.set()
            first_out.wait(10)
            seen.append(gc.isenabled())  # the first capture's end must not resume it under this one

    worker = threading.Thread(target=second)
    worker.start()
    try:
        with graphs.cyclic_gc_paused():
            with graphs.cyclic_gc_paused():
                pass
            inner_left = gc.isenabled()  # the inner pause ended, the outer one holds
            first_in.set()
            second_in.wait(10)
    finally:
        first_in.set()
        first_out.set()
        worker.join(10)
    assert inner_left is False and seen == [False] and gc.isenabled()
    with pytest.raises(KeyError), graphs.cyclic_gc_paused():
        raise KeyError("a failed capture")
    assert gc.isenabled()


def test_a_program_that_disabled_the_collector_keeps_it_disabled():
    gc.disable()
    try:
        with graphs.cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
