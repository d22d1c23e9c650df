"""The model registry: `--model NAME` -> the layer class that a model file registered.

A model is one file under gnn_dist/models/ (or any module a user imports
before training) holding a `DistConv` subclass decorated with
`@register_model`. Everything model-specific reads it from here: the CLI's
choices, the model stack (gnn_dist.steps.layer_stack.LayerStack), the operator's
normalisation, sampled mode's block operators, inspect's byte prediction and
the memory plan. docs/extending.md walks through adding one.
"""
from __future__ import annotations

from gnn_dist.plugins.registry import Registry, one_of

MODELS = Registry("--model", "layer class")
register_model = MODELS.register  # class decorator: a gnn_dist.models.base.DistConv as --model cls.name
model_names = MODELS.names
model_class = MODELS.get


def check_model_fits(name: str, node_types: list[str] | None, parts: str) -> None:
    """ValueError naming the fix when --model `name` and the partition at `parts` disagree on being typed
    (node_types: the typed partition's node types; None for a homogeneous one)."""
    typed_model = getattr(model_class(name), "typed", False)
    if node_types is None and typed_model:
        raise ValueError(f"--model {name} trains typed graphs, and {parts} holds a homogeneous one: partition a "
                         f"typed graph (--dataset hetero:PATH), or pick another --model")
    if node_types is not None and not typed_model:
        typed_models = [other for other in model_names() if getattr(model_class(other), "typed", False)]
        raise ValueError(f"{parts} holds a typed graph ({', '.join(node_types)}): train it with "
                         f"--model {one_of(typed_models)}")


__all__ = ["MODELS", "check_model_fits", "model_class", "model_names", "one_of", "register_model"]
