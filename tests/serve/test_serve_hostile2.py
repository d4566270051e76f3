"""`seq2seq serve` against more hostile but fair use: alternatives asked beside a translation
(which must not change it), a run trained on under a running server (its best replaced), and
request heads that never end or come a byte at a time (answered 408 within `--timeout`)."""

from __future__ import annotations

import os
import select
import shutil
import socket
import time
from pathlib import Path

import pytest

from helpers import SHIPPED, train_shipped_tiny

pytest.importorskip("fastapi", reason="the serve extra is not installed")
from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import Server  # noqa: E402

from seq2seq_cli.choices import Engine  # noqa: E402
from seq2seq_cli.fileio import sha256  # noqa: E402
from seq2seq_cli.layout import RunLayout  # noqa: E402
from seq2seq_cli.serve.app import ServeSettings, create_app  # noqa: E402
from seq2seq_cli.serve.runs import open_served  # noqa: E402

SPANISH = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def stepped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run with the step checkpoint 20 beside its best (40): two sets of weights of one run."""
    return train_shipped_tiny(tmp_path_factory.mktemp("serve-stepped"), max_steps=40, valid_every=20, keep_last=2)


def served_client(run: Path) -> TestClient:
    """A client of `run` served with the defaults (CTranslate2 where installed, our searches loaded
    when a request first needs them)."""
    return TestClient(create_app([open_served(run, "cpu", {}, None, Engine.auto)], ServeSettings()))


# ---------------------------------------------------------------- alternatives add, and change nothing

def test_alternatives_leave_the_translation_as_it_is_without_them(stepped_run):
    texts = ["\n".join(SPANISH[i:i + 2]) for i in range(0, 12, 2)]  # lines of several sentences, two a text
    assert sum(". " in t for t in texts) >= 2
    with served_client(stepped_run) as client:
        plain = client.post("/translate", json={"q": texts, "source": "es", "target": "en"}).json()
        single = client.post("/translate", json={"q": texts[0], "source": "es", "target": "en", "alternatives": 3})
        assert single.status_code == 200, single.text
        assert single.json()["translatedText"] == plain["translatedText"][0]
        r = client.post("/translate", json={"q": texts, "source": "es", "target": "en", "alternatives": 3})
        assert r.status_code == 200, r.text
        body = r.json()
    assert body["translatedText"] == plain["translatedText"]
    for text, alternatives in zip(body["translatedText"], body["alternatives"], strict=True):
        assert len(alternatives) <= 3 and text not in alternatives and len(set(alternatives)) == len(alternatives)
    assert any(body["alternatives"])


# ---------------------------------------------------------------- a run trained on under the server

def test_a_best_replaced_under_the_server_is_still_served_as_loaded(small_run, tmp_path):
    run = tmp_path / "run"  # a run whose outputs are sentences: none at its limit, so CTranslate2 answers them
    shutil.copytree(small_run, run, ignore=shutil.ignore_patterns("ctranslate2"))
    lines = SPANISH[:8]
    checkpoints = RunLayout(run).checkpoints
    other = next(p.name.removesuffix(".safetensors") for p in sorted(checkpoints.glob("step-*.safetensors"))
                 if sha256(p) != sha256(checkpoints / "best.safetensors"))
    with served_client(run) as first:  # converts the run for CTranslate2 (from the weights loaded into torch)
        assert first.post("/v1/translate", json={"q": lines[:1]}).status_code == 200
    with served_client(run) as client:  # loads the conversion kept: our searches are loaded on first use
        before = client.post("/v1/translate", json={"q": lines}).json()
        assert "results" in before, before
        loaded = [r["translation"] for r in before["results"]]
        # `train --resume` writes a new best: linked in under the old name, as checkpoint.py does
        for suffix in (".safetensors", ".json"):
            os.link(checkpoints / f"{other}{suffix}", checkpoints / f"new{suffix}")
            os.replace(checkpoints / f"new{suffix}", checkpoints / f"best{suffix}")
        nbest = client.post("/v1/translate", json={"q": lines, "nbest": 2})  # our searches, loaded now
        assert nbest.status_code == 200, nbest.text
        assert [r["nbest"][0]["translation"] for r in nbest.json()["results"]] == loaded
        prefixed = client.post("/v1/translate", json={"q": lines[:2], "prefix": ["", ""]})
        assert prefixed.status_code == 200, prefixed.text
        assert [r["translation"] for r in prefixed.json()["results"]] == loaded[:2]
    with served_client(run) as fresh:  # a server started now serves the new best: other answers
        now = [r["translation"] for r in fresh.post("/v1/translate", json={"q": lines}).json()["results"]]
    assert now != loaded


# ---------------------------------------------------------------- request heads within --timeout

def read_answer(sock: socket.socket) -> bytes:
    answer = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return answer
        answer += chunk


def test_a_head_that_never_ends_is_answered_408_within_the_timeout(stepped_run, tmp_path):
    # 4 s: the one timeout is also the translation's, and a loaded 2-core machine can stall a request for seconds
    s = Server(stepped_run, tmp_path, "--timeout", "4")
    try:
        assert s.post("/translate", {"q": "hola", "source": "es", "target": "en"})[0] == 200
        heads = {
            "cut": [b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: appl"],
            "drip": [bytes([c]) for c in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40],
            "nothing": [],
        }
        for name, pieces in heads.items():
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", s.port), timeout=40) as sock:
                for piece in pieces:
                    sock.sendall(piece)
                    if select.select([sock], [], [], 0.25)[0]:  # answered: the deadline passed
                        break
                answer = read_answer(sock)
            took = time.monotonic() - started
            assert answer.startswith(b"HTTP/1.1 408"), (name, answer)
            assert answer.endswith(b'{"error": "the request\'s headers did not arrive within 4 s"}'), (name, answer)
            assert took < 4 + 10, (name, took)
        # a request on a kept-alive connection whose second head never ends: the same
        with socket.create_connection(("127.0.0.1", s.port), timeout=40) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.5)  # answered
            sock.sendall(b"GET /health HTTP/1.1\r\nHo")
            started = time.monotonic()
            answer = read_answer(sock)
            assert answer.startswith(b"HTTP/1.1 200") and time.monotonic() - started < 4 + 10, answer
            assert answer.endswith(b"\r\n\r\n" + b'{"error": "the request\'s headers did not arrive within 4 s"}')
            assert answer.count(b"HTTP/1.1 408 ") == 1, answer
        # a slow but whole request is served
        assert s.post("/translate", {"q": "hola", "source": "es", "target": "en"})[0] == 200
        assert "Traceback" not in s.log.read_text()
    finally:
        s.stop()
