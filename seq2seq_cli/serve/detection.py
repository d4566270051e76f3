"""Language detection among the languages a server translates (POST /detect, `source: auto`).

Each run's character n-gram profiles (`seq2seq_cli/data/langprofile.py`: RUN/languages.json,
written by `tokenize`; fitted at start from the run's training data where a run has none) tell
the served languages apart, Chichewa among them, which py3langid does not know. Where some served
language has no profile (an imported model, whose training text is not at hand), py3langid ranks
the languages it knows among those served, as the data's filter does.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from seq2seq_cli.data import langid
from seq2seq_cli.data.langprofile import Profiles, profiles_of_run
from seq2seq_cli.serve.runs import ServedRun

log = logging.getLogger("seq2seq.serve")


class Detector:
    """Ranks the served `languages` for a text; the profiles are read (or fitted) once, on first use
    or at `prepare`."""

    def __init__(self, languages: list[str], runs: list[ServedRun]) -> None:
        self.languages = languages
        self.runs = runs
        self._profiles: Profiles | None = None
        self._ready = False
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Read or fit the runs' profiles now (a server does it before it opens its port)."""
        with self._lock:
            if self._ready:
                return
            found = Profiles({})
            for run in self.runs:
                if run.path is None or set(self.languages) <= set(found.languages):
                    continue
                try:
                    from seq2seq_cli.layout import RunLayout
                    from seq2seq_cli.run.loaded import run_config

                    config = run_config(run.path)
                    found = found.merged(profiles_of_run(config, RunLayout(run.path).language_profiles))
                except Exception as exc:  # no profiles and no data at hand: py3langid ranks this run's languages
                    log.warning("%s: no language profiles (%s); detection falls back to py3langid", run.name,
                                str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            missing = [lang for lang in self.languages if lang not in found.languages]
            self._profiles = None if missing else found
            if missing:
                log.warning("no language profile of %s: detection ranks the served languages with py3langid",
                            ", ".join(missing))
            self._ready = True

    @property
    def method(self) -> str:
        self.prepare()
        return "profiles" if self._profiles is not None else "py3langid"

    def rank(self, text: str, among: list[str] | None = None) -> list[dict[str, Any]]:
        """LibreTranslate's answer for one text: each language of `among` (the served ones) with
        its confidence in percent (adding up to 100), the likelier first."""
        self.prepare()
        codes = among if among is not None else self.languages
        if self._profiles is not None and text.strip():
            probs = self._profiles.probabilities(text, codes)
            shares = [probs.get(c, 0.0) for c in codes]
        else:
            known = [langid.identifier_code(lang) for lang in codes]
            ranked = langid.probabilities(text) if any(known) and text.strip() else {}
            values = [float(ranked.get(code, 0.0)) if code else 0.0 for code in known]
            total = sum(values)
            shares = [v / total for v in values] if total > 0 else [1 / len(codes)] * len(codes)
        found = [{"confidence": round(100 * share, 1), "language": lang} for lang, share in zip(codes, shares)]
        return sorted(found, key=lambda d: -d["confidence"])
