"""`mpiexec -n P gnn-dist embed`: every node's output of one layer of a trained model, in original id order, in
one .npy file that no process ever holds whole.

    mpiexec -n P gnn-dist embed --parts DIR --checkpoint-dir CK --out emb.npy [--layer K] [--dtype fp16|fp32]

The model comes from the newest complete checkpoint in CK (written at any P, on any partition of the same
graph: only the replicated model is read). Inference is the evaluation path, layer by layer in chunks of
--eval-chunk-nodes owned rows (gnn_dist.steps.layer_stack.LayerStack.forward_layerwise), so a rank holds one
layer's activations and one chunk at a time. `--layer K` picks the layer (0-based; negative counts from the
end, -1 the last: the logits; -2 the penultimate layer's output, after its BatchNorm and ReLU, the usual
embedding).

A typed graph's model (R-GCN, R-GAT) writes the target type's logits by type-local id for the last layer (it
computes no other row), and every node's row by homogeneous id for an earlier one; each rank's embedding rows
come from the checkpoint's rank files, whatever P wrote them.

Rank 0 creates the file under a temporary name as an .npy memmap of [num_nodes, width]; every rank writes its
own rows there by original id; rank 0 renames it to --out when every rank has finished. A job that fails or
is killed leaves nothing at --out.

May import: config, context, graph, halo, hetero, memory, models, options, partition, resilience, steps, training
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gnn_dist.config import DEFAULT_EVAL_CHUNK_NODES, ModelConfig
from gnn_dist.context import RankContext, SetupError
from gnn_dist.options import option

EMBED_DTYPES = {"fp32": np.float32, "fp16": np.float16}


@dataclass(frozen=True)
class EmbedConfig:
    parts: str = option(help="partition directory from gnn-dist partition")
    checkpoint_dir: str = option(help="the training run's --checkpoint-dir (its newest complete checkpoint)")
    out: str = option(help=".npy file to write: [num_nodes, width] rows in original node id order")
    layer: int = option(-1, "the layer whose output to write (0-based; -1 the last: logits; -2 the penultimate, "
                            "after its BatchNorm and ReLU)")
    dtype: str = option("fp32", "dtype of the rows written", choices=tuple(EMBED_DTYPES))
    eval_chunk_nodes: int = option(DEFAULT_EVAL_CHUNK_NODES, "infer layer by layer over chunks of this many owned "
                                   "nodes")
    threads: int = option(1, "torch threads per rank")


def resolve_layer(layer: int, num_layers: int) -> int:
    """--layer as a 0-based index; ValueError naming the range otherwise."""
    index = layer + num_layers if layer < 0 else layer
    if not 0 <= index < num_layers:
        raise ValueError(f"--layer {layer}: the model has {num_layers} layers: give 0 to {num_layers - 1}, or -1 to "
                         f"-{num_layers} from the end")
    return index


def embed(ctx: RankContext, config: EmbedConfig) -> dict:
    """Collective: write the file; returns {"out", "rows", "width", "layer", "peak_rss_bytes_per_rank"}."""
    from gnn_dist.graph.local_graph import LocalGraph
    from gnn_dist.halo.exchange import HaloExchanger
    from gnn_dist.halo.plan import HaloPlan
    from gnn_dist.memory.rss import peak_rss_bytes, use_workspace
    from gnn_dist.models import model_class
    from gnn_dist.partition.format import load_meta, load_part
    from gnn_dist.resilience.checkpoint import encoder_weights, graph_identity, trained_model
    from gnn_dist.steps.layer_stack import LayerStack
    from gnn_dist.training.setup import agree_on_setup, check_writable

    torch.set_num_threads(config.threads)
    use_workspace()

    def build_local():
        if config.eval_chunk_nodes < 1:
            raise ValueError(f"--eval-chunk-nodes must be at least 1, got {config.eval_chunk_nodes}")
        meta = load_meta(config.parts)
        ctx.check_num_parts(meta.num_parts, config.parts)
        fields, weights, manifest = trained_model(config.checkpoint_dir)
        if getattr(model_class(fields["model"]), "typed", False) != (meta.hetero is not None):
            raise SetupError(f"{config.checkpoint_dir} holds a {'typed' if meta.hetero is None else 'homogeneous'} "
                             f"graph's model and --parts {config.parts} does not: embed a partition of the graph it "
                             f"was trained on")
        model = ModelConfig(**fields)
        model.validate()
        layer = resolve_layer(config.layer, model.num_layers)
        check_writable(str(Path(config.out).resolve().parent), "--out's folder")
        return meta, load_part(config.parts, ctx.rank, meta), model, weights, manifest, layer

    meta, part, model_config, weights, manifest, layer = agree_on_setup(ctx, build_local)  # type: ignore[misc]
    identity = graph_identity(ctx.comm, meta, part.node_ids, part.y, part.deg[:part.n_owned])
    recorded = manifest.get("graph") or {}
    if any(recorded.get(key) != identity[key] for key in ("num_nodes", "num_edges", "fingerprint")):
        raise SetupError(f"{config.checkpoint_dir} was trained on {recorded.get('dataset')} "
                         f"({recorded.get('num_nodes')} nodes) but --parts {config.parts} holds {identity['dataset']} "
                         f"({identity['num_nodes']} nodes): embed a partition of the graph it was trained on")
    exchanger = HaloExchanger(ctx.comm, HaloPlan.from_part(part))
    if meta.hetero is not None:
        num_rows, ids, rows = _typed_rows(config, meta, part, exchanger, model_config, weights, manifest, layer)
        width = rows.shape[1]
        write_rows_by_id(ctx, config.out, num_rows, width, ids, rows.numpy().astype(EMBED_DTYPES[config.dtype],
                                                                                    copy=False), config.dtype)
        peaks = [int(v) for v in ctx.comm.allgather_object(peak_rss_bytes())]
        return {"out": config.out, "rows": num_rows, "width": width, "layer": layer, "peak_rss_bytes_per_rank": peaks}
    graph = LocalGraph.from_part(part, model_class(model_config.model).normalise, whole_operator=False)
    x_full = torch.cat([graph.x, exchanger.fetch_once(graph.x)])
    # The last layer's width: the class count, or a link-prediction model's embedding width.
    out_width = manifest["widths"][1] if "widths" in manifest else meta.num_classes
    model = LayerStack(model_config, meta.num_features, out_width, graph, exchanger, seed=0)
    model.load_state_dict(encoder_weights(weights))
    model.eval()
    rows = model.forward_layerwise(x_full, config.eval_chunk_nodes, upto=layer)
    width = rows.shape[1]
    del x_full
    write_rows_by_id(ctx, config.out, meta.num_nodes, width, graph.node_ids.cpu().numpy(),
                     rows.cpu().numpy().astype(EMBED_DTYPES[config.dtype], copy=False), config.dtype)
    peaks = [int(v) for v in ctx.comm.allgather_object(peak_rss_bytes())]
    return {"out": config.out, "rows": meta.num_nodes, "width": width, "layer": layer,
            "peak_rss_bytes_per_rank": peaks}


def _typed_rows(config: EmbedConfig, meta, part, exchanger, model_config: ModelConfig, weights: dict,
                manifest: dict, layer: int) -> tuple[int, np.ndarray, torch.Tensor]:
    """A typed graph's model (gnn_dist.hetero.stack): (rows in the file, the ids of this rank's rows, its rows).

    The last layer computes the target type's rows only, so --layer -1 writes [target nodes, classes] by
    type-local id; an earlier layer writes every node's row by its homogeneous id (the types one after another,
    in the partition's order, each by type-local id: meta.json's hetero.num_nodes gives where each begins). The
    embedding rows this rank owns now come from the checkpoint's rank files, one at a time."""
    from gnn_dist.hetero.stack import TypedStack
    from gnn_dist.partition.format import type_offsets
    from gnn_dist.resilience.checkpoint import shard_files
    from gnn_dist.resilience.sharded import restore_model

    model = TypedStack(model_config, manifest["widths"][1], part, exchanger, seed=0, layerwise=True)
    try:
        restore_model(model, weights, shard_files(config.checkpoint_dir))
    except ValueError as err:
        raise SetupError(f"{config.checkpoint_dir} does not fit this typed graph's model ({err}): embed a partition "
                         f"of the graph it was trained on") from err
    model.eval()
    rows = model.forward_layerwise(None, config.eval_chunk_nodes, upto=layer).cpu()
    if layer == model_config.num_layers - 1:  # the target type's rows, by type-local id
        hetero = meta.hetero
        first = type_offsets(hetero)[hetero["node_types"].index(hetero["target"])]
        ids = part.node_ids[model.output_rows.cpu().numpy()] - first
        return int(hetero["num_nodes"][hetero["target"]]), ids, rows
    return meta.num_nodes, part.node_ids, rows


def write_rows_by_id(ctx: RankContext, out: str, num_rows: int, width: int, ids: np.ndarray, rows: np.ndarray,
                     dtype: str) -> None:
    """Collective: every rank's rows into one [num_rows, width] .npy file at their ids, through a memmap that
    each rank opens; rank 0 creates it under a temporary name and renames it once all have written."""
    from gnn_dist.resilience.faults import maybe_inject_failure

    target = Path(out).resolve()
    temporary = target.with_name(f".{target.name}.partial-{ctx.comm.allgather_object(uuid.uuid4().hex[:8])[0]}")
    error = None
    if ctx.is_root:
        try:
            np.lib.format.open_memmap(temporary, mode="w+", dtype=EMBED_DTYPES[dtype], shape=(num_rows, width)).flush()
        except OSError as err:
            error = f"cannot create {temporary}: {err.strerror or err}"
    error = ctx.comm.allgather_object(error)[0]
    if error is not None:
        raise SetupError(error)
    try:
        mapped = np.lib.format.open_memmap(temporary, mode="r+")
        order = np.argsort(ids, kind="stable")  # ascending ids: the writes walk the file forwards
        mapped[ids[order]] = rows[order]
        mapped.flush()
        del mapped
        maybe_inject_failure(ctx.rank, 0)  # the failure tests: a rank that dies with its rows half the job's
        failed = None
    except OSError as err:
        failed = f"rank {ctx.rank}: writing {temporary}: {err.strerror or err}"
    failures = [f for f in ctx.comm.allgather_object(failed) if f is not None]
    if ctx.is_root:
        if failures:
            temporary.unlink(missing_ok=True)
        else:
            os.replace(temporary, target)
    if failures:
        raise SetupError(failures[0])
    ctx.comm.barrier()  # nobody reports done before the file has its name
