"""`gnn-dist inspect`: how good a partition is, and what training on it will send.

Every part file is verified against its sha256 in meta.json first.

May import: config, hetero, link, memory, models, partition, plan
"""
from __future__ import annotations

import dataclasses
import os

from gnn_dist.config import LinkConfig, ModelConfig
from gnn_dist.hetero.report import format_typed_report, typed_report
from gnn_dist.memory.host import readable_bytes
from gnn_dist.models import check_model_fits
from gnn_dist.partition.format import load_meta, part_shapes, verify_part_file
from gnn_dist.plan.host import plan_host
from gnn_dist.plan.memory import PlanConfig, plan_part
from gnn_dist.plan.traffic import exchanged_widths, predicted_halo_bytes_per_epoch
from gnn_dist.plan.typed import plan_typed, typed_shape

FP32_BYTES = 4
# Above this max/mean of the edges the parts aggregate, an attention model's full-batch training warns: its epoch
# is mostly per-edge work (GAT on twitch FR at P=1: 81% in the attention and its source-row gathers), so every
# other rank waits for the heaviest part, about 13% of the epoch at 1.15x.
EDGE_IMBALANCE_WARNING = 1.15


def edge_counts(meta) -> list[int]:
    """The in-edges each part aggregates, local and cut: what full-batch per-edge work follows."""
    return [p.local_edges + p.cut_edges for p in meta.parts]


def edge_balance(meta) -> float:
    """max/mean of edge_counts (0.0 for a graph without edges)."""
    edges = edge_counts(meta)
    return max(edges) / (sum(edges) / len(edges)) if sum(edges) else 0.0


def edge_imbalance_warning(meta, model_name: str) -> str | None:
    """One line for a full-batch run of an attention model on parts uneven in edges, naming the fix; else None.

    Node-balanced METIS parts of a graph with a dense core differ in edges (twitch FR at P=2: 1.26x); a model
    whose work is mostly per edge then runs at the heaviest part's pace. GCN and SAGE are left alone: their
    dense transforms, per node, dominate at usual widths, and --balance edges lets the node counts drift.
    """
    from gnn_dist.models import model_class

    if meta.num_parts < 2 or not model_class(model_name).attention:
        return None
    balance = edge_balance(meta)
    if balance <= EDGE_IMBALANCE_WARNING:
        return None
    edges = edge_counts(meta)
    heaviest = edges.index(max(edges))
    return (f"part {heaviest} aggregates {balance:.2f}x the mean of the parts' edges: {model_name}'s attention works "
            f"per edge, so the other ranks wait for it in every layer (P={meta.num_parts} runs at most "
            f"{meta.num_parts / balance:.2f}x one rank's speed on these parts); partition again with --balance both "
            f"(the default, nodes and edges together) or --balance edges (edges within 3%, up to "
            f"{meta.num_parts / 1.03:.2f}x) to even them (gnn-dist inspect shows the balance)")


def default_model(meta) -> str:
    """The model inspect plans for when none is named: R-GCN on a typed partition, train's default otherwise."""
    return "rgcn" if meta.hetero is not None else ModelConfig().model


def inspect_partition(directory: str | os.PathLike, model: ModelConfig | None = None, *,
                      schedule: str = "exact", halo_dtype: str = "fp32", memory: PlanConfig | None = None,
                      link: LinkConfig | None = None) -> dict:
    """memory: the training set-up to plan peak memory per rank for (defaults follow `model`); link: the link
    options (--task link partitions: the output is the embedding, and the endpoint exchanges are predicted)."""
    from pathlib import Path

    directory = Path(directory)
    meta = load_meta(directory)
    for k in range(meta.num_parts):
        verify_part_file(directory, meta, k)
    model = model or ModelConfig(model=default_model(meta))
    check_model_fits(model.model, meta.hetero["node_types"] if meta.hetero else None, str(directory))
    if meta.hetero is not None:
        return _typed(directory, meta, model, schedule, halo_dtype, memory)
    owned = [p.owned for p in meta.parts]
    total_halo = sum(p.halo for p in meta.parts)
    mean_owned = sum(owned) / len(owned)
    train = [p.train for p in meta.parts]
    mean_train = sum(train) / len(train)
    memory = memory or PlanConfig(model=model)
    link = link or LinkConfig()
    # The last layer's width: the class count, or (a --task link partition) the embedding's.
    out_dim = (link.embedding_dim or model.hidden) if meta.task == "link" else meta.num_classes
    if meta.task == "link":
        memory = dataclasses.replace(memory, task="link", neg_ratio=link.neg_ratio, decoder=link.decoder,
                                     negatives=link.negatives)
    report = {
        "directory": str(directory),
        "dataset": meta.dataset,
        "method": meta.method,
        "seed": meta.seed,
        "num_nodes": meta.num_nodes,
        "num_edges": meta.num_edges,
        "num_parts": meta.num_parts,
        "num_features": meta.num_features,
        "num_classes": meta.num_classes,
        "task": meta.task,
        "edge_cut": meta.edge_cut,
        "edge_cut_fraction": meta.edge_cut / max(meta.num_edges // 2, 1),
        "replication_factor": (meta.num_nodes + total_halo) / meta.num_nodes,
        "balance": max(owned) / mean_owned,
        "train_balance": max(train) / mean_train if mean_train else 0.0,
        # each rank aggregates over its nodes' in-edges, local and cut: full-batch compute follows these
        "edge_balance": edge_balance(meta),
        "total_halo_rows": total_halo,
        "halo_bytes_per_layer_per_column": total_halo * FP32_BYTES,
        "model": {"model": model.model, "hidden": model.hidden, "num_layers": model.num_layers,
                  **({"heads": model.heads} if model.heads > 1 else {})},
        "exchanged_widths": exchanged_widths(model, meta.num_features, out_dim),
        "schedule": schedule,
        "halo_dtype": halo_dtype,
        "predicted_halo_bytes_per_epoch": predicted_halo_bytes_per_epoch(
            total_halo, model, meta.num_features, out_dim, halo_dtype, schedule, meta.num_parts,
            memory.halo_memory),
        "parts": [
            {"part": k, "owned": p.owned, "halo": p.halo, "local_edges": p.local_edges,
             "cut_edges": p.cut_edges, "train": p.train}
            for k, p in enumerate(meta.parts)
        ],
    }
    if meta.task == "link":
        from gnn_dist.link.row_fetch import predicted_score_bytes

        train_bytes, eval_bytes = predicted_score_bytes(directory, out_dim, link.neg_ratio, link.negatives)
        report["link"] = {**meta.link, "embedding_dim": out_dim, "neg_ratio": link.neg_ratio,
                          "negatives": link.negatives, "decoder": link.decoder,
                          "predicted_score_bytes_per_epoch": train_bytes,
                          "predicted_eval_score_bytes_per_evaluation": eval_bytes}
    shapes = part_shapes(directory)
    plans = [plan_host(shape, memory, meta.num_features, out_dim) for shape in shapes]
    report["memory_plan"] = {
        "device": memory.device,
        "halo_memory": memory.halo_memory, "halo_block_rows": memory.halo_block_rows,
        "feature_dtype": memory.feature_dtype, "dropout": memory.model.dropout,
        "batch_norm": memory.model.batch_norm,
        "predicted_peak_rss_bytes": max(plan.peak for plan in plans),
        "predicted_peak_rss_bytes_per_rank": [plan.peak for plan in plans],
        "peak_phase_per_rank": [plan.phase for plan in plans],
        "breakdown_of_largest": {name: value for name, value in max(plans, key=lambda p: p.peak).parts.items()
                                 if value},
    }
    if memory.device != "cpu":
        # the host's plan above; the GPU's: every tensor training makes (what torch.cuda.max_memory_allocated sees)
        on_device = [plan_part(shape, memory, meta.num_features, out_dim) for shape in shapes]
        report["memory_plan"].update({
            "predicted_peak_device_bytes": max(plan.peak for plan in on_device),
            "predicted_peak_device_bytes_per_rank": [plan.peak for plan in on_device],
            "device_breakdown_of_largest": {name: value for name, value in
                                            max(on_device, key=lambda p: p.peak).parts.items() if value},
        })
    return report


def _typed(directory, meta, model, schedule: str, halo_dtype: str, memory: PlanConfig | None) -> dict:
    """A typed partition's report: the common figures, then per type and per relation (gnn_dist.hetero.report).
    The halo bytes: the embedding rows' (exact, fp32), and the hidden layers' as the schedule and dtype send them
    (each later layer exchanges --hidden columns; layer 0 exchanges none through the schedule)."""
    owned = [p.owned for p in meta.parts]
    total_halo = sum(p.halo for p in meta.parts)
    plan_config = dataclasses.replace(memory or PlanConfig(model=model), model=model, schedule=schedule)
    typed = typed_report(directory, meta, model,
                         each_part=lambda arrays: plan_typed(typed_shape(arrays, meta), plan_config, meta.num_classes))
    plans = typed.pop("each_part")
    hidden_layers = predicted_halo_bytes_per_epoch(total_halo, model, model.hidden, meta.num_classes, halo_dtype,
                                                   schedule, meta.num_parts)
    sequential = plan_config.halo_memory == "sequential"
    # layer 0's halo: the featureless types' embedding rows (resident: the featured rows' raw features came once,
    # at set-up), or with sequential halos every halo row at --hidden columns, forward and back (exact, fp32)
    typed["layer0_halo_rows"] = total_halo if sequential else typed["embedding_halo_rows"]
    layer0 = 2 * FP32_BYTES * model.hidden * total_halo if sequential else typed["embedding_halo_bytes_per_epoch"]
    return {
        "directory": str(directory), "dataset": meta.dataset, "method": meta.method, "seed": meta.seed,
        "num_nodes": meta.num_nodes, "num_edges": meta.num_edges, "num_parts": meta.num_parts,
        "num_features": meta.num_features, "num_classes": meta.num_classes, "task": meta.task,
        "replication_factor": (meta.num_nodes + total_halo) / meta.num_nodes,
        "balance": max(owned) / (sum(owned) / len(owned)), "total_halo_rows": total_halo,
        "model": {"model": model.model, "hidden": model.hidden, "num_layers": model.num_layers},
        "schedule": schedule, "halo_dtype": halo_dtype,
        "predicted_halo_bytes_per_epoch": layer0 + hidden_layers,
        "memory_plan": {
            "device": "cpu", "halo_memory": plan_config.halo_memory, "dropout": model.dropout,
            "predicted_peak_rss_bytes": max(plan.peak for plan in plans),
            "predicted_peak_rss_bytes_per_rank": [plan.peak for plan in plans],
            "peak_phase_per_rank": [plan.phase for plan in plans],
            "breakdown_of_largest": {name: value for name, value in max(plans, key=lambda p: p.peak).parts.items()
                                     if value},
            # each featureless type's embedding rows per rank (its owned nodes: the shard it holds and steps)
            "embedding_shard_rows_per_rank": {
                t: [p["owned_per_type"][t] for p in typed["typed_parts"]]
                for t in typed["node_types"] if not typed["feature_widths"][t]},
        },
        "parts": [{"part": k, "owned": p.owned, "halo": p.halo, "local_edges": p.local_edges,
                   "cut_edges": p.cut_edges, "train": p.train} for k, p in enumerate(meta.parts)],
        "typed": typed,
    }


def format_report(report: dict) -> str:
    lines = [
        f"{report['directory']}: {report['dataset']} split into {report['num_parts']} parts by {report['method']} "
        f"(seed {report['seed']})",
        f"  nodes {report['num_nodes']:,}  directed edges {report['num_edges']:,}  features {report['num_features']}  "
        f"classes {report['num_classes']}",
        "",
        f"  {'part':>5} {'owned':>10} {'halo':>10} {'local edges':>12} {'cut edges':>10} {'train':>8}",
    ]
    for p in report["parts"]:
        lines.append(f"  {p['part']:>5} {p['owned']:>10,} {p['halo']:>10,} {p['local_edges']:>12,} "
                     f"{p['cut_edges']:>10,} {p['train']:>8,}")
    if "typed" in report:
        return "\n".join(lines + [f"  replication factor  {report['replication_factor']:.3f} (owned + halo over "
                                   f"nodes)"] + format_typed_report(report))
    mb = report["predicted_halo_bytes_per_epoch"] / 1e6
    m = report["model"]
    lines += [
        "",
        f"  edge cut            {report['edge_cut']:,} undirected edges ({100 * report['edge_cut_fraction']:.1f}%)",
        f"  replication factor  {report['replication_factor']:.3f} (owned + halo over nodes)",
        f"  balance             {report['balance']:.3f} nodes, {report['train_balance']:.3f} training nodes, "
        f"{report['edge_balance']:.3f} edges (max/mean; --balance both evens both, --balance edges the edges)",
        f"  halo payload        {report['halo_bytes_per_layer_per_column']:,} bytes per layer per feature column (fp32)",
        f"  training traffic    {mb:.2f} MB of halo payload per epoch for {m['model']} hidden {m['hidden']}, "
        f"{m['num_layers']} layers, schedule {report['schedule']}, halo dtype {report['halo_dtype']} "
        f"(exchanged widths {report['exchanged_widths']}, forward and backward)",
    ]
    if "link" in report:
        link = report["link"]
        lines += [
            f"  link prediction     {link['train']:,} training, {link['val']:,} validation and {link['test']:,} test "
            f"edges ({link['source']} split); embedding {link['embedding_dim']}, {link['neg_ratio']} negatives per "
            f"positive (rule {link['negatives']}), {link['decoder']} decoder",
            f"  scoring traffic     {link['predicted_score_bytes_per_epoch'] / 1e6:.2f} MB of endpoint rows and "
            f"gradients per training epoch (expected), {link['predicted_eval_score_bytes_per_evaluation'] / 1e6:.2f} "
            f"MB per evaluation",
        ]
    plan = report["memory_plan"]
    per_rank = ", ".join(f"{v / 2**30:.2f}" for v in plan["predicted_peak_rss_bytes_per_rank"])
    largest = sorted(plan["breakdown_of_largest"].items(), key=lambda kv: -kv[1])[:6]
    lines += [
        f"  {'peak host memory' if 'predicted_peak_device_bytes' in plan else 'peak memory':<19} "
        f"{plan['predicted_peak_rss_bytes'] / 2**30:.2f} GiB per rank at most (predicted; "
        f"per rank {per_rank} GiB) with --halo-memory {plan['halo_memory']}, --feature-dtype "
        f"{plan['feature_dtype']}",
        "                      largest rank at its peak: " + ", ".join(f"{k} {readable_bytes(v)}" for k, v in largest),
    ]
    if "predicted_peak_device_bytes" in plan:
        per_rank = ", ".join(f"{v / 2**30:.2f}" for v in plan["predicted_peak_device_bytes_per_rank"])
        largest = sorted(plan["device_breakdown_of_largest"].items(), key=lambda kv: -kv[1])[:6]
        lines += [
            f"  peak GPU memory     {plan['predicted_peak_device_bytes'] / 2**30:.2f} GiB per rank at most "
            f"(predicted, --device {plan['device']}; per rank {per_rank} GiB)",
            "                      largest rank at its peak: "
            + ", ".join(f"{k} {readable_bytes(v)}" for k, v in largest),
        ]
    return "\n".join(lines)
