"""OpenAI-compatible transcription API: `POST /v1/audio/transcriptions`, `/v1/audio/translations`,
`GET /v1/models` (the fields and answers of OpenAI's API reference; ours beyond it as extra form fields).

An upload is spooled to a temporary file (its bytes bounded while it arrives, see `app.UploadGate`), its
decoded duration checked from the header, then transcribed window by window through the scheduler like
any other request (`longform.transcribe`), so it shares batches with live sessions and other uploads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from asr_app.audio import AudioLoadError
from asr_app.decoding.text import compression_ratio
from asr_app.languages import LANGUAGES
from asr_app.limits import LimitExceeded
from asr_app.longform import JobCancelled, TranscribeOptions, transcribe
from asr_app.scheduler import ClientGone, SchedulerBusy, SchedulerClosed
from asr_app.serve.security import AccessSettings, Refusal, require_key
from asr_app.transcript import Transcript
from asr_app.ui.engine import UiEngine
from asr_app.writers import to_srt, to_vtt

log = logging.getLogger(__name__)

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("segment", "word")
OPENAI_MODEL_ALIASES = ("whisper-1",)   # what existing OpenAI clients send
SPOOL_CHUNK = 1 << 20


@dataclass(frozen=True)
class TranscriptionRequest:
    task: str
    model: str
    language: str | None
    prompt: str | None
    response_format: str
    temperature: float
    granularities: tuple[str, ...]
    stream: bool
    mode: str | None


WHISPER_SIZES = {(384, 4): "tiny", (512, 6): "base", (768, 12): "small", (1024, 24): "medium", (1280, 32): "large"}


TRANSCRIPTIONS_PATH, TRANSLATIONS_PATH = "/v1/audio/transcriptions", "/v1/audio/translations"
TASK_OF_PATH = {TRANSCRIPTIONS_PATH: "transcribe", TRANSLATIONS_PATH: "translate"}   # the routes, for the gate


def model_id(engine: UiEngine) -> str:
    """The id `/v1/models` lists for the loaded pair: Whisper's size name read from the target's shape
    (`whisper-tiny.en`), `+draft` when a draft runs beside it. Never a server path."""
    config = engine.pair.target.config
    size = WHISPER_SIZES.get((config.d_model, config.decoder_layers))
    english = "auto" not in engine.languages
    name = f"whisper-{size}{'.en' if english else ''}" if size else f"whisper-{engine.describe()['target']}"
    return name if engine.pair.draft is None else f"{name}+draft"


def model_entry(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "asr-app"}


class RequestSlots:
    """At most `limit` transcriptions at once, each on a thread of its own: never on the event loop's shared pool,
    which /health, /metrics, uploads and the live sessions' stop and flush need (40 long uploads there would
    hang them all). The next one is refused as busy: by `app.UploadGate` before its body is read where the
    slots are full when it arrives, else here once its form is read."""

    def __init__(self, limit: int) -> None:
        self.limit, self.running = limit, 0
        self._lock = threading.Lock()

    @property
    def full(self) -> bool:
        return self.running >= self.limit

    def busy(self) -> Refusal:
        return Refusal(503, f"the service is busy: {self.limit} transcriptions are running (--max-requests); try "
                            "again shortly", "server_busy")

    def take(self) -> None:
        with self._lock:
            if self.running >= self.limit:
                raise self.busy()
            self.running += 1

    def give(self) -> None:
        with self._lock:
            self.running -= 1


def to_loop(loop: asyncio.AbstractEventLoop, callback, *args) -> None:
    """`callback(*args)` on `loop`, from another thread; nothing when the loop has closed (the server stopped:
    nobody is there to tell)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


def in_own_thread(loop: asyncio.AbstractEventLoop, folder: Path, slots: RequestSlots, work, *args) -> asyncio.Future:
    """`work(*args)` on a thread of its own, holding a slot already taken; returns the future its result or error
    resolves (on `loop`). The upload's folder is removed and the slot given back when it ends, or here when the
    thread cannot start."""
    outcome = loop.create_future()
    outcome.add_done_callback(lambda f: f.cancelled() or f.exception())   # read: nobody may be waiting any more

    def settle(value: object, failed: bool) -> None:
        if not outcome.done():
            outcome.set_exception(value) if failed else outcome.set_result(value)  # type: ignore[arg-type]

    def run() -> None:
        try:
            to_loop(loop, settle, work(*args), False)
        except BaseException as exc:  # noqa: BLE001 - handed to the request, which answers it
            to_loop(loop, settle, exc, True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            slots.give()

    try:
        threading.Thread(target=run, name="asr-serve-request", daemon=True).start()
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        slots.give()
        raise
    return outcome


async def until_done_or_gone(outcome: asyncio.Future, request: Request, cancelled: threading.Event):
    """The transcription's result; a client that disconnects meanwhile cancels it (at its next window). The body
    is read by now, so the only message left to receive is the client's going away. (Starlette's
    `is_disconnected` looks without waiting, and behind this app's layers it never saw a closed socket.)"""
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait([outcome, gone], return_when=asyncio.FIRST_COMPLETED)
        if not outcome.done():
            if gone.exception() is None:
                cancelled.set()
            else:   # not a disconnect: the watcher failed, the client may still be there
                log.debug("watching for the client's disconnect failed", exc_info=gone.exception())
        return await outcome
    finally:
        gone.cancel()
        if not outcome.done():   # this handler was cancelled: nobody reads the result
            cancelled.set()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class CancelWhenDone(StreamingResponse):
    """A streamed answer that cancels its transcription however it ends: sent whole, cut off, or never begun (a
    client gone before the first byte: the body's generator then never runs, nor its `finally`)."""

    def __init__(self, content, cancelled: threading.Event, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self.cancelled = cancelled

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.cancelled.set()


def build_router(engine: UiEngine, access: AccessSettings, slots: RequestSlots) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models(request: Request) -> dict:
        require_key(access, request)
        return {"object": "list", "data": [model_entry(i) for i in (model_id(engine), *OPENAI_MODEL_ALIASES)]}

    @router.get("/v1/models/{name:path}")
    async def retrieve_model(request: Request, name: str) -> dict:
        require_key(access, request)
        if name not in (model_id(engine), *OPENAI_MODEL_ALIASES):
            raise unknown_model(engine, name)
        return model_entry(name)

    async def handle(task: str, request: Request, file: UploadFile, model: str, language: str | None,
                     prompt: str | None, response_format: str, temperature: float | None,
                     granularities: list[str] | None, stream: bool, mode: str | None) -> Response:
        require_key(access, request)
        # Fields a client leaves out take the server's launch options (--temperature, --language, --mode).
        base = engine.base_options
        req = TranscriptionRequest(task, model, language if language is not None else base.language, prompt,
                                   response_format, base.temperature if temperature is None else temperature,
                                   tuple(granularities or ()), stream, mode)
        check_request(engine, req)
        cancelled = threading.Event()
        slots.take()   # given back by the transcription's thread, or below when it never starts
        folder = None
        try:
            folder = Path(tempfile.mkdtemp(prefix="asr_serve_"))
            path = await spool(file, folder, engine)
            await run_in_threadpool(_checked_duration, engine, path)
        except BaseException as exc:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            slots.give()
            if isinstance(exc, LimitExceeded):
                raise refusal_for(exc) from None
            raise
        loop = asyncio.get_running_loop()
        if req.stream:
            queue: asyncio.Queue = asyncio.Queue()
            in_own_thread(loop, folder, slots, stream_work, engine, req, path, cancelled, queue, loop)
            return CancelWhenDone(stream_events(queue), cancelled, media_type="text/event-stream")
        outcome = in_own_thread(loop, folder, slots, run_transcription, engine, req, path, None, cancelled)
        try:
            transcript = await until_done_or_gone(outcome, request, cancelled)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, never a traceback
            refusal = refusal_for(exc)
            log_refusal(refusal, "transcription refused", exc)
            raise refusal from None
        return render(req, transcript)

    @router.post(TRANSCRIPTIONS_PATH)
    async def transcriptions(request: Request, file: UploadFile = File(...), model: str = Form(...),
                             language: str | None = Form(None), prompt: str | None = Form(None),
                             response_format: str = Form("json"), temperature: float | None = Form(None),
                             timestamp_granularities: list[str] | None = Form(None,
                                                                              alias="timestamp_granularities[]"),
                             # the same field without the brackets (curl users write it so)
                             granularities_plain: list[str] | None = Form(None, alias="timestamp_granularities"),
                             stream: bool = Form(False), mode: str | None = Form(None)) -> Response:
        granularities = [*(timestamp_granularities or ()), *(granularities_plain or ())] or None
        return await handle("transcribe", request, file, model, language, prompt, response_format, temperature,
                            granularities, stream, mode)

    @router.post(TRANSLATIONS_PATH)
    async def translations(request: Request, file: UploadFile = File(...), model: str = Form(...),
                           prompt: str | None = Form(None), response_format: str = Form("json"),
                           temperature: float | None = Form(None), mode: str | None = Form(None)) -> Response:
        return await handle("translate", request, file, model, None, prompt, response_format, temperature,
                            None, False, mode)

    return router


def unknown_model(engine: UiEngine, name: str) -> Refusal:
    return Refusal(404, f"model {name!r} is not served here; GET /v1/models lists {model_id(engine)!r} (and "
                        "'whisper-1')", "model_not_found")


def check_request(engine: UiEngine, req: TranscriptionRequest) -> None:
    """Every cheap check, before the upload is read (those the fields sent before the file decide alone are made
    earlier still, by the upload gate: refusal_before_upload)."""
    check_model(engine, req.model)
    check_response_format(req.response_format)
    check_granularity_names(req.granularities)
    if req.granularities and req.response_format != "verbose_json":
        raise Refusal(400, "timestamp_granularities needs response_format=verbose_json")
    if req.stream and req.response_format not in ("json", "text"):
        raise Refusal(400, "stream=true sends text events; use response_format json or text with it")
    check_task(engine, req.task)
    try:
        decoding_options(engine, req)
    except ValueError as exc:
        raise Refusal(400, str(exc)) from None


def check_model(engine: UiEngine, name: str) -> None:
    if name not in (model_id(engine), *OPENAI_MODEL_ALIASES):
        raise unknown_model(engine, name)


def check_response_format(name: str) -> None:
    if name not in RESPONSE_FORMATS:
        raise Refusal(400, f"response_format {name!r} is not one of {', '.join(RESPONSE_FORMATS)}")


def check_granularity_names(names: Sequence[str]) -> None:
    bad = [g for g in names if g not in GRANULARITIES]
    if bad:
        raise Refusal(400, f"timestamp_granularities {bad} not supported; choose from segment, word")


def check_task(engine: UiEngine, task: str) -> None:
    if task == "translate" and "auto" not in engine.languages:
        raise Refusal(400, "translation needs a multilingual model; this server runs an English-only one")


PEEKED_FIELDS = frozenset({"model", "response_format", "timestamp_granularities[]", "timestamp_granularities"})


def refusal_before_upload(engine: UiEngine, path: str, fields: dict[str, list[str]]) -> Refusal | None:
    """The refusal check_request would give, where the fields a form sent before its file decide it alone; None
    when they do not. As FastAPI reads a form: a field sent twice counts by its last value (here the last
    before the file: a client that sends it again after the file is answered by the first), an empty one as
    not sent, and the translations endpoint has no granularities."""
    task = TASK_OF_PATH.get(path)
    if task is None:
        return None
    sent = {name: [v for v in values if v] for name, values in fields.items()}
    try:
        if sent.get("model"):
            check_model(engine, sent["model"][-1])
        if sent.get("response_format"):
            check_response_format(sent["response_format"][-1])
        if task == "transcribe":
            check_granularity_names([*sent.get("timestamp_granularities[]", ()),
                                     *sent.get("timestamp_granularities", ())])
        check_task(engine, task)
    except Refusal as refusal:
        return refusal
    return None


def decoding_options(engine: UiEngine, req: TranscriptionRequest):
    mode = req.mode or (engine.base_options.mode if engine.base_options.mode in engine.modes else engine.modes[0])
    language = (req.language or "auto").strip().lower() or "auto"
    return engine.options(mode, req.temperature, language, task=req.task, timestamps=True,
                          word_timestamps="word" in req.granularities)


def spool_name(filename: str | None) -> str:
    """The name an upload is spooled under: "audio" plus the client's extension where it is a plain one (the
    audio readers may go by it). Never the client's own name: too long, "..", a NUL or a slash would make
    the file system refuse good audio."""
    suffix = Path(filename or "").suffix
    return "audio" + (suffix.lower() if re.fullmatch(r"\.[A-Za-z0-9]{1,10}", suffix) else "")


async def spool(file: UploadFile, folder: Path, engine: UiEngine) -> Path:
    """The upload into `folder`, counting bytes as they come (refused past the limit, nothing kept)."""
    path, size = folder / spool_name(file.filename), 0
    try:
        with path.open("wb") as out:
            while chunk := await file.read(SPOOL_CHUNK):
                size += len(chunk)
                engine.limits.check_upload_bytes(size, complete=False)
                out.write(chunk)
    finally:
        await file.close()   # the form's own copy: the upload is not kept on disk twice while it is transcribed
    if size == 0:
        raise LimitExceeded("the uploaded file is empty")
    return path


def _checked_duration(engine: UiEngine, path: Path) -> float:
    return engine.limits.check_upload_file(path)


def run_transcription(engine: UiEngine, req: TranscriptionRequest, path: Path, on_segments,
                      cancelled: threading.Event) -> Transcript:
    """The upload at `path`, window by window through the scheduler, each window's wait for the decoder bounded
    by `--request-timeout`; `cancelled` (the client went away) ends it at its next window, decoded or silent."""
    options = decoding_options(engine, req)
    decoder = engine.scheduler.client(options, timeout_s=engine.limits.request_timeout_s,
                                      session=f"api-{id(path)}", cancelled=cancelled)
    fallback = engine.fallback(req.temperature)   # openai/whisper's rule, or the launch's --temperature list
    transcript = transcribe(decoder, path, TranscribeOptions(decoding=options, initial_prompt=req.prompt,
                                                             temperature_fallback=fallback), on_segments=on_segments,
                            cancelled=cancelled)
    transcript.source = path.name
    return transcript


def stream_work(engine: UiEngine, req: TranscriptionRequest, path: Path, cancelled: threading.Event,
                queue: asyncio.Queue, loop: asyncio.AbstractEventLoop) -> None:
    """A streamed transcription (on its own thread): each window's new text, then the whole text or the error,
    onto `queue` for `stream_events`."""
    started = False

    def put(item: tuple) -> None:
        to_loop(loop, queue.put_nowait, item)

    def on_segments(segments) -> None:
        # Segments are joined by a space, the first of the stream has none: the deltas add up to the done text.
        nonlocal started
        text = " ".join(s.text.strip() for s in segments if s.text.strip())
        if started and text:
            text = " " + text
        started = started or bool(text)
        put(("delta", text))

    try:
        put(("done", run_transcription(engine, req, path, on_segments, cancelled).text))
    except Exception as exc:  # noqa: BLE001 - reported in the stream
        refusal = refusal_for(exc)
        log_refusal(refusal, "streamed transcription ended", exc)
        put(("error", refusal))


async def stream_events(queue: asyncio.Queue) -> AsyncIterator[str]:
    """Server-sent events as OpenAI streams a transcription: a `transcript.text.delta` per finished window's
    text, then `transcript.text.done` with the whole text (or an `error`)."""
    while True:
        kind, value = await queue.get()
        if kind == "delta":
            yield _sse({"type": "transcript.text.delta", "delta": value})
        elif kind == "done":
            yield _sse({"type": "transcript.text.done", "text": value.strip()})
            return
        else:
            yield _sse({"type": "error", "error": {"message": value.message, "code": value.status}})
            return


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


CLIENT_GONE = 499   # nginx's "client closed request": nobody reads it, the log and /metrics do


def refusal_for(exc: BaseException) -> Refusal:
    """A transcription error as the answer the client gets (never a traceback, never a server path): the
    audio's fault is a 4xx that says what is wrong with it; the service's own trouble a 5xx that says only that
    (its details go to the log)."""
    if isinstance(exc, Refusal):
        return exc
    if isinstance(exc, LimitExceeded):
        return Refusal(413 if "is accepted" in str(exc) else 400, str(exc))
    causes = _causes(exc)
    for cause in causes:   # a window's decode failed for want of the decoder: the service, not the audio
        if isinstance(cause, SchedulerBusy | TimeoutError):
            return Refusal(503, f"the service is busy: {cause}", "server_busy")
        if isinstance(cause, SchedulerClosed):
            return Refusal(503, "the service is shutting down", "server_busy")
        if isinstance(cause, ClientGone | JobCancelled):   # at a decode, or between windows
            return Refusal(CLIENT_GONE, "the client went away", "client_gone")
    if not any(isinstance(cause, AudioLoadError) for cause in causes):
        return Refusal(500, "the service failed while transcribing this upload (its log says why); the audio may "
                            "be fine, try again", "server_error")
    message = str(exc).split("\n")[0]
    marker = tempfile.gettempdir() + "/"
    while marker in message:   # "/tmp/asr_serve_x/a.wav" -> "a.wav"
        head, _, rest = message.partition(marker)
        message = head + rest.split("/", 1)[-1]
    return Refusal(400, f"the audio could not be transcribed: {message}")


def log_refusal(refusal: Refusal, what: str, exc: BaseException | None = None) -> None:
    """Bad input at INFO; the service too busy at WARNING (an overload, not a fault); any other 5xx at ERROR
    with the error's traceback."""
    if refusal.status < 500 or refusal.status == CLIENT_GONE:
        log.info("%s: %s", what, refusal.message)
    elif refusal.code == "server_busy":
        log.warning("%s: %s", what, refusal.message)
    else:
        log.error("%s: %s", what, refusal.message, exc_info=exc or True)


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what caused it, outermost first (a bounded walk: a cycle of causes ends it)."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain and len(chain) < 8:
        chain.append(exc)
        exc = exc.__cause__
    return chain


def render(req: TranscriptionRequest, transcript: Transcript) -> Response:
    text = transcript.text.strip()
    if req.response_format == "text":
        return PlainTextResponse(text + "\n")
    if req.response_format == "srt":
        return PlainTextResponse(to_srt(transcript))
    if req.response_format == "vtt":
        return PlainTextResponse(to_vtt(transcript), media_type="text/vtt")
    if req.response_format == "json":
        return JSONResponse({"text": text})
    return JSONResponse(verbose(req, transcript))


def verbose(req: TranscriptionRequest, transcript: Transcript) -> dict:
    """OpenAI's verbose_json: language by name, duration, segments, and words when asked for. avg_logprob and
    no_speech_prob are kept per 30 s window here, not per segment: they are null in each segment."""
    language = "english" if req.task == "translate" else LANGUAGES.get(transcript.language or "", "")
    # each segment at the temperature its own window was finally decoded at (a fallback is per window)
    temperatures = dict(zip(transcript.stats.get("window_seeks", ()), transcript.stats.get("window_temperatures", ())))
    body: dict = {"task": req.task, "language": language, "duration": transcript.duration,
                  "text": transcript.text.strip()}
    if "word" not in req.granularities or "segment" in req.granularities or not req.granularities:
        body["segments"] = [{"id": i, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text,
                             "tokens": list(s.tokens), "temperature": float(temperatures.get(s.seek, req.temperature)),
                             "avg_logprob": None, "compression_ratio": round(compression_ratio(s.text), 3),
                             "no_speech_prob": None}
                            for i, s in enumerate(transcript.segments)]
    if "word" in req.granularities:
        body["words"] = [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                         for s in transcript.segments for w in s.words or []]
    return body
