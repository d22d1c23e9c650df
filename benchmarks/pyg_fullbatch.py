"""PyG's own full-batch GCN, GraphSAGE or GAT on the whole graph, one process: the baseline we are measured against.

    python -m gnn_dist.benchmarks.pyg_fullbatch --dataset synthetic:arxiv --path edge_index|csr --epochs 5

Prints one JSON line: median epoch time, peak RSS, test accuracy. Paths:
`edge_index` is GCNConv's default message passing (gcn_norm cached);
`csr` feeds GCNConv a normalised torch sparse CSR adjacency (PyG's fast path).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="synthetic:arxiv")
    parser.add_argument("--root", default=None)
    parser.add_argument("--path", choices=["edge_index", "csr"], default="edge_index")
    parser.add_argument("--model", choices=["gcn", "sage", "gat"], default="gcn")
    parser.add_argument("--heads", type=int, default=1, help="GAT: heads per hidden layer (the output layer has one)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (peak device memory is reported on cuda)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from torch_geometric.nn import GATConv, GCNConv, SAGEConv
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    from gnn_dist.partition.datasets import load_dataset

    device = torch.device(args.device)
    g = load_dataset(args.dataset, args.root)
    x, y = torch.from_numpy(g.x).to(device), torch.from_numpy(g.y).to(device)
    edge_index = torch.from_numpy(g.edge_index).to(device)
    train, test = torch.from_numpy(g.train_mask).to(device), torch.from_numpy(g.test_mask).to(device)
    dims = [g.num_features] + [args.hidden * args.heads] * (args.num_layers - 1) + [g.num_classes]
    if args.model == "gat":
        if args.path != "edge_index":
            parser.error("--model gat runs on the edge_index path (PyG's GATConv takes no torch CSR adjacency)")
        last = len(dims) - 2
        convs = torch.nn.ModuleList(GATConv(i, o if k == last else o // args.heads, heads=1 if k == last else args.heads,
                                            dropout=args.dropout)
                                    for k, (i, o) in enumerate(zip(dims[:-1], dims[1:])))
    elif args.model == "gcn":
        convs = torch.nn.ModuleList(GCNConv(i, o, cached=True, normalize=args.path == "edge_index")
                                    for i, o in zip(dims[:-1], dims[1:]))
    else:
        convs = torch.nn.ModuleList(SAGEConv(i, o) for i, o in zip(dims[:-1], dims[1:]))
    if args.path == "csr" and args.model != "gat":
        if args.model == "gcn":
            ei, w = gcn_norm(edge_index, None, g.num_nodes, add_self_loops=True)
        else:
            ei, w = edge_index, None
        adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], device=device) if w is None else w,
                                      (g.num_nodes, g.num_nodes)).coalesce().to_sparse_csr()
        graph_arg = adj
    else:
        graph_arg = edge_index
    convs = convs.to(device)
    opt = torch.optim.Adam(convs.parameters(), lr=0.01, weight_decay=5e-4)

    def forward(training: bool) -> torch.Tensor:
        h = x
        for k, conv in enumerate(convs):
            h = F.dropout(h, args.dropout, training)
            h = conv(h, graph_arg)
            if k < len(convs) - 1:
                h = torch.relu(h)
        return h

    times = []
    for _ in range(args.epochs):
        start = time.perf_counter()
        convs.train()
        opt.zero_grad()
        out = forward(True)
        F.cross_entropy(out[train], y[train]).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the epoch's kernels have run, not only been queued
        times.append(time.perf_counter() - start)
    convs.eval()
    with torch.no_grad():
        acc = float((forward(False).argmax(1)[test] == y[test]).float().mean())
    print(json.dumps({"path": args.path, "model": args.model, "epochs": args.epochs,
                      "epoch_s_median": statistics.median(times), "epoch_s": times, "test_acc": acc,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "peak_device_bytes": int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda"
                      else None}))


if __name__ == "__main__":
    main()
