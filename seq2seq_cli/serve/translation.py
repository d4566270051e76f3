"""The translating routes of `seq2seq serve`: LibreTranslate's POST /translate, POST /detect,
GET /languages and GET /frontend/settings, and POST /v1/translate with the decoding options of
`translate`. Each request goes along the route of its (source, target) (`routing.py`): one run,
or two through a pivot language (`legs.py`)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from seq2seq_cli.decode.options import clip
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents.detect import SERVED
from seq2seq_cli.errors import UserError
from seq2seq_cli.languages import language_name, pair_text
from seq2seq_cli.serve.legs import translate_texts, translator_of, whole_lines
from seq2seq_cli.serve.parse import (
    REQUEST_DECODE_KEYS,
    V1_KEYS,
    RequestError,
    as_bool,
    as_int,
    check_key,
    check_pair,
    check_size,
    decode_options,
    nbest_fits,
    read_body,
    route_of,
    texts_of,
)
from seq2seq_cli.serve.routing import Route
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
    target = data["target"]
    detected: list[dict[str, Any]] = []
    if data["source"] == "auto":  # each text from the served language it is most likely in that reaches the target
        detected = await asyncio.to_thread(lambda: [auto_source(state, t, target) for t in texts])
        sources = [d["language"] for d in detected]
    else:
        sources = [data["source"]] * len(texts)
    out_texts: list[str] = [""] * len(texts)
    out_alts: list[list[str]] = [[] for _ in texts]
    for source in dict.fromkeys(sources):  # the texts of each source language together
        mine = [i for i, s in enumerate(sources) if s == source]
        route = route_of(state, source, target)
        # sentences joined back into lines, or html with its markup: the same with alternatives or without
        for i, text in zip(mine, await translate_texts(state, route, [texts[i] for i in mine], fmt)):
            out_texts[i] = text
        if alternatives:
            candidates = await with_alternatives(state, route, [lines[i] for i in mine], alternatives)
            for i, others in zip(mine, candidates):
                out_alts[i] = [text for text in others if text != out_texts[i]][:alternatives]
    single = isinstance(data["q"], str)
    body: dict[str, Any] = {"translatedText": out_texts[0] if single else out_texts}
    if alternatives:
        body["alternatives"] = out_alts[0] if single else out_alts
    if detected:
        body["detectedLanguage"] = detected[0] if single else detected
    return JSONResponse(body)


async def with_alternatives(state: AppState, route: Route, lines: list[list[str]], alternatives: int) -> list[list[str]]:
    """The `alternatives` + 1 best translations of each text (its lines, each translated whole),
    from the n-best lists of the route's last leg (the beam raised to hold them): the
    alternatives are those of them that are not the text's translation."""
    run = route.last.run
    decode_cfg = run.decode
    if not decode_cfg.sampling and decode_cfg.beam_size < alternatives + 1:
        decode_cfg = decode_options(run, {"beam_size": alternatives + 1})
    flat = [line for ls in lines for line in ls]
    results = await whole_lines(state, route, flat, state.batcher.options(decode_cfg, alternatives + 1))
    out = []
    start = 0
    for ls in lines:
        mine = results[start : start + len(ls)]
        start += len(ls)
        ranks = [[h["translation"] for h in r.get("nbest", [r])] for r in mine]
        out.append(list(dict.fromkeys("\n".join(rs[k] if k < len(rs) else rs[0] for rs in ranks)
                                      for k in range(alternatives + 1))))
    return out


def auto_source(state: AppState, text: str, target: str) -> dict[str, Any]:
    """LibreTranslate's detectedLanguage of a text with `source: auto`: the likeliest served
    language other than `target`, with the detector's confidence in it; a 400 where no route
    leads from it to `target`."""
    found = next(d for d in state.detector.rank(text) + [{"language": "", "confidence": 0.0}] if d["language"] != target)
    lang = found["language"]
    if not lang or state.routes.find(lang, target) is None:
        what = f"in {language_name(lang)} ({lang}), which" if lang else "in no language that"
        raise RequestError(400, f"the text is {what} this server does not translate into {language_name(target)} ({target})")
    return found


@router.get("/languages")
async def languages(request: Request) -> JSONResponse:
    """Each served language with every language it is translated into, direct or through a pivot."""
    routes = app_state(request).routes
    return JSONResponse([{"code": lang, "name": language_name(lang), "targets": routes.targets(lang)}
                         for lang in routes.languages])


@router.post("/detect")
async def detect(request: Request) -> JSONResponse:
    state, data = await read_request(request)
    if data.get("q") is None:
        raise RequestError(400, "Invalid request: missing q parameter")
    texts = texts_of(data["q"])
    check_size(state, texts)
    found = await asyncio.to_thread(lambda: [state.detector.rank(t) for t in texts])
    return JSONResponse(found[0] if isinstance(data["q"], str) else found)


@router.get("/frontend/settings")
async def frontend_settings(request: Request) -> JSONResponse:
    """What LibreTranslate's clients ask before they translate: the limits, whether a key is
    needed, the file formats, and the languages to show first (the first run's first pair)."""
    state = app_state(request)
    source_lang, target_lang = state.pool.runs[0].pairs[0]
    keys = state.settings.api_keys is not None
    return JSONResponse({
        "charLimit": state.settings.max_chars, "frontendTimeout": 500, "suggestions": False, "filesTranslation": True,
        "apiKeys": keys, "keyRequired": keys, "supportedFilesFormat": list(SERVED),
        "language": {"source": {"code": source_lang, "name": language_name(source_lang)},
                     "target": {"code": target_lang, "name": language_name(target_lang)}},
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
    route = await v1_route(state, data, texts)
    nbest = as_int(data.get("nbest", 1), "nbest", 1, 64)
    alignment = as_bool(data.get("alignment", False), "alignment")
    attention = as_bool(data.get("attention", False), "attention")
    given = {k: v for k, v in data.items() if k in REQUEST_DECODE_KEYS}
    decode_cfg = decode_options(route.last.run, given)
    nbest_fits(nbest, decode_cfg)
    before = {leg.run.name: decode_options(leg.run, given) for leg in route.legs[:-1]}  # the same options on each leg
    per_text = check_size(state, texts)
    prefixes = None
    if data.get("prefix") is not None:
        prefixes = prefixes_of(await translator_of(state, route.last), data["prefix"], data["q"], per_text)
    lines = [line for ls in per_text for line in ls]
    results = await whole_lines(state, route, lines, state.batcher.options(decode_cfg, nbest, alignment, attention),
                                prefixes, lambda leg: state.batcher.options(before[leg.run.name], 1))
    body: dict[str, Any] = {"results": results, "source": route.legs[0].pair[0], "target": route.last.pair[1],
                            "runs": route.runs, "pivot": route.pivot}
    return JSONResponse(body)


async def v1_route(state: AppState, data: dict[str, Any], texts: list[str]) -> Route:
    """The route of a /v1/translate request: its source (or auto: the language detected in all
    its text) and target; without them, the server's one pair where it has one."""
    source, target = data.get("source"), data.get("target")
    pairs = list(state.routes.direct)
    if len(pairs) == 1:  # a server of one pair: it is the default
        source, target = pairs[0][0] if source is None else source, pairs[0][1] if target is None else target
    if source is None or target is None:
        raise RequestError(400, f"Invalid request: missing {'source' if source is None else 'target'} parameter "
                                f"(this server translates {pair_text(pairs)}, and more through a pivot: GET /languages)")
    check_pair(state, source, target)
    if source == "auto":
        source = (await asyncio.to_thread(auto_source, state, "\n".join(texts), target))["language"]
    return route_of(state, source, target)


def prefixes_of(translator: Translator, prefix: Any, q: Any, lines: list[list[str]]) -> list[list[int]]:
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
