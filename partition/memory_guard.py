"""The partitioner's own peak memory, predicted from the input's sizes before anything is loaded.

Calibrated with /usr/bin/time peak RSS on the synthetic presets (see
benchmarks/results/distributed-partition-synthetic-products.md). The model is
linear: a fixed process (Python, numpy, torch, pymetis), bytes per stored
input edge, bytes per feature byte; divided over R ranks for PT-Scotch.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnn_dist.plan import available_memory_bytes, readable_bytes

PROCESS_BYTES = 400 << 20
# per input edge as stored (one direction; duplicates and loops included), and per byte of node data
PYMETIS_BYTES_PER_EDGE = 150
PTSCOTCH_BYTES_PER_EDGE = 110
NODE_DATA_FACTOR = {"metis": 2.2, "random": 2.2, "ptscotch": 3.0}


@dataclass(frozen=True)
class InputShape:
    num_nodes: int
    num_features: int
    input_edges: int  # as stored, one direction each


def input_shape(spec: str, root: str | os.PathLike | None = None) -> InputShape | None:
    """The input's sizes without loading it, or None where only loading would tell."""
    kind, _, arg = spec.partition(":")
    try:
        if kind == "chunked" and arg:
            from partition.chunked import read_meta

            meta = read_meta(arg)
            return InputShape(meta.num_nodes, meta.num_features, meta.num_input_edges)
        if kind == "synthetic" and arg:
            from partition.synthetic import PRESETS

            if arg in PRESETS:
                preset = PRESETS[arg]
                return InputShape(preset.num_nodes, preset.num_features, preset.num_directed_edges)
        if kind == "npz" and arg:
            return _npz_shape(Path(arg))
    except Exception:  # noqa: BLE001 - an unreadable input is reported by its loader, with its own fix
        return None
    return None


def _npz_shape(path: Path) -> InputShape | None:
    shapes = {}
    with zipfile.ZipFile(path) as archive:
        for name in ("x", "edge_index"):
            with archive.open(f"{name}.npy") as handle:
                version = np.lib.format.read_magic(handle)
                shapes[name] = np.lib.format._read_array_header(handle, version)[0]
    return InputShape(int(shapes["x"][0]), int(shapes["x"][1]), int(shapes["edge_index"][1]))


def predicted_peak(shape: InputShape, method: str, ranks: int = 1) -> int:
    """Peak bytes of one rank partitioning `shape` with `method` on `ranks` ranks."""
    node_bytes = shape.num_nodes * (shape.num_features * 4 + 40)
    per_edge = PTSCOTCH_BYTES_PER_EDGE if method == "ptscotch" else PYMETIS_BYTES_PER_EDGE
    spread = ranks if method == "ptscotch" else 1
    return int(PROCESS_BYTES + (per_edge * shape.input_edges + NODE_DATA_FACTOR.get(method, 3.0) * node_bytes) / spread)


def refusal(shape: InputShape | None, method: str, ranks: int, ranks_on_host: int, limit: int | None) -> str | None:
    """One line saying why this partition job would not fit, or None."""
    if shape is None:
        return None
    need = predicted_peak(shape, method, ranks)
    if limit is not None:
        have, where = limit, f"--memory-limit {readable_bytes(limit)} per rank"
    else:
        available = available_memory_bytes()
        if available is None:
            return None
        have, where = available // max(1, ranks_on_host), f"{readable_bytes(available)} available on this host"
        if ranks_on_host > 1:
            where += f" for {ranks_on_host} ranks"
    if need <= have:
        return None
    if method == "ptscotch":
        more = max(ranks + 1, -(-int(shape.input_edges * PTSCOTCH_BYTES_PER_EDGE) // max(1, have - PROCESS_BYTES)))
        fix = f"run more ranks (--ranks {more} across hosts with mpirun) or give each rank more memory"
    else:
        fix = ("convert it (gnn-dist convert --dataset SPEC --out DIR) and partition with --dataset chunked:DIR "
               "--method ptscotch --ranks R, so each rank holds 1/R of it")
    return (f"partitioning {shape.num_nodes:,} nodes and {shape.input_edges:,} input edges by {method} would need "
            f"about {readable_bytes(need)} per rank, over the {where}: {fix}")
