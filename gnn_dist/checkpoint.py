"""Checkpoints: every rank writes its shard, rank 0 then writes the manifest that names the set.

    DIR/epoch-000010/rank-00000.pt ...   one shard per rank (torch.save of tensors and plain values)
    DIR/epoch-000010/MANIFEST.json       written last, after every shard is on disk

Every file goes to a temporary name and is renamed when complete, so a crash
mid-write never leaves a checkpoint that looks complete: a checkpoint exists
only once its manifest does. Shards are read with torch.load(weights_only=True)
and checked against the sha256 recorded in the manifest.

A shard holds the model and optimizer state, the schedule's caches, the halo
codec's random state, the next epoch and (rank 0) the metrics so far; dropout
needs no state (its masks are keyed by epoch).
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import uuid
from pathlib import Path

import torch

from gnn_dist.comm import first_failure
from gnn_dist.context import SetupError
from gnn_dist.partition.format import sha256_of

MANIFEST = "MANIFEST.json"
CHECKPOINT_FORMAT = 1


class CheckpointError(SetupError):
    """Raised on every rank alike: a checkpoint cannot be written or does not fit this run."""


def epoch_dir(directory: Path, epoch: int) -> Path:
    return directory / f"epoch-{epoch:06d}"


def describe_run(state) -> dict:
    """What must match between the run that wrote a checkpoint and the run that resumes it."""
    config = state.config
    return {
        "num_parts": state.ctx.size,
        "partition_id": state.partition_id,
        "model": dataclasses.asdict(config.model),
        "schedule": config.schedule,
        "halo_dtype": config.halo_dtype,
    }


def shard_payload(state, next_epoch: int, records: list[dict]) -> dict:
    return {
        "format": CHECKPOINT_FORMAT,
        "next_epoch": next_epoch,
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "schedule": state.exchanger.schedule.state_dict(),
        "codec": state.exchanger.codec.state_dict(),
        "records": records if state.ctx.is_root else [],
    }


def save_checkpoint(state, directory: str | os.PathLike, next_epoch: int, records: list[dict], keep: int) -> Path:
    """Collective: all ranks call it at the same epoch boundary."""
    ctx = state.ctx
    directory = Path(directory)
    target = epoch_dir(directory, next_epoch)
    error, digest = None, None
    tmp = target / f".rank-{ctx.rank:05d}.pt.tmp-{uuid.uuid4().hex[:8]}"
    final = target / f"rank-{ctx.rank:05d}.pt"
    try:
        target.mkdir(parents=True, exist_ok=True)
        # Serialise in memory, then write with plain file I/O: a full disk then
        # surfaces as OSError(ENOSPC), not as torch's opaque zip-writer error.
        buffer = io.BytesIO()
        torch.save(shard_payload(state, next_epoch, records), buffer)
        with open(tmp, "wb") as handle:
            handle.write(buffer.getbuffer())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
        digest = sha256_of(final)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        error = f"{err.strerror or err} ({type(err).__name__})"
    failure = first_failure(ctx.comm, error)
    if failure:
        final.unlink(missing_ok=True)
        rank, msg, _ = failure
        raise CheckpointError(f"checkpoint to {target} failed on rank {rank}: {msg}: free disk space or "
                              f"choose another --checkpoint-dir; the last complete checkpoint is unchanged")
    digests = ctx.comm.allgather_object(digest)
    if ctx.is_root:
        manifest = {"format": CHECKPOINT_FORMAT, "next_epoch": next_epoch, **describe_run(state),
                    "shards": [{"file": f"rank-{r:05d}.pt", "sha256": d} for r, d in enumerate(digests)]}
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


def load_checkpoint(state, directory: str | os.PathLike) -> tuple[int, list[dict]] | None:
    """Restore this rank from the newest complete checkpoint; None when there is none.

    Raises CheckpointError (on this rank) when it does not fit the run; the
    caller agrees on errors across ranks.
    """
    found = complete_checkpoints(directory)
    if not found:
        return None
    path = found[-1]
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path / MANIFEST}: unreadable ({err}): delete {path} to resume from the one "
                              f"before") from err
    expected = describe_run(state)
    if manifest.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {manifest.get('format')!r} is not {CHECKPOINT_FORMAT}: "
                              f"use another --checkpoint-dir")
    if manifest.get("num_parts") != expected["num_parts"]:
        raise CheckpointError(f"{path} was written by {manifest.get('num_parts')} ranks but {expected['num_parts']} "
                              f"were started: resume with mpiexec -n {manifest.get('num_parts')} and the same --parts")
    if manifest.get("partition_id") != expected["partition_id"]:
        raise CheckpointError(f"{path} belongs to another partition than --parts {state.config.parts}: resume with "
                              f"the partition directory it was trained on, or use another --checkpoint-dir")
    for key in ("model", "schedule", "halo_dtype"):
        if manifest.get(key) != expected[key]:
            raise CheckpointError(f"{path} was trained with {key} {manifest.get(key)} but this run asks for "
                                  f"{expected[key]}: pass the same options or use another --checkpoint-dir")
    shard_info = manifest["shards"][state.ctx.rank]
    shard_path = path / shard_info["file"]
    if not shard_path.is_file() or sha256_of(shard_path) != shard_info["sha256"]:
        raise CheckpointError(f"{shard_path} is missing or corrupt (sha256 differs from {MANIFEST}): delete {path} "
                              f"to resume from the checkpoint before it")
    try:
        shard = torch.load(shard_path, weights_only=True)
        state.model.load_state_dict(shard["model"])
        state.optimizer.load_state_dict(shard["optimizer"])
        state.exchanger.schedule.load_state_dict(shard["schedule"])
        # "codec_rng": how shards written before codecs had a state_dict kept the int8 codec's generator
        state.exchanger.codec.load_state_dict(shard.get("codec", {"rng": shard.get("codec_rng")}))
    except (RuntimeError, KeyError, ValueError) as err:
        raise CheckpointError(f"{shard_path} does not fit this model ({str(err).splitlines()[0]}): pass the same "
                              f"--model/--hidden/--num-layers or use another --checkpoint-dir") from err
    return int(shard["next_epoch"]), list(shard["records"])
