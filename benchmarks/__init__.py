"""Benchmark scripts: each prints a markdown table and writes JSON rows (see benchmarks/README.md).

They sit above the runtime and beneath the command line (`gnn-dist bench` runs the harness); the package's
API is `gnn_dist` below.

May import: comm, config, gnn_dist, graph, kernels, link, partition, plan, plugins, tasks, training
"""
