"""What the tests of `seq2seq serve` as a real process share: a free port, and `Server`, the
command started on one with its stderr in a file, and driven by plain HTTP requests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from helpers import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m seq2seq_cli serve` on a free port, its stderr in a file."""

    def __init__(self, run: Path, tmp: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "seq2seq_cli", "serve", "--model", str(run), "--device", "cpu",
                                          "--port", str(self.port), *args], stdout=err, stderr=err, env=env)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise AssertionError(f"serve did not answer in time: {self.log.read_text()}")

    def request(self, path: str, body: bytes | None = None, content_type: str = "application/json",
                headers: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, Any, Any]:
        """-> (status, headers (names in any case), the JSON answer) whatever the status."""
        req = urllib.request.Request(self.url + path, data=body, headers={"Content-Type": content_type, **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.headers, json.loads(r.read())
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            assert "Traceback" not in text
            return e.code, e.headers, json.loads(text)

    def get(self, path: str) -> tuple[int, Any, Any]:
        return self.request(path)

    def post(self, path: str, data: dict, **kw) -> tuple[int, Any, Any]:
        return self.request(path, json.dumps(data).encode(), **kw)

    def metrics(self) -> dict:
        return self.get("/metrics")[2]

    def wait_for_queue(self, depth: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.metrics()["queue_depth"] != depth:
            assert time.monotonic() < deadline, f"queue depth never reached {depth}"
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
