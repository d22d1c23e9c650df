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
