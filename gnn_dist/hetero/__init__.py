"""Typed (heterogeneous) graphs on a rank: which of its rows are of which type and which relation each operator
entry belongs to (typed_part), the typed inputs (a Linear per featured type, and per featureless type an
embedding table sharded by owner, whose halo rows travel every step: inputs), and the typed model stack
(stack: the inputs, then R-GCN layers, gnn_dist.models.rgcn).

May import: halo, kernels, models, nn, partition
"""
