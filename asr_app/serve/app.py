"""The FastAPI app of `asr-serve`: the OpenAI-compatible API, the live WebSocket, `/health`, `/metrics`, and
the Gradio app at `/`, all over one `UiEngine` (one model pair, one scheduler, one set of bounds)."""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import PlainTextResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asr_app.limits import LimitExceeded
from asr_app.serve.api import (
    PEEKED_FIELDS,
    RequestSlots,
    build_router,
    model_id,
    refusal_before_upload,
    refusal_for,
)
from asr_app.serve.form_peek import FormPeek
from asr_app.serve.live import build_live_router
from asr_app.serve.metrics import metrics_text
from asr_app.serve.security import (
    KEY_REFUSAL,
    AccessSettings,
    Refusal,
    bearer,
    error_response,
    key_matches,
    require_key,
)
from asr_app.ui.engine import UiEngine
from asr_app.ui.page_script import RECORDER_RETRY_HEAD

log = logging.getLogger(__name__)

UPLOAD_PATHS = ("/v1/audio/",)
FORM_OVERHEAD_BYTES = 1 << 20   # multipart headers and the other fields around an upload
DISCARD_BYTES = 16 << 20        # of an upload past the bound, read and dropped before its 413 is sent


class UploadGate:
    """An upload's key and size, checked before its body is read: a request without the right API key is
    refused (401) before a byte of it is received; a body past the bound by its Content-Length before reading
    it, and one sent without it (chunked) once its bytes counted while they arrive pass the bound (413), so a
    client cannot make the server spool more than the limit to disk, nor anything at all without the key.
    The bound is the upload limit (`limit_mb`, what refusals name) plus room for the form around the file.
    The fields a form sends before its file go to `early_check` once the file begins (serve/form_peek.py): a
    request it refuses (a model not served here) is answered without receiving the upload.
    The innermost layer: CORS answers a browser's preflight before it, and /metrics counts its answers."""

    def __init__(self, app: ASGIApp, limit_mb: float, api_key: str | None = None,
                 slots: RequestSlots | None = None,
                 early_check: Callable[[str, dict[str, list[str]]], Refusal | None] | None = None) -> None:
        self.app, self.limit_mb, self.api_key, self.slots = app, limit_mb, api_key, slots
        self.early_check = early_check
        self.max_bytes = int(limit_mb * 1e6) + FORM_OVERHEAD_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(UPLOAD_PATHS):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        query_key = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("api_key", [None])[0]
        if not key_matches(self.api_key, bearer(headers, query_key)):
            await _answer(send, 401, KEY_REFUSAL, "authentication_error")
            return
        if self.slots is not None and self.slots.full:   # busy now: say so before the client sends its upload
            busy = self.slots.busy()
            await _answer(send, busy.status, busy.message, busy.code)
            return
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _answer(send, 413, f"the request is {int(declared) / 1e6:.1f} MB; uploads of at most "
                                     f"{self.limit_mb:g} MB are accepted")
            return
        peek = FormPeek(headers.get("content-type"), PEEKED_FIELDS) if self.early_check else None
        seen, ended = 0, False
        stopped: Refusal | None = None   # why the app was told the client left: the body is not read further

        async def counted() -> Message:
            nonlocal seen, ended, stopped
            if stopped is not None:
                return {"type": "http.disconnect"}
            message = await receive()
            ended = message["type"] != "http.request" or not message.get("more_body", False)
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                stopped = Refusal(413, f"the upload is larger than the {self.limit_mb:g} MB that is accepted")
            elif peek is not None and not peek.done:
                peek.feed(message.get("body", b""))
                if peek.file_began:   # the fields sent before the file: refused now, not after the upload
                    stopped = self._checked_early(scope["path"], peek.fields)
            if stopped is not None:   # the app stops reading, and its answer is dropped
                return {"type": "http.disconnect"}
            return message

        async def unless_stopped(message: Message) -> None:
            if stopped is None:
                await send(message)

        try:
            await self.app(scope, counted, unless_stopped)
        except Exception:
            if stopped is None:
                raise
            log.debug("a refused upload ended the app's reading", exc_info=True)
        if stopped is not None:
            if not ended:   # past the body's end, receive() would wait for the client to leave
                await self._discard_rest(receive)
            await _answer(send, stopped.status, stopped.message, stopped.code)

    def _checked_early(self, path: str, fields: dict[str, list[str]]) -> Refusal | None:
        """`early_check`'s refusal; a check that fails leaves the request to the app's own checks."""
        try:
            return self.early_check(path, fields)
        except Exception:  # noqa: BLE001 - never a 500 for what the app would answer by itself
            log.exception("the early check of an upload's fields failed; the app checks them")
            return None

    @staticmethod
    async def _discard_rest(receive: Receive) -> None:
        """Read (and drop) what the client is still sending, up to DISCARD_BYTES, so that it reads the 413
        instead of a reset connection; a larger remainder is cut off."""
        dropped = 0
        while dropped < DISCARD_BYTES:
            message = await receive()
            dropped += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                return


class CountAnswers:
    """HTTP answers by status class, for /metrics. Counted as they are sent; a request whose handler failed before
    answering counts as a 5xx here (Starlette's outermost layer answers it, outside every layer of ours)."""

    def __init__(self, app: ASGIApp, answers: dict[str, int]) -> None:
        self.app, self.answers = app, answers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answered = False

        async def counted(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                self._count(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:
            if not answered:
                self._count(500)
            raise

    def _count(self, status: int) -> None:
        key = f"{status // 100}xx"
        self.answers[key] = self.answers.get(key, 0) + 1


async def _answer(send: Send, status: int, message: str, code: str = "invalid_request_error") -> None:
    response = error_response(status, message, code)
    await response(scope={"type": "http"}, receive=None, send=send)  # type: ignore[arg-type]


def build_app(engine: UiEngine, access: AccessSettings = AccessSettings(), mount_ui: bool = True) -> FastAPI:
    app = FastAPI(title="asr-app", docs_url=None, redoc_url=None, openapi_url=None)
    answers: dict[str, int] = {}
    slots = RequestSlots(engine.limits.max_requests)
    _install_error_handlers(app)
    # Added first, so innermost: each later layer wraps it (the answer count, then CORS).
    app.add_middleware(UploadGate, limit_mb=engine.limits.max_upload_mb, api_key=access.api_key, slots=slots,
                       early_check=functools.partial(refusal_before_upload, engine))

    app.add_middleware(CountAnswers, answers=answers)

    if access.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(access.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    # The scheduler's figures are read on the shared pool (with --engine ray they are a round trip to the replicas'
    # board), which transcriptions never hold (api.RequestSlots).
    @app.get("/health")
    async def health() -> dict:
        m = await run_in_threadpool(engine.scheduler.metrics)
        answer = {"status": "ok", "model": model_id(engine), "queue_depth": m.queue_depth,
                  "live_sessions": len(engine.sessions), "max_sessions": engine.limits.max_sessions,
                  "requests": slots.running, "max_requests": slots.limit}
        if hasattr(engine.scheduler, "figures_age_s"):   # --engine ray: the replicas' figures are this old
            age = engine.scheduler.figures_age_s
            answer["figures_age_s"] = None if age is None else round(age, 1)
        return answer

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        require_key(access, request)
        text = await run_in_threadpool(metrics_text, engine, dict(answers))   # a copy made on the loop, which counts
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    app.include_router(build_router(engine, access, slots))
    app.include_router(build_live_router(engine, access))
    _answer_unknown_api_paths(app)   # after the API's own routes, before the web app's mount
    if mount_ui:
        # imported here: the API alone (mount_ui=False, as the serving bench runs it) needs no Gradio
        import gradio as gr

        from asr_app.ui.app import build_app as build_gradio_app
        demo = build_gradio_app(engine)
        app = gr.mount_gradio_app(app, demo, path="/", max_file_size=f"{int(engine.limits.max_upload_mb)}mb",
                                  ssr_mode=False, auth_dependency=None, head=RECORDER_RETRY_HEAD)
        app.state.gradio_demo = demo   # its upload cache is cleared when the service stops (serve/cli.py)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(Refusal)
    async def on_refusal(_request: Request, exc: Refusal) -> Response:
        return error_response(exc.status, exc.message, exc.code)

    @app.exception_handler(LimitExceeded)
    async def on_limit(_request: Request, exc: LimitExceeded) -> Response:
        refusal = refusal_for(exc)
        return error_response(refusal.status, refusal.message)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(p) for p in first.get("loc", ())[1:]) or "request"
        if field == "file" and first.get("type") != "missing":   # a text field where the audio should be
            return error_response(400, "file: send the audio as a file part of a multipart form "
                                       "(-F file=@audio.wav), not as text")
        return error_response(400, f"{field}: {first.get('msg', 'invalid value')}")

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        """An unknown path or method in OpenAI's error shape, with one sentence."""
        if exc.status_code == 404:
            message = unknown_path(request.url.path)
        elif exc.status_code == 405:
            message = f"{request.method} is not accepted for {request.url.path}"
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, headers=exc.headers)


def unknown_path(path: str) -> str:
    return (f"there is no {path} here; the API is /v1/audio/transcriptions, /v1/audio/translations, /v1/models, "
            "/v1/live (a WebSocket), /health and /metrics")


def _answer_unknown_api_paths(app: FastAPI) -> None:
    """Paths under /v1 that no route takes, or a method a route does not take, answered in the API's error shape
    (405 with Allow). Without this, the web app mounted at / would take them and answer its own way."""
    api_methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]

    @app.api_route("/v1/{rest:path}", methods=api_methods, include_in_schema=False)
    async def unknown_api_path(request: Request, rest: str) -> Response:
        path = request.url.path
        # the routes before this one: the API's own (the web app's mount, after it, would take every path)
        routes = list(itertools.takewhile(lambda r: getattr(r, "endpoint", None) is not unknown_api_path,
                                          app.router.routes))

        def taken(scope: dict) -> bool:   # whether one of the API's own routes takes this request whole
            return any(r.matches({**request.scope, **scope})[0] == Match.FULL for r in routes)

        allowed = [m for m in api_methods if taken({"method": m})]
        if taken({"type": "websocket"}):
            return error_response(400, f"{path} is a WebSocket endpoint: connect to it with ws:// (or wss://)")
        if allowed:
            return error_response(405, f"{request.method} is not accepted for {path}",
                                  headers={"Allow": ", ".join(allowed)})
        return error_response(404, unknown_path(path))

    @app.exception_handler(Exception)
    async def on_error(_request: Request, exc: Exception) -> Response:
        refusal = refusal_for(exc)
        if refusal.status >= 500 or not isinstance(exc, ValueError | OSError):
            log.exception("request failed")
        return error_response(refusal.status, refusal.message, refusal.code)
