"""A user's model named on the command line, MODULE_OR_FILE:NAME: the callable it names, the keyword arguments
it is built with, and the model built from them (gnn-dist train --model, and gnn-dist export of its
checkpoints, which record both)."""
from __future__ import annotations

import inspect

from torch import nn

from gnn_dist.plugins.loading import import_target

# The keywords PyG's basic models (GCN, GraphSAGE, GIN, GAT, PNA, EdgeCNN) take, which the command line fills
BASIC_KEYWORDS = ("in_channels", "hidden_channels", "num_layers", "out_channels", "dropout")


def model_callable(spec: str):
    """The class or function MODULE_OR_FILE:NAME names (ValueError naming the fix when it cannot be had)."""
    module_name, _, name = spec.rpartition(":")
    try:
        module = import_target(module_name, prefix="gnn_dist_model_")
    except Exception as err:  # noqa: BLE001 - any failure of user code is one line
        raise ValueError(f"--model {spec}: cannot import {module_name} ({type(err).__name__}: {err}): give an "
                         f"importable module or a .py file") from None
    built = getattr(module, name, None)
    if not callable(built):
        raise ValueError(f"--model {spec}: {module_name} has no class or function {name}")
    return built


def model_keywords(build, basic: dict, extra: dict) -> dict:
    """The keyword arguments `build` is called with: those of `basic` (BASIC_KEYWORDS' values) that it takes, all
    of them when it takes **kwargs, then `extra` over them (--model-kwargs)."""
    try:
        parameters = inspect.signature(build).parameters
    except (TypeError, ValueError):  # no signature to read: give it everything
        parameters = None
    if parameters is not None and not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        basic = {k: v for k, v in basic.items() if k in parameters}
    return {**basic, **extra}


def build_model(spec: str, keywords: dict) -> nn.Module:
    """spec's model built with `keywords` (torch's generator as the caller seeded it)."""
    build = model_callable(spec)
    try:
        model = build(**keywords)
    except Exception as err:  # noqa: BLE001 - the user's constructor: one line naming the call
        call = ", ".join(f"{k}={v!r}" for k, v in keywords.items())
        raise ValueError(f"--model {spec}: {getattr(build, '__name__', spec)}({call}) failed "
                         f"({type(err).__name__}: {err}): give its arguments in --model-kwargs") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"--model {spec} returned a {type(model).__name__}, not a torch.nn.Module")
    return model
