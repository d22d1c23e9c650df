"""gnn-dist: distributed full-batch GNN training over METIS partitions with MPI.

The Python API for user scripts (see examples/train_gcn.py):

    from gnn_dist import ModelConfig, RankContext, TrainConfig, make_world_comm, train
    final = train(RankContext(make_world_comm()), TrainConfig(parts="parts/", model=ModelConfig()))
"""
from gnn_dist.comm import make_world_comm
from gnn_dist.context import RankContext, SetupError
from gnn_dist.model import ModelConfig
from gnn_dist.trainer import TrainConfig, train

__all__ = ["ModelConfig", "RankContext", "SetupError", "TrainConfig", "make_world_comm", "train"]
__version__ = "0.1.0"
