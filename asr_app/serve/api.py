"""OpenAI-compatible transcription API: `POST /v1/audio/transcriptions`, `/v1/audio/translations`,
`GET /v1/models` (the fields and answers of OpenAI's API reference; ours beyond it as extra form fields).

An upload is spooled to a temporary file (its bytes bounded while it arrives, see `app.UploadGate`), its
decoded duration checked from the header, then transcribed window by window through the scheduler like
any other request (`longform.transcribe`), so it shares batches with live sessions and other uploads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from asr_app.decoding.text import compression_ratio
from asr_app.languages import LANGUAGES
from asr_app.limits import LimitExceeded
from asr_app.longform import TranscribeOptions, transcribe
from asr_app.scheduler import SchedulerBusy, SchedulerClosed
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


def build_router(engine: UiEngine, access: AccessSettings) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    def list_models(request: Request) -> dict:
        require_key(access, request)
        return {"object": "list", "data": [model_entry(i) for i in (model_id(engine), *OPENAI_MODEL_ALIASES)]}

    @router.get("/v1/models/{name:path}")
    def retrieve_model(request: Request, name: str) -> dict:
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
        folder = Path(tempfile.mkdtemp(prefix="asr_serve_"))
        try:
            path = await spool(file, folder, engine)
            await run_in_threadpool(_checked_duration, engine, path)
        except LimitExceeded as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise refusal_for(exc) from None
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if req.stream:
            return StreamingResponse(stream_events(engine, req, path, folder), media_type="text/event-stream")
        try:
            transcript = await run_in_threadpool(run_transcription, engine, req, path, None, None)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, never a traceback
            refusal = refusal_for(exc)
            log_refusal(refusal, "transcription refused")
            raise refusal from None
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return render(req, transcript)

    @router.post("/v1/audio/transcriptions")
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

    @router.post("/v1/audio/translations")
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
    """Every cheap check, before the upload is read."""
    if req.model not in (model_id(engine), *OPENAI_MODEL_ALIASES):
        raise unknown_model(engine, req.model)
    if req.response_format not in RESPONSE_FORMATS:
        raise Refusal(400, f"response_format {req.response_format!r} is not one of {', '.join(RESPONSE_FORMATS)}")
    bad = [g for g in req.granularities if g not in GRANULARITIES]
    if bad:
        raise Refusal(400, f"timestamp_granularities {bad} not supported; choose from segment, word")
    if req.granularities and req.response_format != "verbose_json":
        raise Refusal(400, "timestamp_granularities needs response_format=verbose_json")
    if req.stream and req.response_format not in ("json", "text"):
        raise Refusal(400, "stream=true sends text events; use response_format json or text with it")
    if req.task == "translate" and "auto" not in engine.languages:
        raise Refusal(400, "translation needs a multilingual model; this server runs an English-only one")
    try:
        decoding_options(engine, req)
    except ValueError as exc:
        raise Refusal(400, str(exc)) from None


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
    with path.open("wb") as out:
        while chunk := await file.read(SPOOL_CHUNK):
            size += len(chunk)
            engine.limits.check_upload_bytes(size, complete=False)
            out.write(chunk)
    if size == 0:
        raise LimitExceeded("the uploaded file is empty")
    return path


def _checked_duration(engine: UiEngine, path: Path) -> float:
    return engine.limits.check_upload_file(path)


def run_transcription(engine: UiEngine, req: TranscriptionRequest, path: Path, on_segments,
                      cancelled: threading.Event | None) -> Transcript:
    options = decoding_options(engine, req)
    decoder = engine.scheduler.client(options, timeout_s=engine.limits.request_timeout_s,
                                      session=f"api-{id(path)}")

    def hook(segments):
        if cancelled is not None and cancelled.is_set():
            raise ConnectionAbortedError("the client went away")
        if on_segments is not None:
            on_segments(segments)

    fallback = engine.fallback(req.temperature)   # openai/whisper's rule, or the launch's --temperature list
    transcript = transcribe(decoder, path, TranscribeOptions(decoding=options, initial_prompt=req.prompt,
                                                             temperature_fallback=fallback), on_segments=hook)
    transcript.source = path.name
    return transcript


async def stream_events(engine: UiEngine, req: TranscriptionRequest, path: Path, folder: Path) -> AsyncIterator[str]:
    """Server-sent events as OpenAI streams a transcription: a `transcript.text.delta` per finished window's
    text, then `transcript.text.done` with the whole text."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    cancelled = threading.Event()

    started = False

    def on_segments(segments) -> None:
        # Segments are joined by a space, the first of the stream has none: the deltas add up to the done text.
        nonlocal started
        text = " ".join(s.text.strip() for s in segments if s.text.strip())
        if started and text:
            text = " " + text
        started = started or bool(text)
        loop.call_soon_threadsafe(queue.put_nowait, ("delta", text))

    def work() -> None:
        try:
            transcript = run_transcription(engine, req, path, on_segments, cancelled)
            loop.call_soon_threadsafe(queue.put_nowait, ("done", transcript.text))
        except Exception as exc:  # noqa: BLE001 - reported in the stream
            refusal = refusal_for(exc)
            log_refusal(refusal, "streamed transcription ended")
            loop.call_soon_threadsafe(queue.put_nowait, ("error", refusal))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    worker = threading.Thread(target=work, name="asr-serve-stream", daemon=True)
    worker.start()
    try:
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
    finally:
        cancelled.set()   # a client that left stops the transcription at its next window


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def refusal_for(exc: BaseException) -> Refusal:
    """A transcription error as the answer the client gets (never a traceback, never a server path)."""
    if isinstance(exc, Refusal):
        return exc
    if isinstance(exc, LimitExceeded):
        return Refusal(413 if "is accepted" in str(exc) else 400, str(exc))
    for cause in _causes(exc):   # a window's decode failed for want of the decoder: the service, not the audio
        if isinstance(cause, SchedulerBusy | TimeoutError):
            return Refusal(503, f"the service is busy: {cause}", "server_busy")
        if isinstance(cause, SchedulerClosed):
            return Refusal(503, "the service is shutting down", "server_busy")
    message = str(exc).split("\n")[0]
    marker = tempfile.gettempdir() + "/"
    while marker in message:   # "/tmp/asr_serve_x/a.wav" -> "a.wav"
        head, _, rest = message.partition(marker)
        message = head + rest.split("/", 1)[-1]
    return Refusal(400, f"the audio could not be transcribed: {message}")


def log_refusal(refusal: Refusal, what: str) -> None:
    """Bad input at INFO; the service too busy at WARNING (an overload, not a fault); any other 5xx at ERROR
    with its traceback."""
    if refusal.status < 500:
        log.info("%s: %s", what, refusal.message)
    elif refusal.code == "server_busy":
        log.warning("%s: %s", what, refusal.message)
    else:
        log.error("%s: %s", what, refusal.message, exc_info=True)


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
    temperatures = transcript.stats.get("window_temperatures") or [req.temperature]
    body: dict = {"task": req.task, "language": language, "duration": transcript.duration,
                  "text": transcript.text.strip()}
    if "word" not in req.granularities or "segment" in req.granularities or not req.granularities:
        body["segments"] = [{"id": i, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text,
                             "tokens": list(s.tokens), "temperature": float(max(temperatures)),
                             "avg_logprob": None, "compression_ratio": round(compression_ratio(s.text), 3),
                             "no_speech_prob": None}
                            for i, s in enumerate(transcript.segments)]
    if "word" in req.granularities:
        body["words"] = [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                         for s in transcript.segments for w in s.words or []]
    return body
