"""Values made on first use, for the fields of a `Translator` (`translate.py`): a translator whose
CTranslate2 engine decodes everything never loads the model into torch, nor imports torch; one
that needs our searches (a forced prefix, constraints, an output the engine leaves to us) loads
it then, once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class Deferred(Generic[T]):
    """A value made the first time it is asked for, once (under a lock: serve's threads share
    it), and shared by the copies of the translator that holds it."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make: Callable[[], T] | None = make
        self._lock = threading.Lock()
        self._value: Any = None

    def get(self) -> T:
        with self._lock:
            if self._make is not None:
                self._value, self._make = self._make(), None
            return self._value


class OnFirstUse(Generic[T]):
    """A translator's field that holds a value, or a `Deferred` one made when the field is
    first read: the model of a translator whose CTranslate2 engine decodes without it."""

    def __init__(self, *default: T) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}_held"

    @overload
    def __get__(self, obj: None, owner: Any = None) -> T: ...
    @overload
    def __get__(self, obj: object, owner: Any = None) -> T: ...
    def __get__(self, obj: object | None, owner: Any = None) -> T:
        if obj is None:  # the class's default, for dataclass
            if not self.default:
                raise AttributeError(self.slot)
            return self.default[0]
        held = obj.__dict__[self.slot]
        return held.get() if isinstance(held, Deferred) else held

    def __set__(self, obj: object, value: T | Deferred[T]) -> None:
        obj.__dict__[self.slot] = value
