"""PyG's GraphSAGE trained on sampled mini-batches of a partitioned graph, then evaluated full-batch, exactly.

    gnn-dist partition --dataset synthetic:arxiv --num-parts 2 --out parts/arxiv2
    mpiexec -n 2 python examples/pyg_neighbor_sampling.py parts/arxiv2

The loop is PyG's NeighborLoader loop; the lines marked "gnn-dist" are what differ from single-process PyG.
Each rank draws batches of its own training nodes; the gradients are summed over ranks every step, so a step
at P ranks is one process's step on the P batches together.
"""
import argparse

import torch
from torch_geometric.nn.models import GraphSAGE

import gnn_dist as gd

parser = argparse.ArgumentParser()
parser.add_argument("parts")
parser.add_argument("--hidden", type=int, default=256)
parser.add_argument("--num-layers", type=int, default=3)
parser.add_argument("--fanouts", default="15,10,5")
parser.add_argument("--batch-size", type=int, default=1024)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

ctx = gd.init()                                                                   # gnn-dist
data = gd.load_partition(args.parts, ctx)                                         # gnn-dist
torch.manual_seed(args.seed)
loader = gd.NeighborLoader(data, num_neighbors=[int(f) for f in args.fanouts.split(",")],   # gnn-dist
                           input_nodes=data.train_mask, batch_size=args.batch_size, shuffle=True)
net = GraphSAGE(data.num_features, args.hidden, args.num_layers, data.num_classes, dropout=0.5)
model = gd.distribute(net)                                                        # gnn-dist
optimizer = torch.optim.Adam(model.parameters(), lr=0.003)

for epoch in range(1, args.epochs + 1):
    model.train()
    total = seeds = 0
    for batch in loader:
        optimizer.zero_grad()
        out = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                    num_sampled_edges_per_hop=batch.num_sampled_edges)[:batch.batch_size]
        loss = gd.cross_entropy(out, batch.y[:batch.batch_size])                  # gnn-dist
        loss.backward()
        optimizer.step()
        total, seeds = total + loss.item() * batch.batch_size, seeds + batch.batch_size
    if ctx.is_root:
        print(f"epoch {epoch} loss {total / max(seeds, 1):.6f}")

whole = gd.distribute(model.module, data)           # gnn-dist: the same weights, full-batch over the halo
whole.eval()
with torch.no_grad():
    out = whole(data.x, data.edge_index)
accuracy = gd.accuracy(out, data.y, data.test_mask)                               # gnn-dist
if ctx.is_root:
    print(f"test accuracy {accuracy:.4f}")
