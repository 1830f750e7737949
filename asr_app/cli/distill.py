"""asr-distill: train a decoder-only draft for any Whisper from unlabelled audio (docs/distill.md).

    asr-distill --target openai/whisper-tiny.en --audio speech/ --out drafts/tiny.en --steps 3000
    asr-distill --target my-whisper/ --audio a/ b/ --eval-audio held-out/ --out drafts/mine --threads 2
    asr-distill ... --resume          # continue an interrupted run (the same command plus --resume)
    asr-transcribe talk.flac --target my-whisper/ --draft drafts/mine

Arguments are checked before torch is imported: --help and a bad option answer at once.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from asr_app.distill.errors import DistillError, Interrupted
from asr_app.distill.options import (
    EVAL_LANGUAGES,
    FOLDER_LANGUAGE,
    TIMESTAMP_SETTINGS,
    DistillOptions,
    EvalOptions,
    TeacherOptions,
    TrainOptions,
)
from asr_app.languages import language_code

PROG = "asr-distill"


def _ints(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    t, r = TeacherOptions(), TrainOptions()
    p = argparse.ArgumentParser(prog=PROG, description="Distil a speculative-decoding draft from a Whisper target "
                                "on unlabelled audio (the target's own transcripts are the labels).")
    p.add_argument("--target", required=True, help="the Whisper to make a draft for: hub id or local folder")
    p.add_argument("--audio", nargs="+", type=Path, required=True, metavar="DIR", help="training audio (folders, files)")
    p.add_argument("--out", type=Path, required=True, help="new folder for the draft, its card and checkpoints")
    p.add_argument("--eval-audio", nargs="+", type=Path, default=(), metavar="DIR",
                   help="held-out audio for the evaluation (default: --holdout of the training files)")
    p.add_argument("--holdout", type=float, default=0.1, help="files set aside when --eval-audio is not given")
    p.add_argument("--cache", type=Path, default=None, help="teacher cache (default ~/.cache/asr-app/distill)")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="the target's dtype in the teacher pass (auto: fp16 on CUDA)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    g = p.add_argument_group("teacher (labels)")
    g.add_argument("--language", default=None,
                   help="label in this language (default: detected per clip); 'folder': in the language named by a "
                        "clip's folder below --audio (speech/de/..., as make_synthetic_speech.py writes), "
                        "detected elsewhere")
    g.add_argument("--tasks", default="transcribe", help="transcribe and/or translate, comma-separated")
    g.add_argument("--timestamps", choices=TIMESTAMP_SETTINGS, default=t.timestamps,
                   help="labels with and/or without timestamps (mixed: one of the two per clip)")
    g.add_argument("--top-k", type=int, default=t.top_k, help="teacher probabilities kept per position")
    g.add_argument("--max-new-tokens", type=int, default=t.max_new_tokens)
    g.add_argument("--keep-capped", action="store_true", help="keep labels that never ended (a looping target)")
    g.add_argument("--teacher-batch", type=int, default=t.batch_size, help="clips labelled together")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=r.steps)
    g.add_argument("--batch-size", type=int, default=r.batch_size, help="label sequences per step")
    g.add_argument("--lr", type=float, default=r.lr)
    g.add_argument("--min-lr", type=float, default=r.min_lr)
    g.add_argument("--warmup", type=int, default=r.warmup_steps, help="warm-up steps")
    g.add_argument("--kl-weight", type=float, default=r.kl_weight)
    g.add_argument("--ce-weight", type=float, default=r.ce_weight)
    g.add_argument("--layers", type=_ints, default=None, help="target decoder layers to start from (default first,last)")
    g.add_argument("--init-draft", default=None, metavar="DRAFT",
                   help="start from this draft instead of the target's layers (bundled or a folder): train an "
                        "existing draft further on new audio")
    g.add_argument("--draft-vocab", type=int, default=r.draft_vocab,
                   help="token ids the training head scores, as the runtime's --draft-vocab (0: all)")
    g.add_argument("--audio-view", choices=("window", "audio"), default=r.audio_view,
                   help="encoder frames the student reads: the whole 30 s window, or the clip's audio (cheaper)")
    g.add_argument("--seed", type=int, default=r.seed)
    g.add_argument("--checkpoint-minutes", type=float, default=r.checkpoint_minutes)
    g.add_argument("--checkpoint-steps", type=int, default=None)
    g = p.add_argument_group("evaluation")
    g.add_argument("--gammas", type=_ints, default=EvalOptions().gammas, help="fixed gammas measured")
    g.add_argument("--eval-max-clips", type=int, default=None)
    g.add_argument("--eval-timestamps", action="store_true", help="decode the held-out clips with timestamps")
    g.add_argument("--eval-task", choices=("transcribe", "translate"), default="transcribe",
                   help="decode the held-out clips with this task (translate: a multilingual target)")
    g.add_argument("--eval-language", choices=EVAL_LANGUAGES, default=EvalOptions().language,
                   help="decode the held-out clips in the language the target detects, or in their folder's "
                        "language where it names one (given: as a user's --language decodes)")
    g.add_argument("--no-speed", action="store_true", help="do not report the exact/off timing")
    g.add_argument("--baseline-draft", default=None, metavar="DRAFT",
                   help="also measure this draft on the held-out clips: bundled (the draft shipped for the target) or a folder")
    return p


def options_from_args(args: argparse.Namespace) -> DistillOptions:
    """ValueError (a readable message) for a bad value."""
    language = (FOLDER_LANGUAGE if (args.language or "").strip().lower() == FOLDER_LANGUAGE
                else language_code(args.language) if args.language else None)
    teacher = TeacherOptions(top_k=args.top_k, timestamps=args.timestamps, language=language,
                             tasks=tuple(t.strip() for t in args.tasks.split(",") if t.strip()),
                             max_new_tokens=args.max_new_tokens, keep_capped=args.keep_capped,
                             batch_size=args.teacher_batch)
    train = TrainOptions(steps=args.steps, batch_size=args.batch_size, lr=args.lr, min_lr=min(args.min_lr, args.lr),
                         warmup_steps=args.warmup, kl_weight=args.kl_weight, ce_weight=args.ce_weight,
                         layers=args.layers or None, init_draft=args.init_draft, draft_vocab=args.draft_vocab or None,
                         audio_view=args.audio_view, seed=args.seed, checkpoint_minutes=args.checkpoint_minutes,
                         checkpoint_steps=args.checkpoint_steps)
    evaluation = EvalOptions(gammas=args.gammas, timestamps=args.eval_timestamps, task=args.eval_task,
                             speed=not args.no_speed, max_clips=args.eval_max_clips,
                             baseline_draft=args.baseline_draft, language=args.eval_language)
    return DistillOptions(target=args.target, audio=tuple(args.audio), out=args.out, eval_audio=tuple(args.eval_audio),
                          holdout=args.holdout, cache=args.cache, device=args.device,
                          dtype=None if args.dtype == "auto" else args.dtype, resume=args.resume, teacher=teacher,
                          train=train, evaluation=evaluation)


class BarReporter:
    """The run's progress on stderr: tqdm bars on a terminal (teacher clips, then training steps with loss,
    agreement and ETA), else one plain line every `every` seconds. A `pipeline.Reporter`."""

    def __init__(self, enabled: bool = True, every: float = 30.0) -> None:
        self.enabled, self.every = enabled, every
        self.tty = enabled and sys.stderr.isatty()
        self.bar = None
        self.last_line = 0.0
        self.recent: list[tuple[float, float]] = []  # (loss, agreement) of the last steps, for a steadier display

    def message(self, text: str) -> None:
        if self.enabled:
            (self.bar.write if self.bar is not None else print)(text, file=sys.stderr)

    def _bar(self, total: int, unit: str, initial: int = 0):
        from tqdm import tqdm

        if self.bar is None or self.bar.total != total or self.bar.unit != unit:
            self.close()
            self.bar = tqdm(total=total, initial=initial, unit=unit, file=sys.stderr, dynamic_ncols=True)
        return self.bar

    def _line(self, text: str, last: bool) -> None:
        if last or time.monotonic() - self.last_line >= self.every:
            self.last_line = time.monotonic()
            print(text, file=sys.stderr, flush=True)

    def teacher(self, done: int, total: int) -> None:
        if self.tty:
            bar = self._bar(total, "clip")
            bar.update(done - bar.n)
        elif self.enabled:
            self._line(f"teacher pass: {done}/{total} clips", done == total)

    def step(self, log, result, total: int) -> None:
        self.recent = [*self.recent[-19:], (log.loss, log.agreement)]
        loss = sum(r[0] for r in self.recent) / len(self.recent)
        agreement = 100 * sum(r[1] for r in self.recent) / len(self.recent)
        if self.tty:
            bar = self._bar(total, "step", initial=log.step - 1)
            bar.set_postfix_str(f"loss {loss:.3f}, agreement {agreement:.1f}%", refresh=False)
            bar.update(log.step - bar.n)
        elif self.enabled:
            done = log.step - (result.resumed_at or 0)
            eta = log.seconds / log.step * (total - log.step) if done else 0.0
            self._line(f"step {log.step}/{total}: loss {loss:.3f}, agreement {agreement:.1f}%, "
                       f"{log.seconds / 60:.1f} min, ETA {eta / 60:.1f} min", log.step == total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _summary(result) -> list[str]:
    card = result.card
    train = card["training"]
    lines = [f"draft written to {result.out} ({train['steps']} steps in {train['seconds'] / 60:.1f} min; teacher "
             f"{result.teacher.computed} clips labelled, {result.teacher.reused} from the cache)"]
    ev = card.get("evaluation")
    if ev:
        dec = ev["decoder"]
        calls = ", ".join(f"g{g} {v:.2f}" for g, v in dec["tokens_per_call"].items())
        lines.append(f"held-out: agreement {100 * ev['initial']['agreement']:.1f}% -> {100 * ev['final']['agreement']:.1f}%"
                     f"; tokens per target call {calls}; exact == off on {dec['identical']}/{dec['clips']} clips")
        if dec.get("speedup") and dec.get("loop_speedup") and dec.get("ceiling"):
            lines.append(f"speed: exact {dec['speedup']:.2f}x off end to end, {dec['loop_speedup']:.2f}x in the token "
                         f"loop; at most {dec['ceiling']:.2f}x with any draft (the rest costs both alike)")
    lines.append(f"use it: asr-transcribe FILE --target {card['target']['name']} --draft {result.out}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        options = options_from_args(args)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    import torch

    from asr_app.distill.pipeline import distill
    from asr_app.models.errors import ModelLoadError

    if args.threads is not None:
        torch.set_num_threads(max(1, args.threads))
    command = shlex.join([PROG, *(sys.argv[1:] if argv is None else argv)])
    began = time.perf_counter()
    try:
        result = distill(options, BarReporter(enabled=not args.quiet), command)
    except Interrupted as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; what was done is kept: continue with the same command and --resume",
              file=sys.stderr)
        return 130
    except (DistillError, ModelLoadError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    for line in _summary(result):
        print(line, file=sys.stderr)
    print(f"total {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
