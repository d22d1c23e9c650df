"""Models: one file per model, each registering its layer (see gnn_dist.models.registry).

Importing this package registers the built-in models.
"""
from gnn_dist.models import gat, gcn, sage  # noqa: F401 - registers the built-in models
from gnn_dist.models.registry import model_class, model_names, one_of, register_model

__all__ = ["model_class", "model_names", "one_of", "register_model"]
