"""Chunked streaming: re-decode a growing audio buffer and commit text as it becomes stable.

The processor follows whisper_streaming's OnlineASRProcessor: three verbs (`insert_audio`,
`process`, `finish`), a buffer that is re-decoded as soon as the previous decode is done and at
least `step_s` of new audio has arrived (the decoder's cost sets the pace), a commit policy, and
buffer trimming at committed segment boundaries with the committed text passed to the decoder as
prompt context. Two commit policies (docs/streaming.md):

- `local-agreement` (LocalAgreement-2, whisper_streaming): commit the words two consecutive
  hypotheses agree on and that end at least `edge_s` before the end of the buffer (two hypotheses a
  fraction of a second apart can agree on a word the speaker has not finished);
- `alignatt` (AlignAtt, Papi et al. 2023, as in SimulStreaming): commit the words the target's
  cross-attention has moved past, i.e. that end at least `frontier_s` before the end of the buffer.

Word times come from the target's cross-attention (decoding/alignment.py: Whisper's DTW over the
alignment heads). With `word_alignment=False` they are interpolated inside Whisper's timestamped
segments in proportion to the words' lengths instead (cheaper, and off by up to seconds).
"""

from __future__ import annotations

import abc
import dataclasses
import math
import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from asr_app.audio import SAMPLE_RATE, SILENCE_RMS, WINDOW_SECONDS, peak_frame_rms, prepare_audio
from asr_app.decoding.options import DecodingOptions
from asr_app.decoding.protocol import Decoder
from asr_app.decoding.silence import LOGPROB_THRESHOLD, NO_SPEECH_THRESHOLD, judged_silent
from asr_app.vad import SpeechDetector

_NORMALISE = re.compile(r"[^\w']+")
STEP_S = 0.3  # least new audio before a re-decode (docs/streaming.md: chosen from bench/stream_bench.py)
EDGE_S = 0.3  # local-agreement: agreed words must end this far before the buffer's end (docs/streaming.md)
# Rewritten committed words: the last committed words (3, else 2) found again ending this near where they
# were committed mark where the new words start (CommitPolicy._after_anchor). Never one word alone: a short
# word ("and", "that") recurs nearby, and a wrong anchor would repeat words or drop them.
ANCHOR_WORDS = (3, 2)
ANCHOR_S = 0.6
STEP_HISTORY = 4096   # decodes kept for statistics (20 min at one every 0.3 s); older ones are only counted
# Rewritten committed words, no anchor: a word of the new hypothesis that starts within this of the last committed
# word's end and has no more audio of its own past it (one 20 ms alignment frame, with room for rounding) is the
# committed audio heard as other words ("my" heard again as "am I", the "I" zero-long at the end of "my"), not a
# new word. A short new word ("a", 50 ms past the seam) has more; a zero-long word later on is left alone.
SEAM_S = 0.025


@dataclass(frozen=True)
class Word:
    start: float  # seconds from the start of the stream
    end: float
    text: str     # as decoded, punctuation included

    @property
    def key(self) -> str:
        """What two hypotheses must share to agree on this word (case and punctuation ignored)."""
        return _NORMALISE.sub("", self.text.lower()) or self.text


def words_from_segments(segments: Sequence[Any], offset: float = 0.0, limit: float | None = None) -> list[Word]:
    """Words in stream time: the segments' aligned words when they have them, else interpolated.

    `segments` are objects with start/end/text (and maybe words) relative to the decoded window;
    `offset` shifts them to stream time; `limit` (the window's audio length) clamps times the model
    placed past the end of the audio it actually heard.
    """
    words: list[Word] = []
    for seg in segments:
        if getattr(seg, "words", None):
            for w in seg.words:
                start = min(float(w.start), limit) if limit is not None else float(w.start)
                end = min(float(w.end), limit) if limit is not None else float(w.end)
                if w.word.strip():
                    words.append(Word(offset + start, offset + max(end, start), w.word.strip()))
            continue
        words.extend(_interpolated(seg, offset, limit))
    return words


def _interpolated(seg: Any, offset: float, limit: float | None) -> list[Word]:
    """A segment's words with times spread over it in proportion to their lengths."""
    start, end = float(seg.start), float(seg.end)
    if limit is not None:
        start, end = min(start, limit), min(end, limit)
    end = max(end, start)
    pieces = seg.text.split()
    total = sum(len(p) for p in pieces)
    words, done = [], 0
    for piece in pieces:
        w_start = start + (end - start) * done / total
        done += len(piece)
        w_end = start + (end - start) * done / total
        words.append(Word(offset + w_start, offset + w_end, piece))
    return words


def join_words(words: Sequence[Word]) -> str:
    return " ".join(w.text for w in words)


class CommitPolicy(abc.ABC):
    """What a commit policy keeps: committed words still in the buffer, the uncommitted tail.

    Each hypothesis is the full word sequence decoded from the current buffer, so it repeats the
    words already committed inside the buffer; those are matched and skipped first (by text,
    falling back to times and an n-gram check when the model rewrote them). Committed words never
    change; `tail` is the uncommitted rest of the newest hypothesis. Subclasses decide, in
    `insert`, which words of the uncommitted part become final.
    """

    name = "policy"

    def __init__(self) -> None:
        self.in_buffer: list[Word] = []   # committed words whose audio is still in the buffer
        self.committed_end = 0.0          # end time of the last committed word
        self.tail: list[Word] = []        # newest hypothesis minus what is committed

    @abc.abstractmethod
    def insert(self, hypothesis: Sequence[Word], buffer_end: float) -> list[Word]:
        """Add a new hypothesis of the buffer (which ends at stream time `buffer_end`); returns the
        words it commits (maybe none)."""

    def _uncommitted_part(self, hypothesis: Sequence[Word]) -> list[Word]:
        i = 0
        while i < min(len(hypothesis), len(self.in_buffer)) and hypothesis[i].key == self.in_buffer[i].key:
            i += 1
        if i == len(self.in_buffer):
            return list(hypothesis[i:])
        # The model changed words we already committed ("stuff it" became "Stuffered"). Where the last two or
        # three committed words are still there near where they ended, what follows them is new: word times move
        # between decodes (by 0.16 s, measured), so a cut by time alone can drop the next word.
        anchored = self._after_anchor(hypothesis)
        if anchored is not None:
            return anchored
        # Else fall back to time, as whisper_streaming does (less a word at the seam with no audio of its own, see
        # SEAM_S), then drop a repeated n-gram at the seam (the same words heard twice across the cut).
        end = self.committed_end
        rest = [w for w in hypothesis if w.start > end - 0.1
                and not (w.start <= end + SEAM_S and w.end - max(w.start, end) <= SEAM_S)]
        committed_keys = [w.key for w in self.in_buffer]
        for n in range(min(5, len(rest), len(committed_keys)), 0, -1):
            if [w.key for w in rest[:n]] == committed_keys[-n:]:
                return rest[n:]
        return rest

    def _after_anchor(self, hypothesis: Sequence[Word]) -> list[Word] | None:
        """The words after the last committed words (their last 3, else 2, as ANCHOR_WORDS says), matched in
        `hypothesis` where they end within ANCHOR_S of where they were committed; None: not found."""
        keys = [w.key for w in hypothesis]
        committed = [w.key for w in self.in_buffer]
        for n in (n for n in ANCHOR_WORDS if n <= len(committed)):
            ends = [i + n for i in range(len(keys) - n + 1) if keys[i : i + n] == committed[-n:]
                    and abs(hypothesis[i + n - 1].end - self.committed_end) <= ANCHOR_S]
            if ends:
                best = min(ends, key=lambda e: abs(hypothesis[e - 1].end - self.committed_end))
                return list(hypothesis[best:])
        return None

    def flush(self) -> list[Word]:
        """Commit the whole tail (end of stream, or a forced buffer cut)."""
        flushed = self._commit(self.tail)
        self.tail = []
        return flushed

    def trim(self, before: float) -> None:
        """The buffer now starts at `before`: forget committed words that lie before it."""
        self.in_buffer = [w for w in self.in_buffer if w.end > before + 1e-6]

    def _commit(self, words: Sequence[Word]) -> list[Word]:
        # Times from different hypotheses can overlap slightly; committed times are made monotone so
        # that the final transcript's timeline never runs backwards.
        fixed: list[Word] = []
        floor = self.committed_end
        for w in words:
            start = max(w.start, floor)
            fixed.append(Word(start, max(w.end, start), w.text))
            floor = fixed[-1].end
        if fixed:
            self.in_buffer.extend(fixed)
            self.committed_end = fixed[-1].end
        return fixed


class LocalAgreement(CommitPolicy):
    """LocalAgreement-2: commit the longest common prefix of the last two hypotheses, up to the first
    word that ends within `edge_s` of the buffer's end. At short steps two hypotheses come from nearly
    the same audio and may agree on a word cut off at the edge ("in" of "into"); held back, it is
    compared again once more audio has come.

    With `settle_s`, the words after the agreed ones that the previous hypothesis could not have agreed on,
    because they end past that hypothesis' buffer less `edge_s`, are committed from one hypothesis once they
    end `settle_s` before the buffer's end. That happens only after a large step:
    a decoder that falls behind (a loaded server) re-decodes seconds of new audio at once, and waiting for a
    second hypothesis of those words costs another whole round of everyone's re-decodes. At steps shorter than
    `settle_s - edge_s` no word qualifies, so a stream the decoder keeps up with commits as before."""

    name = "local-agreement"

    def __init__(self, edge_s: float = EDGE_S, settle_s: float | None = None) -> None:
        super().__init__()
        if settle_s is not None and settle_s <= edge_s:
            raise ValueError(f"settle_s must exceed edge_s ({edge_s:g} s), got {settle_s:g}")
        self.edge_s = edge_s
        self.settle_s = settle_s
        self._previous: list[Word] | None = None
        self._previous_end = float("-inf")   # the buffer's end when the previous hypothesis was decoded

    def insert(self, hypothesis: Sequence[Word], buffer_end: float = float("inf")) -> list[Word]:
        new = self._uncommitted_part(hypothesis)
        agreed: list[Word] = []
        previous = self._previous or []
        for old, cur in zip(previous, new):
            if old.key != cur.key or cur.end > buffer_end - self.edge_s:
                break
            agreed.append(cur)
        if self.settle_s is not None and math.isfinite(buffer_end):   # no end given: nothing is settled
            agreed += self._settled_unheard(new[len(agreed):], previous[len(agreed):], buffer_end)
        committed = self._commit(agreed)
        self.tail = new[len(agreed):]
        self._previous = self.tail
        self._previous_end = buffer_end
        return committed

    def _settled_unheard(self, words: Sequence[Word], unmatched: Sequence[Word], buffer_end: float) -> list[Word]:
        """The leading words that the previous hypothesis could not agree on (they end past its buffer less the
        edge) and that end `settle_s` before this buffer's end. Where the two disagree on audio the previous
        hypothesis heard clearly, nothing is settled: a word of this one that ends there (heard as another word,
        or added), or a word of the previous one there (`unmatched`: its words this one did not repeat) that
        this one left out."""
        if unmatched and unmatched[0].end <= self._previous_end - self.edge_s:
            return []
        settled = []
        for w in words:
            if w.end <= self._previous_end - self.edge_s or w.end > buffer_end - self.settle_s:
                break
            settled.append(w)
        return settled

    def flush(self) -> list[Word]:
        self._previous = None  # the next hypothesis has nothing to agree with (the audio it heard stays heard)
        return super().flush()


class AlignAtt(CommitPolicy):
    """AlignAtt: commit the words whose audio the target's attention has already moved past.

    A word is final once its aligned end lies at least `frontier_s` before the end of the buffer:
    the model has heard what follows it, so new audio is unlikely to change it (Papi et al. 2023
    stop decoding where the attention reaches the last frames; SimulStreaming's default margin is
    25 frames = 0.5 s). Words are committed in order: the first one too close to the end stops it.
    """

    name = "alignatt"

    def __init__(self, frontier_s: float = 0.5) -> None:
        super().__init__()
        self.frontier_s = frontier_s

    def insert(self, hypothesis: Sequence[Word], buffer_end: float) -> list[Word]:
        new = self._uncommitted_part(hypothesis)
        ready = 0
        while ready < len(new) and new[ready].end <= buffer_end - self.frontier_s:
            ready += 1
        committed = self._commit(new[:ready])
        self.tail = new[ready:]
        return committed


POLICIES = {"local-agreement": LocalAgreement, "alignatt": AlignAtt}


def commit_policy(name: str, frontier_s: float = 0.5, edge_s: float = EDGE_S,
                  settle_s: float | None = None) -> CommitPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown commit policy '{name}'; choose one of {', '.join(POLICIES)}")
    return AlignAtt(frontier_s) if name == "alignatt" else LocalAgreement(edge_s, settle_s)


@dataclass(frozen=True)
class StreamingOptions:
    step_s: float = STEP_S            # re-decode once the previous decode is done and this much new audio came
    policy: str = "local-agreement"   # commit policy: local-agreement | alignatt (docs/streaming.md)
    frontier_s: float = 0.5           # alignatt: a word is final once it ends this far before the buffer's end
    edge_s: float = EDGE_S            # local-agreement: an agreed word must end this far before the buffer's end
    settle_s: float | None = None     # local-agreement: after a step too large for a second hypothesis, commit
    #                                   from one the words new to it that end this far before the buffer's end
    word_alignment: bool = True       # word times from cross-attention (else interpolated in segments)
    trim_s: float = 15.0              # once the buffer is longer, cut it at a committed segment end
    max_buffer_s: float = WINDOW_SECONDS  # hard cap (Whisper's window); forces a cut when reached
    prompt_chars: int = 200           # committed text before the buffer, passed as the decoder prompt
    prompt_tokens: int | None = None  # when set: the last this-many tokens of that text, so every session whose
    #                                   prompt is that long shares one prompt length and can share a batch
    no_speech_threshold: float = NO_SPEECH_THRESHOLD  # Whisper's no-speech rule (decoding/silence.py)
    logprob_threshold: float = LOGPROB_THRESHOLD
    energy_threshold: float = SILENCE_RMS  # RMS (of 30 ms frames) below which the whole buffer is silence
    vad_filter: bool = False          # a buffer Silero VAD finds no speech in is silence too (asr_app/vad.py)
    reuse_hypothesis: bool = True     # offer the previous decode of the buffer as a hint (same result, faster)
    decoding: DecodingOptions | None = None  # None = the decoder's own, with timestamps on

    def __post_init__(self) -> None:
        if self.prompt_tokens is not None and self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be at least 1 (or None: the whole prompt), got {self.prompt_tokens}")
        if self.settle_s is not None and not self.edge_s < self.settle_s <= self.max_buffer_s:
            raise ValueError(f"settle_s must lie in ({self.edge_s:g}, {self.max_buffer_s:g}] seconds (or None: off), "
                             f"got {self.settle_s:g}")


@dataclass
class StreamEvent:
    kind: Literal["commit", "partial"]
    text: str                          # commit: the newly final words; partial: the current tail
    start: float                       # audio times (s from stream start) of the words in `text`
    end: float
    emitted_at: float                  # wall seconds since the stream's first sample was captured
    audio_received: float = 0.0        # seconds of audio the processor had received when emitting
    words: list[Word] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "text": self.text, "start": round(self.start, 3), "end": round(self.end, 3),
               "emitted_at": round(self.emitted_at, 3), "audio_received": round(self.audio_received, 3)}
        if self.kind == "commit":
            out["words"] = [{"word": w.text, "start": round(w.start, 3), "end": round(w.end, 3)} for w in self.words]
        return out


@dataclass
class StepRecord:
    """One decode of the buffer, for statistics."""
    buffer_start: float
    buffer_end: float
    compute_s: float
    skipped_silence: bool
    acceptance_rate: float | None
    hint_tokens: int = 0              # tokens of the previous hypothesis offered as a hint ...
    hint_accepted: int = 0            # ... and how many of them the target kept
    target_calls: int = 0             # target decoder passes of this decode


class StreamingProcessor:
    """insert_audio(chunk) as audio arrives; process() after each chunk; finish() at the end."""

    def __init__(self, decoder: Decoder, options: StreamingOptions = StreamingOptions(),
                 clock: Callable[[], float] = time.monotonic):
        if options.max_buffer_s > WINDOW_SECONDS or options.step_s <= 0:
            raise ValueError("need 0 < step_s and max_buffer_s <= 30 (Whisper's window)")
        if options.edge_s < 0 or options.frontier_s < 0:
            raise ValueError("need edge_s >= 0 and frontier_s >= 0")
        if options.policy == "alignatt" and not options.word_alignment:
            raise ValueError("the alignatt policy needs word_alignment (word times from cross-attention)")
        self.decoder = decoder
        self.options = options
        base = options.decoding if options.decoding is not None else decoder.options
        # words for the commit policy and the events, which carry no probability: the pass for it is skipped
        self.decoding = dataclasses.replace(base, timestamps=True, word_timestamps=options.word_alignment,
                                            word_probabilities=False)
        self.clock = clock
        self.vad = SpeechDetector() if options.vad_filter else None
        self.agreement = commit_policy(options.policy, options.frontier_s, options.edge_s, options.settle_s)
        self.committed: list[Word] = []
        self.steps: deque[StepRecord] = deque(maxlen=STEP_HISTORY)   # the newest decodes (a stream may run for hours)
        self.compute_s = 0.0              # time spent decoding, over the whole stream
        self._buffer = np.zeros(0, dtype=np.float32)
        self._buffer_start = 0.0          # stream time of the buffer's first sample
        self._received = 0                # samples received in total
        self._decoded_upto = 0            # value of _received at the last decode
        self._t0: float | None = None
        self._last_partial: str | None = None
        self._finished = False
        self.prompt_retries = 0           # silent-judged decodes done again without the prompt
        # The previous decode: its tokens, and the buffer start and prompt they were decoded with.
        self._previous: tuple[list[int], float, str | None] | None = None

    # -- the three verbs -------------------------------------------------------------------

    def insert_audio(self, chunk: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
        if self._finished:
            raise RuntimeError("insert_audio after finish()")
        chunk = prepare_audio(chunk, sample_rate, source="stream chunk")
        if self._t0 is None:
            # The first chunk's audio was being captured during the chunk's duration before now.
            self._t0 = self.clock() - chunk.size / SAMPLE_RATE
        self._buffer = np.concatenate([self._buffer, chunk])
        self._received += chunk.size

    def process(self) -> list[StreamEvent]:
        """Decode the buffer if at least one step of new audio arrived; returns new events."""
        if self._received - self._decoded_upto < self.options.step_s * SAMPLE_RATE:
            return []
        return self._step(final=False)

    def resume(self) -> None:
        """Take more audio after finish() (a chunk that was on its way when the recording stopped): the
        committed words stay final; the next finish() decodes the new audio and commits the rest."""
        self._finished = False

    def finish(self) -> list[StreamEvent]:
        """Decode whatever audio is left and commit the final tail."""
        if self._finished:
            return []
        events = self._step(final=True) if self._received > self._decoded_upto else []
        self._finished = True
        flushed = self.agreement.flush()
        self.committed.extend(flushed)
        if flushed:
            events.append(self._event("commit", flushed))
        if self._last_partial:
            events.append(self._event("partial", []))
        return events

    # -- results ---------------------------------------------------------------------------

    @property
    def committed_text(self) -> str:
        return join_words(self.committed)

    @property
    def buffer_seconds(self) -> float:
        return self._buffer.size / SAMPLE_RATE

    @property
    def audio_seconds(self) -> float:
        return self._received / SAMPLE_RATE

    # -- internals -------------------------------------------------------------------------

    def _now(self) -> float:
        return self.clock() - (self._t0 if self._t0 is not None else self.clock())

    def _event(self, kind: Literal["commit", "partial"], words: list[Word]) -> StreamEvent:
        start = words[0].start if words else self.audio_seconds
        end = words[-1].end if words else self.audio_seconds
        return StreamEvent(kind, join_words(words), start, end, self._now(), self.audio_seconds, list(words))

    def _prompt(self) -> str | list[int] | None:
        before = [w for w in self.committed if w.end <= self._buffer_start + 1e-6]
        text = (join_words(before)[-self.options.prompt_chars:] if before else "").strip()
        if not text or self.options.prompt_tokens is None:
            return text or None
        # Encoded as the decoder encodes a text prompt (build_prompt), then cut to a fixed length.
        tokenizer = self.decoder.pair.processor.tokenizer
        return tokenizer(" " + text, add_special_tokens=False)["input_ids"][-self.options.prompt_tokens:]

    def _cut(self, at: float) -> None:
        """Drop buffer audio before stream time `at`."""
        drop = int(round((at - self._buffer_start) * SAMPLE_RATE))
        drop = min(max(drop, 0), self._buffer.size)
        if drop:
            self._buffer = self._buffer[drop:]
            self._buffer_start += drop / SAMPLE_RATE
            self.agreement.trim(self._buffer_start)

    def _enforce_cap(self, events: list[StreamEvent]) -> None:
        """Keep the buffer within Whisper's window before decoding it."""
        cap = self.options.max_buffer_s
        if self.buffer_seconds <= cap:
            return
        if self.agreement.committed_end > self._buffer_start:
            self._cut(self.agreement.committed_end)
        if self.buffer_seconds > cap and self.agreement.tail:
            # Nothing agreed for a whole window: take the last hypothesis as final rather than lose it.
            flushed = self.agreement.flush()
            self.committed.extend(flushed)
            events.append(self._event("commit", flushed))
            self._cut(flushed[-1].end)
        if self.buffer_seconds > cap:  # still too long (e.g. one endless segment): keep the newest audio
            self._cut(self._buffer_start + self.buffer_seconds - cap)

    def _hypothesis(self) -> tuple[list[Word], list[Any], bool, Any]:
        """Decode the buffer -> (words in stream time, segments, skipped as silence, decoding stats)."""
        if peak_frame_rms(self._buffer) < self.options.energy_threshold:
            return [], [], True, None
        if self.vad is not None and not self.vad.speech(self._buffer):
            return [], [], True, None
        prompt = self._prompt()
        hint = None
        if self.options.reuse_hypothesis and self._previous is not None:
            # The buffer grew by a step since the previous decode; if it still starts at the same place
            # with the same prompt, that decode (timestamps included) is most likely this one's prefix.
            tokens, start, previous_prompt = self._previous
            if start == self._buffer_start and previous_prompt == prompt:
                hint = tokens
        result = self.decoder.decode([self._buffer], self.decoding, prompts=[prompt], hints=[hint])[0]
        self._previous = (list(result.tokens), self._buffer_start, prompt)
        if prompt is not None and self._silent(result):
            # The buffer has sound (the energy gate passed) but the decode calls it silence: a prompt can talk
            # Whisper into that, so decode once more without it before any words are given up (as long-form
            # does with a window).
            self.prompt_retries += 1
            result = self.decoder.decode([self._buffer], self.decoding, prompts=[None], hints=[None])[0]
            self._previous = (list(result.tokens), self._buffer_start, None)
        if self._silent(result):
            return [], [], True, result.stats
        words = words_from_segments(result.segments, self._buffer_start, self.buffer_seconds)
        return words, list(result.segments), False, result.stats

    def _silent(self, result) -> bool:
        return judged_silent(result, self.options.no_speech_threshold, self.options.logprob_threshold)

    def _step(self, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        new_audio = self._buffer[-min(self._received - self._decoded_upto, self._buffer.size):]
        if (not final and self.committed and not self.agreement.tail
                and peak_frame_rms(new_audio) < self.options.energy_threshold):
            # Everything heard so far is committed and only silence arrived since: re-decoding could
            # only repeat it. Drop the committed audio (the prompt keeps its text) and wait.
            self._decoded_upto = self._received
            self.steps.append(StepRecord(self._buffer_start, self._buffer_start + self.buffer_seconds, 0.0,
                                         True, None))
            self._cut(self._buffer_start + self.buffer_seconds - 0.5)
            return events
        self._enforce_cap(events)
        self._decoded_upto = self._received
        started = time.perf_counter()
        words, segments, silent, stats = self._hypothesis()
        compute = time.perf_counter() - started
        self.compute_s += compute
        acceptance = stats.acceptance_rate if stats is not None and stats.drafted else None
        self.steps.append(StepRecord(self._buffer_start, self._buffer_start + self.buffer_seconds, compute, silent,
                                     acceptance, stats.hinted if stats else 0, stats.hint_accepted if stats else 0,
                                     stats.target_calls if stats else 0))
        newly = self.agreement.insert(words, self._buffer_start + self.buffer_seconds)
        if newly:
            self.committed.extend(newly)
            events.append(self._event("commit", newly))
        partial = join_words(self.agreement.tail)
        if partial != self._last_partial and not final:
            events.append(self._event("partial", self.agreement.tail))
            self._last_partial = partial
        if final:
            return events
        if silent and not self.agreement.tail:
            # Nothing pending in a silent buffer: keep only its last half second (a word may be starting).
            self._cut(self._buffer_start + self.buffer_seconds - 0.5)
        elif self.buffer_seconds > self.options.trim_s:
            self._trim_at_segment(segments)
        return events

    def _trim_at_segment(self, segments: list[Any]) -> None:
        """Cut where the committed text ends. With aligned word times that is the last committed word's end:
        the prompt then holds exactly the words before the cut and the buffer exactly the audio after
        them. (A cut at a segment end before committed words left them in the audio but out of the
        prompt, and tiny.en then skipped them and what followed.) Interpolated times are too rough for
        that: there the cut is at the latest segment end inside the committed text, as whisper_streaming
        does."""
        committed_end = self.agreement.committed_end
        if self.options.word_alignment and self.agreement.in_buffer:
            cuts = [committed_end]
        else:
            cuts = [self._buffer_start + float(s.end) for s in segments if
                    self._buffer_start + float(s.end) <= committed_end + 0.05]
        cuts = [c for c in cuts if c > self._buffer_start]
        if cuts:
            self._cut(max(cuts))


def latency_report(events: Sequence[StreamEvent], audio_seconds: float,
                   compute_seconds: float) -> dict[str, float | int | None]:
    """whisper_streaming's latency: per committed word, emission time minus the word's end in the audio.

    first_partial_s: emission of the first event showing any text minus the end of its first word.
    audio_lag_*: the same per-word latency in audio time (audio received at emission minus the word's
    end): with a source that is not paced (`FileSource(realtime=False)`) this is the latency of the
    commit policy alone, as on an infinitely fast machine.
    rtf: decoding compute time / audio duration.
    """
    finalization = [ev.emitted_at - w.end for ev in events if ev.kind == "commit" for w in ev.words]
    lag = np.asarray([ev.audio_received - w.end for ev in events if ev.kind == "commit" for w in ev.words])
    first = next((ev for ev in events if ev.words), None)
    arr = np.asarray(finalization, dtype=np.float64)
    return {
        "words": int(arr.size),
        "first_partial_s": (first.emitted_at - first.words[0].end) if first else None,
        "finalization_p50_s": float(np.percentile(arr, 50)) if arr.size else None,
        "finalization_p90_s": float(np.percentile(arr, 90)) if arr.size else None,
        "finalization_max_s": float(arr.max()) if arr.size else None,
        "audio_lag_p50_s": float(np.percentile(lag, 50)) if lag.size else None,
        "audio_lag_p90_s": float(np.percentile(lag, 90)) if lag.size else None,
        "rtf": compute_seconds / audio_seconds if audio_seconds > 0 else None,
    }
