"""The dataset registry behind --dataset KIND[:ARG]: what each kind is and how to load it (docs/extending.md).

The built-in kinds register themselves in gnn_dist.partition.datasets (and ogb_link); their streaming
converters in gnn_dist.partition.convert. Load through gnn_dist.partition.datasets, which imports them all.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gnn_dist.partition.graph import DatasetError, Graph, GraphSizes


@dataclass(frozen=True)
class DatasetKind:
    """What --dataset KIND[:ARG] names: how to load it, and what its source can tell without loading it all.

    load(arg, root, *, seed, download) -> Graph
    sizes(arg, root) -> GraphSizes | None     the sizes without loading (the partitioner's memory check runs
                                              before the load); without it, the check runs after the load
    convert(arg, root, out, *, seed, overwrite, edges_per_chunk, nodes_per_chunk) -> ChunkedMeta
                                              `gnn-dist convert` streaming the source in chunks; without it,
                                              convert loads the graph whole and writes it in chunks
    """

    load: Callable
    takes_arg: bool
    form: str
    sizes: Callable | None = None
    convert: Callable | None = None


_KINDS: dict[str, DatasetKind] = {}


def register_dataset(kind: str, form: str, takes_arg: bool = True, sizes: Callable | None = None,
                     convert: Callable | None = None):
    """Decorator: `loader(arg, root, *, seed, download) -> Graph` serves --dataset KIND:ARG (or plain KIND when
    takes_arg is False). `form` is how error messages list it; `sizes` and `convert` as DatasetKind says.
    docs/extending.md has the recipe."""
    def register(loader: Callable) -> Callable:
        _KINDS[kind] = DatasetKind(loader, takes_arg, form, sizes, convert)
        return loader
    return register


def dataset_forms() -> str:
    return ", ".join(entry.form for entry in _KINDS.values())


def dataset_kind(spec: str) -> tuple[DatasetKind, str | None]:
    """The registered kind of `spec` and its argument; a DatasetError listing the valid forms otherwise."""
    kind, colon, arg = spec.partition(":")
    entry = _KINDS.get(kind)
    if entry is not None and (bool(arg) if entry.takes_arg else not colon):
        return entry, (arg if colon else None)
    raise DatasetError(f"unknown dataset {spec!r}: use one of {dataset_forms()}")


def load_dataset(spec: str, root: str | os.PathLike | None = None, *, seed: int = 0,
                 download: bool = False) -> Graph:
    """Load the graph named by `spec`; every failure is a DatasetError naming the fix."""
    entry, arg = dataset_kind(spec)
    return entry.load(arg, root, seed=seed, download=download)


def dataset_sizes(spec: str, root: str | os.PathLike | None = None) -> GraphSizes | None:
    """The sizes of `spec` without loading it, or None where only loading would tell (or the source is
    unreadable: its loader then reports that, with its own fix)."""
    try:
        entry, arg = dataset_kind(spec)
        return entry.sizes(arg, root) if entry.sizes is not None else None
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def need_root(spec: str, root) -> Path:
    if root is None:
        raise DatasetError(f"dataset {spec!r} is read from disk: pass --root DIR (the folder holding it)")
    return Path(root)


def register_converter(kind: str, convert: Callable) -> None:
    """Give a registered kind its streaming converter (DatasetKind.convert) after the fact: the converters of
    the built-in kinds live with the chunked writer (gnn_dist.partition.convert), above their loaders."""
    _KINDS[kind] = dataclasses.replace(_KINDS[kind], convert=convert)
