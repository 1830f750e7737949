"""`distill`: the whole recipe, from folders of audio to a draft folder with its card (docs/distill.md).

    out folder  -> checked first (a finished draft, an interrupted run without --resume: one clear line)
    audio       -> clips (data.py)            target -> fingerprint (teacher.py)
    teacher pass, cached per clip (teacher.py, cache.py)
    student (student.py) -> training with checkpoints (train.py)
    export (export.py) -> evaluation on held-out audio (evaluate.py) -> card and plot (card.py)
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import WhisperForCausalLM

from asr_app.decoding.prompt import eos_token
from asr_app.distill import card as cards
from asr_app.distill.batching import Schedule, head_index
from asr_app.distill.cache import LabelInfo, TeacherCache, default_cache_root
from asr_app.distill.checkpoint import CHECKPOINT, RunFile, differences, normalised
from asr_app.distill.data import Clip, ClipReader, inventory, split_holdout
from asr_app.distill.errors import DistillError
from asr_app.distill.evaluate import decoder_figures, in_decoder, teacher_forced
from asr_app.distill.export import save_draft, write_bundle
from asr_app.distill.options import FOLDER_LANGUAGE, RUNTIME_DRAFT_VOCAB, DistillOptions
from asr_app.distill.student import build_student, check_start, default_layers, head_weight
from asr_app.distill.teacher import Teacher, target_fingerprint
from asr_app.distill.train import StepLog, Trainer, TrainResult
from asr_app.distill.vocab import label_ranking
from asr_app.fileio import write_problem
from asr_app.models import ct2
from asr_app.models.bundled import load_bundled_draft
from asr_app.models.errors import ModelLoadError
from asr_app.models.loading import ModelPair, check_pair, load_pair
from asr_app.models.presets import BUNDLED
from asr_app.runtime.vocab import (
    RANKING_ATTR,
    TokenSpace,
    draft_ranking,
    draft_vocabulary,
    shipped_ranking_fits,
)

TOKENIZER_FILES = ("tokenizer.json", "vocab.json")
TEACHER_STAGE = "teacher pass"   # run.json's status until training starts


class Reporter:
    """What a front end hears of a run (the CLI draws bars from it); every method may do nothing."""

    def message(self, text: str) -> None: ...

    def teacher(self, done: int, total: int) -> None: ...

    def step(self, log: StepLog, result: TrainResult, total: int) -> None: ...

    def close(self) -> None: ...


@dataclass
class TeacherStats:
    computed: int = 0
    reused: int = 0
    failed: int = 0
    seconds: float = 0.0
    unreadable: dict[str, str] = field(default_factory=dict)   # clip key -> why its audio could not be decoded


@dataclass
class DistillResult:
    out: Path
    card: dict
    training: TrainResult
    teacher: TeacherStats
    cache: Path
    student: WhisperForCausalLM   # the trained draft in float32, as it left training (the folder holds float16)


# ---------------------------------------------------------------------- checks before any model loads
def check_out(options: DistillOptions) -> RunFile:
    """The output folder can take this run: new or empty, or an interrupted run and --resume; and it can be
    written to."""
    run = RunFile(options.out)
    _check_run_file(run, options)
    check_writable(options.out)
    return run


def _check_run_file(run: RunFile, options: DistillOptions) -> None:
    doc = run.read()
    out = options.out
    if doc is None:
        if options.resume:
            raise DistillError(f"nothing to resume in {out}: it holds no asr-distill run (start without --resume)")
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise DistillError(f"{out} exists and is not an empty folder; choose a new --out for the draft")
        return
    if doc.get("status") == "done":
        raise DistillError(f"{out} already holds a finished draft; choose another --out (or remove that folder)")
    # A run stopped in its teacher pass that never trained (no checkpoint: a resumed run passes through the
    # teacher stage again, with its checkpoint kept) lost nothing, and the teacher cache keeps its labels:
    # starting it again is what --resume would do, so a run that failed there does not block its own command.
    trained = (out / CHECKPOINT).is_file()
    if not options.resume and (doc.get("status") != TEACHER_STAGE or trained):
        where = "while training" if trained else f"in its {doc.get('status', '?')} stage"
        raise DistillError(f"{out} holds an interrupted run (stopped {where}): continue it with the same command "
                           "and --resume, or choose another --out")


def check_writable(folder: Path) -> None:
    """`folder` can be made and written to: tried now, before any model loads, rather than found out after
    the target has loaded. Folders made for the trial are removed: nothing is left behind until the run
    writes."""
    why = write_problem(folder, keep=False)
    if why:
        raise DistillError(f"cannot write the draft to --out {folder}: {why}")


def check_tokenizer(target: str) -> None:
    """A local target folder must carry its tokenizer: the teacher's transcripts are made of its tokens."""
    folder = Path(target).expanduser()
    if not folder.is_dir() or ct2.is_ct2_dir(folder) or not (folder / "config.json").is_file():
        return
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise DistillError(f"target '{target}' has no tokenizer ({' or '.join(TOKENIZER_FILES)}): copy the tokenizer "
                           "files of the Whisper it was made from into the folder")


# ---------------------------------------------------------------------- data and the teacher pass
@dataclass
class _Data:
    train: list[Clip]
    held: list[Clip]
    skipped: list[str]   # training files left out, with why


def _clips(options: DistillOptions, report: Reporter) -> _Data:
    def skip(line: str) -> None:
        report.message(f"skipped: {line}")

    train_inv = inventory(options.audio, skip=skip)
    clips = list({c.key: c for c in train_inv.clips}.values())  # a file given twice is one file
    if options.eval_audio:
        held = list({c.key: c for c in inventory(options.eval_audio, role="held-out", skip=skip).clips}.values())
        keys = {h.key for h in held}
        train = [c for c in clips if c.key not in keys]  # never train on held-out audio
    else:
        train, held = split_holdout(clips, options.holdout)
    if not train:
        raise DistillError("every training clip is also held-out audio: nothing is left to train on")
    return _Data(train, held, train_inv.skipped)


def teacher_pass(pair: ModelPair, cache: TeacherCache, clips: list[Clip], options: DistillOptions,
                 report: Reporter) -> TeacherStats:
    began = time.perf_counter()
    teacher = Teacher(pair, options.teacher)
    if options.teacher.language == FOLDER_LANGUAGE:
        report.message(teacher.folder_summary(clips))
    todo = [c for c in clips if not cache.valid(c.key) or not _labelled_as_given(teacher, cache, c)]
    stats = TeacherStats(reused=len(clips) - len(todo))
    if todo:
        report.message(f"teacher pass: {len(todo)} clips to label ({stats.reused} found in the cache {cache.folder})")
        read, done = ClipReader(), 0
        for batch in _teacher_batches(todo, options.teacher.batch_size, teacher):
            usable, audio = [], []
            for clip in batch:
                try:
                    audio.append(read(clip))
                    usable.append(clip)
                except (OSError, ValueError) as exc:  # AudioLoadError is a ValueError; it names the file
                    stats.failed += 1
                    if str(exc) not in stats.unreadable.values():   # once per file, not once per window
                        report.message(f"skipped: {exc}")
                    stats.unreadable[clip.key] = str(exc)
            for clip, record in zip(usable, teacher.label(usable, audio) if usable else []):
                cache.save(clip.key, record)
            stats.computed += len(usable)
            done += len(batch)
            report.teacher(done, len(todo))
    stats.seconds = time.perf_counter() - began
    return stats


def _labelled_as_given(teacher: Teacher, cache: TeacherCache, clip: Clip) -> bool:
    """Whether a cached record is in the language this run gives its clip (a file moved to another language
    folder is labelled again); any language when the target detects it."""
    given = teacher.given_language(clip)
    return given is None or cache.language(clip.key) == given


def _teacher_batches(clips: list[Clip], size: int, teacher: Teacher) -> list[list[Clip]]:
    """Batches of clips given one language (one decode per variant, not one per language in the batch), in the
    order of the clips' content hashes within each language, the languages taking turns: a pass stopped part
    way has labelled a sample of every folder; a file's windows come in order."""
    groups: dict[str, list[Clip]] = {}
    for clip in sorted(clips, key=lambda c: (c.digest, c.window)):
        groups.setdefault(teacher.given_language(clip) or "", []).append(clip)
    runs = [[group[i : i + size] for i in range(0, len(group), size)] for _, group in sorted(groups.items())]
    return [run[i] for i in range(max(map(len, runs), default=0)) for run in runs if i < len(run)]


def _examples(cache: TeacherCache, clips: list[Clip], keep_capped: bool) -> tuple[list[LabelInfo], int]:
    """Every cached label of `clips` (capped ones only when asked for), and how many were left out."""
    infos = [info for c in clips if cache.valid(c.key) for info in cache.labels(c.key)]
    kept = [i for i in infos if keep_capped or not i.capped]
    return kept, len(infos) - len(kept)


def _digest(clips: list[Clip]) -> str:
    return hashlib.sha256(json.dumps(sorted(c.key for c in clips)).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------- the run
@dataclass
class _Head:
    ids: torch.Tensor | None
    weight: torch.Tensor
    to_head: torch.Tensor
    suppress: torch.Tensor | None


def _head(pair: ModelPair, student, size: int | None, ranking: tuple[int, ...] | None) -> _Head:
    tokenizer, gc = pair.processor.tokenizer, pair.target.generation_config
    vocab = pair.target.config.vocab_size
    return head_of(pair, student, draft_vocabulary(tokenizer, vocab, eos_token(gc), size, ranking) if size else None)


def head_of(pair: ModelPair, draft, ids: torch.Tensor | None) -> _Head:
    """The head scoring `ids` (None: every id) with `draft`'s output rows, and the map from the target's ids to
    its rows: a draft measured beside another is scored through its own ids, not the other's."""
    gc, vocab = pair.target.generation_config, pair.target.config.vocab_size
    suppress = list(getattr(gc, "suppress_tokens", None) or [])
    mask = TokenSpace(vocab, ids).mask(suppress, pair.device) if suppress else None
    return _Head(ids, head_weight(draft, ids), head_index(vocab, ids), mask)


# Parts of a run's identity known only once the models load (a quick check before the loads leaves them out).
_LOADED = ("target", "start_draft")


def _identity(options: DistillOptions, data: _Data, fingerprint: str | None, start: str | None = None) -> dict:
    """What makes a run this run; without the target's fingerprint, the part known before it loads. `start`:
    the fingerprint of the draft the student starts from (--init-draft), whose weights make the run too."""
    teacher = {**options.teacher.cache_key(), "keep_capped": options.teacher.keep_capped}
    identity = {"teacher": teacher, "train": options.train.identity(), "train_clips": _digest(data.train),
                "held_out_clips": _digest(data.held)}
    if start is not None:
        identity = {"start_draft": start, **identity}
    return identity if fingerprint is None else {"target": fingerprint, **identity}


def _check_resumable(run: RunFile, identity: dict) -> None:
    stored = dict((run.read() or {}).get("identity", {}))
    for part in _LOADED:
        if part not in identity:
            stored.pop(part, None)
    changed = differences(stored, normalised(identity))
    if changed:
        raise DistillError(f"the run in {run.folder} was started with other options, audio or target (it differs "
                           f"in {', '.join(changed[:6])}); resume it with the same command")


def _load_target(options: DistillOptions) -> ModelPair:
    pair = load_pair(target=options.target, draft=None, device=options.device, dtype=options.dtype)
    if getattr(pair.processor, "tokenizer", None) is None:
        raise DistillError(f"target '{options.target}' has no tokenizer: the teacher's transcripts need one")
    if not getattr(pair.target.generation_config, "is_multilingual", False):
        if "translate" in (*options.teacher.tasks, options.evaluation.task):
            raise DistillError(f"target '{options.target}' is English-only: it cannot translate (--tasks, --eval-task)")
        if options.teacher.language not in (None, "en", FOLDER_LANGUAGE):
            raise DistillError(f"target '{options.target}' is English-only: --language {options.teacher.language} "
                               "is not available")
    specials = pair.target.config.vocab_size - eos_token(pair.target.generation_config)
    if options.train.draft_vocab and options.train.draft_vocab <= specials:
        raise DistillError(f"--draft-vocab {options.train.draft_vocab} cannot hold the target's {specials} special and "
                           "timestamp tokens: give more, or 0 for the whole vocabulary")
    return pair


@dataclass
class _Run:
    """One run's context, built up stage by stage."""

    options: DistillOptions
    report: Reporter
    command: str
    file: RunFile
    data: _Data
    pair: ModelPair
    identity: dict
    cache: TeacherCache
    teacher: TeacherStats | None = None
    examples: list[LabelInfo] = field(default_factory=list)
    held_examples: list[LabelInfo] = field(default_factory=list)
    capped: int = 0
    baseline: WhisperForCausalLM | None = None   # another draft measured on the same held-out clips
    start: WhisperForCausalLM | None = None      # the draft the student starts from (--init-draft)


def distill(options: DistillOptions, report: Reporter | None = None, command: str = "") -> DistillResult:
    """Distil a draft for `options.target` into `options.out`; DistillError (one line) for what a user can fix."""
    report = report or Reporter()
    file = check_out(options)
    check_tokenizer(options.target)
    data = _clips(options, report)
    if options.resume:
        _check_resumable(file, _identity(options, data, None))  # before the target loads: a quick answer
    pair = _load_target(options)
    start = _start_draft(options, pair)
    identity = _identity(options, data, target_fingerprint(pair.target),
                         target_fingerprint(start) if start is not None else None)
    if options.resume:
        _check_resumable(file, identity)
    spec = options.evaluation.baseline_draft
    baseline = load_draft(spec, pair) if spec else None
    options.out.mkdir(parents=True, exist_ok=True)
    file.write(identity, TEACHER_STAGE)
    cache = TeacherCache(options.cache or default_cache_root(), identity["target"], options.teacher.cache_key(),
                         pair.target_name)
    run = _Run(options, report, command, file, data, pair, identity, cache, baseline=baseline, start=start)
    run.teacher = teacher_pass(pair, cache, data.train + data.held, options, run.report)
    run.examples, run.capped = _examples(cache, data.train, options.teacher.keep_capped)
    if not run.examples:
        raise _no_labels(run)
    run.held_examples = _examples(cache, data.held, options.teacher.keep_capped)[0]
    return _train_and_write(run)


def _no_labels(run: _Run) -> DistillError:
    """Why no training label came out: audio that failed to decode (NaN samples, a file truncated mid-stream;
    its header read well), or labels that never ended, or both."""
    unread = [run.teacher.unreadable[c.key] for c in run.data.train if c.key in run.teacher.unreadable]
    if len(unread) == len(run.data.train):
        return DistillError(f"none of the {len(unread)} training clip(s) could be read: their headers are sound but "
                            f"their audio failed to decode (first: {unread[0]}); fix or remove those files")
    also = f"; {len(unread)} clip(s) could not be read (first: {unread[0]})" if unread else ""
    return DistillError(f"the teacher produced no usable labels for the training audio ({run.capped} reached "
                        f"max_new_tokens={run.options.teacher.max_new_tokens} without ending{also})")


def _train_and_write(run: _Run) -> DistillResult:
    options, pair = run.options, run.pair
    torch.manual_seed(options.train.seed)
    student = build_student(pair.target, options.train.layers, run.start).to(pair.device)
    # A draft trained further keeps the head it was trained on; a new one ranks the tokens of its labels.
    ranking = draft_ranking(run.start) if run.start is not None else None
    ranking = ranking or _label_ranking(run, options.train.draft_vocab)
    if ranking is not None:   # saved with the draft: the runtime's head scores the ids this one is trained on
        setattr(student.config, RANKING_ATTR, list(ranking))
    head = _head(pair, student, options.train.draft_vocab, ranking)
    load = functools.lru_cache(maxsize=128)(run.cache.load)
    measure = functools.partial(teacher_forced, load=load, head=head.weight, to_head=head.to_head,
                                suppress=head.suppress, view=options.train.audio_view, device=pair.device)
    initial = measure(student, run.held_examples) if run.held_examples else None
    run.file.write(run.identity, "training")
    trainer = Trainer(student, Schedule(run.examples, options.train.batch_size, options.train.seed), load,
                      head.weight, head.to_head, head.suppress, options.train, options.out, run.identity, pair.device)
    result = trainer.run(options.resume, lambda log, res: run.report.step(log, res, options.train.steps))
    run.report.close()
    run.file.write(run.identity, "evaluation")
    save_draft(student, pair.processor, options.out)
    write_bundle(student, options.out)
    # Evaluated as it ships: the folder's float16 weights, loaded the way --draft loads them.
    exported = WhisperForCausalLM.from_pretrained(options.out, dtype=pair.dtype).to(pair.device).eval()
    evaluation = None
    if run.held_examples:
        evaluation = {"initial": asdict(initial),
                      **_evaluate(run, exported, measure(student, run.held_examples), "the distilled draft")}
        if run.baseline is not None:
            baseline = copy.deepcopy(run.baseline).float()
            own = head_of(pair, baseline, _own_head_ids(pair, baseline))
            measured = measure(baseline, run.held_examples, head=own.weight, to_head=own.to_head, suppress=own.suppress)
            spec = options.evaluation.baseline_draft
            evaluation["baseline"] = {"draft": spec, **_evaluate(run, run.baseline, measured,
                                                                       f"the baseline draft {spec}")}
    card = _card(run, result, evaluation)
    history = result.history
    cards.plot_history(options.out / cards.PLOT, [h.step for h in history], [h.loss for h in history],
                       [h.agreement for h in history], (evaluation or {}).get("final", {}).get("agreement"))
    cards.write_card(options.out, card)
    run.file.write(run.identity, "done")
    (options.out / CHECKPOINT).unlink(missing_ok=True)
    return DistillResult(options.out, card, result, run.teacher, run.cache.folder, student)


def _own_head_ids(pair: ModelPair, draft) -> torch.Tensor | None:
    """The ids the runtime's head scores for another draft (its own ranking, or the shipped one)."""
    vocab, eos = pair.target.config.vocab_size, eos_token(pair.target.generation_config)
    return draft_vocabulary(pair.processor.tokenizer, vocab, eos, RUNTIME_DRAFT_VOCAB, draft_ranking(draft))


def _label_ranking(run: _Run, size: int | None) -> tuple[int, ...] | None:
    """The reduced head's ranking from the training labels, where the runtime ships no ranking for this
    tokenizer (None: the shipped ranking applies, or the head scores every id)."""
    pair = run.pair
    vocab, eos = pair.target.config.vocab_size, eos_token(pair.target.generation_config)
    if not size or size >= vocab or shipped_ranking_fits(pair.processor.tokenizer, vocab):
        return None
    return label_ranking(run.cache, run.examples, eos, size - (vocab - eos))


def _evaluate(run: _Run, draft, teacher_forced_figures, draft_name: str) -> dict:
    """The teacher-forced figures given, and `draft` (called `draft_name` in an error) in the decoder, on the
    held-out clips."""
    options = run.options
    held = [c for c in run.data.held if run.cache.valid(c.key)]  # those the teacher pass could read
    run.report.message(f"evaluating on {len(held)} held-out clips")
    clips = held[: options.evaluation.max_clips] if options.evaluation.max_clips else held
    read = ClipReader()
    audio = [read(c) for c in clips]
    names = [f"{c.path.name}#{c.window}" for c in clips]
    decoder = in_decoder(run.pair, draft, audio, names, options.evaluation, options.teacher.max_new_tokens,
                         languages=[c.folder_language for c in clips], draft_name=draft_name)
    return {"clips": len(held), "hours": sum(c.seconds for c in held) / 3600, "final": asdict(teacher_forced_figures),
            "language": _eval_language(run), "decoder": decoder_figures(decoder)}


def _eval_language(run: _Run) -> str:
    """How the held-out clips' language was chosen: "given" applies to a multilingual target only; an
    English-only one decodes English either way."""
    if not getattr(run.pair.target.generation_config, "is_multilingual", False):
        return "en"
    return run.options.evaluation.language


def load_draft(spec: str, pair: ModelPair, flag: str = "--baseline-draft") -> WhisperForCausalLM:
    """Another draft to measure beside the new one (or to start from: `flag`): "bundled" (the draft the package
    ships for this target) or a folder. It must fit the target as any --draft must, checked here, before the
    teacher pass: not found out after the training, at its evaluation."""
    if spec == BUNDLED:
        try:
            return load_bundled_draft(pair.target)
        except ModelLoadError as exc:
            raise DistillError(f"{flag} bundled: {exc}") from exc
    try:
        draft = WhisperForCausalLM.from_pretrained(spec, dtype=pair.dtype)
    except (OSError, ValueError) as exc:
        raise DistillError(f"{flag} '{spec}' cannot be loaded: {str(exc).splitlines()[0][:200]}") from exc
    try:
        check_pair(pair.target, draft, pair.target_name, spec)
    except ModelLoadError as exc:
        raise DistillError(f"{flag} {spec} does not fit the target: {exc}") from exc
    return draft.to(pair.device).eval()


def _start_draft(options: DistillOptions, pair: ModelPair) -> WhisperForCausalLM | None:
    """The draft the student starts from (--init-draft), checked against the target and --draft-vocab before the
    teacher pass: its head's ranking is kept, so the run must train a head of that ranking's size."""
    spec = options.train.init_draft
    if spec is None:
        return None
    draft = load_draft(spec, pair, "--init-draft")
    vocab, eos = pair.target.config.vocab_size, eos_token(pair.target.generation_config)
    try:
        check_start(pair.target, draft, f"--init-draft {spec}")
        ranking = draft_ranking(draft)
        if ranking is None:
            return draft
        size = len(ranking) + vocab - eos   # its text tokens and the target's special ones
        draft_vocabulary(pair.processor.tokenizer, vocab, eos, size, ranking)   # raises for ids it cannot hold
    except ValueError as exc:
        raise DistillError(f"--init-draft {spec}: {exc}") from exc
    if options.train.draft_vocab != size:
        raise DistillError(f"--init-draft {spec} was trained with a head of {size} tokens, which it keeps: give "
                           f"--draft-vocab {size} (not {options.train.draft_vocab or 0})")
    return draft


def _mean_log(logs: list[StepLog]) -> dict:
    """Loss and training-batch agreement over a few steps (one step's batch is noisy)."""
    return {"steps": len(logs), "loss": sum(h.loss for h in logs) / len(logs),
            "agreement": sum(h.agreement for h in logs) / len(logs)}


def _data_card(run: _Run) -> dict:
    options, data = run.options, run.data
    return {"train": {"sources": [str(s) for s in options.audio], "files": len({c.path for c in data.train}),
                      "clips": len(data.train), "hours": sum(c.seconds for c in data.train) / 3600,
                      "labels": len(run.examples), "positions": sum(e.predicted for e in run.examples),
                      "capped_left_out": run.capped, "skipped_files": len(data.skipped)},
            "held_out": {"sources": [str(s) for s in options.eval_audio] or [f"holdout {options.holdout}"],
                         "clips": len(data.held), "hours": sum(c.seconds for c in data.held) / 3600}}


def _layers_card(run: _Run) -> list[int] | None:
    """The target layers the student started from (None: it started from a draft, `started_from`)."""
    if run.start is not None:
        return None
    return list(run.options.train.layers or default_layers(run.pair.target))


def _card(run: _Run, result: TrainResult, evaluation: dict | None) -> dict:
    options, target, device, stats = run.options, run.pair.target, run.pair.device, run.teacher
    return {
        "target": {"name": run.pair.target_name, "fingerprint": run.identity["target"],
                   "vocab": target.config.vocab_size, "d_model": target.config.d_model,
                   "decoder_layers": target.config.decoder_layers},
        "command": run.command, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": f"cpu, {torch.get_num_threads()} torch thread(s)" if device.type == "cpu" else str(device),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "data": _data_card(run),
        "teacher": {**asdict(options.teacher), "variants": [v.name for v in options.teacher.variants()],
                    "seconds": stats.seconds, "computed": stats.computed, "reused": stats.reused,
                    "failed": stats.failed},
        "training": {**asdict(options.train), "layers": _layers_card(run),
                     "started_from": options.train.init_draft,
                     "steps": result.steps, "seconds": result.seconds, "resumed_at": result.resumed_at,
                     "first": _mean_log(result.history[:5]), "final": _mean_log(result.history[-5:])},
        "evaluation": evaluation,
        "files": {"weights": "model.safetensors", "bundle": "bundle/", "plot": cards.PLOT},
    }
