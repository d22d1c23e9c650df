"""Runs that survive failure: checkpoints (written once for what is replicated, per rank for the rest),
`gnn-dist supervise` (restart a failed job, on the hosts still answering), the per-rank watchdog, and the
failure injection the failure tests use (faults).

May import: comm, config, context, kernels, log, partition, plugins, pyg
"""
