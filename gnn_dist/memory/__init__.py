"""Memory as measured on this host: resident memory per phase (rss), and what fits on the host with the
refusal to start a job that would not (host). Used by training and by the partitioner alike, so it sits
beneath both; the memory *plan* (predictions from a model and a partition) is gnn_dist.plan.

May import: kernels
"""
