"""Checkpoints: the replicated state once, each rank's own state beside it, and a manifest that names the set.

    DIR/epoch-000010/replicated.pt      model, optimizer, next epoch, metrics so far (rank 0 writes it)
    DIR/epoch-000010/rank-00000.pt ...  what only that rank holds: the schedule's caches, the halo codec's
                                        random state (a few hundred bytes when there are none), and a typed
                                        graph's embedding rows it owns with their optimiser state, keyed by
                                        (type, id) (gnn_dist.resilience.sharded)
    DIR/epoch-000010/MANIFEST.json      written last: the run's identity and the sha256 of every file

The model and optimizer are the same on every rank (gradients are summed
before every step), so they are written once, and the checkpoint's size does
not grow with P. Dropout masks, sampled batches and the exact schedule are
keyed by (seed, epoch, node), not by rank, so the replicated state is all a
run needs to continue on another number of ranks: a checkpoint resumes on any
partition of the same graph (same nodes, edges and a fingerprint of ids,
labels and degrees), at any P. Only on the partition that wrote it is each
rank's own state restored; elsewhere it is rebuilt (stale halos refresh at the
resumed epoch, pipeline and adaptive start from an exact exchange, int8's
random stream restarts, the sampled feature cache refills), and the job says
so in one line.

Every file goes to a temporary name and is renamed when complete, so a crash
mid-write never leaves a checkpoint that looks complete: a checkpoint exists
only once its manifest does. Files are read with torch.load(weights_only=True)
(no unpickling of arbitrary objects) and checked against the manifest's sha256.
Format 1 (every rank wrote everything; before sharded checkpoints) is still read, at the
same P and partition only.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import torch

from gnn_dist.comm.communicator import failure_among
from gnn_dist.config import ModelConfig
from gnn_dist.context import SetupError
from gnn_dist.kernels.keyed_random import fingerprint_words
from gnn_dist.log import rank_logger
from gnn_dist.partition.format import sha256_of
from gnn_dist.resilience.sharded import own_rows, replicated_state, restore, sharded_rows

MANIFEST = "MANIFEST.json"
REPLICATED = "replicated.pt"
CHECKPOINT_FORMAT = 2
# What a resumed run must share with the run that wrote the checkpoint (the model: every ModelConfig option).
RESUME_MUST_MATCH = ("model", "task", "schedule", "halo_dtype")


class CheckpointError(SetupError):
    """Raised on every rank alike: a checkpoint cannot be written or does not fit this run."""


def epoch_dir(directory: Path, epoch: int) -> Path:
    return directory / f"epoch-{epoch:06d}"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def describe_run(state) -> dict:
    """What a resumed run is checked against: the options that must match, and where the checkpoint came from."""
    config = state.config
    return {
        "num_parts": state.ctx.size,
        "partition_id": state.partition_id,
        "graph": state.graph_identity,
        "model": dataclasses.asdict(config.model),
        "task": state.task.describe(),
        "schedule": config.schedule,
        "halo_dtype": config.halo_dtype,
    }


def _on_host(value):
    """`value` with every tensor in it copied to the host: checkpoints are device-independent, so a run trained on
    a GPU resumes on CPUs and the reverse (the loader moves what it restores to its own device)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _on_host(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(item) for item in value)
    return value


def _on_device(tensors: dict, device: torch.device) -> dict:
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in tensors.items()}


def _write_atomically(payload: dict, final: Path) -> str:
    """torch.save to a temporary name, fsync, rename; returns the file's sha256.

    Serialised in memory and written with plain file I/O, so a full disk surfaces as OSError(ENOSPC), not as
    torch's opaque zip-writer error.
    """
    tmp = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        buffer = io.BytesIO()
        torch.save(_on_host(payload), buffer)
        with open(tmp, "wb") as handle:
            handle.write(buffer.getbuffer())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return sha256_of(final)


def save_checkpoint(state, directory: str | os.PathLike, next_epoch: int, records: list[dict], keep: int) -> Path:
    """Collective: all ranks call it at the same epoch boundary."""
    ctx = state.ctx
    directory = Path(directory)
    target = epoch_dir(directory, next_epoch)
    error, digest, replicated_digest = None, None, None
    mine = target / rank_file(ctx.rank)
    try:
        target.mkdir(parents=True, exist_ok=True)
        own = {"schedule": state.exchanger.schedule.state_dict(), "codec": state.exchanger.codec.state_dict()}
        if sharded_rows(state.model):
            own["shards"] = own_rows(state.model, state.optimizer)
        digest = _write_atomically(own, mine)
        if ctx.is_root:
            weights, optimizer_state = replicated_state(state.model, state.optimizer)
            replicated_digest = _write_atomically({
                "next_epoch": next_epoch, "model": weights, "optimizer": optimizer_state, "records": records,
                "guard": state.guard.state_dict() if state.guard is not None else {}}, target / REPLICATED)
    except OSError as err:
        error = f"{err.strerror or err} ({type(err).__name__})"
    # One collective carries both: every rank's error (agreed on as comm.first_failure does) and digest.
    results = ctx.comm.allgather_object((error, digest))
    failure = failure_among([message for message, _ in results])
    if failure:
        mine.unlink(missing_ok=True)
        if ctx.is_root:
            (target / REPLICATED).unlink(missing_ok=True)
        rank, msg, _ = failure
        raise CheckpointError(f"checkpoint to {target} failed on rank {rank}: {msg}: free disk space or "
                              f"choose another --checkpoint-dir; the last complete checkpoint is unchanged")
    if ctx.is_root:
        widths = [state.model.convs[0].in_dim, state.model.convs[-1].out_dim]  # what export needs to rebuild it
        manifest = {"format": CHECKPOINT_FORMAT, "next_epoch": next_epoch, **describe_run(state), "widths": widths,
                    "replicated": {"file": REPLICATED, "sha256": replicated_digest},
                    "shards": [{"file": rank_file(r), "sha256": d} for r, (_, d) in enumerate(results)]}
        hetero = getattr(state.model, "hetero", None)
        if hetero is not None:  # a typed graph's types and relations: what export rebuilds its model from
            manifest["hetero"] = hetero
        tmp_manifest = target / f".{MANIFEST}.tmp"
        tmp_manifest.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp_manifest, target / MANIFEST)
        for old in complete_checkpoints(directory)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def complete_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoint folders that have a manifest, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("epoch-*") if (p / MANIFEST).is_file())


def _user_model_files(directory: str | os.PathLike) -> list[Path]:
    """The checkpoints of a --model MODULE:NAME run (gnn_dist.pyg.checkpoint: one gd.save file per epoch)."""
    from gnn_dist.pyg.checkpoint import epoch_files

    return epoch_files(directory)


def newest_checkpoint_epoch(directory: str | os.PathLike) -> int | None:
    """The epoch the newest complete checkpoint resumes at (None when there is none)."""
    found = complete_checkpoints(directory)
    if not found:
        user_model = _user_model_files(directory)
        return int(user_model[-1].stem.rpartition("-")[2]) if user_model else None
    try:
        return int(json.loads((found[-1] / MANIFEST).read_text())["next_epoch"])
    except (OSError, ValueError, KeyError):
        return None


def _read_verified(path: Path, entry: dict) -> dict:
    file = path / entry["file"]
    if not file.is_file() or sha256_of(file) != entry["sha256"]:
        raise CheckpointError(f"{file} is missing or corrupt (sha256 differs from {MANIFEST}): delete {path} "
                              f"to resume from the checkpoint before it")
    return torch.load(file, weights_only=True, map_location="cpu")


def newest_manifest(directory: str | os.PathLike) -> tuple[Path, dict] | None:
    """(folder, manifest) of the newest complete checkpoint in `directory`, or None when there is none."""
    found = complete_checkpoints(directory)
    if not found:
        return None
    path = found[-1]
    try:
        return path, json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path / MANIFEST}: unreadable ({err}): delete {path} to resume from the one "
                              f"before") from err


def trained_model(directory: str | os.PathLike) -> tuple[dict, dict, dict]:
    """(the ModelConfig fields, the model's state_dict, the manifest) of the newest complete checkpoint: what
    `gnn-dist embed` and `gnn-dist export` need, on any partition and at any P. CheckpointError when absent."""
    newest = newest_manifest(directory)
    if newest is None and _user_model_files(directory):
        raise CheckpointError(f"{directory} holds a --model MODULE:NAME model's checkpoints, which gnn-dist embed "
                              f"cannot run: gnn-dist export it and call the model in PyG")
    if newest is None:
        raise CheckpointError(f"no complete checkpoint in {directory}: train with --checkpoint-dir {directory} first")
    path, manifest = newest
    if manifest.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is a format-{manifest.get('format')} checkpoint: resume and train one epoch "
                              f"with this gnn-dist to rewrite it")
    replicated = _read_verified(path, manifest["replicated"])
    # options added since the checkpoint was written had their defaults then
    model = {**dataclasses.asdict(ModelConfig()), **manifest["model"]}
    return model, replicated["model"], manifest


def shard_files(directory: str | os.PathLike) -> list:
    """A loader of each rank file's "shards" entry in the newest checkpoint, read (and verified) when called:
    what gnn_dist.resilience.sharded.fill_rows takes, on any partition."""
    path, manifest = newest_manifest(directory)  # type: ignore[misc]
    return [lambda entry=entry: _read_verified(path, entry).get("shards", {}) for entry in manifest["shards"]]


def encoder_weights(weights: dict) -> dict:
    """The layer stack's own weights: without a link-prediction decoder's (`decoder.*`, gnn_dist.link.decoders)."""
    return {name: value for name, value in weights.items() if not name.startswith("decoder.")}


def load_checkpoint(state, directory: str | os.PathLike) -> tuple[int, list[dict]] | None:
    """Restore this rank from the newest complete checkpoint; None when there is none.

    Raises CheckpointError (on this rank) when it does not fit the run; the
    caller agrees on errors across ranks.
    """
    newest = newest_manifest(directory)
    if newest is None:
        return None
    path, manifest = newest
    expected = describe_run(state)
    if manifest.get("format") not in (1, CHECKPOINT_FORMAT):
        raise CheckpointError(f"{path}: checkpoint format {manifest.get('format')!r} is not {CHECKPOINT_FORMAT}: "
                              f"use another --checkpoint-dir")
    same_partition = manifest.get("num_parts") == expected["num_parts"] and \
        manifest.get("partition_id") == expected["partition_id"]
    if manifest["format"] == 1 and not same_partition:
        raise CheckpointError(f"{path} was written by an older gnn-dist, which resumes only on the partition and "
                              f"rank count that wrote it ({manifest.get('num_parts')} ranks): resume with those")
    if manifest["format"] != 1 and not _same_graph(manifest.get("graph"), expected["graph"]):
        raise CheckpointError(f"{path} was trained on {_graph_text(manifest.get('graph'))} but --parts "
                              f"{state.config.parts} holds {_graph_text(expected['graph'])}: resume on a partition of "
                              f"the same graph, or use another --checkpoint-dir")
    for key in RESUME_MUST_MATCH:
        recorded = manifest.get(key)
        if key == "model" and isinstance(recorded, dict):
            # options added since the checkpoint was written (--heads, --attn-dropout) had their defaults then
            recorded = {**dataclasses.asdict(type(state.config.model)()), **recorded}
        if key == "task" and recorded is None:
            recorded = {"task": "node"}  # checkpoints from before --task were node classification's
        if recorded != expected[key]:
            raise CheckpointError(f"{path} was trained with {key} {manifest.get(key)} but this run asks for "
                                  f"{expected[key]}: pass the same options or use another --checkpoint-dir")
    try:
        if manifest["format"] == 1:
            replicated = own = _read_verified(path, manifest["shards"][state.ctx.rank])
            own = {"schedule": own["schedule"], "codec": {"rng": own.get("codec_rng")}}
        else:
            replicated = _read_verified(path, manifest["replicated"])
            own = _read_verified(path, manifest["shards"][state.ctx.rank]) if same_partition else None
        # rows sharded by owner (embedding tables): this rank's own file on the same partition, else every old
        # rank's file in turn, keeping the rows it owns now (gnn_dist.resilience.sharded)
        old_files = [manifest["shards"][state.ctx.rank]] if same_partition else manifest["shards"]
        restore(state.model, state.optimizer, replicated["model"], replicated["optimizer"],
                [lambda entry=entry: _read_verified(path, entry)["shards"] for entry in old_files]
                if sharded_rows(state.model) else [])
        if state.guard is not None and replicated.get("guard"):
            state.guard.load_state_dict(replicated["guard"])
        if own is not None:
            state.exchanger.schedule.load_state_dict(_on_device(own["schedule"], state.device))
            state.exchanger.codec.load_state_dict(own["codec"])
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"{path} does not fit this model ({str(err).splitlines()[0]}): pass the same "
                              f"--model/--hidden/--num-layers or use another --checkpoint-dir") from err
    if not same_partition and state.ctx.is_root:
        rank_logger(state.ctx.rank).warning(
            f"the checkpoint in {path} was written by {manifest['num_parts']} ranks on another partition of this "
            f"graph: model, optimizer, epoch and metrics carry over; per-rank state (schedule caches, the halo "
            f"codec's random stream, the sampled feature cache) is rebuilt")
    return int(replicated["next_epoch"]), list(replicated["records"])


def graph_identity(comm, meta, node_ids: np.ndarray, labels: np.ndarray, degrees: np.ndarray) -> dict:
    """Collective: what a checkpoint records of the graph, the same for every partition of it at any P.

    The fingerprint sums a hash of every node's (original id, label, degree) over all ranks, so two graphs
    of one size (another seed of a synthetic preset, say) differ in it.
    """
    with np.errstate(over="ignore"):
        local = int(fingerprint_words(node_ids, labels, degrees).sum(dtype=np.uint64))
    total = sum(comm.allgather_object(local)) % (1 << 64)
    return {"dataset": meta.dataset, "num_nodes": meta.num_nodes, "num_edges": meta.num_edges,
            "fingerprint": f"{total:016x}"}


def _same_graph(recorded, mine: dict) -> bool:
    """The name may differ (a chunked copy of a dataset is the same graph); sizes and fingerprint may not."""
    return isinstance(recorded, dict) and all(recorded.get(k) == mine[k] for k in ("num_nodes", "num_edges",
                                                                                  "fingerprint"))


def _graph_text(graph) -> str:
    if not isinstance(graph, dict):
        return "an unrecorded graph"
    return (f"{graph.get('dataset')} ({graph.get('num_nodes'):,} nodes, {graph.get('num_edges'):,} edges, "
            f"fingerprint {graph.get('fingerprint')})")
