"""The terminology of `translate`: constraint files (`--constraints`) and glossaries (`--glossary`).

A constraint file holds one JSON list of target phrases per input line (`[]`: none). A
glossary holds one term per line, `source term<TAB>target term`; an input line containing a
source term (whole words, case as in the file, no inflection; both compared in Unicode's
composed form, NFC, so a term typed decomposed matches) gets the target term as a
constraint. Both may be given; a line's phrases are then the file's followed by the
glossary's, each phrase once. Phrases are tokenized with the run's target SentencePiece
model, which normalises them as it does the input; every problem is a UserError naming the
file and line.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import lone_surrogate, read_lines
from seq2seq_cli.ids import UNK

if TYPE_CHECKING:
    from sentencepiece import SentencePieceProcessor


def read_constraints(path: Path) -> list[list[str]]:
    """One list of target phrases per line of `path`."""
    out: list[list[str]] = []
    for number, line in enumerate(read_lines(path), start=1):
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{number}: invalid JSON ({exc}); expected a JSON list of target phrases, "
                            'e.g. ["Moses", "Red Sea"], or [] for none') from None
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise UserError(f"{path}:{number}: expected a JSON list of target phrases (strings), got {line.strip()[:60]}")
        for k, phrase in enumerate(value, start=1):
            if (bad := lone_surrogate(phrase)) is not None:
                raise UserError(f"{path}:{number}: target phrase {k} holds a lone surrogate ({bad}), which is no character; "
                                "expected text that UTF-8 can encode")
        out.append(value)
    return out


@dataclass
class Glossary:
    """Source term -> (target term, line of the glossary file)."""

    path: Path
    terms: dict[str, tuple[str, int]]
    pattern: re.Pattern[str] | None = None

    def __post_init__(self) -> None:
        if self.terms:  # longest first, so a longer term wins where two start at one place
            alternatives = "|".join(re.escape(t) for t in sorted(self.terms, key=len, reverse=True))
            self.pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)")

    def matches(self, line: str) -> list[str]:
        """The source terms `line` contains as whole words (not overlapping), in order, each once."""
        if self.pattern is None:
            return []
        return list(dict.fromkeys(m.group(0) for m in self.pattern.finditer(unicodedata.normalize("NFC", line))))


def read_glossary(path: Path) -> Glossary:
    """Read `source term<TAB>target term` lines (blank lines skipped)."""
    terms: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise UserError(f"{path}:{number}: expected a source term, a TAB and a target term; found no TAB")
        source, target = (part.strip() for part in line.rstrip("\r").split("\t", 1))
        source = unicodedata.normalize("NFC", source)  # matched against the input line in the same form
        if "\t" in target:
            raise UserError(f"{path}:{number}: expected 2 tab-separated columns (source term, target term), found more")
        if not source:
            raise UserError(f"{path}:{number}: empty source term")
        if source in terms:
            raise UserError(f"{path}:{number}: source term {source!r} is already on line {terms[source][1]}; "
                            "give each source term once")
        terms[source] = (target, number)
    return Glossary(path, terms)


@dataclass
class Terminology:
    """The constraints of each input line, from a constraint file, a glossary or both."""

    constraints: list[list[str]] | None = None
    constraints_path: Path | None = None
    glossary: Glossary | None = None
    _cache: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def load(cls, constraints: Path | None, glossary: Path | None) -> Terminology | None:
        if constraints is None and glossary is None:
            return None
        return cls(read_constraints(constraints) if constraints is not None else None, constraints,
                   read_glossary(glossary) if glossary is not None else None)

    def files(self) -> dict[str, Path]:
        """The files read, by flag."""
        named = {"--constraints": self.constraints_path, "--glossary": self.glossary.path if self.glossary else None}
        return {flag: path for flag, path in named.items() if path is not None}

    def check_line_count(self, count: int, name: str) -> None:
        """Refuse a constraint file with another number of lines than the input's `count`."""
        if self.constraints is not None and len(self.constraints) != count:
            raise UserError(f"{self.constraints_path} has {len(self.constraints)} lines but {name} has {count}; "
                            "expected one JSON list of target phrases per input line")

    def check_tokens(self, sp: SentencePieceProcessor) -> None:
        """Tokenize every glossary target term now, so a bad one is reported before anything is translated."""
        if self.glossary is not None:
            for target, number in self.glossary.terms.values():
                self._encode(sp, target, f"{self.glossary.path}:{number}")

    def _encode(self, sp: SentencePieceProcessor, phrase: str, where: str) -> list[int]:
        if phrase not in self._cache:
            ids = sp.encode(phrase)
            if not ids:
                raise UserError(f"{where}: target phrase {phrase!r} tokenizes to nothing; give a phrase with text in it")
            if UNK in ids:
                raise UserError(f"{where}: target phrase {phrase!r} holds characters the target vocabulary lacks "
                                "(they would become <unk>)")
            self._cache[phrase] = ids
        return self._cache[phrase]

    def phrases(self, sp: SentencePieceProcessor, lines: list[str], first: int, name: str) -> list[list[list[int]]]:
        """The constraint phrases (target ids) of `lines`, the lines `first`.. (from 0) of the
        input `name`, each phrase once."""
        if self.constraints is not None and first + len(lines) > len(self.constraints):
            raise UserError(f"{name} has more lines than {self.constraints_path} ({len(self.constraints)}); "
                            "expected one JSON list of target phrases per input line")
        out = []
        for i, line in enumerate(lines):
            found: dict[tuple[int, ...], None] = {}
            if self.constraints is not None:
                where = f"{self.constraints_path}:{first + i + 1}"
                if self.constraints[first + i] and not line.strip():
                    raise UserError(f"{where}: constraints for an empty input line, which is not translated; use []")
                for phrase in self.constraints[first + i]:
                    found[tuple(self._encode(sp, phrase, where))] = None
            if self.glossary is not None:
                for term in self.glossary.matches(line):
                    target, number = self.glossary.terms[term]
                    found[tuple(self._encode(sp, target, f"{self.glossary.path}:{number}"))] = None
            out.append([list(p) for p in found])
        return out
