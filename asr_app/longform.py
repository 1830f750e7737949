"""Long-form and batch transcription with segment timestamps.

Long audio is decoded as Whisper itself does it: a 30 s window, then the next window starts
at the last complete segment's closing timestamp (or one window further when the model
closed its last segment at the window end or emitted none). Each window is decoded with
the previous text as prompt. Several files advance together when `batch_size > 1`: each
round decodes the current window of every active file in one batched call.

Temperature fallback, also as Whisper does it: a window whose text is a repetition loop (gzip
compression ratio above 2.4) or whose mean log-probability is below -1 is decoded again at
temperatures 0.2, 0.4, ... 1.0 until it passes; a window judged silent is not retried. After a
window decoded above T = 0.5 the previous text is no longer passed as prompt (it may be the loop).
At T > 0 each round of windows and each retry of a window draws from its own seed, derived from the
job's (`decoding.seeds.reseeded`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asr_app.audio import (
    SAMPLE_RATE,
    SILENCE_RMS,
    WINDOW_SECONDS,
    ArrayAudio,
    AudioFileReader,
    AudioLoadError,
    is_silent,
    prepare_audio,
)
from asr_app.decoding.alignment import attach_words, shift_words
from asr_app.decoding.options import DecodingOptions, DecodingResult, DecodingStats, Segment
from asr_app.decoding.protocol import Decoder
from asr_app.decoding.seeds import reseeded
from asr_app.decoding.silence import LOGPROB_THRESHOLD, NO_SPEECH_THRESHOLD, judged_silent
from asr_app.decoding.text import SECONDS_PER_TIMESTAMP, compression_ratio
from asr_app.transcript import Transcript
from asr_app.vad import SpeechDetector

WINDOW_SAMPLES = int(WINDOW_SECONDS * SAMPLE_RATE)
MIN_TAIL_SECONDS = 0.1         # a shorter remainder is not worth a window (and invites hallucinations)
VAD_PAD_S = 0.2                # with --vad_filter, a window starts this much before the speech it found
VAD_MIN_SKIP_S = 1.0           # ... when the speech starts more than this far into the window
TEMPERATURE_FALLBACK = (0.2, 0.4, 0.6, 0.8, 1.0)   # openai/whisper's schedule after T = 0
MEL_FRAMES_PER_SECOND = 100    # Whisper's feature frames (hop 160 samples): the unit of openai-whisper's `seek`

__all__ = ["TranscribeOptions", "transcribe", "transcribe_many"]


@dataclass(frozen=True)
class TranscribeOptions:
    decoding: DecodingOptions | None = None  # None: the decoder's own options (timestamps forced on)
    condition_on_previous_text: bool = True
    prompt_tokens: int = 223                 # earlier tokens passed as the prompt (openai/whisper: n_ctx // 2 - 1)
    initial_prompt: str | None = None        # text before the audio: spellings, names, style (--initial_prompt)
    no_speech_threshold: float = NO_SPEECH_THRESHOLD  # Whisper's silence rule (decoding/silence.py)
    logprob_threshold: float = LOGPROB_THRESHOLD
    energy_threshold: float = SILENCE_RMS    # a window with no 30 ms frame this loud is skipped, not decoded
    batch_size: int = 1
    temperature_fallback: tuple[float, ...] = TEMPERATURE_FALLBACK  # retry temperatures; () = no fallback
    compression_ratio_threshold: float | None = 2.4  # text compressing better than this is a repetition loop
    vad_filter: bool = False                 # skip windows without speech by Silero VAD (asr_app/vad.py)


class _LongForm:
    """One file's progress through its windows; its audio is read window by window (bounded memory)."""

    def __init__(self, key: Any, source: str, audio: AudioFileReader | ArrayAudio):
        self.key, self.source, self.audio = key, source, audio
        self.total = audio.samples
        self.seek = 0
        self._window: tuple[int, np.ndarray] | None = None
        self.segments: list[Segment] = []
        self.decode_s = 0.0
        self.windows = 0
        self.results: list[DecodingResult] = []
        self.started = time.perf_counter()
        self.temperatures: list[float] = []  # the temperature each decoded window was finally decoded at
        self.window_seeks: list[int] = []   # ... and where that window starts, in the segments' `seek` frames
        self.fallbacks = 0                   # extra decodes made by the temperature fallback
        self.prompt_from = 0                 # segments before this index are not used as prompt
        self.prompt_retries = 0              # windows decoded again without the prompt (no-speech rule)
        self.load_s = 0.0
        self.context: list[list[int]] = []   # per segment: its tokens as decoded, window-relative timestamps
        self.initial_tokens: list[int] = []  # the initial prompt's tokens

    @property
    def done(self) -> bool:
        return self.total - self.seek < MIN_TAIL_SECONDS * SAMPLE_RATE

    def window(self) -> np.ndarray:
        if self._window is None or self._window[0] != self.seek:
            self._window = (self.seek, self.audio.window(self.seek, WINDOW_SAMPLES))
        return self._window[1]

    def place(self) -> tuple[int, str]:
        """The current window, for the seeds of its sampled decodes (`sampled`): its offset and a digest of its
        samples, so the same audio decodes alike whatever its path, its batch companions or the files before it."""
        return self.seek, hashlib.blake2b(self.window().tobytes(), digest_size=8).hexdigest()

    def prompt(self, options: TranscribeOptions) -> list[int] | None:
        """The initial prompt's tokens (if any), then the latest tokens of the previous windows with their
        timestamps (openai/whisper's prompt; the initial prompt stays in front)."""
        previous = self.context[self.prompt_from:] if options.condition_on_previous_text else []
        room = max(0, options.prompt_tokens - len(self.initial_tokens))
        tail = [t for piece in previous for t in piece][-room:] if room else []
        return (self.initial_tokens + tail) or None


class JobCancelled(ConnectionAbortedError):
    """transcribe_many's `cancelled` was set: its caller went away, nothing more is read."""


def split_window(tokens: list[int], timestamp_begin: int, window_s: float,
                 decode: Callable[[list[int]], str]) -> tuple[list[Segment], float]:
    """Whisper's segmentation of one window -> (segments relative to the window, seconds to advance).

    Consecutive timestamp tokens close one segment and open the next; a single timestamp at the
    very end means the model closed its last segment and the whole window is consumed.
    Otherwise the window advances to the last closing timestamp, so an unfinished segment is
    decoded again in the next window.
    """
    is_ts = [t >= timestamp_begin for t in tokens]
    single_ending = is_ts[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]

    def seconds(token: int) -> float:
        return min((token - timestamp_begin) * SECONDS_PER_TIMESTAMP, window_s)

    def make(piece: list[int], start: float, end: float) -> Segment | None:
        text_tokens = [t for t in piece if t < timestamp_begin]
        text = decode(text_tokens).strip() if text_tokens else ""
        return Segment(start, max(end, start), text, text_tokens) if text else None

    segments: list[Segment] = []
    if cuts:
        slices = cuts + ([len(tokens)] if single_ending else [])
        last = 0
        for cut in slices:
            piece = tokens[last:cut]
            seg = make(piece, seconds(piece[0]) if is_ts[last] else 0.0,
                       seconds(piece[-1]) if is_ts[cut - 1] else window_s)
            if seg:
                segments.append(seg)
            last = cut
        advance = window_s if single_ending else seconds(tokens[last - 1])
    else:
        stamps = [t for t in tokens if t >= timestamp_begin]
        end = seconds(stamps[-1]) if stamps and stamps[-1] != timestamp_begin else window_s
        start = seconds(stamps[0]) if stamps and is_ts[0] and len(stamps) > 1 else 0.0
        seg = make(tokens, start, end)
        if seg:
            segments.append(seg)
        advance = window_s
    if advance <= 0:  # never loop on the same window
        advance = window_s
    return segments, advance


def needs_fallback(result: DecodingResult, options: TranscribeOptions) -> bool:
    """openai/whisper's test of a failed window: too repetitive or too unlikely, unless it is silence."""
    if judged_silent(result, options.no_speech_threshold, options.logprob_threshold):
        return False  # silence: skipped by _advance, retrying would only invent words
    threshold = options.compression_ratio_threshold
    if threshold is not None and compression_ratio(result.text) > threshold:
        return True
    return bool(result.avg_logprob < options.logprob_threshold)  # NaN (mode hf) compares False


def _unless_dropped_for_its_prompt(decoder: Decoder, job: _LongForm, result: DecodingResult,
                                   decoding: DecodingOptions, options: TranscribeOptions) -> DecodingResult:
    """Never skip speech silently. Every decoded window passed the energy gate (it has sound); when the
    no-speech rule would drop one that was decoded with the previous text as prompt, it is decoded again
    without the prompt, which can talk the model into "no speech" (seen: 30 s of clear speech dropped in a
    2-hour file). The retry is kept when it finds speech."""
    rule = (options.no_speech_threshold, options.logprob_threshold)
    if not judged_silent(result, *rule) or job.prompt(options) is None:
        return result
    started = time.perf_counter()
    try:
        retry = decoder.decode([job.window()], sampled(decoding, [job], "without prompt"), prompts=[None])[0]
    except ConnectionAbortedError:   # the caller went away (a server's client): nothing more is wanted
        raise
    except Exception:  # noqa: BLE001 - the window already has a result
        return result
    finally:
        job.decode_s += time.perf_counter() - started
    job.prompt_retries += 1
    return result if judged_silent(retry, *rule) else retry


def _best_attempt(attempts: list[tuple[Any, float]], options: TranscribeOptions) -> tuple[Any, float]:
    """When every temperature failed: the most probable attempt that is not a repetition loop, else the most
    probable one (faster-whisper's choice; openai/whisper keeps the last, often the noisiest)."""
    threshold = options.compression_ratio_threshold

    def score(attempt: tuple[Any, float]) -> float:
        value = attempt[0].avg_logprob
        return value if value == value else float("-inf")  # NaN (mode hf) ranks last

    no_loop = [a for a in attempts if threshold is None or compression_ratio(a[0].text) <= threshold]
    return max(no_loop or attempts, key=score)


def _with_fallback(decoder: Decoder, job: _LongForm, result: DecodingResult, decoding: DecodingOptions,
                   options: TranscribeOptions) -> DecodingResult:
    """Decode the job's window again at rising temperatures while the result looks failed; when every
    temperature fails, the most probable attempt is kept (_best_attempt)."""
    temperature = decoding.temperature
    attempts = [(result, temperature)]
    for retry_temperature in (t for t in options.temperature_fallback if t > decoding.temperature):
        if not needs_fallback(result, options):
            break
        started = time.perf_counter()
        try:
            retry = sampled(dataclasses.replace(decoding, temperature=retry_temperature), [job], "fallback")
            result = decoder.decode([job.window()], retry, prompts=[job.prompt(options)])[0]
        except ConnectionAbortedError:   # the caller went away: nothing more is wanted
            raise
        except Exception:  # noqa: BLE001 - the window already has a result; keep it rather than fail the file
            break
        finally:
            job.decode_s += time.perf_counter() - started
        job.fallbacks += 1
        temperature = retry_temperature
        attempts.append((result, temperature))
    if len(attempts) > 1 and needs_fallback(result, options):
        result, temperature = _best_attempt(attempts, options)
    job.temperatures.append(temperature)
    job.window_seeks.append(job.seek * MEL_FRAMES_PER_SECOND // SAMPLE_RATE)
    return result


def sampled(decoding: DecodingOptions, jobs: list[_LongForm], *retry: str) -> DecodingOptions:
    """`decoding` for a decode of `jobs`' current windows: at T > 0 a stream of its own, derived from the job's
    seed and the windows themselves (one seed for every window would give each window, and each retry of it,
    the same uniforms). Greedy decodes draw nothing and keep their options."""
    if decoding.temperature == 0:
        return decoding
    return reseeded(decoding, *(part for job in jobs for part in job.place()), *retry,
                    *([decoding.temperature] if retry else []))


def _timestamp_begin(decoder: Decoder) -> int:
    return decoder.pair.target.generation_config.no_timestamps_token_id + 1


def _aggregate_stats(results: list[DecodingResult]) -> dict[str, Any]:
    """The file's decoding statistics: its windows' summed (DecodingStats.total), per-step timings left out."""
    totals = dataclasses.asdict(DecodingStats.total([r.stats for r in results]))
    totals.pop("verify_steps")
    return totals


def _open(key: Any, src: str | Path | np.ndarray) -> _LongForm:
    """A file (read window by window) or a 16 kHz array as a job; raises when it cannot be used."""
    started = time.perf_counter()
    is_path = isinstance(src, (str, Path))
    audio = AudioFileReader(src) if is_path else ArrayAudio(prepare_audio(src, SAMPLE_RATE))
    if audio.samples == 0:
        audio.close()
        raise AudioLoadError(f"{src if is_path else 'audio array'}: no samples")
    job = _LongForm(key, str(src) if is_path else "audio array", audio)
    job.load_s = time.perf_counter() - started
    return job


def _skip_unspoken(job: _LongForm, options: TranscribeOptions, vad: SpeechDetector | None) -> bool:
    """True when the job's window is not decoded this round: it is silent (energy gate) or, with a VAD,
    holds no speech (both consumed), or speech starts well into it (the job moves to just before it)."""
    window = job.window()
    if is_silent(window, options.energy_threshold):  # Whisper invents words on silence
        job.seek += len(window)
        job.windows += 1
        return True
    if vad is None:
        return False
    spans = vad.speech(window)
    if not spans:
        job.seek += len(window)
        job.windows += 1
        return True
    skip = spans[0][0] - int(VAD_PAD_S * SAMPLE_RATE)
    if skip > VAD_MIN_SKIP_S * SAMPLE_RATE:
        job.seek += skip
        return True
    return False


def _decoded(job: _LongForm, result: DecodingResult, decoder: Decoder, decoding: DecodingOptions,
             options: TranscribeOptions, ts_begin: int, decode_text) -> None:
    """A decoded window: second chances (prompt, temperature), then its segments and the next seek."""
    result = _unless_dropped_for_its_prompt(decoder, job, result, decoding, options)
    result = _with_fallback(decoder, job, result, decoding, options)
    _advance(job, result, ts_begin, decode_text, options)
    if job.temperatures[-1] > 0.5:
        job.prompt_from = len(job.segments)  # do not condition the next window on a sampled window


def transcribe_many(decoder: Decoder, items: Iterable[tuple[Any, str | Path | np.ndarray]],
                    options: TranscribeOptions = TranscribeOptions(),
                    on_progress: Callable[[float], None] | None = None,
                    on_segments: Callable[[Any, list[Segment]], None] | None = None,
                    cancelled: threading.Event | None = None,
                    ) -> Iterator[tuple[Any, Transcript | Exception]]:
    """Transcribe (key, path-or-16k-array) items, yielding (key, Transcript or the error) as each finishes.

    Up to `options.batch_size` files are decoded together. A file that cannot be loaded, read or
    decoded yields its exception and the others carry on. `on_progress(seconds)` is called
    with the audio seconds consumed after every window. `cancelled`, once set, ends the whole job at its next
    round with JobCancelled (a ConnectionAbortedError): checked here as well as by a decoder that waits,
    because silent windows are read and skipped without a decode.
    """
    decoding = dataclasses.replace(options.decoding or decoder.options, timestamps=True)
    ts_begin = _timestamp_begin(decoder)
    tokenizer = decoder.pair.processor.tokenizer
    vad = SpeechDetector() if options.vad_filter else None
    initial = (tokenizer(" " + options.initial_prompt.strip(), add_special_tokens=False)["input_ids"]
               if options.initial_prompt and options.initial_prompt.strip() else [])

    def decode_text(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    def progress(job: _LongForm, before: int) -> None:
        if on_progress:
            on_progress((min(job.seek, job.total) - before) / SAMPLE_RATE)

    pending, active = iter(items), []
    try:
        while True:
            if cancelled is not None and cancelled.is_set():
                raise JobCancelled("the caller went away: the transcription was stopped")
            yield from _fill(active, pending, initial, max(1, options.batch_size))
            if not active:
                return
            audible, failed = _read_windows(active, options, vad, progress)
            for job, outcome in (_decode_round(decoder, audible, sampled(decoding, audible), options)
                                 if audible else ()):
                if isinstance(outcome, Exception):
                    failed[id(job)] = outcome
                    continue
                before, known = job.seek, len(job.segments)
                _decoded(job, outcome[0], decoder, decoding, options, ts_begin, decode_text)
                progress(job, before)
                if on_segments is not None and len(job.segments) > known:
                    on_segments(job.key, job.segments[known:])
            for job in [j for j in active if id(j) in failed or j.done]:
                active.remove(job)
                job.audio.close()
                yield job.key, failed.get(id(job)) or _finish(job, decoder, decoding)
    finally:   # ended early (cancelled, or the caller stopped reading): no file is left open
        for job in active:
            with contextlib.suppress(Exception):   # one that will not close leaves the others to close
                job.audio.close()


def _fill(active: list[_LongForm], pending: Iterator, initial: list[int], size: int):
    """Open items until `size` jobs are active; yields (key, error) for an item that cannot be opened."""
    while len(active) < size:
        item = next(pending, None)
        if item is None:
            return
        try:
            active.append(_open(*item))
            active[-1].initial_tokens = list(initial)
        except Exception as exc:  # noqa: BLE001 - reported per file, the batch goes on
            yield item[0], exc


def _read_windows(active: list[_LongForm], options: TranscribeOptions, vad: SpeechDetector | None,
                  progress) -> tuple[list[_LongForm], dict[int, Exception]]:
    """Read the round's window of every job now (a file that breaks mid-way fails alone) -> (the jobs whose
    window is decoded, failures by job id); silent windows are skipped here."""
    audible: list[_LongForm] = []
    failed: dict[int, Exception] = {}
    for job in active:
        before = job.seek
        try:
            skipped = _skip_unspoken(job, options, vad)
        except Exception as exc:  # noqa: BLE001
            failed[id(job)] = exc
            continue
        if skipped:
            progress(job, before)
        else:
            audible.append(job)
    return audible, failed


def _decode_round(decoder: Decoder, jobs: list[_LongForm], decoding: DecodingOptions, options: TranscribeOptions):
    """Decode the current window of every job in one call; on failure retry one by one so one bad
    file does not sink the others."""
    windows = [job.window() for job in jobs]
    prompts = [job.prompt(options) for job in jobs]
    started = time.perf_counter()
    try:
        results = decoder.decode(windows, decoding, prompts=prompts)
    except Exception as exc:  # noqa: BLE001
        if len(jobs) == 1:
            yield jobs[0], _decoding_failed(jobs[0], exc)
            return
        for job, window, prompt in zip(jobs, windows, prompts):
            t0 = time.perf_counter()
            try:
                result = decoder.decode([window], decoding, prompts=[prompt])[0]
            except Exception as exc:  # noqa: BLE001
                yield job, _decoding_failed(job, exc)
                continue
            job.decode_s += time.perf_counter() - t0
            yield job, (result, time.perf_counter() - t0)
        return
    share = (time.perf_counter() - started) / len(jobs)
    for job, result in zip(jobs, results):
        job.decode_s += share
        yield job, (result, share)


def _decoding_failed(job: _LongForm, exc: Exception) -> RuntimeError:
    """The file's failure, naming it; the decoder's own error stays its cause (a server answers a timeout
    or a full queue with "busy", not as bad audio)."""
    failure = RuntimeError(f"{job.source}: decoding failed ({type(exc).__name__}: {exc})")
    failure.__cause__ = exc
    return failure


def _advance(job: _LongForm, result: DecodingResult, ts_begin: int, decode_text: Callable[[list[int]], str],
             options: TranscribeOptions) -> None:
    window_samples = len(job.window())
    window_s = window_samples / SAMPLE_RATE
    job.windows += 1
    job.results.append(result)
    if judged_silent(result, options.no_speech_threshold, options.logprob_threshold):
        job.seek += window_samples
        return
    segments, advance = split_window(list(result.tokens), ts_begin, window_s, decode_text)
    if any(s.words is not None for s in result.segments):
        attach_words(segments, [w for s in result.segments for w in s.words or []])
    offset = job.seek / SAMPLE_RATE
    consumed = min(window_samples, max(1, int(round(advance * SAMPLE_RATE))))
    ceiling = (job.seek + consumed) / SAMPLE_RATE   # the next window starts here
    floor = job.segments[-1].end if job.segments else 0.0
    seek_frames = job.seek * MEL_FRAMES_PER_SECOND // SAMPLE_RATE
    for seg in segments:
        # Absolute times, kept monotone (a segment never starts before the previous one ended, nor a word).
        start = max(offset + seg.start, floor)
        end = max(offset + seg.end, start)
        words = shift_words(seg.words, offset, floor, ceiling)
        job.segments.append(Segment(round(start, 3), round(end, 3), seg.text, seg.tokens, words, seek_frames))
        job.context.append([_stamp(seg.start, ts_begin), *seg.tokens, _stamp(seg.end, ts_begin)])
        floor = end
    job.seek += consumed


def _stamp(seconds: float, ts_begin: int) -> int:
    """The timestamp token of a window-relative time."""
    return ts_begin + max(0, min(1500, int(round(seconds / SECONDS_PER_TIMESTAMP))))


def _language(job: _LongForm, decoding: DecodingOptions) -> tuple[str | None, float | None]:
    """The language given, or the one detected on the first window with speech (multilingual models detect
    it per 30 s window; the first one names the file, as openai/whisper does)."""
    for result in job.results:
        if getattr(result, "language_probability", None) is not None and result.no_speech_prob < 0.5:
            return result.language, result.language_probability
    first = job.results[0] if job.results else None
    return (getattr(first, "language", None) or decoding.language), getattr(first, "language_probability", None)


def _finish(job: _LongForm, decoder: Decoder, decoding: DecodingOptions) -> Transcript:
    duration = job.total / SAMPLE_RATE
    language, language_probability = _language(job, decoding)
    total = time.perf_counter() - job.started + job.load_s
    pair = decoder.pair
    return Transcript(
        source=job.source,
        duration=round(duration, 3),
        text=" ".join(s.text for s in job.segments).strip(),
        segments=job.segments,
        language=language,
        mode=decoding.mode,
        model={"target": getattr(pair, "target_name", None), "draft": getattr(pair, "draft_name", None),
               "device": str(getattr(pair, "device", "")), "dtype": str(getattr(pair, "dtype", "")).removeprefix("torch.")},
        timings={"load_s": round(job.load_s, 4), "decode_s": round(job.decode_s, 4),
                 "total_s": round(total, 4), "rtf": round(job.decode_s / duration, 4) if duration else 0.0},
        stats={**(_aggregate_stats(job.results) if job.results else {"mode": decoding.mode, "windows": 0}), "temperature_fallbacks": job.fallbacks, "prompt_retries": job.prompt_retries,
               "window_temperatures": job.temperatures, "window_seeks": job.window_seeks,
               "language_probability": language_probability},
    )


def transcribe(decoder: Decoder, audio_or_path: str | Path | np.ndarray,
               options: TranscribeOptions = TranscribeOptions(),
               on_segments: Callable[[list[Segment]], None] | None = None,
               cancelled: threading.Event | None = None) -> Transcript:
    """Long-form transcription of one file or 16 kHz array; raises on bad input. `on_segments` receives each
    window's new segments as soon as they are final; `cancelled` stops it (transcribe_many)."""
    hook = (lambda _key, segments: on_segments(segments)) if on_segments is not None else None
    [(_, outcome)] = list(transcribe_many(decoder, [(0, audio_or_path)], options, on_segments=hook,
                                             cancelled=cancelled))
    if isinstance(outcome, Exception):
        raise outcome
    return outcome
