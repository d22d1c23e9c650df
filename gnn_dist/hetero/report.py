"""`gnn-dist inspect` of a typed partition: owned and halo nodes per type, edges and cut per relation, and the
halo bytes an R-GCN epoch sends.

An epoch's bytes (forward rows and backward gradients, summed over ranks): the first layer's halo rows of the
featureless types (embedding rows, exact and fp32 every step whatever the schedule) at --hidden columns, here;
and every later layer's whole halo at its input width (--hidden), as the schedule and the halo dtype send it,
which inspect adds (gnn_dist.plan.traffic, as for a homogeneous graph). The featured types' raw features
travel once, at set-up. With --halo-memory sequential the first layer's whole halo travels every step instead
(its owners' input rows, at --hidden columns), and no raw features travel.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from gnn_dist.partition.format import PartitionMeta, part_file_name, type_offsets

FP32_BYTES = 4


def typed_report(directory: Path, meta: PartitionMeta, model, each_part=None) -> dict:
    """The typed part of inspect's report, reading each part file once. each_part(arrays), when given, is called
    with every part's arrays in that one pass (inspect's memory plan takes its counts there); its results are
    the report's "each_part"."""
    hetero = meta.hetero
    types, relations = hetero["node_types"], [tuple(r) for r in hetero["relations"]]
    offsets = type_offsets(hetero)
    featureless = np.array([not hetero["feature_widths"][t] for t in types])
    parts, extra = [], []
    for k in range(meta.num_parts):
        with np.load(directory / part_file_name(k), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files} if each_part is not None else archive
            if each_part is not None:
                extra.append(each_part(arrays))
            owned_type = np.searchsorted(offsets, arrays["node_ids"], side="right") - 1
            halo_type = np.searchsorted(offsets, arrays["halo_ids"], side="right") - 1
            cut = arrays["indices"] >= arrays["node_ids"].shape[0]
            edge_type = arrays["edge_type"]
            parts.append({
                "part": k,
                "owned_per_type": dict(zip(types, np.bincount(owned_type, minlength=len(types)).tolist())),
                "halo_per_type": dict(zip(types, np.bincount(halo_type, minlength=len(types)).tolist())),
                "edges_per_relation": np.bincount(edge_type, minlength=len(relations)).tolist(),
                "cut_per_relation": np.bincount(edge_type[cut], minlength=len(relations)).tolist(),
            })
    embedding_rows = sum(p["halo_per_type"][t] for p in parts for t, f in zip(types, featureless) if f)
    embedding_bytes = 2 * FP32_BYTES * model.hidden * embedding_rows
    return {
        "node_types": types, "target": hetero["target"], "relations": [list(r) for r in relations],
        "reverse_relations": hetero["reverse_relations"],
        "feature_widths": hetero["feature_widths"],
        "type_balance": {t: max(p["owned_per_type"][t] for p in parts) / (hetero["num_nodes"][t] / meta.num_parts)
                         for t in types},
        "relation_edges": hetero["relation_edges"],
        "relation_cut": [sum(p["cut_per_relation"][r] for p in parts) for r in range(len(relations))],
        "embedding_halo_rows": embedding_rows,
        "typed_parts": parts,
        "embedding_halo_bytes_per_epoch": embedding_bytes,
        "each_part": extra,
    }


def format_typed_report(report: dict) -> list[str]:
    typed = report["typed"]
    lines = ["", f"  typed graph: target {typed['target']}; types (features; owned per part, halo per part):"]
    for t in typed["node_types"]:
        owned = " / ".join(f"{p['owned_per_type'][t]:,}" for p in typed["typed_parts"])
        halo = " / ".join(f"{p['halo_per_type'][t]:,}" for p in typed["typed_parts"])
        width = typed["feature_widths"][t]
        lines.append(f"    {t:<16} {f'{width} features' if width else 'embedding':<14} owned {owned}  halo {halo}  "
                     f"(balance {typed['type_balance'][t]:.3f})")
    lines.append("  relations (edges, of which cut):")
    for relation, edges, cut in zip(typed["relations"], typed["relation_edges"], typed["relation_cut"]):
        lines.append(f"    {'__'.join(relation):<40} {edges:>12,} {cut:>10,}")
    m = report["model"]
    layer0 = "every halo row at layer 0 (--halo-memory sequential: the owners' input rows" \
        if report["memory_plan"]["halo_memory"] == "sequential" \
        else "embedding rows of featureless types at layer 0 (the owners' rows"
    lines.append(f"  training traffic    {report['predicted_halo_bytes_per_epoch'] / 1e6:.2f} MB of halo payload per "
                 f"epoch for {m['model']} hidden {m['hidden']}, {m['num_layers']} layers: {typed['layer0_halo_rows']:,} "
                 f"{layer0}, fp32, exact), every halo row at each later layer "
                 f"({report['schedule']}, {report['halo_dtype']})")
    plan = report["memory_plan"]
    per_rank = ", ".join(f"{v / 2**30:.2f}" for v in plan["predicted_peak_rss_bytes_per_rank"])
    largest = sorted(plan["breakdown_of_largest"].items(), key=lambda kv: -kv[1])[:6]
    shards = "; ".join(f"{t} {' / '.join(f'{rows:,}' for rows in per_rank_rows)} of {typed_total(report, t):,}"
                       for t, per_rank_rows in plan["embedding_shard_rows_per_rank"].items())
    lines.append(f"  peak memory         {plan['predicted_peak_rss_bytes'] / 2**30:.2f} GiB per rank at most "
                 f"(predicted; per rank {per_rank} GiB)")
    lines.append("                      largest rank at its peak: "
                 + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in largest))
    if shards:
        whole = "one rank: the whole tables" if len(typed["typed_parts"]) == 1 else "no rank holds a whole table"
        lines.append(f"  embedding shards    rows per rank: {shards} ({whole})")
    return lines


def typed_total(report: dict, node_type: str) -> int:
    """Nodes of one type over the whole graph."""
    return sum(p["owned_per_type"][node_type] for p in report["typed"]["typed_parts"])
