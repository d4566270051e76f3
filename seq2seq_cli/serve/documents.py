"""Documents in `seq2seq serve`: LibreTranslate's texts split into sentences and joined back,
its `format: "html"`, carried through with its markup (`seq2seq_cli/decode/markup.py`), and
its files: POST /translate_file and GET /download_file/NAME (`seq2seq_cli/decode/docfiles.py`).

The sentences go through the server's batcher like any request's lines (`decode` is the
app's way to submit lines and await their results), so limits, queueing and batching
across clients hold for them too.
"""

from __future__ import annotations

import asyncio
import email.policy
import mimetypes
import re
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from email.parser import BytesParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from seq2seq_cli.decode.docfiles import check_file, text_chars, translate_bytes
from seq2seq_cli.decode.markup import MarkupDocument, aligned
from seq2seq_cli.decode.sentences import Splitter, plan
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.errors import UserError
from seq2seq_cli.serve.batcher import Batcher, JobOptions, QueueFull

Options = Callable[..., JobOptions]  # the batcher's `options`
Decode = Callable[[list[str], bool], Awaitable[list[dict[str, Any]]]]  # lines, with alignment -> results
FORMATS = ("text", "html")


async def translate_lines(lines: list[str], splitter: Splitter, decode: Decode) -> list[str]:
    """Lines translated one output per line, each cut into sentences and joined back."""
    split = plan(lines, splitter)
    results = await decode(split.units, False)
    return split.join([r["translation"] for r in results])


async def translate_html(texts: list[str], translator: Translator, splitter: Splitter, decode: Decode) -> list[str]:
    """HTML texts (fragments or documents) translated with their markup."""
    docs = [MarkupDocument(text, "html", splitter) if text.strip() else None for text in texts]  # HTML always parses
    sentences = [s for d in docs if d is not None for s in d.sentences]
    results = await decode(sentences, True) if sentences else []
    skip = len(translator.tag_ids)
    out, k = [], 0
    for text, doc in zip(texts, docs):
        if doc is None:
            out.append(text)
            continue
        mine = []
        for sentence, result in zip(doc.sentences, results[k : k + len(doc.sentences)]):
            tokens = [translator.tgt_sp.piece_to_id(p) for p in result["attention"]["target"][:-1]]
            links = [int(pair.split("-")[0]) - skip for pair in result["alignment"].split()]
            mine.append(aligned(translator, sentence, tokens, links))
        k += len(doc.sentences)
        out.append(doc.render(mine))
    return out


async def translate_texts(
    texts: list[str], fmt: str, translator: Translator, splitter: Splitter,
    decode: Callable[[list[str], JobOptions], Awaitable[list[dict[str, Any]]]], options: Options,
) -> list[str]:
    """LibreTranslate's texts translated: in `fmt` html with their markup, else line by line
    (one output line per line), each line cut into sentences and joined back."""

    async def run(lines: list[str], alignment: bool) -> list[dict[str, Any]]:
        return await decode(lines, options(translator.decode, 1, alignment, alignment))

    if fmt == "html":
        return await translate_html(texts, translator, splitter, run)
    per_text = [t.split("\n") for t in texts]
    joined = await translate_lines([line for ls in per_text for line in ls], splitter, run)
    out, k = [], 0
    for ls in per_text:
        out.append("\n".join(joined[k : k + len(ls)]))
        k += len(ls)
    return out


# ---------------------------------------------------------------------------------- files

FILE_LIFETIME_S = 600.0  # a translated file not downloaded by then is removed
MAX_FILE_BYTES = 10 << 20  # bytes of an uploaded file; more are answered 413
NAME = re.compile(r"[0-9a-f]{32}\.[\w. -]{1,200}")


class FileStore:
    """The server's temporary folder of translated files: each is downloaded once (then
    removed) or removed after FILE_LIFETIME_S; the folder is removed when the server ends."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="seq2seq-files-"))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.folder), True)

    def put(self, name: str, data: bytes) -> str:
        self.sweep()
        stored = f"{uuid.uuid4().hex}.{Path(name).name}"
        (self.folder / stored).write_bytes(data)
        return stored

    def take(self, stored: str) -> bytes | None:
        """A stored file's bytes, removed from the folder; None if there is no such file."""
        self.sweep()
        if not NAME.fullmatch(stored):
            return None
        path = self.folder / stored
        try:
            data = path.read_bytes()
        except OSError:
            return None
        path.unlink(missing_ok=True)
        return data

    def sweep(self) -> None:
        now = time.time()
        for path in self.folder.iterdir():
            if now - path.stat().st_mtime > FILE_LIFETIME_S:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        self._finalizer()


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


def add_file_routes(
    app: Any, translator: Translator, batcher: Batcher, max_chars: int, check_key: Callable[[dict[str, Any], Any], None],
    check_pair: Callable[[Any, Any], None], error: Callable[[int, str], Exception],
) -> FileStore:
    """LibreTranslate's POST /translate_file (multipart: file, source, target, api_key ->
    {"translatedFileUrl"}) and GET /download_file/NAME on `app`. A file is translated on the
    batcher's decoding thread in its turn (`Batcher.run_alone`), never beside a batch.
    `check_key(fields, request)` and `check_pair(source, target)` are the app's checks;
    `error(status, message)` makes the error to raise."""
    store = FileStore()
    app.state.files = store
    splitter = Splitter(translator.languages[0])

    async def translate(name: str, data: bytes) -> bytes:
        try:
            future = batcher.run_alone(lambda: translate_bytes(translator, name, data, splitter))
        except QueueFull as exc:
            raise error(503, f"server busy: {exc.limit} requests are queued, the limit; retry later") from None
        except RuntimeError:
            raise error(503, "server is shutting down") from None
        return await asyncio.wrap_future(future)

    @app.post("/translate_file")
    async def translate_file(request: Request) -> JSONResponse:
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > MAX_FILE_BYTES + 65536:
            raise error(413, f"file too large: {length} bytes of body, the limit is {MAX_FILE_BYTES}")
        body = await request.body()
        if len(body) > MAX_FILE_BYTES + 65536:
            raise error(413, f"file too large: {len(body)} bytes of body, the limit is {MAX_FILE_BYTES}")
        kind = request.headers.get("content-type", "")
        try:
            fields = multipart_fields(kind, body) if kind.lower().startswith("multipart/form-data") else None
        except (ValueError, UnicodeError):
            fields = None
        if fields is None:
            raise error(400, "Invalid request: send the file as multipart/form-data (fields file, source, target)")
        check_key(fields, request)
        for field in ("file", "source", "target"):
            if fields.get(field) is None:
                raise error(400, f"Invalid request: missing {field} parameter")
        check_pair(fields["source"], fields["target"])
        upload = fields.get("file")
        if not isinstance(upload, tuple):
            raise error(400, "Invalid request: file must be a file (a multipart part with a filename)")
        name, data = upload
        name = Path(name or "file").name
        try:
            suffix = check_file(name, data)
            chars = text_chars(suffix, data, name)
        except UserError as exc:
            raise error(400, str(exc)) from None
        if chars > max_chars:
            raise error(413, f"file too large: {chars} characters of text, the limit is {max_chars}")
        try:
            translated = await translate(name, data)
        except UserError as exc:
            raise error(400, str(exc)) from None
        stored = store.put(name, translated)
        return JSONResponse({"translatedFileUrl": f"{str(request.base_url).rstrip('/')}/download_file/{stored}"})

    @app.get("/download_file/{stored}")
    async def download_file(stored: str) -> Response:
        data = store.take(stored)
        if data is None:
            raise error(404, f"no translated file {stored!r} (each is downloaded once, within {FILE_LIFETIME_S:g} s)")
        filename = stored.split(".", 1)[1]
        return Response(data, media_type=mimetypes.guess_type(filename)[0] or "application/octet-stream",
                        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename)}"})

    return store
