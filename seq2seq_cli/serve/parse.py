"""Reading and checking a request of `seq2seq serve`: its body (JSON or a form) and its fields.
Every problem is a `RequestError`, answered as {"error": "one line"} with its status; a JSON
value of any kind in any field gets such an answer, never a 500."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.options import check_nbest, clip, decode_settings, field_name
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import first_surrogate
from seq2seq_cli.languages import language_name
from seq2seq_cli.serve.batcher import QueueFull
from seq2seq_cli.serve.routing import Route
from seq2seq_cli.serve.runs import ServedRun
from seq2seq_cli.serve.state import AppState, app_state

# The decoding options a request may set; batch_tokens, precision, quantize and shortlist belong
# to the server (the model is loaded with them) and are set on the `serve` command line;
# requests carry no constraints, so constraint_beam_size is not theirs either.
REQUEST_DECODE_KEYS = [k for k in DecodeConfig.model_fields
                       if k not in ("batch_tokens", "precision", "quantize", "shortlist", "constraint_beam_size")]
V1_KEYS = ["q", "source", "target", "api_key", "nbest", "alignment", "attention", "prefix"]
MAX_DEPTH = 32  # JSON objects and lists inside each other; a request needs 2 (an object holding q's list)


class RequestError(Exception):
    """An answer other than 200: status, one-line message, extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def too_large(what: str, size: str, limit: int) -> RequestError:
    """The 413 answer: `what` ("request", "file") of `size` (with its unit) over `limit`."""
    return RequestError(413, f"{what} too large: {size}, the limit is {limit}")


def queued(submit: Callable[[], Future]) -> Future:
    """The future of work handed to the batcher by `submit`, or the 503 answer (with Retry-After)
    when its queue is full or it is stopping."""
    try:
        return submit()
    except QueueFull as exc:
        raise RequestError(503, f"server busy: {exc.limit} requests are queued, the limit; retry later",
                           {"Retry-After": "1"}) from None
    except RuntimeError:
        raise RequestError(503, "server is shutting down", {"Retry-After": "5"}) from None


async def answered(state: AppState, future: Future) -> Any:
    """What the batcher's `future` gives, within the request timeout (else 504); a problem with
    the request's input found while decoding is its 400."""
    timeout = state.settings.timeout_s
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
    except TimeoutError:
        raise RequestError(504, f"translation took longer than the request timeout of {timeout:g} s") from None
    except UserError as exc:
        raise RequestError(400, str(exc)) from None


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def json_kind(value: Any) -> str:
    """What a JSON value is, in words: 'a string', 'a list', 'an object' ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    kinds = ((str, "a string"), (int, "a number"), (float, "a number"), (list, "a list"), (dict, "an object"))
    return next((kind for cls, kind in kinds if isinstance(value, cls)), type(value).__name__)


async def read_body(request: Request, limit: int) -> dict[str, Any]:
    """The request's fields from a JSON object or a urlencoded form (a repeated q gives a list),
    checked by `check_values`; a body over `limit` bytes is refused (413)."""
    check_key_early(app_state(request), request)
    raw = await read_limited(request, limit, "request", limit)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    looks_json = raw.lstrip()[:1] in (b"{", b"[")  # JSON sent with curl -d's default form type is read as JSON
    if kind == "application/json" or (kind in ("", "application/x-www-form-urlencoded") and looks_json):
        data = parse_json(raw)
    elif kind in ("application/x-www-form-urlencoded", ""):
        data = parse_form(raw)
    else:
        raise RequestError(400, f"Invalid request: Content-Type {kind!r} is not supported; "
                                "send application/json or application/x-www-form-urlencoded")
    check_values(data)
    return data


async def read_limited(request: Request, limit: int, what: str, shown: int) -> bytes:
    """The request's body, read as it arrives: refused (413, `what` too large, the limit shown
    as `shown`) as soon as it passes `limit` bytes, whether or not it said its length."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise too_large(what, f"{length} bytes of body", shown)
    chunks, size = [], 0
    timeout = app_state(request).settings.timeout_s
    stream = request.stream().__aiter__()
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:  # a body that stops coming (a client gone quiet, or one holding connections open) waits no longer than a request
            chunk = await asyncio.wait_for(stream.__anext__(), max(0.0, deadline - asyncio.get_running_loop().time()))
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise RequestError(408, f"the request's body did not arrive within {timeout:g} s") from None
        except ClientDisconnect:  # nobody is left to answer: one line in the metrics, no traceback in the log
            raise RequestError(400, "the client closed the connection before its body ended") from None
        size += len(chunk)
        if size > limit:
            raise too_large(what, f"more than {limit} bytes of body", shown)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(400, f"Invalid request: the body is not valid JSON ({exc})") from None
    except RecursionError:
        raise RequestError(400, f"Invalid request: the body nests JSON more than {MAX_DEPTH} levels deep") from None
    except ValueError:  # an integer of more digits than Python converts
        raise RequestError(400, "Invalid request: the body is not valid JSON "
                                f"(a number of more than {sys.get_int_max_str_digits()} digits)") from None
    if not isinstance(data, dict):
        raise RequestError(400, f"Invalid request: expected a JSON object, got {type(data).__name__}")
    return data


def parse_form(raw: bytes) -> dict[str, Any]:
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


def check_values(data: dict[str, Any]) -> None:
    """Refuse what JSON can carry but no field can use, naming the field: nesting deeper than
    MAX_DEPTH, and strings that are not text (lone surrogates, which `\\ud800` escapes decode
    to and no encoding can write)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            check_text(value, where)
        elif isinstance(value, (list, dict)):
            if depth > MAX_DEPTH:
                raise RequestError(400, f"Invalid request: the body nests JSON more than {MAX_DEPTH} levels deep")
            if isinstance(value, list):
                stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
            else:
                for name, item in value.items():
                    check_text(name, "")
                    stack.append((item, f"{where}.{name}" if where else name, depth + 1))


def check_text(text: str, where: str) -> None:
    """`text` (the value at `where`, "" for a field name) is Unicode that UTF-8 can write."""
    point = first_surrogate(text)
    if point is not None:
        what = clip(where) if where else "a field name"
        raise RequestError(400, f"Invalid request: {what} holds a lone surrogate (U+{point:04X}), "
                                "which is not text; send valid Unicode")


def header_key(request: Request) -> str | None:
    """The API key a request carries outside its body: the X-API-Key header, else the api_key
    of the query string."""
    return request.headers.get("x-api-key") or request.query_params.get("api_key") or None


def check_key_early(state: AppState, request: Request) -> None:
    """A wrong key in the header or the query string is refused (403) before the body is read."""
    key = header_key(request)
    if state.settings.api_keys is not None and key is not None and key not in state.settings.api_keys:
        raise RequestError(403, "Invalid API key")


def check_key(state: AppState, data: dict[str, Any], request: Request) -> None:
    """The request's API key (the api_key field, else the X-API-Key header or the query
    string's api_key), where the server needs one."""
    key = data.get("api_key")
    if key is not None and not isinstance(key, str):
        raise RequestError(400, f"Invalid request: api_key must be a string (got {json_kind(key)})")
    if state.settings.api_keys is None:
        return
    key = key or header_key(request)
    if not key:
        raise RequestError(403, "Invalid request: missing api_key (this server requires an API key)")
    if key not in state.settings.api_keys:
        raise RequestError(403, "Invalid API key")


def check_pair(state: AppState, source: Any, target: Any) -> None:
    """`source` (or auto) and `target` are strings naming languages the server translates from and
    into (else 400); where source is not auto, a route joins them (`route_of`)."""
    for name, value in (("source", source), ("target", target)):
        if not isinstance(value, str):
            raise RequestError(400, f"Invalid request: {name} must be a string (got {json_kind(value)})")
    sources, targets = state.routes.sources(), state.routes.reached()
    if source != "auto" and source not in sources:
        raise RequestError(400, f"{clip(str(source))} is not supported as the source language; this server translates "
                                f"from {', '.join(sources)}")
    if target not in targets:
        raise RequestError(400, f"{clip(str(target))} is not supported as the target language; this server translates "
                                f"into {', '.join(targets)}")
    if source != "auto":
        route_of(state, source, target)


def route_of(state: AppState, source: str, target: str) -> Route:
    """The route of a pair the server translates (direct or through a pivot); else LibreTranslate's 400."""
    route = state.routes.find(source, target)
    if route is None:
        raise RequestError(400, f"{language_name(target)} ({target}) is not available as a target language from "
                                f"{language_name(source)} ({source})")
    return route


def texts_of(q: Any) -> list[str]:
    if isinstance(q, str):
        return [q]
    if isinstance(q, list) and all(isinstance(t, str) for t in q):
        return q
    raise RequestError(400, "Invalid request: q must be a string or a list of strings")


def check_size(state: AppState, texts: list[str]) -> list[list[str]]:
    """The lines of each text, within the server's limits (else 413)."""
    chars = sum(len(t) for t in texts)
    if chars > state.settings.max_chars:
        raise too_large("request", f"{chars} characters", state.settings.max_chars)
    lines = [t.split("\n") for t in texts]
    count = sum(len(ls) for ls in lines)
    if count > state.settings.max_lines:
        raise too_large("request", f"{count} lines", state.settings.max_lines)
    return lines


def decode_options(run: ServedRun, given: dict[str, Any]) -> DecodeConfig:
    """A run's decoding settings on the server with a request's own (DecodeConfig keys), checked
    by the rules `translate` checks its flags with (`seq2seq_cli/decode/options.py`)."""
    try:
        return decode_settings(run.decode, given, run.target_vocabulary, field_name)
    except UserError as exc:
        raise RequestError(400, str(exc)) from None


def nbest_fits(nbest: int, decode: DecodeConfig) -> None:
    """An n-best list within the beam, as `translate --nbest` checks it."""
    try:
        check_nbest(nbest, decode, field_name)
    except UserError as exc:
        raise RequestError(400, str(exc)) from None


def as_int(value: Any, name: str, low: int, high: int) -> int:
    """A whole number in [low, high] from JSON or a form field."""
    try:
        number = int(value) if not isinstance(value, bool) and str(value).strip().lstrip("-").isdigit() else None
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise RequestError(400, f"Invalid request: {name} must be a whole number from {low} to {high} (got {clip(repr(value))})")
    return number


def as_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise RequestError(400, f"Invalid request: {name} must be true or false (got {clip(repr(value))})")
