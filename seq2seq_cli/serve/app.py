"""The HTTP API of `seq2seq serve`: LibreTranslate-compatible endpoints, its own endpoint with
the decoding options of `translate`, health, metrics and the web page.

    POST /translate      {"q": str | [str], "source", "target", "format": "text", "alternatives": N, "api_key"}
                         -> {"translatedText": str | [str]} (+ "alternatives", as LibreTranslate answers)
    GET  /languages      -> [{"code", "name", "targets"}]
    POST /v1/translate   {"q": str | [str], "nbest", "alignment", "attention", "prefix", "api_key", DecodeConfig keys...}
                         -> {"results": [{"translation", "score", "nbest"?, "alignment"?, "attention"?} per line]}
    GET  /health, GET /metrics (JSON, or Prometheus text with ?format=prometheus), GET / (the page)

    POST /translate_file (multipart) -> {"translatedFileUrl"}; GET /download_file/NAME

The routes live in routers (`translation.py`, `files.py`, `status.py`), each reaching the one `AppState`
with `app_state(request)` and reading its body with `parse.read_body`; a new group of routes
is one more router in ROUTERS, its routes carrying their full paths (the metrics count by
them). HEAD is answered wherever GET is, without a body.

Every error is answered as {"error": "one line"} with its status: 400 bad request, 403 API key,
413 too large, 503 queue full (with Retry-After), 504 timeout, 500 anything else; never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.serve import files, status, translation
from seq2seq_cli.serve.parse import REQUEST_DECODE_KEYS, V1_KEYS, RequestError, error_response
from seq2seq_cli.serve.runs import ServedRun
from seq2seq_cli.serve.state import AppState, ServeSettings, app_state, path_label

__all__ = ["REQUEST_DECODE_KEYS", "ROUTERS", "V1_KEYS", "ServeSettings", "create_app"]

log = logging.getLogger("seq2seq.serve")

ROUTERS: tuple[APIRouter, ...] = (translation.router, files.router, status.router)


def create_app(served: Translator | list[ServedRun], settings: ServeSettings,
               routers: Sequence[APIRouter] = ROUTERS) -> FastAPI:
    """The ASGI app around one loaded translator, or runs (`seq2seq_cli/serve/runs.py`); its decoding
    thread runs while the app does."""
    state = AppState.create(served, settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.batcher.start()
        yield
        await asyncio.to_thread(state.batcher.stop)
        state.files.close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None, title="seq2seq")
    app.state.serve = state
    app.state.batcher = state.batcher
    app.state.files = state.files
    app.add_exception_handler(RequestError, request_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, internal_error)
    app.add_middleware(Counting)
    for router in routers:
        app.include_router(router)
    # the routers' routes (the app holds each router, not copies of its routes)
    every = [*(route for router in routers for route in router.routes), *app.routes]
    state.api_routes = [route for route in every if isinstance(route, APIRoute)]
    for route in state.api_routes:
        if route.methods is not None and "GET" in route.methods:
            route.methods.add("HEAD")  # answered as a GET, the server leaving out the body
    return app


async def request_error(_: Request, exc: RequestError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.headers)


async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    # its headers kept: a 405 names the methods the path takes (Allow), as HTTP asks
    return error_response(exc.status_code, str(exc.detail), dict(exc.headers) if exc.headers else None)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(500, f"internal error ({type(exc).__name__}); the server log has the details")


class Counting:
    """ASGI middleware counting each request under its route's path (one label for paths
    without a route) and each response under its status. Plain ASGI: an `http` middleware
    function (Starlette's BaseHTTPMiddleware) adds a task and a stream to every request; a
    one-word request took 6.6 ms with it, 5.9 ms without (bench/README.md)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        state = app_state(request)
        state.requests[path_label(request)] += 1
        status_code = [500]

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_code[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            state.responses[500] += 1
            raise
        state.responses[status_code[0]] += 1
