"""A user's script in which one rank alone fails while the others wait in a collective: the job must end."""
import sys

import torch
from torch_geometric.nn import GCNConv

import gnn_dist as gd

ctx = gd.init()
data = gd.load_partition(sys.argv[1], ctx)
model = gd.distribute(GCNConv(data.num_features, data.num_classes), data)
if ctx.rank == 1:
    raise ValueError("rank 1's own mistake")
gd.all_reduce(torch.ones(1))  # the other ranks wait here for a rank that will never come
