"""The HTTP API of `seq2seq serve`: LibreTranslate-compatible endpoints, its own endpoint with
the decoding options of `translate`, health, metrics and the web page.

    POST /translate      {"q": str | [str], "source", "target", "format": "text", "alternatives": N, "api_key"}
                         -> {"translatedText": str | [str]} (+ "alternatives", as LibreTranslate answers)
    GET  /languages      -> [{"code", "name", "targets"}]
    POST /v1/translate   {"q": str | [str], "nbest", "alignment", "attention", "prefix", "api_key", DecodeConfig keys...}
                         -> {"results": [{"translation", "score", "nbest"?, "alignment"?, "attention"?} per line]}
    GET  /health, GET /metrics (JSON, or Prometheus text with ?format=prometheus), GET / (the page)

Every error is answered as {"error": "one line"} with its status: 400 bad request, 403 API key,
413 too large, 503 queue full (with Retry-After), 504 timeout, 500 anything else; never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.sentences import Splitter
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.errors import UserError
from seq2seq_cli.languages import LANGUAGE_NAMES
from seq2seq_cli.serve import documents
from seq2seq_cli.serve.batcher import Batcher, JobOptions, QueueFull
from seq2seq_cli.serve.page import PAGE

log = logging.getLogger("seq2seq.serve")

# The decoding options a request may set; batch_tokens, precision and quantize belong to the
# server (the model is loaded with them) and are set on the `serve` command line; requests
# carry no constraints, so constraint_beam_size is not theirs either.
REQUEST_DECODE_KEYS = [k for k in DecodeConfig.model_fields
                       if k not in ("batch_tokens", "precision", "quantize", "constraint_beam_size")]
V1_KEYS = ["q", "source", "target", "api_key", "nbest", "alignment", "attention", "prefix"]


@dataclass
class ServeSettings:
    """Limits and behaviour of the server (the `serve` command's options)."""

    batch_wait_ms: float = 5.0  # how long the oldest queued request waits for others to batch with
    max_queue: int = 256  # requests queued or being decoded; beyond it 503
    max_chars: int = 20000  # characters of text per request; beyond it 413
    max_lines: int = 200  # lines (sentences) per request; beyond it 413
    timeout_s: float = 60.0  # a request not answered in this time gets 504
    api_keys: frozenset[str] | None = None  # None: no key needed
    batching: bool = True  # False: one request per decoding batch


class RequestError(Exception):
    """An answer other than 200: status, one-line message, extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def create_app(translator: Translator, settings: ServeSettings) -> FastAPI:
    """The ASGI app around one loaded translator; its decoding thread runs while the app does."""
    batcher = Batcher(translator, settings.batch_wait_ms / 1000.0, settings.max_queue, settings.batching)
    source_lang, target_lang = translator.languages
    requests: Counter[str] = Counter()
    splitter = Splitter(source_lang)
    responses: Counter[int] = Counter()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        await asyncio.to_thread(batcher.stop)

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None, title="seq2seq")
    app.state.batcher = batcher

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, f"internal error ({type(exc).__name__}); the server log has the details")

    @app.middleware("http")
    async def _count(request: Request, call_next: Any) -> Response:
        requests[request.url.path] += 1
        try:
            response = await call_next(request)
        except Exception:
            responses[500] += 1
            raise
        responses[response.status_code] += 1
        return response

    def check_key(data: dict[str, Any], request: Request) -> None:
        if settings.api_keys is None:
            return
        key = data.get("api_key") or request.headers.get("x-api-key")
        if not key:
            raise RequestError(403, "Invalid request: missing api_key (this server requires an API key)")
        if key not in settings.api_keys:
            raise RequestError(403, "Invalid API key")

    def check_pair(source: Any, target: Any) -> None:
        if source not in (source_lang, "auto"):
            raise RequestError(400, f"{source} is not supported as the source language; this model translates "
                                    f"{source_lang} to {target_lang}")
        if target != target_lang:
            raise RequestError(400, f"{target} is not supported as the target language; this model translates "
                                    f"{source_lang} to {target_lang}")

    def texts_of(q: Any) -> list[str]:
        if isinstance(q, str):
            return [q]
        if isinstance(q, list) and all(isinstance(t, str) for t in q):
            return q
        raise RequestError(400, "Invalid request: q must be a string or a list of strings")

    def check_size(texts: list[str]) -> list[list[str]]:
        chars = sum(len(t) for t in texts)
        if chars > settings.max_chars:
            raise RequestError(413, f"request too large: {chars} characters, the limit is {settings.max_chars}")
        lines = [t.split("\n") for t in texts]
        count = sum(len(ls) for ls in lines)
        if count > settings.max_lines:
            raise RequestError(413, f"request too large: {count} lines, the limit is {settings.max_lines}")
        return lines

    def prefixes_of(prefix: Any, q: Any, lines: list[list[str]]) -> list[list[int]]:
        """The forced prefix of each line of a request (target ids, [] = none): `prefix` has
        q's shape (a string, or a list as long as q's), each text's lines matching its q text's
        lines; an empty string is no prefix for all the lines of its text."""
        if isinstance(q, str) and isinstance(prefix, str):
            texts = [prefix]
        elif isinstance(q, list) and isinstance(prefix, list) and all(isinstance(t, str) for t in prefix):
            texts = prefix
        else:
            raise RequestError(400, "Invalid request: prefix must have the shape of q: a string for a string, "
                                    "a list of strings for a list")
        if len(texts) != len(lines):
            raise RequestError(400, f"Invalid request: prefix has {len(texts)} entries but q has {len(lines)}")
        flat: list[str] = []
        for i, (text, ls) in enumerate(zip(texts, lines)):
            parts = text.split("\n") if text else [""] * len(ls)
            if len(parts) != len(ls):
                raise RequestError(400, f"Invalid request: prefix {i + 1} has {len(parts)} lines but its q text has "
                                        f"{len(ls)}; give one prefix line per line (an empty line for none)")
            flat.extend(parts)
        try:
            return translator.encode_prefixes(flat, lambda i: f"prefix of line {i + 1}")
        except UserError as exc:
            raise RequestError(400, f"Invalid request: {exc}") from None

    async def decode(lines: list[str], options: JobOptions, prefixes: list[list[int]] | None = None) -> list[dict[str, Any]]:
        try:
            future = batcher.submit(lines, options, prefixes)
        except QueueFull as exc:
            raise RequestError(503, f"server busy: {exc.limit} requests are queued, the limit; retry later",
                               {"Retry-After": "1"}) from None
        except RuntimeError:
            raise RequestError(503, "server is shutting down", {"Retry-After": "5"}) from None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), settings.timeout_s)
        except TimeoutError:
            raise RequestError(504, f"translation took longer than the request timeout of {settings.timeout_s:g} s") from None
        except UserError as exc:
            raise RequestError(400, str(exc)) from None

    @app.post("/translate")
    async def libretranslate(request: Request) -> JSONResponse:
        data = await read_body(request, settings)
        check_key(data, request)
        for name in ("q", "source", "target"):
            if data.get(name) is None:
                raise RequestError(400, f"Invalid request: missing {name} parameter")
        texts = texts_of(data["q"])
        check_pair(data["source"], data["target"])
        fmt = data.get("format") or "text"
        if fmt not in documents.FORMATS:
            raise RequestError(400, f"format {fmt!r} is not supported; this server translates format text or html")
        alternatives = as_int(data.get("alternatives") or 0, "alternatives", 0, 16)
        lines = check_size(texts)
        decode_cfg = translator.decode
        if alternatives and not decode_cfg.sampling and decode_cfg.beam_size < alternatives + 1:
            decode_cfg = decode_cfg.model_copy(update={"beam_size": alternatives + 1})
        flat = [line for ls in lines for line in ls]
        results = [] if fmt == "html" or not alternatives else await decode(flat, batcher.options(decode_cfg, alternatives + 1))
        out_texts, out_alts = [], []
        start = 0
        for ls in lines if results else []:
            mine = results[start : start + len(ls)]
            start += len(ls)
            out_texts.append("\n".join(r["translation"] for r in mine))
            ranks = [[h["translation"] for h in r.get("nbest", [r])] for r in mine]
            out_alts.append(["\n".join(rs[k] if k < len(rs) else rs[0] for rs in ranks) for k in range(1, alternatives + 1)])
        if not results:  # sentences joined back into lines, or html with its markup
            out_texts = await documents.translate_texts(texts, fmt, translator, splitter, decode, batcher.options)
            out_alts = [[] for _ in texts]
        single = isinstance(data["q"], str)
        body: dict[str, Any] = {"translatedText": out_texts[0] if single else out_texts}
        if alternatives:
            body["alternatives"] = out_alts[0] if single else out_alts
        if data["source"] == "auto":
            detected = {"confidence": 100.0, "language": source_lang}
            body["detectedLanguage"] = detected if single else [detected] * len(texts)
        return JSONResponse(body)

    @app.get("/languages")
    async def languages() -> JSONResponse:
        return JSONResponse([
            {"code": source_lang, "name": LANGUAGE_NAMES.get(source_lang, source_lang), "targets": [target_lang]},
            {"code": target_lang, "name": LANGUAGE_NAMES.get(target_lang, target_lang), "targets": []},
        ])

    @app.post("/v1/translate")
    async def v1_translate(request: Request) -> JSONResponse:
        data = await read_body(request, settings)
        check_key(data, request)
        unknown = [k for k in data if k not in V1_KEYS and k not in REQUEST_DECODE_KEYS]
        if unknown:
            raise RequestError(400, f"unknown field {unknown[0]!r}; known fields: {', '.join(V1_KEYS + REQUEST_DECODE_KEYS)}")
        if data.get("q") is None:
            raise RequestError(400, "Invalid request: missing q parameter")
        texts = texts_of(data["q"])
        if data.get("source") is not None or data.get("target") is not None:
            check_pair(data.get("source", source_lang), data.get("target", target_lang))
        nbest = as_int(data.get("nbest", 1), "nbest", 1, 64)
        alignment = as_bool(data.get("alignment", False), "alignment")
        attention = as_bool(data.get("attention", False), "attention")
        given = {k: v for k, v in data.items() if k in REQUEST_DECODE_KEYS}
        try:
            decode_cfg = DecodeConfig(**{**translator.decode.model_dump(), **given})
        except ValidationError as exc:
            raise RequestError(400, describe_options_error(exc)) from None
        if not decode_cfg.sampling and nbest > decode_cfg.beam_size:
            raise RequestError(400, f"nbest {nbest} is larger than beam_size {decode_cfg.beam_size}; raise beam_size")
        per_text = check_size(texts)
        prefixes = None if data.get("prefix") is None else prefixes_of(data["prefix"], data["q"], per_text)
        lines = [line for ls in per_text for line in ls]
        results = await decode(lines, batcher.options(decode_cfg, nbest, alignment, attention), prefixes)
        return JSONResponse({"results": results})

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok", "languages": [source_lang, target_lang], "queue": batcher.pending()})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        c = batcher.counters
        figures = {
            "requests": dict(requests), "responses": {str(k): v for k, v in sorted(responses.items())},
            "batches": c.batches, "sentences": c.sentences, "requests_decoded": c.requests,
            "largest_batch_requests": c.largest_batch, "queue_depth": batcher.pending(),
            "uptime_s": round(time.monotonic() - started, 1),
        }
        if request.query_params.get("format") == "prometheus" or "text/plain" in request.headers.get("accept", ""):
            return PlainTextResponse(prometheus_text(figures), media_type="text/plain; version=0.0.4")
        return JSONResponse(figures)

    @app.get("/")
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE)

    documents.add_file_routes(app, translator, settings.max_chars, check_key, check_pair, RequestError)

    started = time.monotonic()
    return app


async def read_body(request: Request, settings: ServeSettings) -> dict[str, Any]:
    """The request's fields from a JSON object or a urlencoded form (a repeated q gives a list)."""
    limit = settings.max_chars * 4 + 65536  # UTF-8 text and the other fields, with room to spare
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise RequestError(413, f"request too large: {length} bytes of body, the limit is {limit}")
    raw = await request.body()
    if len(raw) > limit:
        raise RequestError(413, f"request too large: {len(raw)} bytes of body, the limit is {limit}")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    looks_json = raw.lstrip()[:1] in (b"{", b"[")  # JSON sent with curl -d's default form type is read as JSON
    if kind == "application/json" or (kind in ("", "application/x-www-form-urlencoded") and looks_json):
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RequestError(400, f"Invalid request: the body is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise RequestError(400, f"Invalid request: expected a JSON object, got {type(data).__name__}")
        return data
    if kind in ("application/x-www-form-urlencoded", ""):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(400, "Invalid request: the form is not UTF-8") from None
        form: dict[str, Any] = {}
        for key, value in parse_qsl(text, keep_blank_values=True):
            if key in form:
                form[key] = [*form[key], value] if isinstance(form[key], list) else [form[key], value]
            else:
                form[key] = value
        return form
    raise RequestError(400, f"Invalid request: Content-Type {kind!r} is not supported; "
                            "send application/json or application/x-www-form-urlencoded")


def as_int(value: Any, name: str, low: int, high: int) -> int:
    """A whole number in [low, high] from JSON or a form field."""
    try:
        number = int(value) if not isinstance(value, bool) and str(value).strip().lstrip("-").isdigit() else None
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise RequestError(400, f"Invalid request: {name} must be a whole number from {low} to {high} (got {value!r})")
    return number


def as_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise RequestError(400, f"Invalid request: {name} must be true or false (got {value!r})")


def describe_options_error(exc: ValidationError) -> str:
    """A rejected decoding option of a request as one line: the field, its value, what is allowed."""
    problems = []
    for err in exc.errors():
        msg = str(err["msg"]).removeprefix("Value error, ")
        problems.append(f"{err['loc'][0]} {err['input']!r}: {msg}" if err["loc"] else f"decoding options: {msg}")
    return "; ".join(problems)


def prometheus_text(figures: dict[str, Any]) -> str:
    """The metrics in the Prometheus text format."""
    lines = ["# TYPE seq2seq_requests_total counter"]
    lines += [f'seq2seq_requests_total{{path="{p}"}} {n}' for p, n in sorted(figures["requests"].items())]
    lines.append("# TYPE seq2seq_responses_total counter")
    lines += [f'seq2seq_responses_total{{status="{s}"}} {n}' for s, n in figures["responses"].items()]
    for name, kind in (("batches", "counter"), ("sentences", "counter"), ("requests_decoded", "counter"),
                       ("largest_batch_requests", "gauge"), ("queue_depth", "gauge"), ("uptime_s", "gauge")):
        metric = f"seq2seq_{name}_total" if kind == "counter" else f"seq2seq_{name}"
        lines += [f"# TYPE {metric} {kind}", f"{metric} {figures[name]}"]
    return "\n".join(lines) + "\n"
