"""The model registry: `--model NAME` -> the layer class that a model file registered.

A model is one file under gnn_dist/models/ (or any module a user imports
before training) holding a `DistConv` subclass decorated with
`@register_model`. Everything model-specific reads it from here: the CLI's
choices, the model stack (gnn_dist.layer_stack.LayerStack), the operator's
normalisation, sampled mode's block operators, inspect's byte prediction and
the memory plan. docs/extending.md walks through adding one.
"""
from __future__ import annotations

_MODELS: dict[str, type] = {}


def register_model(conv_class: type) -> type:
    """Class decorator: make `conv_class` (a gnn_dist.models.base.DistConv) available as --model conv_class.name."""
    name = getattr(conv_class, "name", "")
    if not name or not isinstance(name, str):
        raise ValueError(f"{conv_class.__name__} needs a class attribute `name` (its --model NAME)")
    if name in _MODELS and _MODELS[name] is not conv_class:
        raise ValueError(f"--model {name} is registered twice: by {_MODELS[name].__qualname__} and "
                         f"{conv_class.__qualname__}")
    _MODELS[name] = conv_class
    return conv_class


def model_names() -> tuple[str, ...]:
    return tuple(_MODELS)


def model_class(name: str) -> type:
    """The layer class of --model NAME; ValueError naming the valid choices otherwise."""
    try:
        return _MODELS[name]
    except KeyError:
        raise ValueError(f"unknown --model {name!r}: use {one_of(model_names())}") from None


def one_of(names) -> str:
    """'a', 'a or b', 'a, b or c'."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
