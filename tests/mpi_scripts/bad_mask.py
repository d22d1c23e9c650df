"""A user's script with a mistake every rank makes alike: a mask of the wrong length (one line, non-zero exit)."""
import sys

from torch_geometric.nn import GCNConv

import gnn_dist as gd

ctx = gd.init()
data = gd.load_partition(sys.argv[1], ctx)
model = gd.distribute(GCNConv(data.num_features, data.num_classes), data)
out = model(data.x, data.edge_index)
gd.cross_entropy(out, data.y, data.train_mask[:3]).backward()
