"""LibreTranslate's file routes of `seq2seq serve`: POST /translate_file (multipart: file,
source, target, api_key -> {"translatedFileUrl"}) and GET /download_file/ID. A file is
translated by the documents wing as `translate -i FILE` translates it (`translate_bytes`), on
the batcher's decoding thread in its run's turn (`Batcher.run_alone`), never beside a batch;
through a pivot, the first leg's document is translated again by the second's run; the
result waits in the server's `FileStore` for its one download (a HEAD does not take it), under
an id of the server's own; the name it was sent with comes back in Content-Disposition only.
An upload is read as it arrives, never past MAX_FILE_BYTES.
"""

from __future__ import annotations

import email.policy
import functools
import logging
import mimetypes
from email.parser import BytesParser
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.decode.options import clip
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents.detect import check_document, check_served_name, detect
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.documents.translate import describe_pieces, text_chars, translate_bytes
from seq2seq_cli.errors import UserError
from seq2seq_cli.serve.legs import alone, translator_of
from seq2seq_cli.serve.parse import (
    RequestError,
    check_key,
    check_key_early,
    check_pair,
    read_limited,
    route_of,
    too_large,
)
from seq2seq_cli.serve.state import AppState, app_state
from seq2seq_cli.serve.store import FILE_LIFETIME_S

MAX_FILE_BYTES = 10 << 20  # bytes of an uploaded file; more are answered 413
log = logging.getLogger("seq2seq.serve")

router = APIRouter()


def multipart_fields(content_type: str, body: bytes) -> dict[str, Any]:
    """The fields of a multipart/form-data body, in memory: name -> text, or (filename, bytes)
    for a file."""
    message = BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise ValueError("the body is not multipart/form-data")
    fields: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        payload = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        if isinstance(name, str):
            fields[name] = (filename or "", payload) if filename is not None else payload.decode("utf-8", "replace")
    return fields


async def read_upload(request: Request, state: AppState) -> dict[str, Any]:
    """The multipart fields of an upload, read as they arrive and refused (413) once past
    MAX_FILE_BYTES; a wrong key in the header or the query string is refused (403) before
    anything is read."""
    check_key_early(state, request)
    body = await read_limited(request, MAX_FILE_BYTES + 65536, "file", MAX_FILE_BYTES)
    kind = request.headers.get("content-type", "")
    try:
        fields = multipart_fields(kind, body) if kind.lower().startswith("multipart/form-data") else None
    except (ValueError, UnicodeError):
        fields = None
    if fields is None:
        raise RequestError(400, "Invalid request: send the file as multipart/form-data (fields file, source, target)")
    return fields


@router.post("/translate_file")
async def translate_file(request: Request) -> JSONResponse:
    state = app_state(request)
    fields = await read_upload(request, state)
    check_key(state, fields, request)
    for field in ("file", "source", "target"):
        if fields.get(field) is None:
            raise RequestError(400, f"Invalid request: missing {field} parameter")
    check_pair(state, fields["source"], fields["target"])
    if fields["source"] == "auto":
        raise RequestError(400, "Invalid request: source auto is not taken for files; name the file's language in source")
    route = route_of(state, fields["source"], fields["target"])
    upload = fields.get("file")
    if not isinstance(upload, tuple):
        raise RequestError(400, "Invalid request: file must be a file (a multipart part with a filename)")
    name, data = upload
    name = PurePosixPath((name or "file").replace("\\", "/")).name or "file"
    try:
        check_served_name(name)
        fmt = detect(name, data[:4096])
        check_document(name, data, fmt)
        chars = text_chars(fmt, data, name)
    except UserError as exc:
        raise RequestError(400, str(exc)) from None
    if chars > state.settings.max_chars:
        raise too_large("file", f"{chars} characters of text", state.settings.max_chars)
    translated = data
    for leg in route.legs:  # through a pivot: the first leg's document is the second's
        cut: list[int] = []
        translated = await alone(state, leg, functools.partial(document, name=name, data=translated, fmt=fmt, cut=cut))
        if cut:
            translator = await translator_of(state, leg)
            log.warning("%s", describe_pieces(name, len(cut), translator).removeprefix("warning: "))
    stored = state.files.put(name, translated)
    return JSONResponse({"translatedFileUrl": f"{str(request.base_url).rstrip('/')}/download_file/{stored}"})


def document(translator: Translator, splitter: Splitter, name: str, data: bytes, fmt: DocumentFormat,
             cut: list[int]) -> bytes:
    """`translate_bytes` with the arguments in the order `alone` gives them."""
    return translate_bytes(translator, name, data, fmt, splitter, cut)


@router.get("/download_file/{stored}")
async def download_file(request: Request, stored: str) -> Response:
    """A translated file, once: a GET takes it, a HEAD only looks (its headers, no body)."""
    found = app_state(request).files.take(stored, keep=request.method == "HEAD")
    if found is None:
        raise RequestError(404, f"no translated file {clip(repr(stored))} "
                                f"(each is downloaded once, within {FILE_LIFETIME_S:g} s)")
    filename, data = found
    return Response(data, media_type=mimetypes.guess_type(stored)[0] or "application/octet-stream",
                    headers={"Content-Disposition": content_disposition(filename)})


def content_disposition(filename: str) -> str:
    """An attachment named `filename`: RFC 6266's plain ASCII filename for old clients, and the
    name itself in RFC 5987's filename* (UTF-8, percent-encoded)."""
    plain = "".join(c if " " <= c < "\x7f" and c not in '"\\%' else "_" for c in filename) or "file"
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(filename, safe='')}"
