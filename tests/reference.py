"""The independent single-process reference: each model's PyG layer (GCNConv, SAGEConv; + torch BatchNorm1d) on the
whole graph. Which PyG layer, and how our parameter names map onto its, comes from the model's file (gnn_dist.models)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gnn_dist.models import model_class


class PygModel(nn.Module):
    def __init__(self, model: str, widths: list[tuple], batch_norm: bool):
        """widths: (in, out) per layer, or (in, out, layer options) as ModelConfig.layers gives them (GAT's heads)."""
        super().__init__()
        self.model = model
        self.convs = nn.ModuleList(model_class(model).pyg_conv(i, o, **(rest[0] if rest else {}))
                                   for i, o, *rest in widths)
        self.norms = nn.ModuleList(nn.BatchNorm1d(w[1]) for w in widths[:-1]) if batch_norm else None

    def forward(self, x, edge_index):
        for k, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if k < len(self.convs) - 1:
                if self.norms is not None:
                    x = self.norms[k](x)
                x = torch.relu(x)
        return x

    def name_map(self) -> dict[str, str]:
        """Our parameter name -> the reference's."""
        names = {}
        for k in range(len(self.convs)):
            for ours, theirs in model_class(self.model).pyg_parameter_names().items():
                names[f"convs.{k}.{ours}"] = f"convs.{k}.{theirs}"
        if self.norms is not None:
            for k in range(len(self.norms)):
                names[f"norms.{k}.weight"] = f"norms.{k}.weight"
                names[f"norms.{k}.bias"] = f"norms.{k}.bias"
        return names


def pyg_with_our_parameters(model: str, widths, batch_norm: bool, our_params: dict[str, torch.Tensor]) -> PygModel:
    """The float64 PyG reference holding our parameters (every one of ours mapped to exactly one of theirs)."""
    ref = PygModel(model, widths, batch_norm).double()
    theirs = dict(ref.named_parameters())
    names = ref.name_map()
    assert set(names) == set(our_params), (sorted(names), sorted(our_params))
    with torch.no_grad():
        for ours, value in our_params.items():
            theirs[names[ours]].copy_(value)
    return ref


def reference_logits_and_grads(graph, model: str, widths, batch_norm: bool, our_params: dict[str, torch.Tensor]):
    """Logits of every node (original order) and the gradient of the mean train loss, by our parameter names."""
    ref = pyg_with_our_parameters(model, widths, batch_norm, our_params)
    theirs = dict(ref.named_parameters())
    names = ref.name_map()
    ref.train()  # BatchNorm uses batch statistics, as our training step does
    x = torch.from_numpy(graph.x).double()
    logits = ref(x, torch.from_numpy(graph.edge_index))
    mask = torch.from_numpy(graph.train_mask)
    loss = F.cross_entropy(logits[mask], torch.from_numpy(graph.y)[mask])
    loss.backward()
    grads = {ours: theirs[names[ours]].grad.detach() for ours in our_params}
    return logits.detach(), loss.detach(), grads
