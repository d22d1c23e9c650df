"""`gnn-dist export` of a typed graph's model (R-GCN, R-GAT): plain torch and PyG modules run on a PyG HeteroData.

    gnn-dist export --checkpoint-dir CK --out model.pt        # writes model.pt and model.json beside it

model.pt is the `state_dict` of torch.nn.ModuleDict({"inputs": ..., "convs": ...}):

    inputs[type]   torch.nn.Linear(features, hidden) for a featured type; torch.nn.Embedding(nodes, hidden) for a
                   featureless one: its whole table, joined from the ranks' shards (each row from the rank that
                   owned it), rows in type-local id order
    convs[k]       --model rgcn: torch_geometric.nn.RGCNConv(in, out, relations, num_bases, aggr='mean'), run on
                   data.to_homogeneous()'s edges with the relations numbered in model.json's order;
                   --model rgat: torch_geometric.nn.HeteroConv({relation: GATConv(in, out // heads, heads,
                   add_self_loops=False)}, aggr='sum') on data.edge_index_dict

with ReLU between the layers (dropout is training's alone). model.json lists the node types, the target type,
the relations in order, each module's class and arguments, and whether the graph was trained with reverse
relations (then apply torch_geometric.transforms.ToUndirected() to the HeteroData first, as partition did).
`forward(model, spec, data)` is the whole forward, and docs/export.md has it in plain torch and PyG.

May import: config, context, models, resilience
"""
from __future__ import annotations

import json
import os

import torch
from torch import nn

from gnn_dist.config import ModelConfig
from gnn_dist.export.files import spec_path
from gnn_dist.models.base import build_module

FORMAT = "gnn-dist-pyg-hetero-1"


def typed_spec(config: ModelConfig, hetero: dict, num_classes: int) -> dict:
    """model.json: the modules of the exported model, with what forward() needs to run them."""
    H = config.hidden
    inputs = {t: {"module": "torch.nn.Linear", "kwargs": {"in_features": w, "out_features": H}} if w else
              {"module": "torch.nn.Embedding", "kwargs": {"num_embeddings": hetero["num_nodes"][t], "embedding_dim": H}}
              for t, w in hetero["feature_widths"].items()}
    relations = [list(r) for r in hetero["relations"]]
    layers = []
    for i, o, options in config.layers(H, num_classes):
        if config.model == "rgcn":
            layers.append({"module": "torch_geometric.nn.RGCNConv",
                           "kwargs": {"in_channels": i, "out_channels": o, "num_relations": len(relations),
                                      "num_bases": config.num_bases or None, "aggr": "mean"}})
        else:
            heads = options["heads"]
            layers.append({"module": "torch_geometric.nn.HeteroConv", "aggr": "sum",
                           "per_relation": {"module": "torch_geometric.nn.GATConv",
                                            "kwargs": {"in_channels": i, "out_channels": o // heads, "heads": heads,
                                                       "add_self_loops": False}}})
    return {"format": FORMAT, "model": config.model, "node_types": list(hetero["node_types"]),
            "target": hetero["target"], "relations": relations,
            "reverse_relations": bool(hetero.get("reverse_relations", True)), "inputs": inputs, "layers": layers}


def build(spec: dict) -> nn.ModuleDict:
    """The modules a spec (model.json) describes, with fresh parameters."""
    if spec.get("format") != FORMAT:
        raise ValueError(f"not a gnn-dist typed export (format {spec.get('format')!r}, expected {FORMAT})")
    convs = nn.ModuleList()
    for layer in spec["layers"]:
        if "per_relation" in layer:
            from torch_geometric.nn import HeteroConv

            each = layer["per_relation"]
            convs.append(HeteroConv({tuple(r): build_module(each["module"], each["kwargs"]) for r in spec["relations"]},
                                    aggr=layer["aggr"]))
        else:
            convs.append(build_module(layer["module"], layer["kwargs"]))
    inputs = nn.ModuleDict({t: build_module(m["module"], m["kwargs"]) for t, m in spec["inputs"].items()})
    return nn.ModuleDict({"inputs": inputs, "convs": convs})


def forward(model: nn.ModuleDict, spec: dict, data) -> torch.Tensor:
    """The target type's logits on a HeteroData (its relations as model.json lists them)."""
    types, relations = spec["node_types"], [tuple(r) for r in spec["relations"]]
    x = {t: model["inputs"][t](data[t].x) if isinstance(model["inputs"][t], nn.Linear) else model["inputs"][t].weight
         for t in types}
    last = len(model["convs"]) - 1
    if spec["model"] == "rgcn":  # one homogeneous graph, relations numbered in the spec's order
        first = dict(zip(types, torch.tensor([0] + [x[t].shape[0] for t in types]).cumsum(0).tolist()))
        edge_index = torch.cat([data[r].edge_index + torch.tensor([[first[r[0]]], [first[r[2]]]]) for r in relations], 1)
        edge_type = torch.cat([torch.full((data[r].edge_index.shape[1],), k) for k, r in enumerate(relations)])
        h = torch.cat([x[t] for t in types])
        for k, conv in enumerate(model["convs"]):
            h = conv(h, edge_index, edge_type)
            h = torch.relu(h) if k < last else h
        start = first[spec["target"]]
        return h[start:start + x[spec["target"]].shape[0]]
    for k, conv in enumerate(model["convs"]):
        x = conv(x, {r: data[r].edge_index for r in relations})
        x = {t: torch.relu(v) for t, v in x.items()} if k < last else x
    return x[spec["target"]]


def typed_model(config: ModelConfig, weights: dict, tables: dict, hetero: dict, num_classes: int,
                trained: dict) -> tuple[nn.ModuleDict, dict]:
    """(the exported modules holding the trained weights, their spec); tables: featureless type -> its whole
    embedding table; trained: what gnn-dist trained (model.json's "gnn_dist")."""
    spec = {**typed_spec(config, hetero, num_classes), "gnn_dist": trained}
    model = build(spec)
    with torch.no_grad():
        for t, module in model["inputs"].items():
            if isinstance(module, nn.Linear):
                module.weight.copy_(weights[f"inputs.linears.{t}.weight"])
                module.bias.copy_(weights[f"inputs.linears.{t}.bias"])
            else:
                module.weight.copy_(tables[t])
        for k, conv in enumerate(model["convs"]):
            _load_conv(conv, {name.split(".", 2)[2]: value for name, value in weights.items()
                              if name.startswith(f"convs.{k}.")}, config, spec["relations"])
    return model, spec


def _load_conv(conv: nn.Module, ours: dict, config: ModelConfig, relations: list) -> None:
    if config.model == "rgcn":  # our names are RGCNConv's, but for the bases, which RGCNConv calls its weight
        for name, value in ours.items():
            getattr(conv, "weight" if name == "basis" else name).copy_(value)
        return
    for r, relation in enumerate(relations):
        gat = conv.convs[tuple(relation)]
        gat.lin.weight.copy_(ours["weight"][r])
        gat.att_src.copy_(ours["att_src"][r].view_as(gat.att_src))
        gat.att_dst.copy_(ours["att_dst"][r].view_as(gat.att_dst))
        gat.bias.copy_(ours["bias"][r])


def load_pyg_typed(path: str | os.PathLike) -> tuple[nn.ModuleDict, dict]:
    """(the exported modules in eval mode, their spec), from path and the .json beside it."""
    spec = json.loads(spec_path(path).read_text())
    model = build(spec)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval(), spec
