"""The `slow` marker: slow tests are skipped unless asked for, and markers are checked."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import REPO


def pytest_run(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "SEQ2SEQ_SLOW"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=REPO,
                          env={**environ, **env}, capture_output=True, text=True, timeout=300)


def test_slow_tests_are_skipped_by_default():
    r = pytest_run("tests/train/test_interrupt.py", "-rs", "-k", "random_moments")
    assert r.returncode == 0, r.stdout[-2000:]
    assert "8 skipped" in r.stdout and "slow: run with --runslow or SEQ2SEQ_SLOW=1" in r.stdout


def test_runslow_or_the_environment_variable_runs_them(monkeypatch):
    import pytest

    from conftest import pytest_collection_modifyitems

    class Item:
        def __init__(self, slow: bool) -> None:
            self.keywords = {"slow": True} if slow else {}
            self.markers: list = []

        def add_marker(self, marker) -> None:
            self.markers.append(marker)

    class Config:
        def __init__(self, runslow: bool) -> None:
            self.runslow = runslow

        def getoption(self, name: str) -> bool:
            return self.runslow

    def skipped(runslow: bool, env: str | None) -> list[bool]:
        if env is None:
            monkeypatch.delenv("SEQ2SEQ_SLOW", raising=False)
        else:
            monkeypatch.setenv("SEQ2SEQ_SLOW", env)
        items = [Item(True), Item(False)]
        pytest_collection_modifyitems(Config(runslow), items)  # type: ignore[arg-type]
        return [bool(i.markers) and i.markers[0].name == "skip" for i in items]

    assert skipped(False, None) == [True, False]
    assert skipped(False, "0") == [True, False]
    assert skipped(True, None) == [False, False]
    assert skipped(False, "1") == [False, False]
    assert pytest.mark.slow.name == "slow"


def test_markers_are_strict():
    from tomllib import loads

    options = loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in options["addopts"].split()
    assert {m.split(":")[0] for m in options["markers"]} == {"slow", "cuda"}
