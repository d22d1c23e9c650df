"""Under mpiexec: distributed logits and gradients against PyG on the whole graph.

Rank 0 prints one JSON line {"max_logit_diff", "max_grad_diff", "loss_diff"}
and exits 1 when any exceeds --tolerance (1e-5; a GPU run is held to 1e-4).
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from gnn_dist import ModelConfig, RankContext, TrainConfig, make_world_comm  # noqa: E402
from gnn_dist.partition.datasets import load_dataset  # noqa: E402
from gnn_dist.training import setup  # noqa: E402
from tests.reference import reference_logits_and_grads  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--parts", required=True)
parser.add_argument("--dataset", required=True)
parser.add_argument("--root", default=None)
parser.add_argument("--model", default="gcn")
parser.add_argument("--hidden", type=int, default=16)
parser.add_argument("--num-layers", type=int, default=2)
parser.add_argument("--batch-norm", action="store_true")
parser.add_argument("--heads", type=int, default=1)
parser.add_argument("--halo-memory", default="resident")
parser.add_argument("--halo-block-rows", type=int, default=0)
parser.add_argument("--device", default="cpu")
parser.add_argument("--tolerance", type=float, default=1e-5)
args = parser.parse_args()

ctx = RankContext(make_world_comm())
config = TrainConfig(parts=args.parts, epochs=0, progress=False, seed=11, halo_memory=args.halo_memory,
                     halo_block_rows=args.halo_block_rows, device=args.device,
                     model=ModelConfig(model=args.model, hidden=args.hidden, num_layers=args.num_layers,
                                       dropout=0.0, batch_norm=args.batch_norm, heads=args.heads))
state = setup(ctx, config)
loss = state.mode.compute_gradients(epoch=0)
state.model.train()
with torch.no_grad():
    logits = state.model(state.x_full)
gathered = ctx.comm.allgather_object((state.graph.node_ids.cpu(), logits.cpu()))
if ctx.is_root:
    graph = load_dataset(args.dataset, args.root)
    params = {k: p.detach().cpu().double() for k, p in state.model.named_parameters()}
    ref_logits, ref_loss, ref_grads = reference_logits_and_grads(
        graph, args.model, config.model.layers(graph.num_features, graph.num_classes), args.batch_norm, params)
    full = torch.zeros_like(ref_logits)
    for node_ids, rank_logits in gathered:
        full[node_ids] = rank_logits.double()
    result = {
        "ranks": ctx.size,
        "blocked_operator": state.graph.blocked is not None,
        "max_logit_diff": float((full - ref_logits).abs().max()),
        "max_grad_diff": max(float((p.grad.cpu().double() - ref_grads[k]).abs().max())
                             for k, p in state.model.named_parameters()),
        "loss_diff": abs(loss - float(ref_loss)),
    }
    print(json.dumps(result))
    sys.exit(0 if max(result["max_logit_diff"], result["max_grad_diff"], result["loss_diff"]) <= args.tolerance else 1)
