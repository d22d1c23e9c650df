"""gd.save / gd.load: a distributed model's parameters, its optimizer's state and its step, resumable at any P.

Parameters and optimizer state are the same on every rank (rank 0's at the start, the same summed gradients
after), so rank 0 writes them once, under a temporary name renamed when complete, and any number of ranks
reads them back. The step keys the dropout masks and the schedules, so a resumed run draws what an
uninterrupted one would. Loading reads tensors only (torch.load with weights_only=True): nothing is unpickled.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

FORMAT = "gnn-dist pyg model 1"
# gnn-dist train --model MODULE:NAME's checkpoints: one gd.save file per epoch in --checkpoint-dir
EPOCH_FILES = "model-epoch-*.pt"


def epoch_file(directory: str | os.PathLike, epoch: int) -> Path:
    return Path(directory) / f"model-epoch-{epoch:06d}.pt"


def epoch_files(directory: str | os.PathLike) -> list[Path]:
    """The command line's checkpoints of a user's model in directory, oldest first."""
    return sorted(Path(directory).glob(EPOCH_FILES))


def save(path: str | os.PathLike, model, optimizer=None, run: dict | None = None) -> None:
    """Write the model (a gd.distribute'd one) and the optimizer's state; a collective (rank 0 writes).
    run: what a caller's loop needs to resume (gnn-dist train's epoch and records: numbers, strings, lists and
    dicts of them), returned by load."""
    ctx = model.ctx
    if ctx.is_root:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        state = {"format": FORMAT, "step": model.step, "seed": model.seed, "model": model.module.state_dict()}
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        if run is not None:
            state["run"] = run
        torch.save(state, tmp)
        os.replace(tmp, path)
    ctx.comm.barrier()


def read(path: str | os.PathLike) -> dict:
    """What save wrote, as saved (tensors and plain values only); ValueError when it is not such a file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as err:
        raise ValueError(f"{path} is not a file gd.save wrote ({err}): pass the path of one") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a file gd.save wrote: pass the path of one")
    return state


def load(path: str | os.PathLike, model, optimizer=None) -> dict | None:
    """Restore what save wrote, at this job's number of ranks (any); returns save's `run` (None without one)."""
    return restore(read(path), model, optimizer, path)


def restore(state: dict, model, optimizer=None, path: str | os.PathLike = "the checkpoint") -> dict | None:
    """Restore a state read from path (read's result); returns save's `run` (None without one)."""
    model.module.load_state_dict(state["model"])
    model.step = int(state["step"])
    model.seed = int(state["seed"])
    if optimizer is not None:
        if "optimizer" not in state:
            raise ValueError(f"{path} holds no optimizer state: it was saved without one")
        optimizer.load_state_dict(state["optimizer"])
    return state.get("run")
