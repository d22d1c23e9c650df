"""A rank's view of its part of the graph.

    local_graph    its owned rows' data and the normalised operator over [owned | halo] columns
    sampler        distributed neighbour sampling (--mode sampled), keyed by original ids
    feature_store  features of sampled nodes: this rank's, its halo's, a cache, remote owners'

May import: comm, device, halo, kernels, partition
"""
