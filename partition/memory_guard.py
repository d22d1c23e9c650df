"""The partitioner's own peak memory, predicted from the input's sizes before anything is loaded.

Calibrated on the peak RSS per rank that `gnn-dist partition` prints
(benchmarks/results/distributed-partition-synthetic-large.md, and pymetis's
17.8 GiB on synthetic:products). The model is linear: a fixed process
(Python, numpy, torch, pymetis), bytes per stored input edge and per byte of
node data. PT-Scotch's share does not all fall with R: on synthetic:large a
rank peaked (64-bit Scotch) at 1.92 GiB at R=2 and 1.36 GiB at R=4, about
0.8 GiB + 2.2 GiB / R, so part of its bytes per edge are held on every rank
whatever R is; 32-bit Scotch, used whenever the graph fits, about halves
Scotch's share.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnn_dist.memory_plan import available_memory_bytes, readable_bytes

PROCESS_BYTES = 400 << 20
# per input edge as stored (one direction; duplicates and loops included), and per byte of node data
PYMETIS_BYTES_PER_EDGE = 270
# Scotch's bytes per input edge by the width of SCOTCH_Num (gnn_dist.partition.scotch.scotch_int_bits): in one
# process (R=1, sequential Scotch), and under PT-Scotch the share every rank holds and the share spread
# over the R ranks.
SCOTCH_SEQUENTIAL_BYTES_PER_EDGE = {32: 120, 64: 190}
PTSCOTCH_BYTES_PER_EDGE_EVERY_RANK = {32: 30, 64: 60}
PTSCOTCH_BYTES_PER_EDGE_SPREAD = {32: 110, 64: 235}
NODE_DATA_FACTOR = {"metis": 2.2, "random": 2.2, "ptscotch": 2.0}


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
            from gnn_dist.partition.chunked import read_meta

            meta = read_meta(arg)
            return InputShape(meta.num_nodes, meta.num_features, meta.num_input_edges)
        if kind == "synthetic" and arg:
            from gnn_dist.partition.synthetic import PRESETS

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
    from gnn_dist.partition.scotch import scotch_int_bits

    node_bytes = shape.num_nodes * (shape.num_features * 4 + 40)
    if method != "ptscotch":
        return int(PROCESS_BYTES + PYMETIS_BYTES_PER_EDGE * shape.input_edges + NODE_DATA_FACTOR[method] * node_bytes)
    bits = scotch_int_bits(shape.num_nodes, 2 * shape.input_edges)
    if ranks == 1:
        return int(PROCESS_BYTES + SCOTCH_SEQUENTIAL_BYTES_PER_EDGE[bits] * shape.input_edges
                   + NODE_DATA_FACTOR[method] * node_bytes)
    return int(PROCESS_BYTES + PTSCOTCH_BYTES_PER_EDGE_EVERY_RANK[bits] * shape.input_edges
               + (PTSCOTCH_BYTES_PER_EDGE_SPREAD[bits] * shape.input_edges
                  + NODE_DATA_FACTOR[method] * node_bytes) / ranks)


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
        fix = ("spread the ranks over more hosts (mpirun -n R with a hostfile; more ranks on one host need more "
               "in total) or give each rank more memory")
    else:
        fix = ("convert it (gnn-dist convert --dataset SPEC --out DIR) and partition with --dataset chunked:DIR "
               "--method ptscotch --ranks R, so each rank holds 1/R of it")
    return (f"partitioning {shape.num_nodes:,} nodes and {shape.input_edges:,} input edges by {method} would need "
            f"about {readable_bytes(need)} per rank, over the {where}: {fix}")
