"""gnn-dist: distributed full-batch and sampled GNN training over partitioned graphs with MPI.

The Python API for user scripts (see examples/train_gcn.py):

    from gnn_dist import ModelConfig, RankContext, TrainConfig, make_world_comm, train
    final = train(RankContext(make_world_comm()), TrainConfig(parts="parts/", model=ModelConfig()))

Models and schedules are registries (gnn_dist.models, gnn_dist.schedules; docs/extending.md). The names below
load on first use, so importing one module of the package (its config, say) does not load the runtime.
"""
import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path as _Path

# The repository keeps partition/, kernels/ and benchmarks/ beside this folder; installing maps them to
# gnn_dist.partition, gnn_dist.kernels and gnn_dist.benchmarks (pyproject.toml). A checkout imported by path
# (PYTHONPATH, or python -m from its root) must use its own folders, not those of whichever checkout is
# installed: exactly these three subpackages, and nothing else of the checkout's root, become importable here.
_MAPPED = ("partition", "kernels", "benchmarks")
_checkout = _Path(__file__).resolve().parent.parent


class _CheckoutSubpackages(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        if package != __name__ or name not in _MAPPED:
            return None
        init = _checkout / name / "__init__.py"
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


if not (_Path(__file__).parent / "partition").is_dir() and (_checkout / "partition" / "__init__.py").is_file():
    sys.meta_path.insert(0, _CheckoutSubpackages())

_API = {
    "make_world_comm": "gnn_dist.comm",
    "ModelConfig": "gnn_dist.config", "SampledConfig": "gnn_dist.config", "TrainConfig": "gnn_dist.config",
    "RankContext": "gnn_dist.context", "SetupError": "gnn_dist.context",
    "register_model": "gnn_dist.models", "register_schedule": "gnn_dist.schedules",
    "train": "gnn_dist.training",
}
__all__ = sorted(_API)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
