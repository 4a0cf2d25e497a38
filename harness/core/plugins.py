"""A list of plug-ins of one kind: the built-in ones (module:attribute paths, loaded when first asked for), those of
installed packages (an entry point group), and those a process registers itself. A plug-in of a package that fails to
load is set aside with the reason, never breaking the others."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cached_property
from importlib import metadata
from typing import Generic, TypeVar

T = TypeVar("T")


def load_object(path: str) -> object:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


class Registry(Generic[T]):
    def __init__(self, kind: type[T], builtin: list[str], entry_point_group: str, name_of: Callable[[T], str],
                 check: Callable[[T], str] = lambda item: ""):
        """check(item): why a plug-in is unusable ("" when it is fine)."""
        self.kind, self.builtin_paths, self.group = kind, builtin, entry_point_group
        self.name_of, self.check = name_of, check
        self.registered: list[T] = []

    @cached_property
    def _builtin(self) -> list[T]:
        return [load_object(path) for path in self.builtin_paths]  # type: ignore[misc]

    @cached_property
    def _plugins(self) -> tuple[list[T], list[str]]:
        found: list[T] = []
        problems = []
        names = {self.name_of(item) for item in self._builtin}
        for point in metadata.entry_points(group=self.group):
            try:
                item = point.load()
                problem = (f"it is a {type(item).__name__}, not a {self.kind.__name__}"
                           if not isinstance(item, self.kind) else self.check(item)
                           or (f"the name '{self.name_of(item)}' is taken" if self.name_of(item) in names else ""))
            except Exception as exc:  # a third-party plug-in that fails to load must not break the others
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                problems.append(f"{self.group} plug-in {point.name} ({point.value}): {problem}")
                continue
            names.add(self.name_of(item))
            found.append(item)
        return found, problems

    def all(self) -> list[T]:
        """Built-in ones first, then installed packages', then those registered in this process."""
        return [*self._builtin, *self._plugins[0], *self.registered]

    def problems(self) -> list[str]:
        return self._plugins[1]

    def register(self, item: T) -> None:
        problem = self.check(item) or (f"the name '{self.name_of(item)}' is taken"
                                       if any(self.name_of(i) == self.name_of(item) for i in self.all()) else "")
        if problem:
            raise ValueError(f"cannot register {self.kind.__name__} {self.name_of(item)}: {problem}")
        self.registered.append(item)

    def unregister(self, name: str) -> None:
        self.registered[:] = [i for i in self.registered if self.name_of(i) != name]
