"""Runs the decoding loop's step functions eagerly, or captured once per shape and replayed (docs/runtime.md).

A step function takes `positions` [L] (the absolute positions of its L new tokens), `span` (the cache
slots attention reads), `mask` (which slots each new token sees, or None) and named tensors, and returns
named tensors. Eagerly `span` is the slots in use; a captured step attends over the whole cache with a
mask, so one graph serves every cache length, and its positions come from a one-element device tensor
that each replay refills. Three modes:

- `eager`: call the function (CPU, or `--no-cuda-graphs`).
- `cuda`: capture it in a CUDA graph on first use of a key (after two warm-up calls on a side stream,
  which also compile the Triton kernels), then per call copy the inputs into the graph's own tensors,
  fill the position, replay. The outputs are the graph's tensors: valid until the runner's next captured
  call, of any key (its graphs share one memory pool; `StepRunner`).
- `emulate`: the same static-input, static-output discipline without a GPU, with every host
  synchronisation a capture cannot hold made to raise while the function runs (`no_host_reads`). Tests
  use it to prove on a CPU that a step is capture-safe (a host read inside a captured region fails capture
  or bakes in one value) and that the loop treats outputs as overwritten by the next call.

Capturing is idempotent here: a warm-up call writes the same cache slots with the same values as the
replay that follows, because the inputs are already loaded.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from asr_app.runtime.ops import visible_keys

GraphMode = Literal["eager", "cuda", "emulate"]
StepFn = Callable[..., dict[str, torch.Tensor]]
# Captured keys a workspace keeps; beyond it the least recently used goes (a recapture costs two warm-up
# calls and a capture). Counted on the real tiny.en pair, batch 1, 3 clips: one mode with timestamps on and
# off at T = 0 and 0.6 makes 39 keys (drafts, prompt steps, target steps at gammas 1-13); all four modes so, 95.
# A greedy decode captures its options' 13 target widths up front (engine._capture_widths): three speculative
# modes with timestamps on and off are 78 keys before drafts and prompt steps.
DEFAULT_MAX_GRAPHS = 128


class HostReadError(RuntimeError):
    """A device value was read on the host inside a step that must be capturable."""


# What a CUDA graph cannot hold, checked at two levels because a CPU hides half of it. Python-level calls
# (a TorchFunctionMode): reads whose C++ path never reaches the dispatcher on a CPU tensor (`tolist`,
# `numpy`, `cpu`/`to` of a tensor already there), boolean-mask indexing (named before it decomposes), and
# host data turned into a tensor (its value would be baked in). `to` naming any device counts: here host and
# device are one, and a captured step's tensors are already where it runs, so it has nothing to move. Operator level (a TorchDispatchMode): every
# ATen operator PyTorch itself tags as reading a value into the host (`data_dependent_output`: `item`,
# `bool()`, `equal`, `allclose`) or as sizing its output by the data (`dynamic_output_shape`: `nonzero`,
# `masked_select`, `unique`, `bincount`, `repeat_interleave` by a tensor...), so one called from inside a
# composite function is caught too. Integer indexing (`index.Tensor` with integer indices) has a static shape.
_HOST_READ_METHODS = {"item", "tolist", "numpy", "cpu", "cuda", "__bool__", "__int__", "__float__", "__index__",
                      "__complex__", "__array__"}
_INDEXING_METHODS = {"__getitem__", "__setitem__"}
_HOST_DATA_FUNCTIONS = {torch.tensor, torch.as_tensor, torch.from_numpy}
_BOOL_INDEXED_OPS = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default,
                     torch.ops.aten._index_put_impl_.default}
_CHECKED_COMPOSITES: set = set()  # composite operators whose parts passed _HostOpCheck once


def _refuse(what: str) -> HostReadError:
    return HostReadError(f"{what} inside a captured step: a CUDA graph cannot hold a host synchronisation "
                         "(the capture fails, or one step's value is baked into every replay)")


def _has_bool_index(index) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


def _names_a_device(args, kwargs) -> bool:
    return "device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args)


class _HostCallCheck(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _HOST_READ_METHODS:
            raise _refuse(f"Tensor.{name}()")
        if name == "to" and _names_a_device(args[1:], kwargs):
            raise _refuse("Tensor.to(<device>)")
        if name in _INDEXING_METHODS and len(args) > 1 and _has_bool_index(args[1]):
            raise _refuse(f"boolean-mask indexing (Tensor.{name})")
        if func in _HOST_DATA_FUNCTIONS and not (args and isinstance(args[0], torch.Tensor)):
            raise _refuse(f"torch.{name}() of host data")
        return func(*args, **kwargs)


class _HostOpCheck(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _BOOL_INDEXED_OPS:
            if _has_bool_index(args[1]):
                raise _refuse(f"{func} with a boolean mask")
        elif torch.Tag.data_dependent_output in func.tags:
            raise _refuse(f"{func} (it reads a value on the host)")
        elif torch.Tag.dynamic_output_shape in func.tags:
            raise _refuse(f"{func} (the data sizes its output)")
        elif func not in _CHECKED_COMPOSITES and torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), "CompositeImplicitAutograd"):
            # Under inference_mode a composite operator (`where(condition)`, `repeat_interleave(tensor)`) comes
            # here whole: the first call checks the operators it is made of (which its overload fixes), and
            # once they passed it runs as it is (decomposing every call made emulated decoding 10x slower).
            with self:
                out = func.decompose(*args, **kwargs)
            _CHECKED_COMPOSITES.add(func)
            return out
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_reads() -> Iterator[None]:
    """Make every host synchronisation a CUDA graph cannot hold raise HostReadError while the block runs (the
    capture-safety check). Both checks are modes, which PyTorch keeps per thread: other threads (the web
    app's other sessions) run unchecked."""
    with _HostCallCheck(), _HostOpCheck():
        yield


_collector_lock = threading.Lock()
_collector_pauses = 0            # captures under way, in any thread
_collector_was_enabled = True    # the collector's state before the first of them


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Hold off Python's cyclic garbage collector, in every thread, while the block runs; nested and concurrent
    uses count, and the last one out puts the collector back as it found it (a program that disabled it keeps
    it disabled).

    Why, around a CUDA-graph capture: a collection can run at any allocation, and a dead cycle may hold an old
    decoder's graphs, their memory pool and its tensors. Freeing those inside a capture makes CUDA calls the
    capture forbids, which invalidates it without an error there and fails the next launch with "operation
    failed due to a previous error during capture" (bench/capture_gc_probe.py showed that on an H200; an
    automatic collection doing so is the inferred cause of one GPU test failure). PyTorch no longer collects before a capture
    (`torch.compiler.config.force_cudagraph_gc`), so that would depend on when the collector happens to run.
    Paused, the garbage waits for the next collection after the capture. An explicit gc.collect() is not
    held off; the only one here (the scheduler's idle trim) runs on its worker thread between batches."""
    global _collector_pauses, _collector_was_enabled
    with _collector_lock:
        if _collector_pauses == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _collector_pauses += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_pauses -= 1
            if _collector_pauses == 0 and _collector_was_enabled:
                gc.enable()


class BakedValueError(RuntimeError):
    """A captured step was called again under its key with a different plain (non-tensor) argument: the
    graph would replay the value it was captured with."""


@dataclass
class GraphStats:
    """What a StepRunner holds and has done: captured keys now (at most `max_graphs`), captures, evictions,
    and the seconds its CUDA graph captures took (their warm-up runs included)."""

    graphs: int
    max_graphs: int
    captures: int
    evictions: int
    capture_s: float = 0.0


def _poison_(t: torch.Tensor) -> None:
    """Overwrite a tensor with values no step produces, as another graph's replay may in a shared pool."""
    if t.dtype == torch.bool:
        t.logical_not_()
    elif t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(-987_654_321 if t.dtype in (torch.int32, torch.int64) else 0)


class _Captured:
    """One step function captured for one key: static inputs, a position scalar, static outputs."""

    def __init__(self, fn: StepFn, tensors: dict[str, torch.Tensor], static: dict, length: int,
                 max_positions: int, mode: GraphMode) -> None:
        device = next(iter(tensors.values())).device
        self.mode = mode
        self.inputs = {name: t.clone() for name, t in tensors.items()}
        self.start = torch.zeros(1, dtype=torch.long, device=device)
        self.offsets = torch.arange(length, device=device)
        self.max_positions = max_positions
        self.fn = fn
        self.static = static
        self.outputs: dict[str, torch.Tensor] | None = None
        self.graph = None
        self.capture_s = 0.0  # the capture's time (emulated: the first run's); the replays are step time

    def _body(self) -> dict[str, torch.Tensor]:
        positions = self.start + self.offsets
        return self.fn(positions=positions, span=self.max_positions,
                       mask=visible_keys(positions, self.max_positions), **self.inputs, **self.static)

    def _capture(self, pool) -> None:
        # Synced on this thread's stream only: a device-wide sync would break another thread's capture.
        stream = torch.cuda.current_stream()
        stream.synchronize()
        started = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            for _ in range(2):
                self._body()
        stream.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # The workspace's graphs share one memory pool (its replays run one after another on one stream, so
        # one graph's temporaries may reuse another's), and the capture ignores other threads' CUDA work
        # (the web app serves several sessions).
        with cyclic_gc_paused(), torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self.outputs = self._body()
        stream.synchronize()   # the warm-up runs on the side stream, which this stream waited for
        self.capture_s = time.perf_counter() - started

    def run(self, tensors: dict[str, torch.Tensor], start: int, pool=None) -> dict[str, torch.Tensor]:
        for name, t in tensors.items():
            self.inputs[name].copy_(t)
        self.start.fill_(start)
        if self.mode == "cuda":
            if self.graph is None:
                self._capture(pool)
            self.graph.replay()
            return self.outputs
        first = self.outputs is None
        started = time.perf_counter()
        with no_host_reads():
            out = self._body()
        if first:
            self.capture_s = time.perf_counter() - started
            self.outputs = {name: t.clone() for name, t in out.items()}
        else:
            for name, t in out.items():
                self.outputs[name].copy_(t)
        return self.outputs


class StepRunner:
    """Runs step functions in one of the three modes; holds the captured steps of one workspace: at most
    `max_graphs` keys, the least recently used one dropped to make room (`stats()` reports them), all
    capturing into one memory pool.

    A shared pool narrows what the caller may assume: a step's outputs are valid until the next call of
    *any* captured key of the runner, not only of its own key (another graph's replay may write its
    temporaries there). Emulation enforces it by overwriting the previous key's outputs with garbage when
    another key runs."""

    def __init__(self, mode: GraphMode, max_positions: int, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
        self.mode = mode
        self.max_positions = max_positions
        self.max_graphs = max_graphs
        self.captured: OrderedDict[tuple, _Captured] = OrderedDict()
        self.captures = self.evictions = 0
        self.capture_s = 0.0  # time spent capturing CUDA graphs: one-time work a caller may leave out of a cost
        self.pool = None  # the CUDA graphs' shared memory pool, made at the first capture
        self._last: _Captured | None = None

    def stats(self) -> GraphStats:
        return GraphStats(len(self.captured), self.max_graphs, self.captures, self.evictions, self.capture_s)

    def run(self, key: tuple, fn: StepFn, tensors: dict[str, torch.Tensor], start: int, length: int,
            capturable: bool = True, **static):
        """fn over L = `length` new tokens at positions start..start+L-1. `static`: plain arguments a
        captured step bakes in. `key` must name everything a capture bakes in besides the tensors' values
        (shapes, which tensors are given, mode, temperature...), and `static` must be the same at every call
        of a key (BakedValueError otherwise: pass a per-step value as a tensor, or only the part of it the
        step depends on, keyed); `capturable=False` runs fn eagerly whatever the mode (the prompt's step,
        and shapes not worth a graph)."""
        if start + length > self.max_positions:
            raise ValueError(f"{start + length} tokens exceed the decoder's {self.max_positions} positions")
        if self.mode == "eager" or not capturable:
            device = next(iter(tensors.values())).device
            positions = torch.arange(start, start + length, device=device)
            span = start + length
            mask = None if length == 1 else visible_keys(positions, span)
            return fn(positions=positions, span=span, mask=mask, **tensors, **static)
        step = self._step(key, fn, tensors, static, length)
        if self.mode == "cuda" and self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        before = step.capture_s
        out = step.run(tensors, start, self.pool)
        self.capture_s += step.capture_s - before   # nonzero only on the run that captured
        if self.mode == "emulate" and self._last is not None and self._last is not step and self._last.outputs:
            for t in self._last.outputs.values():
                _poison_(t)
        self._last = step
        return out

    def _step(self, key: tuple, fn: StepFn, tensors, static: dict, length: int) -> _Captured:
        step = self.captured.get(key)
        if step is not None:
            changed = sorted(name for name in static.keys() | step.static.keys()
                             if static.get(name) != step.static.get(name))
            if changed:
                raise BakedValueError(
                    f"step {key[0]!r} called with {', '.join(f'{n}={static.get(n)!r}' for n in changed)} under a "
                    f"key captured with {', '.join(f'{n}={step.static.get(n)!r}' for n in changed)}: a graph "
                    "would replay the captured value. Make it part of the key, or a tensor input")
            self.captured.move_to_end(key)
            return step
        if len(self.captured) >= self.max_graphs:
            dropped = self.captured.popitem(last=False)[1]  # the least recently used, with its graph
            self.evictions += 1
            if self._last is dropped:
                self._last = None
        self.captures += 1
        step = self.captured[key] = _Captured(fn, tensors, static, length, self.max_positions, self.mode)
        return step
