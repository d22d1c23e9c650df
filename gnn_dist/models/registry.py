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

__all__ = ["MODELS", "model_class", "model_names", "one_of", "register_model"]
