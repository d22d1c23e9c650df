"""gnn-dist: distributed full-batch GNN training over METIS partitions with MPI.

The Python API for user scripts (see examples/train_gcn.py):

    from gnn_dist import ModelConfig, RankContext, TrainConfig, make_world_comm, train
    final = train(RankContext(make_world_comm()), TrainConfig(parts="parts/", model=ModelConfig()))

Models and schedules are registries (gnn_dist.models, gnn_dist.schedules; docs/extending.md).
"""
from pathlib import Path as _Path

# The repository keeps partition/, kernels/ and benchmarks/ beside this folder; installing maps them to
# gnn_dist.partition, gnn_dist.kernels and gnn_dist.benchmarks (pyproject.toml). A checkout imported by
# path (PYTHONPATH, or python -m from its root) must use its own folders, not those of whichever checkout
# is installed, so there the search path of gnn_dist's subpackages goes on to the checkout's root.
_checkout = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "partition").is_dir() and (_checkout / "partition" / "__init__.py").is_file():
    __path__.append(str(_checkout))  # noqa: F821 - a package's own __path__

from gnn_dist.comm import make_world_comm
from gnn_dist.config import ModelConfig, SampledConfig, TrainConfig
from gnn_dist.context import RankContext, SetupError
from gnn_dist.models import register_model
from gnn_dist.schedules import register_schedule
from gnn_dist.training import train

__all__ = ["ModelConfig", "RankContext", "SampledConfig", "SetupError", "TrainConfig", "make_world_comm", "register_model",
           "register_schedule", "train"]
__version__ = "0.1.0"
