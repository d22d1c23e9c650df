"""Sparse aggregation kernels behind one dispatcher (kernels.spmm)."""
