"""Models: one file per model, each registering its layer class (gnn_dist.models.registry; the base class
every layer derives from: gnn_dist.models.base).

Importing this package imports every module of its folder, which registers the built-in models.

May import: halo, kernels, nn, plugins
"""
from gnn_dist.models.registry import check_model_fits, model_class, model_names, one_of, register_model
from gnn_dist.plugins.registry import import_modules_of

import_modules_of(__name__, __path__, first=("registry", "base", "gcn"))

__all__ = ["check_model_fits", "model_class", "model_names", "one_of", "register_model"]
