"""Link prediction's parts (`--task link`, gnn_dist.tasks.link): the rank's split pairs (pairs), keyed training
negatives (negatives), rows of remote nodes fetched for scoring (row_fetch), pair decoders (decoders), ranking
metrics (metrics), evaluation over all ranks (evaluation), and its full-batch and sampled training steps
(full_batch, mini_batch).

May import: comm, device, halo, kernels, models, partition, steps
"""
