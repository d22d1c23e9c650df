"""The partitioner's own peak memory, predicted from the input's sizes before anything is loaded.

Calibrated on the peak RSS per rank that `gnn-dist partition` prints
(benchmarks/results/distributed-partition-synthetic-large.md, and pymetis's
17.8 GiB on synthetic:products). The model is linear: one gnn-dist process
(gnn_dist.memory.host.PROCESS_BYTES), bytes per stored input edge and per
byte of node data. The input's sizes come from its dataset kind before
loading (gnn_dist.partition.datasets.dataset_sizes) where its source tells.

PT-Scotch's share does not all fall with R: on synthetic:large a rank peaked
(64-bit Scotch) at 1.92 GiB at R=2 and 1.36 GiB at R=4, about 0.8 GiB +
2.2 GiB / R, so part of its bytes per edge are held on every rank whatever R
is; 32-bit Scotch, used whenever the graph fits, about halves Scotch's share.
"""
from __future__ import annotations

from gnn_dist.memory.host import PROCESS_BYTES, budget_refusal
from gnn_dist.partition.graph import GraphSizes

# per input edge as stored (one direction; duplicates and loops included), and per byte of node data
PYMETIS_BYTES_PER_EDGE = 270
# Scotch's bytes per input edge by the width of SCOTCH_Num (gnn_dist.partition.scotch.scotch_int_bits): in one
# process (R=1, sequential Scotch), and under PT-Scotch the share every rank holds and the share spread
# over the R ranks.
SCOTCH_SEQUENTIAL_BYTES_PER_EDGE = {32: 120, 64: 190}
PTSCOTCH_BYTES_PER_EDGE_EVERY_RANK = {32: 30, 64: 60}
PTSCOTCH_BYTES_PER_EDGE_SPREAD = {32: 110, 64: 235}
NODE_DATA_FACTOR = {"metis": 2.2, "random": 2.2, "ptscotch": 2.0}


def predicted_peak(shape: GraphSizes, method: str, ranks: int = 1) -> int:
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


def refusal(shape: GraphSizes | None, method: str, ranks: int, ranks_on_host: int, limit: int | None) -> str | None:
    """One line saying why this partition job would not fit (gnn_dist.memory.host's rule), or None."""
    if shape is None:
        return None
    if method == "ptscotch":
        fix = ("spread the ranks over more hosts (mpirun -n R with a hostfile; more ranks on one host need more "
               "in total) or give each rank more memory")
    else:
        fix = ("convert it (gnn-dist convert --dataset SPEC --out DIR) and partition with --dataset chunked:DIR "
               "--method ptscotch --ranks R, so each rank holds 1/R of it")
    return budget_refusal(predicted_peak(shape, method, ranks), limit, ranks_on_host,
                          f"partitioning {shape.num_nodes:,} nodes and {shape.input_edges:,} input edges by {method}", fix)
