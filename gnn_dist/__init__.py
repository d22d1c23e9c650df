"""gnn-dist: distributed full-batch and sampled GNN training over partitioned graphs with MPI.

Your own PyG model in your own loop (docs/your-model.md, examples/pyg_*.py):

    import gnn_dist as gd
    ctx = gd.init(); data = gd.load_partition("parts/", ctx)
    model = gd.distribute(Net(data.num_features, 64, data.num_classes), data)
    loss = gd.cross_entropy(model(data.x, data.edge_index), data.y, data.train_mask)

The built-in models' training loop (see examples/train_gcn.py):

    from gnn_dist import ModelConfig, RankContext, TrainConfig, make_world_comm, train
    final = train(RankContext(make_world_comm()), TrainConfig(parts="parts/", model=ModelConfig()))

Models and schedules are registries (gnn_dist.models, gnn_dist.schedules; docs/extending.md). The names below
load on first use, so importing one module of the package (its config, say) does not load the runtime.
docs/architecture.md is the map of the subpackages and of which may import which.

May import: anything, and only on first use of a name of the API below
"""
import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path as _Path

# The repository keeps partition/, kernels/ and benchmarks/ beside this folder, and the wheel installs them as
# gnn_dist.partition, gnn_dist.kernels and gnn_dist.benchmarks (setup.py). A checkout imported by path
# (PYTHONPATH=TREE, as benchmarks/regression.py and scripts/mutants.py run another tree, or python -m from its
# root) must find them in its own folders, not in whichever checkout an editable install points at. Exactly
# these three names are mapped, by a finder placed before every other: the checkout's root itself (its tests/,
# scripts/, examples/) never becomes part of the package. An installed wheel has the folders inside and
# installs no finder.
_MAPPED = ("partition", "kernels", "benchmarks")
_checkout = _Path(__file__).resolve().parent.parent


class _CheckoutFolders(importlib.abc.MetaPathFinder):
    """gnn_dist.partition, gnn_dist.kernels and gnn_dist.benchmarks from this checkout's top folders; their
    submodules are then found the usual way, under the folder."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        if package != __name__ or name not in _MAPPED:
            return None
        init = _checkout / name / "__init__.py"
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


if not (_Path(__file__).parent / "partition").is_dir() and (_checkout / "partition" / "__init__.py").is_file():
    sys.meta_path.insert(0, _CheckoutFolders())

_API = {
    "make_world_comm": "gnn_dist.comm.communicator",
    "ModelConfig": "gnn_dist.config", "SampledConfig": "gnn_dist.config", "TrainConfig": "gnn_dist.config",
    "RankContext": "gnn_dist.context", "SetupError": "gnn_dist.context",
    "register_model": "gnn_dist.models", "register_schedule": "gnn_dist.schedules",
    "train": "gnn_dist.training",
    # your model, your loop (docs/your-model.md)
    "init": "gnn_dist.pyg.reductions", "all_reduce": "gnn_dist.pyg.reductions",
    "replicated": "gnn_dist.pyg.reductions", "cross_entropy": "gnn_dist.pyg.reductions",
    "accuracy": "gnn_dist.pyg.reductions", "degree_histogram": "gnn_dist.pyg.reductions",
    "load_partition": "gnn_dist.pyg.part_data",
    "distribute": "gnn_dist.pyg.wrapper", "with_halo": "gnn_dist.pyg.halo_hooks",
    "save": "gnn_dist.pyg.checkpoint", "load": "gnn_dist.pyg.checkpoint",
    "NeighborLoader": "gnn_dist.pyg.loader",
}
__all__ = sorted(_API)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
