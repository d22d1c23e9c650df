"""SpMM effective bandwidth against this machine's copy bandwidth, native kernel and torch's, in one run.

    python -m gnn_dist.benchmarks.spmm_bench --dataset synthetic:arxiv --widths 40,128,256

Two node orders: the dataset's, and the locality order `gnn-dist partition`
writes (METIS blocks of --locality-block nodes, default 256).

Compulsory bytes of Y = A X: the CSR (column index and 4-byte value per
non-zero, row pointers; the index width the operator really uses), X read
once, Y written once. Copy bandwidth: bytes read plus written by a 256 MiB
copy into a preallocated tensor. One thread. "touched" bandwidth counts
every gathered row of X (nnz x width x 4 bytes), as the issue's 5-7 GB/s
figure for torch did; it is also shown against the copy's one-way rate
(bytes copied per second, the issue's "11-14 GB/s" kind of figure).
Target: native effective bandwidth >= 50% of copy bandwidth.

A last table probes the cache one thread really gets: random gathers of
64-byte rows (torch index_select) from working sets of growing size. The
SpMM gathers nnz rows of X; only the share that stays within that size runs
at cache speed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch


def timed(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synthetic:arxiv")
    parser.add_argument("--widths", default="40,128,256")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--locality-block", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("GNN_DIST_KERNEL", "auto")
    from gnn_dist.kernels.native import native_module
    from gnn_dist.kernels.spmm import SparseOperator
    from gnn_dist.partition.datasets import load_dataset
    from gnn_dist.partition.metis import locality_blocks

    graph = load_dataset(args.dataset)
    n = graph.num_nodes
    blocks = locality_blocks(graph, np.zeros(n, dtype=np.int64), 1, args.locality_block)
    orders = {"dataset": np.arange(n), f"locality {args.locality_block}": np.lexsort((np.arange(n), blocks))}
    native = native_module()
    big = torch.randn(256 * 2**20 // 4)
    target = torch.empty_like(big)  # preallocated: time the copy, not page faults of a new tensor
    copy_bw = 2 * big.numel() * 4 / timed(lambda: target.copy_(big), args.repeats)
    print(f"{args.dataset}: {n:,} rows, {graph.num_edges + n:,} non-zeros; copy bandwidth {copy_bw / 1e9:.1f} GB/s "
          f"read+written ({copy_bw / 2e9:.1f} GB/s copied), 1 thread\n")
    print("| order | width | kernel | ms | effective GB/s (compulsory) | vs copy | touched GB/s | touched vs copied |")
    print("|---|---|---|---|---|---|---|---|")
    for order_name, new_to_old in orders.items():
        old_to_new = np.empty(n, dtype=np.int64)
        old_to_new[new_to_old] = np.arange(n)
        src, dst = old_to_new[graph.edge_index[0]], old_to_new[graph.edge_index[1]]
        deg = np.bincount(dst, minlength=n).astype(np.float32) + 1
        rows = np.concatenate([dst, np.arange(n)])
        cols = np.concatenate([src, np.arange(n)])
        values = (1 / np.sqrt(deg[rows] * deg[cols])).astype(np.float32)
        op = SparseOperator.from_coo(torch.from_numpy(rows), torch.from_numpy(cols), torch.from_numpy(values), (n, n))
        A = op.matrix
        index_bytes = A.col_indices().element_size()
        for width in (int(w) for w in args.widths.split(",")):
            x = torch.randn(n, width)
            compulsory = op.nnz * (index_bytes + 4) + (n + 1) * index_bytes + 2 * n * width * 4
            kernels = [("torch sparse", lambda: torch.sparse.mm(A, x))]
            if native is not None:
                kernels.insert(0, ("native", lambda: native.csr_spmm(A.crow_indices(), A.col_indices(), A.values(),
                                                                     x, None)))
            for name, fn in kernels:
                seconds = timed(fn, args.repeats)
                bw = compulsory / seconds
                touched = (op.nnz * (width * 4 + index_bytes + 4) + n * width * 4) / seconds
                print(f"| {order_name} | {width} | {name} | {seconds * 1e3:.0f} | {bw / 1e9:.1f} | "
                      f"{100 * bw / copy_bw:.0f}% | {touched / 1e9:.1f} | {100 * touched / (copy_bw / 2):.0f}% |",
                      flush=True)

    print("\n| working set MB | ns per random 64-byte row gather |")
    print("|---|---|")
    picks = 2_000_000
    for mb in (1, 4, 8, 16, 32, 64, 256):
        rows_in_set = mb * 2**20 // 64
        table = torch.randn(rows_in_set, 16)
        index = torch.randint(0, rows_in_set, (picks,))
        out = torch.empty(picks, 16)
        seconds = timed(lambda: torch.index_select(table, 0, index, out=out), args.repeats)
        print(f"| {mb} | {seconds / picks * 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
