"""Start `seq2seq serve`: check and load the runs once, bind the port, run uvicorn until SIGTERM
or Ctrl-C. On the signal the listening socket closes (new connections are refused), requests in
flight are answered, the decoding thread finishes, and the process exits 0."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from seq2seq_cli.choices import Engine
from seq2seq_cli.errors import UserError
from seq2seq_cli.serve.app import ServeSettings, create_app
from seq2seq_cli.serve.runs import describe_runs, open_served, run_paths

__all__ = ["ServeSettings", "serve"]


class _Server(uvicorn.Server):
    """uvicorn's server, ending with exit code 0 after a graceful shutdown on SIGTERM/SIGINT
    (uvicorn re-raises the signal once it has shut down, which would end the process by it)."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


def head_deadline(timeout_s: float) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11) with a deadline on each request's head: a connection
    whose request line and headers have not all arrived `timeout_s` after it opened (or after
    the first byte of its next request) is answered 408 and closed. uvicorn times out only idle
    connections between requests (keep-alive) and the body (`parse.read_body`): a head sent a
    byte at a time, or never ended, would hold its connection for good."""
    message = json.dumps({"error": f"the request's headers did not arrive within {timeout_s:g} s"}).encode()
    answer = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
              b"content-length: " + str(len(message)).encode() + b"\r\n\r\n" + message)

    class HeadDeadline(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self._awaiting_head():  # the first bytes of a next request
                self._arm()
            super().data_received(data)
            if not self._awaiting_head():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _awaiting_head(self) -> bool:
            return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self) -> None:
            self._head_timer = None
            if self._awaiting_head() and not self.transport.is_closing():
                self.transport.write(answer)
                self.transport.close()

    return HeadDeadline


def read_api_keys(path: Path) -> frozenset[str]:
    """One key per line; blank lines and lines starting with # are skipped."""
    if path.is_dir():
        raise UserError(f"{path}: is a directory, expected a file of API keys (one key per line)")
    if not path.is_file():
        raise UserError(f"{path}: API keys file not found (expected one key per line)")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: invalid UTF-8 at byte {exc.start} (expected one key per line)") from None
    keys = frozenset(k.strip() for k in text.splitlines() if k.strip() and not k.startswith("#"))
    if not keys:
        raise UserError(f"{path}: no API keys in it (expected one key per line)")
    return keys


def listen(host: str, port: int) -> socket.socket:
    """The bound listening socket, or one line saying why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UserError(f"--host {host}: cannot resolve it ({exc.strerror or exc})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UserError(f"{host}:{port}: cannot listen there ({exc.strerror or exc}); choose another --port or --host") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(models: list[Path], device: str, decode: dict[str, object], host: str, port: int, settings: ServeSettings,
          api_keys: Path | None = None, tag: str | None = None, engine: Engine = Engine.auto) -> None:
    """Serve runs until stopped: each of `models` a run (or a checkpoint), or a folder holding runs;
    `tag` goes in front of every source line; `engine` searches (`seq2seq_cli/decode/loading.py`).
    Every run is checked, and loaded unless `settings.max_loaded` says on first use, before the
    port opens."""
    if api_keys is not None:
        settings.api_keys = read_api_keys(api_keys)
    paths = run_paths(models)
    if tag is not None and len(paths) > 1:
        raise UserError(f"--tag {tag}: goes with one run ({len(paths)} are served); a tag belongs to the corpus of one run")
    runs = [open_served(path, device, decode, tag, engine) for path in paths]
    sock = listen(host, port)
    app = create_app(runs, settings)
    state = app.state.serve
    if settings.max_loaded is None:
        state.pool.load_all()  # a bad run fails here, before the port opens
    state.detector.prepare()
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=int(settings.timeout_s) + 5,
                            http=head_deadline(settings.timeout_s))
    server = _Server(config)
    bound = sock.getsockname()
    described = describe_runs(state.pool)
    where = f"http://{host}:{bound[1]}/"
    if len(described) == 1:
        print(f"serving {described[0]} on {where} (Ctrl-C or SIGTERM to stop)", file=sys.stderr, flush=True)
    else:
        loaded = "" if settings.max_loaded is None else f", at most {settings.max_loaded} loaded at once"
        print(f"serving {len(described)} runs on {where}{loaded} (Ctrl-C or SIGTERM to stop):", file=sys.stderr, flush=True)
        for line in described:
            print(f"  {line}", file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    print("stopped", file=sys.stderr, flush=True)
