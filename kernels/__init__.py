"""Sparse aggregation kernels behind one dispatcher (gnn_dist.kernels.spmm)."""
