"""Your own PyG model in your own training loop, on every rank of a partitioned graph.

    gnn-dist partition --dataset planetoid:Cora --root ../shared/data/planetoid --num-parts 2 --out parts/cora2
    mpiexec -n 2 python examples/pyg_node_classification.py parts/cora2 --model gat

The loop is PyG's own; the lines marked "gnn-dist" are all that differ from single-process PyG. The model is
PyG's GCN, GraphSAGE, GIN or GAT as they ship (--model), or any model of your own built from PyG layers.
"""
import argparse

import torch
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

import gnn_dist as gd

parser = argparse.ArgumentParser()
parser.add_argument("parts")
parser.add_argument("--model", choices=["gcn", "sage", "gin", "gat"], default="gcn")
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--dropout", type=float, default=0.5)
parser.add_argument("--schedule", default="exact", help="exact, stale:R or pipeline")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

ctx = gd.init()                                                           # gnn-dist
data = gd.load_partition(args.parts, ctx)                                 # gnn-dist
torch.manual_seed(args.seed)
models = {"gcn": GCN, "sage": GraphSAGE, "gin": GIN, "gat": GAT}
net = models[args.model](data.num_features, args.hidden, 2, data.num_classes, dropout=args.dropout)
model = gd.distribute(net, data, schedule=args.schedule)                  # gnn-dist
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

for epoch in range(1, args.epochs + 1):
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.edge_index)
    loss = gd.cross_entropy(out, data.y, data.train_mask)                 # gnn-dist
    loss.backward()
    optimizer.step()
    if ctx.is_root:
        print(f"epoch {epoch} loss {loss.item():.6f}")

model.eval()
with torch.no_grad():
    out = model(data.x, data.edge_index)
accuracy = gd.accuracy(out, data.y, data.test_mask)                       # gnn-dist
sent = gd.all_reduce(torch.tensor([float(model.graph.exchanger.counters.halo_bytes)]))
if ctx.is_root:
    print(f"test accuracy {accuracy:.4f}, halo bytes sent {int(sent.item()):,}")
