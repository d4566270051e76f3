"""`seq2seq serve` holding several runs: every pair of every run routed by (source, target), a
pair with no run of its own translated through a pivot language (the two legs one after the
other, as `translate` run twice), `/languages` listing what each source reaches, detection among
the served languages (Chichewa among them, which py3langid does not know), batches that never
mix runs, runs taking turns, `--max-loaded`, and `/health` and `/metrics` per run."""

from __future__ import annotations

import io
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO
from seq2seq_cli.cli import app as cli_app
from seq2seq_cli.config_load import load_config

pytest.importorskip("fastapi", reason="the serve extra is not installed")
from fastapi.testclient import TestClient  # noqa: E402
from libretranslatepy import LibreTranslateAPI  # noqa: E402

from seq2seq_cli.choices import Engine  # noqa: E402
from seq2seq_cli.config import DecodeConfig  # noqa: E402
from seq2seq_cli.serve.app import ServeSettings, create_app  # noqa: E402
from seq2seq_cli.serve.batcher import Batcher, JobOptions  # noqa: E402
from seq2seq_cli.serve.detection import Detector  # noqa: E402
from seq2seq_cli.serve.runs import open_served, run_paths  # noqa: E402

ES_EN, NY_EN = REPO / "data" / "bible-es-en", REPO / "data" / "bible-ny-en"
SPANISH = (ES_EN / "test.es").read_text(encoding="utf-8").splitlines()
ENGLISH = (ES_EN / "test.en").read_text(encoding="utf-8").splitlines()
CHICHEWA = (NY_EN / "test.ny").read_text(encoding="utf-8").splitlines()


def train_pairs(tmp: Path, name: str, corpora: list[tuple[Path, str, str]], steps: int = 30, **data: object) -> Path:
    """configs/tiny.yaml trained `steps` updates on the validation splits `corpora` name, each
    corpus with its own pair (`data`: other data settings) -> the run directory."""
    from seq2seq_cli.train.loop import train

    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp / name)
    raw["data"]["src_lang"], raw["data"]["tgt_lang"] = corpora[0][1:]
    raw["data"]["train"] = raw["data"]["valid"] = [{"path": str(p), "src_lang": s, "tgt_lang": t} for p, s, t in corpora]
    raw["data"]["test"] = None
    raw["data"].update(data)
    raw["train"].update({"max_steps": steps, "valid_every": steps})
    path = tmp.parent / f"{tmp.name}-{name}.yaml"  # beside the folder: a folder of runs holds runs only
    tmp.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return train(load_config(path), progress=False, log=lambda _: None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Four runs in one folder: es->en; en->ny; one-to-many en->es and en->ny (target tokens);
    and a second es->en (the same pair twice)."""
    tmp = tmp_path_factory.mktemp("runs")
    folder = tmp / "runs"
    made = {
        "a-es-en": train_pairs(folder, "a-es-en", [(ES_EN / "valid", "es", "en")], 40),
        "b-en-ny": train_pairs(folder, "b-en-ny", [(NY_EN / "valid", "en", "ny")], 80),
        "c-en-many": train_pairs(folder, "c-en-many", [(ES_EN / "valid", "en", "es"), (NY_EN / "valid", "en", "ny")], 40),
    }
    made["d-es-en"] = folder / "d-es-en"
    shutil.copytree(made["a-es-en"], made["d-es-en"])
    return made


def served(runs: dict[str, Path], *names: str, **overrides: object):
    return [open_served(runs[n], "cpu", dict(overrides), None, Engine.auto) for n in names]


@pytest.fixture(scope="module")
def client(runs):
    """An in-process server of the four runs in the order a, b, c, d."""
    app = create_app(served(runs, "a-es-en", "b-en-ny", "c-en-many", "d-es-en"), ServeSettings(max_chars=200000))
    app.state.serve.pool.load_all()
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def translate_cli(run: Path, tmp: Path, name: str, lines: list[str] | str, *flags: str) -> str:
    """What `seq2seq translate` writes for `lines` (or a document's text, in a file called `name`)."""
    src, out = tmp / name, tmp / f"out-{name}"
    src.write_text(lines if isinstance(lines, str) else "\n".join(lines) + "\n", encoding="utf-8")
    result = CliRunner().invoke(cli_app, ["translate", "-m", str(run), "-i", str(src), "-o", str(out), "--device", "cpu",
                                          "--no-progress", *flags])
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8")


def test_languages_list_each_source_with_every_target_it_reaches(client):
    listed = client.get("/languages").json()
    assert listed == [
        {"code": "es", "name": "Spanish", "targets": ["en", "ny"]},  # ny through English
        {"code": "en", "name": "English", "targets": ["es", "ny"]},
        {"code": "ny", "name": "Chichewa", "targets": []},
    ]


def test_a_pivot_answer_is_the_two_legs_one_after_the_other(client, runs, tmp_path):
    lines = SPANISH[:6]
    body = client.post("/translate", json={"q": "\n".join(lines), "source": "es", "target": "ny"}).json()
    english = translate_cli(runs["a-es-en"], tmp_path, "es.txt", lines)
    chichewa = translate_cli(runs["b-en-ny"], tmp_path, "en.txt", english)
    assert body["translatedText"] == chichewa.removesuffix("\n")
    assert len(set(english.splitlines())) > 1  # the first leg's lines are not all alike
    # /v1/translate says which runs and which pivot; each line whole (--no-split), alternatives of the last leg
    answer = client.post("/v1/translate", json={"q": lines[:3], "source": "es", "target": "ny", "nbest": 2}).json()
    assert answer["runs"] == [str(runs["a-es-en"]), str(runs["b-en-ny"])] and answer["pivot"] == "en"
    whole = translate_cli(runs["a-es-en"], tmp_path, "es3.txt", lines[:3], "--no-split").splitlines()
    nbest = translate_cli(runs["b-en-ny"], tmp_path, "en3.txt", whole, "--no-split", "--nbest", "2", "--scores").splitlines()
    got = [f"{h['translation']}\t{-math.inf if h['score'] is None else h['score']:.4f}"  # null: no hypothesis
           for r in answer["results"] for h in r["nbest"]]
    assert got == nbest and len(set(got)) > 2  # the scores follow the first leg's output
    direct = client.post("/v1/translate", json={"q": lines[:1], "source": "es", "target": "en"}).json()
    assert (direct["runs"], direct["pivot"]) == ([str(runs["a-es-en"])], None)


def test_html_and_files_go_through_the_pivot_as_text_does(client, runs, tmp_path):
    html = f"<p>{SPANISH[0]} <b>{SPANISH[1]}</b></p>"
    got = client.post("/translate", json={"q": html, "source": "es", "target": "ny", "format": "html"}).json()
    english = translate_cli(runs["a-es-en"], tmp_path, "page.html", html)
    assert got["translatedText"] == translate_cli(runs["b-en-ny"], tmp_path, "page-en.html", english)
    text = "\n".join(SPANISH[2:5]) + "\n"
    posted = client.post("/translate_file", data={"source": "es", "target": "ny"},
                         files={"file": ("carta.txt", io.BytesIO(text.encode()), "text/plain")})
    assert posted.status_code == 200, posted.text
    url = posted.json()["translatedFileUrl"]
    downloaded = client.get(url[url.index("/download_file/"):]).content.decode()
    english = translate_cli(runs["a-es-en"], tmp_path, "carta.txt", text)
    assert downloaded == translate_cli(runs["b-en-ny"], tmp_path, "carta-en.txt", english)


def test_a_multilingual_run_serves_each_of_its_pairs(client, runs, tmp_path):
    """en->es comes from the one-to-many run (its >>es<< token in front); en->ny from the run named first."""
    lines = ENGLISH[:4]
    answer = client.post("/v1/translate", json={"q": lines, "source": "en", "target": "es"}).json()
    assert answer["runs"] == [str(runs["c-en-many"])]
    expected = translate_cli(runs["c-en-many"], tmp_path, "en.txt", lines, "--no-split", "--tgt-lang", "es").splitlines()
    assert [r["translation"] for r in answer["results"]] == expected
    to_ny = client.post("/v1/translate", json={"q": lines, "source": "en", "target": "ny"}).json()
    assert to_ny["runs"] == [str(runs["b-en-ny"])]


def test_the_same_pair_in_two_runs_goes_to_the_first_named_and_is_logged(runs, caplog):
    with caplog.at_level(logging.WARNING, logger="seq2seq.serve"):
        app = create_app(served(runs, "d-es-en", "a-es-en"), ServeSettings())
    assert f"es -> en: served by {runs['d-es-en']}, named first; {runs['a-es-en']} offers it too" in caplog.text
    routes = app.state.serve.routes
    assert routes.find("es", "en").runs == [str(runs["d-es-en"])]


@pytest.mark.parametrize("body, message", [
    ({"q": "Moni", "source": "ny", "target": "es"},
     "ny is not supported as the source language; this server translates from es, en"),
    ({"q": "Hola", "source": "es", "target": "fr"},
     "fr is not supported as the target language; this server translates into es, en, ny"),
    ({"q": "Hola", "source": "es", "target": "es"}, "Spanish (es) is not available as a target language from Spanish (es)"),
])
def test_a_pair_no_path_reaches_is_a_400(client, body, message):
    r = client.post("/translate", json=body)
    assert (r.status_code, r.json()) == (400, {"error": message})


def test_no_route_between_served_languages_is_libretranslates_400(runs, tmp_path):
    """ny -> en where ny is served only by a run into a third language (its English side
    labelled de) and en only as the target of es -> en: no pivot connects them (the message is
    the serve-no-route row of docs/errors.md)."""
    ny = (NY_EN / "valid.ny").read_text(encoding="utf-8").splitlines()
    en = (NY_EN / "valid.en").read_text(encoding="utf-8").splitlines()
    (tmp_path / "ny-de.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in zip(ny, en)), encoding="utf-8")
    ny_de = train_pairs(tmp_path, "ny-de", [(tmp_path / "ny-de.tsv", "ny", "de")], 2, filters={"langid": False})
    app = create_app([*served(runs, "a-es-en"), open_served(ny_de, "cpu", {}, None, Engine.auto)], ServeSettings())
    with TestClient(app) as c:
        r = c.post("/translate", json={"q": "Moni", "source": "ny", "target": "en"})
        assert (r.status_code, r.json()) == (400, {"error": "English (en) is not available as a target language "
                                                            "from Chichewa (ny)"})
        assert c.get("/languages").json() == [{"code": "es", "name": "Spanish", "targets": ["en"]},
                                              {"code": "en", "name": "English", "targets": []},
                                              {"code": "ny", "name": "Chichewa", "targets": ["de"]},
                                              {"code": "de", "name": "German", "targets": []}]


def test_detection_names_each_served_language_including_chichewa(runs, client):
    """Each run's profiles (written by tokenize) tell es, en and ny apart on >= 95% of the test
    verses; py3langid cannot name a single Chichewa verse."""
    from seq2seq_cli.data import langid

    detector = client.app.state.serve.detector
    assert detector.method == "profiles"
    for code, verses in (("es", SPANISH), ("en", ENGLISH), ("ny", CHICHEWA)):
        right = sum(detector.rank(v)[0]["language"] == code for v in verses)
        assert right / len(verses) >= 0.95, (code, right / len(verses))
    assert not any(max(("es", "en", "ny"), key=lambda c, v=v: langid.probabilities(v).get(c, 0.0)) == "ny"
                   for v in CHICHEWA[:50])
    found = client.post("/detect", json={"q": [CHICHEWA[0], SPANISH[0], ENGLISH[0]]}).json()
    assert [f[0]["language"] for f in found] == ["ny", "es", "en"]
    assert all(sum(d["confidence"] for d in f) == pytest.approx(100, abs=0.2) for f in found)
    # source auto: each text from the language detected in it, through the route to the target
    body = client.post("/translate", json={"q": [SPANISH[3], ENGLISH[3]], "source": "auto", "target": "ny"}).json()
    assert [d["language"] for d in body["detectedLanguage"]] == ["es", "en"]
    pivot = client.post("/translate", json={"q": SPANISH[3], "source": "es", "target": "ny"}).json()["translatedText"]
    direct = client.post("/translate", json={"q": ENGLISH[3], "source": "en", "target": "ny"}).json()["translatedText"]
    assert body["translatedText"] == [pivot, direct]
    r = client.post("/translate", json={"q": CHICHEWA[3], "source": "auto", "target": "es"})  # no run from ny
    assert (r.status_code, r.json()) == (400, {"error": "the text is in Chichewa (ny), which this server does not "
                                                        "translate into Spanish (es)"})


def test_a_run_without_profiles_has_them_fitted_from_its_data(runs, tmp_path):
    copy = tmp_path / "b-en-ny"
    shutil.copytree(runs["b-en-ny"], copy)
    (copy / "languages.json").unlink()
    detector = Detector(["en", "ny"], served({"x": copy}, "x"))
    assert detector.method == "profiles"
    assert [detector.rank(v)[0]["language"] for v in (CHICHEWA[5], ENGLISH[5])] == ["ny", "en"]
    assert not (copy / "languages.json").exists()  # the run is left as training left it


def test_batches_never_mix_runs_and_runs_take_turns():
    """A flood queued on one run, then one request on another: the other is decoded in the
    second round, not after the flood; no round holds two runs."""
    rounds: list[list[str]] = []

    class Recording(Batcher):
        def _decode(self, group, sharing=False) -> None:
            rounds.append([job.lane for job in group])
            for job in group:
                job.future.set_result(job.lines)

    batcher = Recording(None, wait_s=0.0)
    flood = [batcher.submit([f"a{i}"], JobOptions(DecodeConfig(beam_size=1 + i % 3).model_dump_json()), lane="A")
             for i in range(9)]
    lone = batcher.submit(["b"], JobOptions(DecodeConfig().model_dump_json()), lane="B")
    batcher.start()
    try:
        assert lone.result(timeout=30) == ["b"] and all(f.result(timeout=30) for f in flood)
    finally:
        batcher.stop()
    assert all(len(set(r)) == 1 for r in rounds)
    assert [r[0] for r in rounds][:2] == ["A", "B"]
    # while B has just asked, A's rounds are no larger than B's (1) or 2: each of its three groups of 3 takes two
    assert sorted(len(r) for r in rounds if r[0] == "A") == [1, 1, 1, 2, 2, 2]


def test_a_lone_request_on_another_run_decodes_beside_a_flood_each_on_one_thread():
    """Two decoding threads: while a flood on run A is decoded on one thread, a request on B
    starts at once on the other rather than after A's round; where A's engine cannot decode
    on one thread, B waits for A's round as with one decoding thread."""

    class Engine:
        workers = 2

        def __init__(self, shares: bool) -> None:
            self.shares = shares

        def one_thread(self):
            return self if self.shares else None

    def race(shares: bool) -> list[tuple[str, bool, float, float]]:
        rounds: list[tuple[str, bool, float, float]] = []

        class Recording(Batcher):
            def _decode(self, group, sharing=False) -> None:
                start = time.monotonic()
                time.sleep(0.3)
                rounds.append((group[0].lane, sharing, start, time.monotonic()))
                for job in group:
                    job.future.set_result(job.lines)

        a, b = SimpleNamespace(engine=Engine(shares)), SimpleNamespace(engine=Engine(True))
        batcher = Recording(None, wait_s=0.0, workers=2)
        options = JobOptions(DecodeConfig().model_dump_json())
        batcher.start()
        try:
            assert batcher.submit(["b0"], options, translator=b, lane="B").result(timeout=30) == ["b0"]  # B is asking
            rounds.clear()
            flood = [batcher.submit([f"a{i}"], options, translator=a, lane="A") for i in range(6)]
            time.sleep(0.1)  # A's first round is under way
            lone = batcher.submit(["b"], options, translator=b, lane="B")
            assert lone.result(timeout=30) == ["b"] and all(f.result(timeout=30) for f in flood)
        finally:
            batcher.stop()
        return rounds

    rounds = race(shares=True)
    first_a = next(r for r in rounds if r[0] == "A")
    (lone,) = [r for r in rounds if r[0] == "B"]
    assert lone[2] < first_a[3]  # B started while A's first round was still decoding
    beside = [r for r in rounds if r[0] == "A" and r[2] < lone[3] and lone[2] < r[3]]
    assert lone[1] and beside and all(r[1] for r in beside)  # side by side, each on one thread
    rounds = race(shares=False)
    (lone,) = [r for r in rounds if r[0] == "B"]
    assert all(lone[2] >= r[3] - 0.01 or lone[3] <= r[2] + 0.01 for r in rounds if r[0] == "A")  # never side by side
    assert not any(sharing for lane, sharing, _, _ in rounds if lane == "A")


def test_runs_that_are_all_busy_still_batch_what_they_have():
    rounds: list[list[str]] = []

    class Recording(Batcher):
        def _decode(self, group, sharing=False) -> None:
            rounds.append([job.lane for job in group])
            for job in group:
                job.future.set_result(job.lines)

    batcher = Recording(None, wait_s=0.0)
    options = JobOptions(DecodeConfig().model_dump_json())
    futures = [batcher.submit([f"{lane}{i}"], options, lane=lane) for lane in "AB" for i in range(6)]
    batcher.start()
    try:
        assert all(f.result(timeout=30) for f in futures)
    finally:
        batcher.stop()
    assert rounds == [["A"] * 6, ["B"] * 6]


def test_max_loaded_loads_on_first_use_and_unloads_the_least_recently_used(runs, caplog):
    app = create_app(served(runs, "a-es-en", "b-en-ny", "c-en-many"), ServeSettings(max_loaded=1))
    state = app.state.serve
    with TestClient(app) as c, caplog.at_level(logging.WARNING, logger="seq2seq.serve"):
        assert state.pool.loaded_count() == 0
        first = c.post("/translate", json={"q": SPANISH[0], "source": "es", "target": "en"}).json()["translatedText"]
        assert [r.loaded for r in state.pool.runs] == [True, False, False]
        c.post("/translate", json={"q": ENGLISH[0], "source": "en", "target": "es"})
        assert [r.loaded for r in state.pool.runs] == [False, False, True]
        again = c.post("/translate", json={"q": SPANISH[0], "source": "es", "target": "en"}).json()["translatedText"]
        assert again == first
        figures = c.get("/metrics").json()
        health = c.get("/health").json()
    assert f"unloaded {runs['a-es-en']} (--max-loaded 1)" in caplog.text
    assert figures["runs_loaded"] == 1 and figures["runs"][str(runs["a-es-en"])]["loads"] == 2
    assert [r["loaded"] for r in health["runs"]] == [True, False, False]


def test_health_and_metrics_per_run(client, runs):
    before = client.get("/metrics").json()["runs"]
    client.post("/v1/translate", json={"q": [ENGLISH[1], ENGLISH[2]], "source": "en", "target": "es"})
    after = client.get("/metrics").json()["runs"]
    many, es_en = str(runs["c-en-many"]), str(runs["a-es-en"])
    assert after[many]["requests_decoded"] == before[many]["requests_decoded"] + 1
    assert after[many]["sentences"] == before[many]["sentences"] + 2
    assert after[es_en] == before[es_en]
    health = client.get("/health").json()
    assert health["languages"] == ["es", "en", "ny"]
    assert [(r["name"], r["pairs"]) for r in health["runs"]] == [
        (es_en, [["es", "en"]]), (str(runs["b-en-ny"]), [["en", "ny"]]), (many, [["en", "es"], ["en", "ny"]]),
        (str(runs["d-es-en"]), [["es", "en"]])]
    text = client.get("/metrics?format=prometheus").text
    assert f'seq2seq_run_requests_decoded_total{{run="{many}"}} {after[many]["requests_decoded"]}' in text


def test_a_folder_of_runs_is_served_by_one_process_to_libretranslates_client(runs, tmp_path):
    folder = runs["a-es-en"].parent
    assert run_paths([folder]) == [runs[n] for n in ("a-es-en", "b-en-ny", "c-en-many", "d-es-en")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "seq2seq_cli", "serve", "--model", str(folder), "--device", "cpu",
                                 "--port", str(port)], stdout=err, stderr=err, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(url + "/health", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
        api = LibreTranslateAPI(url)
        listed = {(lang["code"], t) for lang in api.languages() for t in lang["targets"]}
        assert listed == {("es", "en"), ("es", "ny"), ("en", "es"), ("en", "ny")}
        samples = {"es": SPANISH[7], "en": ENGLISH[7]}
        for source, target in sorted(listed):
            assert isinstance(api.translate(samples[source], source, target), str)  # the client raises on an error
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    text = log.read_text()
    assert f"serving 4 runs on http://127.0.0.1:{port}/" in text and f"  {runs['c-en-many']} (en -> es, en -> ny" in text
    assert f"es -> en: served by {runs['a-es-en']}, named first; {runs['d-es-en']} offers it too" in text
    assert "Traceback" not in text
