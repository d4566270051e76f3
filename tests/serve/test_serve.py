"""`seq2seq serve` as a real process on a free port, driven by real clients: the libretranslatepy
client, concurrent threads, bad and oversized requests, API keys, a full queue, a timeout and
SIGTERM; the batching of requests in process; the web page in a headless chromium.

Every error case here has a row in docs/errors.md, section "Serving" (checked below).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO, SHIPPED, headless_chromium
from seq2seq_cli.cli import app as cli_app
from seq2seq_cli.config_load import load_config

pytest.importorskip("fastapi", reason="the serve extra is not installed")
from libretranslatepy import LibreTranslateAPI  # noqa: E402
from serve_helpers import Server  # noqa: E402

from seq2seq_cli.decode.translate import Translator  # noqa: E402
from seq2seq_cli.serve.app import ServeSettings, create_app  # noqa: E402
from seq2seq_cli.serve.batcher import Batcher  # noqa: E402

KEY = "k-123"
SENTENCES = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:24]
# A request that takes a while whatever the model says: every line decodes 250 steps, beam 4.
SLOW = {"q": "\n".join(SENTENCES[i % 24] for i in range(200)), "min_len": 240, "max_len_a": 0, "max_len_b": 250, "beam_size": 4}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run trained for two updates: outputs that differ from sentence to sentence (nonsense,
    but not empty) are all these tests need."""
    from seq2seq_cli.train.loop import train

    tmp = tmp_path_factory.mktemp("serve")
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp / "run")
    raw["data"]["train"] = str(SHIPPED / "valid")
    raw["data"]["valid"] = str(SHIPPED / "test")
    raw["train"].update({"max_steps": 2, "valid_every": 2})
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return train(load_config(path), progress=False, log=lambda _: None)


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    """A server with API keys and small limits."""
    tmp = tmp_path_factory.mktemp("server")
    keys = tmp / "keys.txt"
    keys.write_text(f"# keys\n{KEY}\nother-key\n", encoding="utf-8")
    s = Server(run_dir, tmp, "--api-keys", str(keys), "--max-lines", "40", "--max-chars", "3000", "--beam-size", "3",
               "--full-vocabulary")  # a shortlist's candidates follow the batch; the whole vocabulary's answers do not
    yield s
    s.stop()


def translate_cli(run_dir: Path, tmp: Path, lines: list[str], *flags: str) -> list[str]:
    """What `seq2seq translate` writes for these lines (over the whole vocabulary, as `server` decodes,
    unless `flags` ask for the shortlist)."""
    src, out = tmp / "in.txt", tmp / "out.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    vocabulary = [] if "--shortlist" in flags else ["--full-vocabulary"]
    result = CliRunner().invoke(cli_app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out),
                                          "--device", "cpu", "--no-progress", *vocabulary, *flags])
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------------------- real clients


def test_libretranslate_client_gets_what_translate_writes(server, run_dir, tmp_path):
    client = LibreTranslateAPI(server.url, api_key=KEY)
    lines = SENTENCES[:6]
    got = [client.translate(line, "es", "en") for line in lines]
    expected = translate_cli(run_dir, tmp_path, lines, "--beam-size", "3")
    assert got == expected
    assert len(set(expected)) > 1 and all(expected)  # the comparison is not between empty strings
    assert client.languages() == [{"code": "es", "name": "Spanish", "targets": ["en"]},
                                  {"code": "en", "name": "English", "targets": []}]
    status, _, body = server.post("/translate", {"q": lines[:3], "source": "es", "target": "en", "api_key": KEY})
    assert status == 200 and body == {"translatedText": expected[:3]}
    status, _, body = server.post("/translate", {"q": "\n".join(lines[:3]), "source": "auto", "target": "en", "api_key": KEY})
    assert status == 200 and body["translatedText"] == "\n".join(expected[:3])
    assert body["detectedLanguage"]["language"] == "es" and body["detectedLanguage"]["confidence"] > 90
    status, _, body = server.post("/translate", {"q": [lines[0], "The earth was empty."], "source": "auto", "target": "en",
                                                 "api_key": KEY})
    assert [d["language"] for d in body["detectedLanguage"]] == ["es", "es"]  # what it was translated from
    assert body["detectedLanguage"][0]["confidence"] > 90 > body["detectedLanguage"][1]["confidence"]


def test_the_ctranslate2_engine_serves_what_translate_writes(run_dir, tmp_path):
    """`serve --engine ctranslate2`: the LibreTranslate client gets `translate`'s lines; a
    prefix (which the engine leaves to our search) still works."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'seq2seq[ctranslate2]')")
    s = Server(run_dir, tmp_path, "--engine", "ctranslate2", "--beam-size", "3", "--full-vocabulary")
    try:
        lines = SENTENCES[:6]
        got = [LibreTranslateAPI(s.url).translate(line, "es", "en") for line in lines]
        expected = translate_cli(run_dir, tmp_path, lines, "--beam-size", "3")
        assert sum(a != b for a, b in zip(got, expected)) <= 1  # a tie of float32 rounding at most
        assert len(set(expected)) > 1 and all(expected)
        status, _, body = s.post("/v1/translate", {"q": [lines[0]], "prefix": ["And God"]})
        assert status == 200 and body["results"][0]["translation"].startswith("And God")
    finally:
        s.stop()
    assert "(es -> en, searched by CTranslate2) on http://" in s.log.read_text()


def test_serve_with_the_shortlist_answers_as_translate_with_it(run_dir, tmp_path):
    """`serve --shortlist`: the LibreTranslate client gets `translate --shortlist`'s lines."""
    assert (run_dir / "shortlist.tsv").is_file()  # written by train
    s = Server(run_dir, tmp_path, "--shortlist", "--beam-size", "3")
    try:
        lines = SENTENCES[:6]
        got = [LibreTranslateAPI(s.url).translate(line, "es", "en") for line in lines]
        assert got == translate_cli(run_dir, tmp_path, lines, "--beam-size", "3", "--shortlist")
    finally:
        s.stop()
    assert "(es -> en, searched by CTranslate2, shortlist) on http://" in s.log.read_text()


def test_alternatives_are_the_nbest_of_translate(server, run_dir, tmp_path):
    line = SENTENCES[3]
    status, _, body = server.post("/translate", {"q": line, "source": "es", "target": "en", "alternatives": 2, "api_key": KEY})
    assert status == 200
    nbest = translate_cli(run_dir, tmp_path, [line], "--beam-size", "3", "--nbest", "3", "--no-split")
    assert body["translatedText"] == translate_cli(run_dir, tmp_path, [line], "--beam-size", "3")[0]  # as without them
    assert body["alternatives"] == [text for text in nbest if text != body["translatedText"]][:2]


def test_own_endpoint_takes_the_decoding_options_of_translate(server, run_dir, tmp_path):
    lines = SENTENCES[:5]
    options = {"beam_size": 4, "length_penalty": 0.6, "length_penalty_type": "gnmt", "nbest": 2}
    status, _, body = server.post("/v1/translate", {"q": lines, "api_key": KEY, **options})
    assert status == 200
    expected = translate_cli(run_dir, tmp_path, lines, "--beam-size", "4", "--length-penalty", "0.6",
                             "--length-penalty-type", "gnmt", "--nbest", "2", "--scores")
    got = [f"{h['translation']}\t{h['score']:.4f}" for r in body["results"] for h in r["nbest"]]
    assert got == expected
    # sampling with a seed: the same samples as translate gives
    status, _, body = server.post("/v1/translate", {"q": lines, "api_key": KEY, "sampling": True, "seed": 7, "top_k": 20})
    assert [r["translation"] for r in body["results"]] == translate_cli(
        run_dir, tmp_path, lines, "--sampling", "--seed", "7", "--top-k", "20", "--no-split")  # /v1: a line is a sentence
    status, _, body = server.post("/v1/translate", {"q": lines[0], "api_key": KEY, "alignment": True, "attention": True})
    result = body["results"][0]
    assert result["alignment"] == translate_cli(run_dir, tmp_path, lines[:1], "--beam-size", "3", "--alignment")[0].split("\t")[1]
    att = result["attention"]
    assert len(att["weights"]) == len(att["target"]) and all(len(row) == len(att["source"]) for row in att["weights"])
    assert att["source"][-1] == "</s>" and all(abs(sum(row) - 1) < 1e-2 for row in att["weights"])


def test_prefix_is_the_prefix_of_translate(server, run_dir, tmp_path):
    """/v1/translate's `prefix` gives what `translate --prefix` writes, lines with and without
    prefixes decoded together."""
    lines = SENTENCES[:4]
    prefixes = ["The", "", "I would like", "yes, the house"]
    (tmp_path / "prefix.txt").write_text("\n".join(prefixes) + "\n", encoding="utf-8")
    expected = translate_cli(run_dir, tmp_path, lines, "--beam-size", "3", "--nbest", "2", "--scores",
                             "--prefix", str(tmp_path / "prefix.txt"))
    status, _, body = server.post("/v1/translate", {"q": lines, "prefix": prefixes, "nbest": 2, "api_key": KEY})
    assert status == 200, body
    got = [f"{h['translation']}\t{h['score']:.4f}" for r in body["results"] for h in r["nbest"]]
    assert got == expected
    assert all(r["translation"].startswith(p) for r, p in zip(body["results"], prefixes))
    # one text of several lines, its prefix as many lines (n-best 2 as above: this two-update model's
    # outputs tie to float rounding, so each engine, or thread count, may break the ties its own way)
    status, _, body = server.post("/v1/translate", {"q": "\n".join(lines[:2]), "prefix": "\n".join(prefixes[:2]),
                                                    "nbest": 2, "api_key": KEY})
    assert [r["translation"] for r in body["results"]] == [e.split("\t")[0] for e in expected[0:4:2]]


def test_html_keeps_its_markup_and_paragraphs_their_sentences(server, run_dir, tmp_path):
    from lxml import etree

    q = f'<p>{SENTENCES[0]} <b>{SENTENCES[1].split()[0]}</b> <a href="t.html?a=1&amp;b=2">{SENTENCES[1]}</a></p>'
    status, _, body = server.post("/translate", {"q": q, "source": "es", "target": "en", "format": "html", "api_key": KEY})
    assert status == 200, body
    tree = etree.fromstring(body["translatedText"])
    assert sorted(e.tag for e in tree.iter()) == ["a", "b", "p"] and tree.find("a").get("href") == "t.html?a=1&b=2"
    paragraph = " ".join(SENTENCES[:3])
    status, _, body = server.post("/translate", {"q": paragraph, "source": "es", "target": "en", "api_key": KEY})
    assert body["translatedText"] == translate_cli(run_dir, tmp_path, [paragraph], "--beam-size", "3")[0]


def test_concurrent_clients_each_get_their_own_lines(server):
    def ask(i: int) -> tuple[list[str], list[str]]:
        lines = [SENTENCES[(i + k) % len(SENTENCES)] for k in range(1 + i % 3)]
        status, _, body = server.post("/translate", {"q": lines, "source": "es", "target": "en", "api_key": KEY})
        assert status == 200
        return lines, body["translatedText"]

    alone = {line: server.post("/translate", {"q": line, "source": "es", "target": "en", "api_key": KEY})[2]["translatedText"]
             for line in SENTENCES}
    before = server.metrics()
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(ask, range(48)))
    for lines, got in answers:
        assert got == [alone[line] for line in lines]
    after = server.metrics()
    decoded = after["requests_decoded"] - before["requests_decoded"]
    assert decoded == 48 and after["largest_batch_requests"] > 1  # requests that came together were decoded together


def test_health_languages_and_metrics(server):
    assert server.get("/health")[2]["languages"] == ["es", "en"]
    status, _, figures = server.get("/metrics")
    assert status == 200 and {"requests", "responses", "batches", "sentences", "queue_depth"} <= set(figures)
    with urllib.request.urlopen(server.url + "/metrics?format=prometheus") as r:
        text = r.read().decode()
    assert re.search(r"^seq2seq_batches_total \d+$", text, re.MULTILINE)
    assert re.search(r"^seq2seq_queue_depth 0$", text, re.MULTILINE)


def test_libretranslate_client_detects_the_language_of_each_text(server):
    """POST /detect: the server's two languages ranked by the language identifier, in percent."""
    client = LibreTranslateAPI(server.url, api_key=KEY)
    spanish = client.detect("En el principio creó Dios los cielos y la tierra, y la tierra estaba desordenada.")
    english = client.detect("In the beginning God created the heavens and the earth, and the earth was empty.")
    assert [d["language"] for d in spanish] == ["es", "en"] and [d["language"] for d in english] == ["en", "es"]
    for found in (spanish, english):
        assert found[0]["confidence"] > 90 and sum(d["confidence"] for d in found) == pytest.approx(100, abs=0.2)
    status, _, both = server.post("/detect", {"q": ["Buenos días, hermanos.", "Good morning, brothers."], "api_key": KEY})
    assert status == 200 and [found[0]["language"] for found in both] == ["es", "en"]
    assert server.post("/detect", {"q": "hola"})[0] == 403  # the key is asked for as on /translate
    assert server.post("/detect", {"api_key": KEY})[2] == {"error": "Invalid request: missing q parameter"}


def test_frontend_settings_give_the_limits_the_key_rule_and_the_languages(server):
    status, _, settings = server.get("/frontend/settings")
    assert status == 200
    assert (settings["charLimit"], settings["apiKeys"], settings["keyRequired"]) == (3000, True, True)
    assert settings["language"] == {"source": {"code": "es", "name": "Spanish"}, "target": {"code": "en", "name": "English"}}
    assert ".docx" in settings["supportedFilesFormat"] and settings["filesTranslation"] is True


# ---------------------------------------------------------------------------- bad requests

BAD = {
    # case: (path, body, content type, status, message)
    "serve-bad-json": ("/translate", '{"q": "hola", ', "application/json", 400,
                       "Invalid request: the body is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 15 (char 14))"),
    "serve-not-an-object": ("/translate", '["hola"]', "application/json", 400, "Invalid request: expected a JSON object, got list"),
    "serve-missing-q": ("/translate", {"source": "es", "target": "en"}, "application/json", 400, "Invalid request: missing q parameter"),
    "serve-missing-target": ("/translate", "q=hola&source=es", "application/x-www-form-urlencoded", 400,
                             "Invalid request: missing target parameter"),
    "serve-wrong-source": ("/translate", {"q": "hola", "source": "fr", "target": "en"}, "application/json", 400,
                           "fr is not supported as the source language; this server translates from es"),
    "serve-wrong-target": ("/translate", {"q": "hola", "source": "es", "target": "de"}, "application/json", 400,
                           "de is not supported as the target language; this server translates into en"),
    "serve-q-type": ("/translate", {"q": 3, "source": "es", "target": "en"}, "application/json", 400,
                     "Invalid request: q must be a string or a list of strings"),
    "serve-format": ("/translate", {"q": "hola", "source": "es", "target": "en", "format": "markdown"}, "application/json", 400,
                     "format 'markdown' is not supported; this server translates format text or html"),
    "serve-content-type": ("/translate", "hola", "text/plain", 400,
                           "Invalid request: Content-Type 'text/plain' is not supported; send application/json or application/x-www-form-urlencoded"),
    "serve-option-invalid": ("/v1/translate", {"q": "hola", "beam_size": 0}, "application/json", 400,
                             "beam_size 0: Input should be greater than or equal to 1"),
    "serve-option-unknown": ("/v1/translate", {"q": "hola", "beam": 4}, "application/json", 400,
                             "unknown field 'beam'; known fields: q, source, target, api_key, nbest, alignment, attention, prefix, "
                             "beam_size, "
                             "length_penalty, length_penalty_type, max_len_a, max_len_b, min_len, no_repeat_ngram_size, ban_unk, "
                             "replace_unk, sampling, temperature, top_k, top_p, seed"),
    "serve-prefix-shape": ("/v1/translate", {"q": ["hola"], "prefix": "The"}, "application/json", 400,
                           "Invalid request: prefix must have the shape of q: a string for a string, a list of strings for a list"),
    "serve-prefix-count": ("/v1/translate", {"q": ["hola", "adiós"], "prefix": ["The"]}, "application/json", 400,
                           "Invalid request: prefix has 1 entries but q has 2"),
    "serve-prefix-lines": ("/v1/translate", {"q": "hola\nadiós", "prefix": "The"}, "application/json", 400,
                           "Invalid request: prefix 1 has 1 lines but its q text has 2; give one prefix line per line "
                           "(an empty line for none)"),
    "serve-prefix-too-long": ("/v1/translate", {"q": "hola", "prefix": "the house " * 300}, "application/json", 400,
                              "Invalid request: prefix of line 1: the prefix has 1800 target pieces; the model's outputs "
                              "hold at most 254"),
    "serve-nbest-beam": ("/v1/translate", {"q": "hola", "nbest": 5}, "application/json", 400,
                         "nbest 5 is larger than the beam size 3; raise beam_size"),
    "serve-too-many-lines": ("/translate", {"q": ["uno"] * 41, "source": "es", "target": "en"}, "application/json", 413,
                             "request too large: 41 lines, the limit is 40"),
    "serve-too-many-chars": ("/translate", {"q": "a" * 3001, "source": "es", "target": "en"}, "application/json", 413,
                             "request too large: 3001 characters, the limit is 3000"),
    "serve-no-key": ("/translate", {"q": "hola", "source": "es", "target": "en"}, "application/json", 403,
                     "Invalid request: missing api_key (this server requires an API key)"),
    "serve-wrong-key": ("/translate", {"q": "hola", "source": "es", "target": "en", "api_key": "guess"}, "application/json", 403,
                        "Invalid API key"),
    "serve-not-found": ("/nope", None, "application/json", 404, "Not Found"),
    "serve-text-surrogate": ("/translate", {"q": "hola \ud800", "source": "es", "target": "en"}, "application/json", 400,
                             "Invalid request: q holds a lone surrogate (U+D800), which is not text; send valid Unicode"),
    "serve-text-surrogate-v1": ("/v1/translate", {"q": ["hola", "adiós \udfff"]}, "application/json", 400,
                                "Invalid request: q[1] holds a lone surrogate (U+DFFF), which is not text; send valid Unicode"),
    "serve-prefix-surrogate": ("/v1/translate", {"q": "hola", "prefix": "The \ud800"}, "application/json", 400,
                               "Invalid request: prefix holds a lone surrogate (U+D800), which is not text; send valid Unicode"),
    "serve-name-surrogate": ("/translate", {"q": "hola", "source": "es", "target": "en", "x\ud800": 1}, "application/json", 400,
                             "Invalid request: a field name holds a lone surrogate (U+D800), which is not text; send valid Unicode"),
    "serve-beam-over-vocabulary": ("/v1/translate", {"q": "hola", "beam_size": 100000}, "application/json", 400,
                                   "beam_size 100000: larger than the target vocabulary (300 tokens)"),
    "serve-nested-too-deep": ("/v1/translate", '{"q": ' + "[" * 5000 + "]" * 5000 + "}", "application/json", 400,
                              "Invalid request: the body nests JSON more than 32 levels deep"),
    "serve-number-too-long": ("/v1/translate", '{"q": "hola", "beam_size": 1' + "0" * 5000 + "}", "application/json", 400,
                              "Invalid request: the body is not valid JSON (a number of more than 4300 digits)"),
    "serve-key-type": ("/translate", {"q": "hola", "source": "es", "target": "en", "api_key": ["secret1"]}, "application/json",
                       400, "Invalid request: api_key must be a string (got a list)"),
}
KEYLESS = ("serve-no-key", "serve-wrong-key", "serve-not-found", "serve-key-type")


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_request_gets_one_clear_error(server, case):
    path, body, kind, status, message = BAD[case]
    if isinstance(body, dict) and case not in KEYLESS:
        body = {**body, "api_key": KEY}
    if isinstance(body, str) and kind.endswith("urlencoded"):
        body += f"&api_key={KEY}"
    raw = None if body is None else (json.dumps(body) if isinstance(body, dict) else body).encode()
    got_status, _, got = server.request(path, raw, kind, headers={} if case in KEYLESS else {"X-API-Key": KEY})
    assert (got_status, got) == (status, {"error": message})


def test_head_answers_as_get_without_a_body(server):
    """Load balancers and uptime checks send HEAD: every GET route answers it, 200 and no body."""
    for path in ("/", "/health", "/languages", "/frontend/settings", "/metrics"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        head, _, rest = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), (path, head)
        assert rest == b"", path


def test_metrics_stay_bounded_under_random_paths(run_dir):
    """Unknown paths are counted under one label, in the JSON and in the Prometheus text: a
    client cannot grow the server's memory by asking for new paths."""
    from fastapi.testclient import TestClient

    translator = Translator.load(run_dir, "cpu")
    with TestClient(create_app(translator, ServeSettings())) as client:
        for i in range(1000):
            assert client.get(f"/x{i}/{os.urandom(4).hex()}").status_code == 404
        client.post("/nope", json={})
        client.get("/health")
        figures = client.get("/metrics").json()
        text = client.get("/metrics?format=prometheus").text
    assert figures["requests"] == {"other": 1001, "/health": 1, "/metrics": 1}
    assert len(text) < 2000 and text.count("seq2seq_requests_total{") == 3
    assert 'seq2seq_requests_total{path="other"} 1001' in text


# Values of every kind for every field: none of them may give a 500 (or a traceback).
HOSTILE = [None, True, False, -1, 0, 10**30, 1e308, float("nan"), "", "x", "hola \ud800", [], ["x"], [3], {}, {"a": [1]},
           [[["deep"]]], "1" * 5000]


def test_no_json_input_gets_500(run_dir):
    from fastapi.testclient import TestClient

    from seq2seq_cli.serve.app import REQUEST_DECODE_KEYS, V1_KEYS

    translator = Translator.load(run_dir, "cpu", {"beam_size": 2, "max_len_b": 4, "max_len_a": 0})
    requests: list[tuple[str, dict]] = []
    base = {"q": "hola", "source": "es", "target": "en"}
    for name in ("q", "source", "target", "format", "alternatives", "api_key"):
        requests += [("/translate", {**base, name: v}) for v in HOSTILE]
    for name in V1_KEYS + REQUEST_DECODE_KEYS:
        requests += [("/v1/translate", {"q": "hola", name: v}) for v in HOSTILE]
    requests += [("/v1/translate", {"q": "hola", "sampling": True, "top_k": k}) for k in (100000, 10**30)]
    requests += [("/v1/translate", {"q": "hola", **extra}) for extra in (
        {"sampling": True, "temperature": 0.001}, {"no_repeat_ngram_size": 10**6}, {"beam_size": 300, "nbest": 64},
        {"seed": 2**64}, {"seed": -(2**70)}, {"min_len": 10**6}, {"min_len": 3, "max_len_b": 2, "max_len_a": 0})]
    with TestClient(create_app(translator, ServeSettings()), raise_server_exceptions=False) as client:
        for path, body in requests:
            raw = json.dumps(body).encode()  # lone surrogates as \ud800 escapes, NaN as NaN
            r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
            assert r.status_code in (200, 400, 403, 413), (path, body, r.status_code, r.text)
            answer = r.json()
            if r.status_code != 200:
                assert set(answer) == {"error"} and len(answer["error"]) < 400, (path, body, answer)


def partial_body(port: int, close: bool) -> bytes:
    """Headers promising 1,000 bytes of body, 8 of them sent; then close, or wait for the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"q\": \"ho")
        if close:
            return b""
        answer = b""
        while not answer.endswith(b"}"):  # the headers and the JSON body may come apart
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer


def test_a_body_that_stops_coming_gets_408_and_a_vanished_client_no_traceback(run_dir, tmp_path):
    # 4 s: the one timeout is also the translation's, and a loaded 2-core machine can stall a request for seconds
    s = Server(run_dir, tmp_path, "--timeout", "4")
    try:
        assert s.post("/translate", {"q": "hola", "source": "es", "target": "en"})[0] == 200  # first use warmed
        started = time.monotonic()
        answer = partial_body(s.port, close=False)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 4 s" in answer
        assert time.monotonic() - started < 30
        for _ in range(3):
            partial_body(s.port, close=True)
        time.sleep(1)
        assert s.post("/translate", {"q": "hola", "source": "es", "target": "en"})[0] == 200  # still serving
        responses = s.metrics()["responses"]
        assert "500" not in responses and responses.get("408") == 1
        assert "Traceback" not in s.log.read_text()
    finally:
        s.stop()


@pytest.mark.parametrize("field, value, message", [
    ("target", ["en"], "Invalid request: target must be a string (got a list)"),
    ("source", 5, "Invalid request: source must be a string (got a number)"),
    ("alternatives", [], "Invalid request: alternatives must be a whole number from 0 to 16 (got [])"),
    ("alternatives", False, "Invalid request: alternatives must be a whole number from 0 to 16 (got False)"),
])
def test_a_field_of_the_wrong_type_is_named(server, field, value, message):
    body = {"q": "hola", "source": "es", "target": "en", "api_key": KEY, field: value}
    status, _, answer = server.post("/translate", body)
    assert (status, answer) == (400, {"error": message})


def test_html_starting_with_a_control_character_is_a_400(server):
    body = {"q": "\u0001hola <b>mundo</b>", "source": "es", "target": "en", "format": "html", "api_key": KEY}
    status, _, answer = server.post("/translate", body)
    assert status == 400 and "holds U+0001, a character HTML cannot hold" in answer["error"]


def test_api_key_in_a_header_or_the_body(server):
    request = {"q": "hola", "source": "es", "target": "en"}
    assert server.post("/translate", request, headers={"X-API-Key": "other-key"})[0] == 200
    assert server.post("/translate", {**request, "api_key": KEY})[0] == 200
    assert server.post("/v1/translate", {"q": "hola"})[0] == 403


def test_full_queue_gets_503_and_slow_request_504(run_dir, tmp_path):
    s = Server(run_dir, tmp_path, "--max-queue", "1", "--timeout", "1")
    try:
        answers: list = []
        slow = threading.Thread(target=lambda: answers.append(s.post("/v1/translate", SLOW)))
        slow.start()
        s.wait_for_queue(1)
        status, headers, body = s.post("/translate", {"q": "hola", "source": "es", "target": "en"})
        assert (status, body) == (503, {"error": "server busy: 1 requests are queued, the limit; retry later"})
        assert headers["Retry-After"] == "1"
        slow.join()
        assert answers[0][0] == 504
        assert answers[0][2] == {"error": "translation took longer than the request timeout of 1 s"}
        s.wait_for_queue(0)  # the decoding it started goes on to its end, then the server takes requests again
        # (a few tries: with a 1 s timeout, a stall of the loaded machine may give one 504)
        statuses = [s.post("/translate", {"q": "hola", "source": "es", "target": "en"})[0] for _ in range(3)]
        assert 200 in statuses and 503 not in statuses, statuses
    finally:
        s.stop()


def test_sigterm_answers_the_request_in_flight_and_exits_0(run_dir, tmp_path):
    s = Server(run_dir, tmp_path, "--timeout", "300")
    answers: list = []
    slow = threading.Thread(target=lambda: answers.append(s.post("/v1/translate", SLOW)))
    slow.start()
    s.wait_for_queue(1)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(OSError):  # new connections are refused while the one in flight finishes
        s.get("/health")
    slow.join()
    status, _, body = answers[0]
    assert status == 200 and len(body["results"]) == 200
    assert s.proc.wait(timeout=60) == 0
    assert "Traceback" not in s.log.read_text()


# ---------------------------------------------------------------------------- at start

START = {
    # case: (arguments after `serve`, message)
    "serve-model-missing": (["--model", "{tmp}/no-run"], "error: {tmp}/no-run: model not found (expected a run directory or a .safetensors checkpoint)"),
    "serve-keys-missing": (["--model", "{run}", "--api-keys", "{tmp}/keys.txt"], "error: {tmp}/keys.txt: API keys file not found (expected one key per line)"),
    "serve-keys-empty": (["--model", "{run}", "--api-keys", "{tmp}/empty.txt"], "error: {tmp}/empty.txt: no API keys in it (expected one key per line)"),
    "serve-port-in-use": (["--model", "{run}", "--port", "{port}"], "error: 127.0.0.1:{port}: cannot listen there (Address already in use); choose another --port or --host"),
    "serve-keys-directory": (["--model", "{run}", "--api-keys", "{tmp}"], "error: {tmp}: is a directory, expected a file of API keys (one key per line)"),
    "serve-model-twice": (["--model", "{run}", "--model", "{tmp}/empty.txt"], "error: {tmp}/empty.txt: not a checkpoint (expected a run directory, or a .safetensors checkpoint in its checkpoints/)"),
    "serve-folder-without-runs": (["--model", "{tmp}/folder"], "error: {tmp}/folder: neither a run (no config.yaml) nor a folder holding runs (no subfolder has one)"),
    "serve-tag-several-runs": (["--model", "{run}", "--model", "{run}", "--tag", "<bt>"], "error: --tag <bt>: goes with one run (2 are served); a tag belongs to the corpus of one run"),
    "serve-model-not-checkpoint": (["--model", "{tmp}/empty.txt"], "error: {tmp}/empty.txt: not a checkpoint (expected a run directory, or a .safetensors checkpoint in its checkpoints/)"),
}


@pytest.mark.parametrize("case", sorted(START))
def test_bad_start_is_one_line(run_dir, tmp_path, case):
    (tmp_path / "empty.txt").write_text("\n# nothing\n", encoding="utf-8")
    (tmp_path / "folder" / "not-a-run").mkdir(parents=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        fill = {"tmp": str(tmp_path), "run": str(run_dir), "port": str(taken.getsockname()[1])}
        args, message = START[case]
        result = CliRunner().invoke(cli_app, ["serve", "--device", "cpu", *[a.format(**fill) for a in args]])
    assert result.exit_code == 1
    assert result.output.strip() == message.format(**fill)


def test_every_case_is_documented():
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("## Serving", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| (serve-[a-z0-9-]+) \|", section, re.MULTILINE)) == set(BAD) | set(START) | {
        "serve-queue-full", "serve-timeout", "serve-internal", "serve-no-route", "serve-auto-no-route",
        "serve-headers-timeout"}  # tests/serve/test_serve_hostile2.py


# ---------------------------------------------------------------------------- in process


def test_requests_queued_together_are_decoded_in_one_batch(run_dir):
    translator = Translator.load(run_dir, "cpu", {"beam_size": 2})
    batcher = Batcher(translator, wait_s=0.0)
    options = batcher.options(translator.decode)
    requests = [SENTENCES[0:2], SENTENCES[2:5], SENTENCES[5:6]]
    futures = [batcher.submit(lines, options) for lines in requests]  # queued before the worker starts
    other = batcher.submit(SENTENCES[6:8], batcher.options(translator.decode.model_copy(update={"beam_size": 1})))
    batcher.start()
    try:
        got = [[r["translation"] for r in f.result(timeout=120)] for f in futures]
        other_got = [r["translation"] for r in other.result(timeout=120)]
    finally:
        batcher.stop()
    assert got == [translator.translate(lines) for lines in requests]
    greedy = Translator.load(run_dir, "cpu", {"beam_size": 1})
    assert other_got == greedy.translate(SENTENCES[6:8])
    assert batcher.counters.batches == 2  # the three requests with the same options, then the other one
    assert batcher.counters.largest_batch == 3 and batcher.counters.sentences == 8


def test_an_unexpected_failure_is_one_line_500(run_dir, monkeypatch):
    from fastapi.testclient import TestClient

    translator = Translator.load(run_dir, "cpu")

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(Translator, "translate_hypotheses", broken)
    with TestClient(create_app(translator, ServeSettings()), raise_server_exceptions=False) as client:
        r = client.post("/translate", json={"q": "hola", "source": "es", "target": "en"})
    assert r.status_code == 500
    assert r.json() == {"error": "internal error (RuntimeError); the server log has the details"}


# ---------------------------------------------------------------------------- the web page


def test_web_page_translates_and_draws_the_attention(run_dir, tmp_path):
    browser = headless_chromium()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    s = Server(run_dir, tmp_path)
    try:
        browser.get(s.url + "/")
        browser.find_element(By.ID, "source").send_keys(SENTENCES[0] + "\n" + SENTENCES[1])
        browser.find_element(By.ID, "translate").click()
        WebDriverWait(browser, 120).until(lambda b: b.find_element(By.ID, "status").text == "done")
        # the page asks /v1/translate (each line whole, with its attention), as the page's lines
        expected = [r["translation"] for r in s.post("/v1/translate", {"q": SENTENCES[:2]})[2]["results"]]
        assert browser.find_element(By.ID, "output").text.split("\n") == expected
        canvases = browser.find_elements(By.CSS_SELECTOR, "canvas.heatmap")
        assert len(canvases) == 2
        # pixels that are neither white nor transparent: the heatmap cells and labels were drawn
        drawn = browser.execute_script(
            "const c = arguments[0]; const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i+3] > 0 && (d[i] < 250 || d[i+1] < 250)) n++; return n;",
            canvases[0])
        assert drawn > 100
    finally:
        browser.quit()
        s.stop()
