"""Typed (heterogeneous) graphs on a rank: which of its rows are of which type and which relation each operator
entry belongs to (typed_part), the typed inputs (a Linear per featured type, and per featureless type an
embedding table sharded by owner, whose halo rows travel every step: inputs), and the typed model stack
(stack: the inputs, then R-GCN or R-GAT layers, gnn_dist.models), and sampled training on typed graphs (sampler:
a fanout per relation; batch_inputs: per-type features and embedding rows fetched from their owners;
mini_batch: the mode).

May import: graph, halo, kernels, models, nn, partition, steps
"""
