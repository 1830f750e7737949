"""The training loop: AdamW, warm-up and cosine decay, clipped gradients, checkpoints, resume.

Everything a step computes follows from the checkpointed state and the step number (the batch from the
seeded schedule, the learning rate from the step, no dropout), so a run resumed from a checkpoint ends
with the weights an uninterrupted run with the same seed ends with.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from asr_app.distill.batching import Schedule, collate
from asr_app.distill.checkpoint import load_checkpoint, normalised, save_checkpoint
from asr_app.distill.errors import Interrupted
from asr_app.distill.loss import distill_loss, student_logits
from asr_app.distill.options import TrainOptions
from asr_app.distill.student import parameter_groups, trainable


@dataclass
class StepLog:
    step: int           # steps done, this one included
    loss: float
    kl: float
    ce: float
    agreement: float    # of this step's batch, teacher-forced
    lr: float
    seconds: float      # training time so far, earlier sessions of a resumed run included


@dataclass
class TrainResult:
    history: list[StepLog] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    resumed_at: int | None = None   # the step a resumed run continued from


def learning_rate(step: int, options: TrainOptions) -> float:
    """Linear warm-up to `lr`, then cosine decay to `min_lr` at the last step (step counts from 0)."""
    if step < options.warmup_steps:
        return options.lr * (step + 1) / options.warmup_steps
    span = max(1, options.steps - options.warmup_steps - 1)
    progress = min(1.0, (step - options.warmup_steps) / span)
    return options.min_lr + 0.5 * (options.lr - options.min_lr) * (1 + math.cos(math.pi * progress))


@contextlib.contextmanager
def stop_on_interrupt():
    """The first Ctrl-C (or SIGTERM) asks the loop to stop after its current step (it then saves its state);
    a second one interrupts at once. Yields a function that says whether a stop was asked for."""
    asked = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield asked.is_set
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        asked.set()
        for sig, old in previous.items():
            signal.signal(sig, old)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield asked.is_set
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Trainer:
    def __init__(self, student, schedule: Schedule, load: Callable, head: torch.Tensor, to_head: torch.Tensor,
                 suppress: torch.Tensor | None, options: TrainOptions, folder: Path, identity: dict,
                 device: torch.device) -> None:
        self.student, self.schedule, self.load = student, schedule, load
        self.head, self.to_head, self.suppress = head, to_head, suppress
        self.options, self.folder, self.identity, self.device = options, folder, identity, device
        o = options
        self.optimizer = torch.optim.AdamW(parameter_groups(student, o.weight_decay), lr=o.lr, betas=o.betas,
                                           eps=o.eps)
        self.result = TrainResult()

    def _state(self) -> dict:
        return {"identity": normalised(self.identity), "step": self.result.steps, "seconds": self.result.seconds,
                "trainable": {name: p.detach().cpu().clone() for name, p in trainable(self.student)},
                "optimizer": self.optimizer.state_dict(), "history": [asdict(h) for h in self.result.history]}

    def _restore(self, state: dict) -> None:
        with torch.no_grad():
            for name, param in trainable(self.student):
                param.copy_(state["trainable"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.result = TrainResult([StepLog(**h) for h in state["history"]], state["step"], state["seconds"],
                                  resumed_at=state["step"])

    def step(self, index: int) -> StepLog:
        batch = collate(self.schedule.batch(index), self.load, self.to_head, self.options.audio_view, self.device)
        lr = learning_rate(index, self.options)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        parts = distill_loss(student_logits(self.student, batch, self.head), batch, self.options.kl_weight,
                             self.options.ce_weight, self.suppress)
        self.optimizer.zero_grad(set_to_none=True)
        parts.loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in trainable(self.student)], self.options.clip_norm)
        self.optimizer.step()
        return StepLog(index + 1, float(parts.loss.detach()), parts.kl, parts.ce, parts.agreement, lr, 0.0)

    def run(self, resume: bool, on_step: Callable[[StepLog, TrainResult], None] | None = None) -> TrainResult:
        state = load_checkpoint(self.folder, self.identity) if resume else None
        if state is not None:
            self._restore(state)
        o = self.options
        self.student.train()
        last_save = time.monotonic()
        with stop_on_interrupt() as stop_asked:
            for index in range(self.result.steps, o.steps):
                began = time.perf_counter()
                log = self.step(index)
                self.result.seconds += time.perf_counter() - began
                log.seconds = self.result.seconds
                self.result.history.append(log)
                self.result.steps = index + 1
                if on_step is not None:
                    on_step(log, self.result)
                due = (time.monotonic() - last_save >= 60 * o.checkpoint_minutes or self.result.steps == o.steps
                       or (o.checkpoint_steps is not None and self.result.steps % o.checkpoint_steps == 0))
                if due or stop_asked():
                    save_checkpoint(self.folder, self._state())
                    last_save = time.monotonic()
                if stop_asked():
                    raise Interrupted(f"interrupted after step {self.result.steps} of {o.steps}; the run is saved "
                                       "in its output folder: continue it with the same command and --resume")
        self.student.eval()
        return self.result
