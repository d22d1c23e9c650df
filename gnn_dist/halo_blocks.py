"""Moved to gnn_dist.halo.blocks; this name stays for plugins written against it (docs/extending.md showed
`gnn_dist.halo_blocks.BlockPass` to schedule authors). New code imports gnn_dist.halo.blocks.

May import: halo
"""
from gnn_dist.halo.blocks import BlockedOperator, BlockPass, HaloBlock, aggregate_local, row_masses

__all__ = ["BlockPass", "BlockedOperator", "HaloBlock", "aggregate_local", "row_masses"]
