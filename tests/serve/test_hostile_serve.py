"""`seq2seq serve` against hostile clients: bodies sent without a length, keys that are wrong
before the body is read, names a file system refuses, a HEAD before the download, html with
alternatives, and the folder a killed server leaves behind. Every refusal is one line
({"error": ...} with its status), listed in docs/errors.md."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

import hostile_files as hf
from helpers import REPO, train_shipped_tiny
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.serve import store

KEY = "k-hostile"
MiB = 1 << 20


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_shipped_tiny(tmp_path_factory.mktemp("hostile-serve"), max_steps=2)


@pytest.fixture(scope="module")
def client(run_dir):
    from fastapi.testclient import TestClient

    from seq2seq_cli.serve.app import ServeSettings, create_app

    app = create_app(Translator.load(run_dir, "cpu", {"beam_size": 2}), ServeSettings())
    with TestClient(app) as c:
        yield c, app


NAMES = ["report (1).txt", "O'Brien, J.txt", "😀 notas.txt", "100% seguro; 50%.txt", "x" * 210 + ".txt",
         "y" * 300 + ".txt", "nul\x00name.txt", "tab\tand ñ.txt"]


def multipart(name: str, data: bytes) -> tuple[bytes, dict[str, str]]:
    """A form as a browser sends it, the file's name as it is (UTF-8, a NUL byte kept)."""
    parts = [b'--b\r\nContent-Disposition: form-data; name="file"; filename="' + name.encode() + b'"\r\n\r\n' + data]
    parts += [f'--b\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}'.encode()
              for k, v in (("source", "es"), ("target", "en"))]
    return b"\r\n".join(parts) + b"\r\n--b--\r\n", {"content-type": "multipart/form-data; boundary=b"}


@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))
def test_any_name_downloads_by_an_id_of_the_servers_own(client, name):
    c, app = client
    body, headers = multipart(name, b"Hola mundo.\n")
    r = c.post("/translate_file", content=body, headers=headers)
    assert r.status_code == 200, r.json()
    path = r.json()["translatedFileUrl"].removeprefix("http://testserver")
    assert re.fullmatch(r"/download_file/[0-9a-f]{32}\.txt", path)
    head = c.head(path)
    assert head.status_code == 200 and head.content == b""  # a HEAD looks, and leaves the file
    got = c.get(path)
    assert got.status_code == 200 and got.content.endswith(b"\n")
    disposition = got.headers["content-disposition"]
    assert unquote(disposition.split("filename*=UTF-8''", 1)[1]) == name
    assert disposition.isascii() and "\x00" not in disposition
    assert c.get(path).status_code == 404  # downloaded once
    assert list(app.state.files.folder.iterdir()) == []


@pytest.mark.parametrize("path", ["/download_file/..%2F..%2Fetc%2Fpasswd", "/download_file/%2e%2e%2fx",
                                  "/download_file/abc%00.txt", "/download_file/" + "0" * 32 + ".txt"])
def test_a_download_of_anything_else_is_404(client, path):
    c, _ = client
    r = c.get(path)
    assert r.status_code == 404 and list(r.json()) == ["error"]


def test_html_with_alternatives_is_one_line(client):
    c, _ = client
    r = c.post("/translate", json={"q": "<p>Hola.</p>", "source": "es", "target": "en", "format": "html", "alternatives": 2})
    assert r.status_code == 400
    assert r.json() == {"error": CASES["upload-html-alternatives"][1]}


def test_a_killed_servers_folder_is_removed_by_the_next(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    code = ("import time; from seq2seq_cli.serve.store import FileStore; s = FileStore(); print(s.folder, flush=True); "
            "time.sleep(600)")
    first = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    second = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout is not None and second.stdout is not None
        killed, alive = Path(first.stdout.readline().strip()), Path(second.stdout.readline().strip())
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert killed.is_dir()  # SIGKILL gives no chance to remove it
        old = time.time() - store.FILE_LIFETIME_S - 60
        for folder in (killed, alive):
            for path in (folder, *folder.iterdir()):
                os.utime(path, (old, old))
        assert store.remove_stale(tmp_path) == [killed]  # the live server's folder is kept, however old
        assert not killed.exists() and alive.is_dir()
        assert not killed.with_name(killed.name + store.LOCK).exists()
        fresh = tmp_path / (store.PREFIX + "new")
        fresh.mkdir()
        (tmp_path / (fresh.name + store.LOCK)).touch()
        other = tmp_path / (store.PREFIX + "without-lock")
        other.mkdir()
        os.utime(other, (old, old))
        assert store.remove_stale(tmp_path) == []  # young, or not a server's folder
    finally:
        second.kill()
        second.wait()


# ------------------------------------------------------------------------------ a real server


class Server:
    """`python -m seq2seq_cli serve` on a free port, with API keys."""

    def __init__(self, run: Path, tmp: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        keys = tmp / "keys.txt"
        keys.write_text(KEY + "\n", encoding="utf-8")
        self.log = tmp / "serve.log"
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "seq2seq_cli", "serve", "-m", str(run), "--device", "cpu", "--port", str(self.port),
                 "--api-keys", str(keys)], stdout=err, stderr=err, env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 180
        while self.send(["GET /health HTTP/1.1"])[0] != 200:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.3)

    def memory_mb(self) -> tuple[float, float]:
        """(resident memory now, its peak so far) of the server process, in MB."""
        status = dict(re.findall(r"^(\w+):\s+(\d+) kB", Path(f"/proc/{self.proc.pid}/status").read_text(), re.MULTILINE))
        return int(status["VmRSS"]) / 1024, int(status["VmHWM"]) / 1024

    def send(self, lines: list[str], total: int = 0, body: bytes = b"") -> tuple[int, dict, int]:
        """A request of its first `lines` and `body`, or of `total` bytes sent in chunks (no
        length said) until the server answers -> (status, JSON answer, bytes of body sent)."""
        head = "\r\n".join([*lines, "Host: x", *(["Transfer-Encoding: chunked"] if total else [])]) + "\r\n\r\n"
        try:
            conn = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        except OSError:
            return 0, {}, 0
        sent = 0
        with conn:
            conn.sendall(head.encode() + body)
            block = b"%x\r\n" % MiB + b"a" * MiB + b"\r\n"
            try:
                while sent < total and not select.select([conn], [], [], 0)[0]:
                    conn.sendall(block)
                    sent += MiB
                if total and sent >= total:
                    conn.sendall(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer = b""
            try:
                while chunk := conn.recv(65536):
                    answer += chunk
                    if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                        break
            except (ConnectionResetError, TimeoutError):
                pass
        if not answer:
            return 0, {}, sent
        status = int(answer.split(b" ", 2)[1])
        payload = answer.split(b"\r\n\r\n", 1)[1]
        return status, json.loads(payload) if payload.startswith(b"{") else {}, sent


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    s = Server(run_dir, tmp_path_factory.mktemp("hostile-server"))
    yield s
    s.proc.terminate()  # SIGTERM: the server removes its folder of files as it ends
    try:
        s.proc.wait(60)
    except subprocess.TimeoutExpired:
        s.proc.kill()
        s.proc.wait()


UPLOAD = ["POST /translate_file HTTP/1.1", "Content-Type: multipart/form-data; boundary=b"]
TRANSLATE = ["POST /translate HTTP/1.1", "Content-Type: application/json"]
# The rows of docs/errors.md, section "Damaged, hostile and cut-short input", about requests:
# {case: (status, the answer's error)}
CASES = {
    "upload-no-length": (413, f"file too large: more than {10 * MiB + 65536} bytes of body, the limit is {10 * MiB}"),
    "upload-json-no-length": (413, "request too large: more than 145536 bytes of body, the limit is 145536"),
    "upload-wrong-key-first": (403, "Invalid API key"),
    "upload-html-alternatives": (400, "alternatives are given for format text only; format html is translated whole "
                                      "with its markup (leave alternatives out)"),
}


def test_bodies_are_refused_as_they_arrive_and_the_server_stays_small(server):
    warm, _ = multipart("a.txt", b"Hola.\n")
    status, answer, _ = server.send([*UPLOAD, f"X-API-Key: {KEY}", f"Content-Length: {len(warm)}"], body=warm)
    assert status == 200, answer
    idle, _ = server.memory_mb()
    total = 512 * MiB  # as a client sends it, without a length; the server must stop reading early
    status, answer, sent = server.send([*UPLOAD, f"X-API-Key: {KEY}"], total)
    assert (status, answer["error"]) == CASES["upload-no-length"] and sent < 64 * MiB
    status, answer, sent = server.send([*UPLOAD, "X-API-Key: guess"], total)
    assert (status, answer["error"]) == CASES["upload-wrong-key-first"] and sent < 16 * MiB
    status, answer, sent = server.send(["POST /translate_file?api_key=guess HTTP/1.1", UPLOAD[1]], total)
    assert (status, answer["error"]) == CASES["upload-wrong-key-first"] and sent < 16 * MiB
    status, answer, sent = server.send([*TRANSLATE, f"X-API-Key: {KEY}"], total)
    assert (status, answer["error"]) == CASES["upload-json-no-length"] and sent < 64 * MiB
    for name, data in (("lies.odt", hf.odt_lying(512 * MiB)), ("lies.docx", hf.docx_lying(512 * MiB))):
        body, headers = multipart(name, data)
        status, answer, _ = server.send([*UPLOAD, f"X-API-Key: {KEY}", f"Content-Length: {len(body)}"], body=body)
        assert status == 400 and answer["error"].startswith(f"{name}: not a readable"), answer  # said 1,000 bytes
    after, peak = server.memory_mb()
    print(f"serve RSS: idle {idle:.0f} MB, after the hostile bodies {after:.0f} MB, peak {peak:.0f} MB")
    assert after - idle < 100 and peak - idle < 100, (idle, after, peak)


def test_every_request_case_is_documented():
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("## Damaged, hostile and cut-short input", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (upload-[a-z0-9-]+) \| .* \| \d+ \| `([^`]+)` \|$", section, re.MULTILINE))
    assert rows.keys() == CASES.keys()
    assert all(rows[case] == message for case, (_, message) in CASES.items() if "\\" not in message)
