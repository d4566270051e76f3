"""The routes of `seq2seq serve` that translate nothing: GET /health, GET /metrics (JSON, or
Prometheus text with ?format=prometheus), each with its figures per run, and GET / (the web page)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from seq2seq_cli.serve.batcher import Counters
from seq2seq_cli.serve.page import PAGE
from seq2seq_cli.serve.state import app_state

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    state = app_state(request)
    return JSONResponse({"status": "ok", "languages": state.routes.languages, "queue": state.batcher.pending(),
                         "runs": [{"name": run.name, "pairs": [list(p) for p in run.pairs], "loaded": run.loaded,
                                   "queue": state.batcher.pending(run.name)} for run in state.pool.runs]})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = app_state(request)
    c = state.batcher.counters
    figures: dict[str, Any] = {
        "requests": dict(state.requests), "responses": {str(k): v for k, v in sorted(state.responses.items())},
        "batches": c.batches, "sentences": c.sentences, "requests_decoded": c.requests,
        "largest_batch_requests": c.largest_batch, "queue_depth": state.batcher.pending(),
        "uptime_s": round(time.monotonic() - state.started, 1), "runs_loaded": state.pool.loaded_count(),
        "runs": {},
    }
    for run in state.pool.runs:
        lane = state.batcher.lanes.get(run.name, Counters())
        figures["runs"][run.name] = {"batches": lane.batches, "sentences": lane.sentences, "requests_decoded": lane.requests,
                                     "queue_depth": state.batcher.pending(run.name), "loaded": int(run.loaded),
                                     "loads": run.loads}
    if request.query_params.get("format") == "prometheus" or "text/plain" in request.headers.get("accept", ""):
        return PlainTextResponse(prometheus_text(figures), media_type="text/plain; version=0.0.4")
    return JSONResponse(figures)


@router.get("/")
async def page() -> HTMLResponse:
    return HTMLResponse(PAGE)


def prometheus_text(figures: dict[str, Any]) -> str:
    """The metrics in the Prometheus text format."""
    lines = ["# TYPE seq2seq_requests_total counter"]
    lines += [f'seq2seq_requests_total{{path="{p}"}} {n}' for p, n in sorted(figures["requests"].items())]
    lines.append("# TYPE seq2seq_responses_total counter")
    lines += [f'seq2seq_responses_total{{status="{s}"}} {n}' for s, n in figures["responses"].items()]
    for name, kind in (("batches", "counter"), ("sentences", "counter"), ("requests_decoded", "counter"),
                       ("largest_batch_requests", "gauge"), ("queue_depth", "gauge"), ("uptime_s", "gauge")):
        metric = f"seq2seq_{name}_total" if kind == "counter" else f"seq2seq_{name}"
        lines += [f"# TYPE {metric} {kind}", f"{metric} {figures[name]}"]
    for name, kind in (("batches", "counter"), ("sentences", "counter"), ("requests_decoded", "counter"),
                       ("queue_depth", "gauge"), ("loaded", "gauge")):
        metric = f"seq2seq_run_{name}_total" if kind == "counter" else f"seq2seq_run_{name}"
        lines.append(f"# TYPE {metric} {kind}")
        lines += [f'{metric}{{run="{label(run)}"}} {values[name]}' for run, values in figures["runs"].items()]
    return "\n".join(lines) + "\n"


def label(text: str) -> str:
    """A Prometheus label value: backslashes, quotes and newlines escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
