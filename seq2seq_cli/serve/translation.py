"""The translating routes of `seq2seq serve`: LibreTranslate's POST /translate, POST /detect,
GET /languages and GET /frontend/settings, and POST /v1/translate with the decoding options of
`translate`."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from seq2seq_cli.data import langid
from seq2seq_cli.decode.options import clip
from seq2seq_cli.documents.detect import SERVED
from seq2seq_cli.documents.markup import translate_markup
from seq2seq_cli.documents.sentences import plan
from seq2seq_cli.errors import UserError
from seq2seq_cli.languages import LANGUAGE_NAMES
from seq2seq_cli.serve.batcher import JobOptions
from seq2seq_cli.serve.parse import (
    REQUEST_DECODE_KEYS,
    V1_KEYS,
    RequestError,
    answered,
    as_bool,
    as_int,
    check_key,
    check_pair,
    check_size,
    decode_options,
    nbest_fits,
    queued,
    read_body,
    texts_of,
)
from seq2seq_cli.serve.state import AppState, app_state

router = APIRouter()
FORMATS = ("text", "html")  # LibreTranslate's formats


async def read_request(request: Request) -> tuple[AppState, dict[str, Any]]:
    """The app's state and the request's fields, its API key checked."""
    state = app_state(request)
    data = await read_body(request, state.settings.max_chars * 4 + 65536)  # UTF-8 text and the other fields, with room
    check_key(state, data, request)
    return state, data


@router.post("/translate")
async def libretranslate(request: Request) -> JSONResponse:
    state, data = await read_request(request)
    for name in ("q", "source", "target"):
        if data.get(name) is None:
            raise RequestError(400, f"Invalid request: missing {name} parameter")
    texts = texts_of(data["q"])
    check_pair(state, data["source"], data["target"])
    fmt = data.get("format") or "text"
    if fmt not in FORMATS:
        raise RequestError(400, f"format {clip(repr(fmt))} is not supported; this server translates format text or html")
    given = data.get("alternatives")
    alternatives = 0 if given is None else as_int(given, "alternatives", 0, 16)
    if alternatives and fmt == "html":
        raise RequestError(400, "alternatives are given for format text only; format html is translated whole "
                                "with its markup (leave alternatives out)")
    lines = check_size(state, texts)
    decode_cfg = state.translator.decode
    if alternatives and not decode_cfg.sampling and decode_cfg.beam_size < alternatives + 1:
        decode_cfg = decode_options(state, {"beam_size": alternatives + 1})
    flat = [line for ls in lines for line in ls]
    # with alternatives, lines are decoded whole (n-best lists of sentences do not join); else split
    results = []
    if alternatives:
        results = await decode(state, flat, state.batcher.options(decode_cfg, alternatives + 1))
    out_texts, out_alts = [], []
    start = 0
    for ls in lines if results else []:
        mine = results[start : start + len(ls)]
        start += len(ls)
        out_texts.append("\n".join(r["translation"] for r in mine))
        ranks = [[h["translation"] for h in r.get("nbest", [r])] for r in mine]
        out_alts.append(["\n".join(rs[k] if k < len(rs) else rs[0] for rs in ranks) for k in range(1, alternatives + 1)])
    if not results:  # sentences joined back into lines, or html with its markup
        out_texts = await translate_texts(state, texts, fmt)
        out_alts = [[] for _ in texts]
    single = isinstance(data["q"], str)
    body: dict[str, Any] = {"translatedText": out_texts[0] if single else out_texts}
    if alternatives:
        body["alternatives"] = out_alts[0] if single else out_alts
    if data["source"] == "auto":  # translated from the run's source language, with the identifier's confidence in it
        found = await asyncio.to_thread(lambda: [detections(t, state.languages) for t in texts])
        detected = [next(d for d in f if d["language"] == state.languages[0]) for f in found]
        body["detectedLanguage"] = detected[0] if single else detected
    return JSONResponse(body)


@router.get("/languages")
async def languages(request: Request) -> JSONResponse:
    source_lang, target_lang = app_state(request).languages
    return JSONResponse([
        {"code": source_lang, "name": LANGUAGE_NAMES.get(source_lang, source_lang), "targets": [target_lang]},
        {"code": target_lang, "name": LANGUAGE_NAMES.get(target_lang, target_lang), "targets": []},
    ])


def detections(text: str, pair: tuple[str, str]) -> list[dict[str, Any]]:
    """LibreTranslate's answer for one text: each of the server's languages with the language
    identifier's confidence (0-100, the two adding up to 100), the likelier first. A language
    the identifier does not know gets 0; where it knows neither, each gets 50."""
    codes = [langid.identifier_code(lang) for lang in pair]
    ranked = langid.probabilities(text) if any(codes) and text.strip() else {}
    probs = [float(ranked.get(code, 0.0)) if code else 0.0 for code in codes]
    total = sum(probs)
    shares = [p / total for p in probs] if total > 0 else [1 / len(pair)] * len(pair)
    found = [{"confidence": round(100 * share, 1), "language": lang} for lang, share in zip(pair, shares)]
    return sorted(found, key=lambda d: -d["confidence"])


@router.post("/detect")
async def detect(request: Request) -> JSONResponse:
    state, data = await read_request(request)
    if data.get("q") is None:
        raise RequestError(400, "Invalid request: missing q parameter")
    texts = texts_of(data["q"])
    check_size(state, texts)
    found = await asyncio.to_thread(lambda: [detections(t, state.languages) for t in texts])
    return JSONResponse(found[0] if isinstance(data["q"], str) else found)


@router.get("/frontend/settings")
async def frontend_settings(request: Request) -> JSONResponse:
    """What LibreTranslate's clients ask before they translate: the limits, whether a key is
    needed, the file formats, and the languages to show first."""
    state = app_state(request)
    source_lang, target_lang = state.languages
    keys = state.settings.api_keys is not None
    return JSONResponse({
        "charLimit": state.settings.max_chars, "frontendTimeout": 500, "suggestions": False, "filesTranslation": True,
        "apiKeys": keys, "keyRequired": keys, "supportedFilesFormat": list(SERVED),
        "language": {"source": {"code": source_lang, "name": LANGUAGE_NAMES.get(source_lang, source_lang)},
                     "target": {"code": target_lang, "name": LANGUAGE_NAMES.get(target_lang, target_lang)}},
    })


@router.post("/v1/translate")
async def v1_translate(request: Request) -> JSONResponse:
    state, data = await read_request(request)
    unknown = [k for k in data if k not in V1_KEYS and k not in REQUEST_DECODE_KEYS]
    if unknown:
        known = ", ".join(V1_KEYS + REQUEST_DECODE_KEYS)
        raise RequestError(400, f"unknown field {clip(repr(unknown[0]))}; known fields: {known}")
    if data.get("q") is None:
        raise RequestError(400, "Invalid request: missing q parameter")
    texts = texts_of(data["q"])
    if data.get("source") is not None or data.get("target") is not None:
        source_lang, target_lang = state.languages
        check_pair(state, data.get("source", source_lang), data.get("target", target_lang))
    nbest = as_int(data.get("nbest", 1), "nbest", 1, 64)
    alignment = as_bool(data.get("alignment", False), "alignment")
    attention = as_bool(data.get("attention", False), "attention")
    decode_cfg = decode_options(state, {k: v for k, v in data.items() if k in REQUEST_DECODE_KEYS})
    nbest_fits(nbest, decode_cfg)
    per_text = check_size(state, texts)
    prefixes = None if data.get("prefix") is None else prefixes_of(state, data["prefix"], data["q"], per_text)
    lines = [line for ls in per_text for line in ls]
    results = await decode(state, lines, state.batcher.options(decode_cfg, nbest, alignment, attention), prefixes)
    return JSONResponse({"results": results})


def prefixes_of(state: AppState, prefix: Any, q: Any, lines: list[list[str]]) -> list[list[int]]:
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
        return state.translator.encode_prefixes(flat, lambda i: f"prefix of line {i + 1}")
    except UserError as exc:
        raise RequestError(400, f"Invalid request: {exc}") from None


async def translate_texts(state: AppState, texts: list[str], fmt: str) -> list[str]:
    """LibreTranslate's texts translated: in `fmt` html with their markup, as `translate` does an
    HTML file (on the decoding thread, in its turn); else line by line, one output line per line,
    each line cut into sentences and joined back, its sentences batched with other requests'."""
    translator, splitter = state.translator, state.splitter
    if fmt == "html":
        def work() -> list[str]:
            return [translate_markup(translator, text, "html", splitter) for text in texts]

        translated: list[str] = await answered(state, queued(lambda: state.batcher.run_alone(work)))
        return translated
    per_text = [t.split("\n") for t in texts]
    split = plan([line for ls in per_text for line in ls], splitter)
    results = await decode(state, split.units, state.batcher.options(translator.decode, 1))
    joined = split.join([r["translation"] for r in results])
    out, k = [], 0
    for ls in per_text:
        out.append("\n".join(joined[k : k + len(ls)]))
        k += len(ls)
    return out


async def decode(state: AppState, lines: list[str], options: JobOptions,
                 prefixes: list[list[int]] | None = None) -> list[dict[str, Any]]:
    """Each line's result, decoded by the batcher with the requests queued beside it."""
    return await answered(state, queued(lambda: state.batcher.submit(lines, options, prefixes)))
