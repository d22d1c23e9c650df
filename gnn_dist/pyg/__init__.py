"""Your model, your loop: an unmodified PyG model trained full-batch on a partition, exact at any P, or on
sampled mini-batches (gd.NeighborLoader).

    ctx = gd.init(); data = gd.load_partition(DIR, ctx)
    model = gd.distribute(Net(...), data)        # every MessagePassing layer's node inputs get their halo rows
    loss = gd.cross_entropy(model(data.x, data.edge_index), data.y, data.train_mask)

part_data.py   a rank's part as a torch_geometric Data (owned rows, in-edges in local ids) and its halo graph
passes.py      the state of one wrapped forward: which part, which step, which call (thread-local: simulated
               ranks are threads)
halo_hooks.py  PyG's propagate and edge-update pre-hooks: node tensors extended by their halo rows
gcn_norm.py    gcn_norm over the whole graph's degrees (GCNConv, GCN2Conv, APPNP, SGConv, TAGConv, ...)
dropout.py     dropout keyed by original node ids or edge (source, target) ids, the same at every P
batch_norm.py  BatchNorm1d with statistics over every rank's rows
wrapper.py     gd.distribute: refusals, hooks, parameter broadcast, the gradient sum after each backward
reductions.py  gd.init, gd.all_reduce, gd.replicated, gd.cross_entropy, gd.accuracy
checkpoint.py  gd.save / gd.load: the model, the optimizer and the step, resumable at any P
loader.py      gd.NeighborLoader: sampled mini-batches laid out as PyG's, from gnn-dist's keyed sampler
model_spec.py  a MODULE_OR_FILE:NAME model (gnn-dist train --model, export): imported, its keywords, built

May import: comm, context, graph, halo, kernels, memory, models, nn, partition, plugins, schedules, steps
"""
