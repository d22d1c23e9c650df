"""What a memory plan depends on: the model and the training options that change memory (`PlanConfig`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from gnn_dist.config import DEFAULT_HALO_BLOCK_ROWS, ModelConfig


@dataclass(frozen=True)
class PlanConfig:
    """The model and the training options that memory depends on (the rest of train's options do not)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    halo_memory: str = "resident"
    halo_block_rows: int = DEFAULT_HALO_BLOCK_ROWS
    feature_dtype: str = "fp32"
    eval_chunk_nodes: int = 16384
    schedule: str = "exact"
    task: str = "node"
    neg_ratio: int = 1       # --task link
    decoder: str = "dot"     # --task link
    negatives: str = "source"  # --task link: pairs draws (and fetches) each negative's source too
    mode: str = "full"       # full-batch training (sampled: the sparse first layer's copy is not made)
    device: str = "cpu"      # cuda: the plan is the GPU's (plan_part) and the host's is plan_host's
    # Overlapped exchanges go through the host's shared memory (gnn_dist.halo.shared): every rank on one host,
    # fp32 halos, GNN_DIST_SHARED_HALO not 0. A plan made before launch (inspect) assumes one host.
    shared_halo: bool = True
