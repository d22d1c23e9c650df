"""`gnn-dist export`: a trained model as a plain PyTorch Geometric module that loads without gnn-dist.

    gnn-dist export --checkpoint-dir CK --out model.pt        # writes model.pt and model.json beside it

model.pt is the `state_dict` (torch.save) of a `torch_geometric.nn.Sequential` over (x, edge_index) holding
each layer's PyG equivalent, as the model registry names it (DistConv.pyg_spec: GCNConv, SAGEConv,
GATConv), with Dropout before every conv and BatchNorm1d and ReLU between them, as gnn-dist's layer stack
runs them. model.json lists the layers (class path, arguments, how each is called) and what gnn-dist trained.
Without gnn-dist (docs/export.md):

    import importlib, json, torch, torch_geometric.nn as pyg
    spec = json.load(open("model.json"))
    make = lambda l: getattr(importlib.import_module(l["module"].rpartition(".")[0]), l["module"].rpartition(".")[2])
    model = pyg.Sequential(spec["input"], [(make(l)(**l["kwargs"]), l["call"]) for l in spec["layers"]]).eval()
    model.load_state_dict(torch.load("model.pt", weights_only=True))

`load_pyg(path)` does that. A link-prediction model (--task link) exports its encoder so; model.json's
"decoder" says how to score a pair from two embeddings: "dot" (their dot product), or "mlp", whose weights
are in model.decoder.pt, the state_dict of torch.nn.Sequential(Linear(D, D), ReLU(), Linear(D, 1)) applied
to z_u * z_v (`load_decoder(path)` builds it). The model then runs on the whole graph as gnn-dist partitioned it: undirected
(both directions of every edge), without self loops, features as partitioned (--normalize-features included).
A model whose layer has no PyG equivalent built from plain arguments is refused with one line.

A model trained with --model MODULE_OR_FILE:NAME is exported as itself: model.pt is its own state_dict, and
model.json names MODULE_OR_FILE:NAME and the keyword arguments it was built with (load_pyg imports and
builds it: the user's module must be importable where it loads).

May import: config, context, models, plugins, pyg, resilience
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gnn_dist.config import ModelConfig
from gnn_dist.context import SetupError
from gnn_dist.export.files import spec_path, write_export
from gnn_dist.models import model_class
from gnn_dist.models.base import build_module

FORMAT = "gnn-dist-pyg-1"
USER_MODEL_FORMAT = "gnn-dist-user-model-1"
INPUT = "x, edge_index"


def pyg_layers(config: ModelConfig, in_dim: int, out_dim: int) -> tuple[list[dict], dict[str, str]]:
    """The layers of the exported Sequential, and our state_dict key -> its key."""
    conv_class = model_class(config.model)
    layers, names = [], {}
    widths = config.layers(in_dim, out_dim)
    for k, (i, o, options) in enumerate(widths):
        spec = conv_class.pyg_spec(i, o, **options)
        if spec is None:
            raise SetupError(f"--model {config.model} has no PyG layer that plain arguments build, so it cannot be "
                             f"exported as a torch_geometric module: use gnn-dist embed for its outputs instead")
        layers.append({"module": "torch.nn.Dropout", "kwargs": {"p": config.dropout}, "call": "x -> x"})
        index = len(layers)
        layers.append({"module": spec[0], "kwargs": spec[1], "call": f"{INPUT} -> x"})
        for ours, theirs in conv_class.pyg_parameter_names().items():
            names[f"convs.{k}.{ours}"] = f"module_{index}.{theirs}"
        if k < len(widths) - 1:
            if config.batch_norm:
                index = len(layers)
                layers.append({"module": "torch.nn.BatchNorm1d", "kwargs": {"num_features": o}, "call": "x -> x"})
                for name in ("weight", "bias", "running_mean", "running_var"):
                    names[f"norms.{k}.{name}"] = f"module_{index}.{name}"
            layers.append({"module": "torch.nn.ReLU", "kwargs": {}, "call": "x -> x"})
    return layers, names


def build(spec: dict) -> nn.Module:
    """The Sequential a spec (model.json) describes, with fresh parameters."""
    from torch_geometric.nn import Sequential

    if spec.get("format") != FORMAT:
        raise ValueError(f"not a gnn-dist export (format {spec.get('format')!r}, expected {FORMAT})")
    return Sequential(spec["input"], [(build_module(layer["module"], layer["kwargs"]), layer["call"])
                                      for layer in spec["layers"]])


def export(checkpoint_dir: str, out: str) -> dict:
    """Write out (state_dict) and its .json spec from the newest checkpoint; returns the spec."""
    from gnn_dist.pyg.checkpoint import epoch_files
    from gnn_dist.resilience.checkpoint import encoder_weights, trained_model

    user_model = epoch_files(checkpoint_dir)
    if user_model:
        return _export_user_model(user_model[-1], out)
    fields, all_weights, manifest = trained_model(checkpoint_dir)
    if getattr(model_class(fields["model"]), "typed", False):
        return _export_typed(checkpoint_dir, fields, all_weights, manifest, out)
    weights = encoder_weights(all_weights)
    config = ModelConfig(**fields)
    config.validate()
    in_dim, out_dim = _io_widths(config, weights, manifest)
    layers, names = pyg_layers(config, in_dim, out_dim)
    spec = {"format": FORMAT, "input": INPUT, "layers": layers,
            "gnn_dist": {"model": fields, "in_channels": in_dim, "out_channels": out_dim,
                         "graph": manifest.get("graph"), "epochs": manifest.get("next_epoch"),
                         "task": manifest.get("task", {"task": "node"})}}
    writes = []
    task = spec["gnn_dist"]["task"]
    if task["task"] == "link":
        spec["decoder"] = {"kind": task["decoder"]}
        if task["decoder"] == "mlp":
            decoder = mlp_decoder(out_dim)
            decoder.load_state_dict({f"{index}.{name}": all_weights[f"decoder.{layer}.{name}"]
                                     for index, layer in ((0, "hidden"), (2, "out")) for name in ("weight", "bias")})
            spec["decoder"].update(file=decoder_path(out).name, input="z_u * z_v")
            writes.append((decoder_path(out), lambda p, d=decoder: torch.save(d.state_dict(), p)))
    module = build(spec)
    state = module.state_dict()
    for ours, theirs in names.items():
        state[theirs] = weights[ours].reshape(state[theirs].shape).clone()
    module.load_state_dict(state)  # every one of ours has a place, and the shapes agree
    write_export(out, module, spec, writes)
    return spec


def _export_user_model(path: Path, out: str) -> dict:
    """A --model MODULE_OR_FILE:NAME checkpoint: the user's model rebuilt as trained, with its weights."""
    from gnn_dist.pyg.checkpoint import read

    state = read(path)
    run = state.get("run") or {}
    if "model" not in run:
        raise SetupError(f"{path} was written by gd.save in a script, not by a --model MODULE:NAME run of the "
                         f"command line: load it with gd.load in that script")
    spec = {"format": USER_MODEL_FORMAT, "model": run["model"], "keywords": json.loads(run["keywords"]),
            "gnn_dist": {"graph": {"dataset": run["dataset"], "num_nodes": run["num_nodes"]}, "epochs": run["epoch"]}}
    module = _user_model(spec)
    module.load_state_dict(state["model"])
    write_export(out, module, spec)
    return spec


def _user_model(spec: dict) -> nn.Module:
    from gnn_dist.pyg.model_spec import build_model

    return build_model(spec["model"], spec["keywords"])


def _export_typed(checkpoint_dir: str, fields: dict, weights: dict, manifest: dict, out: str) -> dict:
    """A typed graph's model (gnn_dist.export.typed): its input is a HeteroData, and its embedding tables are
    put together from the ranks' shards."""
    from gnn_dist.export.typed import typed_model
    from gnn_dist.resilience.checkpoint import shard_files
    from gnn_dist.resilience.sharded import fill_rows

    hetero = manifest.get("hetero")
    if hetero is None:
        raise SetupError(f"{checkpoint_dir} holds a typed model written before export recorded the graph's types: "
                         f"resume it with --resume and train one epoch to rewrite the checkpoint, then export")
    config = ModelConfig(**fields)
    config.validate()
    # each featureless type's whole table, its rows by id from every rank's file, one file at a time
    tables = {t: torch.empty(hetero["num_nodes"][t], config.hidden)  # host: export's, written from the host
              for t, width in hetero["feature_widths"].items() if not width}
    try:
        fill_rows({f"inputs.shards.{t}": (table, np.arange(len(table))) for t, table in tables.items()},
                  shard_files(checkpoint_dir))
    except ValueError as err:
        raise SetupError(f"{checkpoint_dir}'s newest checkpoint does not hold this model's embedding rows ({err}): "
                         f"delete its newest epoch folder to export the checkpoint before it") from err
    module, spec = typed_model(config, weights, tables, hetero, manifest["widths"][1],
                               trained={"model": fields, "in_channels": manifest["widths"][0],
                                        "out_channels": manifest["widths"][1], "graph": manifest.get("graph"),
                                        "epochs": manifest.get("next_epoch")})
    write_export(out, module, spec)
    return spec


def _io_widths(config: ModelConfig, weights: dict, manifest: dict) -> tuple[int, int]:
    """The model's input and output widths: as the checkpoint recorded them, or (older checkpoints) from the
    first layer's and the last layer's weight matrices ([out, in], as torch and PyG store them)."""
    if "widths" in manifest:
        return tuple(manifest["widths"])  # type: ignore[return-value]
    names = [n for n in model_class(config.model).pyg_parameter_names() if n.endswith("weight")]
    first = next(weights[f"convs.0.{n}"] for n in names if weights[f"convs.0.{n}"].dim() == 2)
    last = next(weights[f"convs.{config.num_layers - 1}.{n}"] for n in names
                if weights[f"convs.{config.num_layers - 1}.{n}"].dim() == 2)
    return int(first.shape[1]), int(last.shape[0])


def decoder_path(path: str | os.PathLike) -> Path:
    return Path(path).with_suffix(".decoder.pt")


def mlp_decoder(width: int) -> nn.Module:
    """--decoder mlp as a plain torch module over z_u * z_v (gnn_dist.link.decoders.MLPDecoder's layers)."""
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))


def load_decoder(path: str | os.PathLike) -> nn.Module | None:
    """The exported link decoder beside the model at `path` (None for dot products: no weights)."""
    spec = json.loads(spec_path(path).read_text())
    if spec.get("decoder", {}).get("kind") != "mlp":
        return None
    decoder = mlp_decoder(spec["gnn_dist"]["out_channels"])
    decoder.load_state_dict(torch.load(decoder_path(path), weights_only=True))
    return decoder.eval()


def load_pyg(path: str | os.PathLike) -> nn.Module:
    """The exported module (eval mode), from path and the .json beside it."""
    spec = json.loads(spec_path(path).read_text())
    module = _user_model(spec) if spec.get("format") == USER_MODEL_FORMAT else build(spec)
    module.load_state_dict(torch.load(path, weights_only=True))
    return module.eval()
