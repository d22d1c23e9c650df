"""gd.save / gd.load: a distributed model's parameters, its optimizer's state and its step, resumable at any P.

Parameters and optimizer state are the same on every rank (rank 0's at the start, the same summed gradients
after), so rank 0 writes them once, under a temporary name renamed when complete, and any number of ranks
reads them back. The step keys the dropout masks and the schedules, so a resumed run draws what an
uninterrupted one would. Loading reads tensors only (torch.load with weights_only=True): nothing is unpickled.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

FORMAT = "gnn-dist pyg model 1"


def save(path: str | os.PathLike, model, optimizer=None) -> None:
    """Write the model (a gd.distribute'd one) and the optimizer's state; a collective (rank 0 writes)."""
    graph = model.graph
    if graph.ctx.is_root:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        state = {"format": FORMAT, "step": model.step, "seed": model.seed, "model": model.module.state_dict()}
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        torch.save(state, tmp)
        os.replace(tmp, path)
    graph.ctx.comm.barrier()


def load(path: str | os.PathLike, model, optimizer=None) -> None:
    """Restore what save wrote, at this job's number of ranks (any)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a file gd.save wrote: pass the path of one")
    model.module.load_state_dict(state["model"])
    model.step = int(state["step"])
    model.seed = int(state["seed"])
    if optimizer is not None:
        if "optimizer" not in state:
            raise ValueError(f"{path} holds no optimizer state: it was saved without one")
        optimizer.load_state_dict(state["optimizer"])
