"""Registries fill themselves: importing a registry package imports every module in its folder.

Adding a model, schedule or dataset is then one new file in its package (or a
`--plugin` module), with no import line to add anywhere else.
"""
from __future__ import annotations

import importlib
import pkgutil


def import_modules_of(package_name: str, package_path, first: tuple[str, ...] = ()) -> None:
    """Import every module of a package: those named in `first` in that order (registries list their entries
    in registration order, so the reference entry comes first), then the rest by name."""
    names = sorted(info.name for info in pkgutil.iter_modules(package_path) if not info.name.startswith("_"))
    for name in [*first, *(n for n in names if n not in first)]:
        importlib.import_module(f"{package_name}.{name}")


def one_of(names) -> str:
    """'a', 'a or b', 'a, b or c'."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class Registry:
    """Classes registered by their `name` attribute under one command-line flag (--model, --task)."""

    def __init__(self, flag: str, what: str):
        self.flag, self.what = flag, what  # "--model", "layer class"
        self._entries: dict[str, type] = {}

    def register(self, cls: type) -> type:
        """Class decorator: make `cls` available as FLAG cls.name."""
        name = getattr(cls, "name", "")
        if not name or not isinstance(name, str):
            raise ValueError(f"{cls.__name__} needs a class attribute `name` (its {self.flag} NAME)")
        if name in self._entries and self._entries[name] is not cls:
            raise ValueError(f"{self.flag} {name} is registered twice: by {self._entries[name].__qualname__} and "
                             f"{cls.__qualname__}")
        self._entries[name] = cls
        return cls

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def get(self, name: str) -> type:
        """The class of FLAG NAME; ValueError naming the valid choices otherwise."""
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"unknown {self.flag} {name!r}: use {one_of(self.names())}") from None
