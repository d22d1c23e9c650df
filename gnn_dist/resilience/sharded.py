"""Checkpoints of a model whose parameters are partly sharded by owner (a typed graph's embedding tables).

A model may hold, beside the weights every rank shares, rows that live only on the rank owning their node
(gnn_dist.hetero.inputs: `model.sharded_rows()` -> {state_dict name: (parameter, each row's type-local id)}).
No rank ever holds a whole table or its optimiser state, so a checkpoint keeps them apart:

    replicated.pt       the model without its shards, the optimiser's state without theirs (rank 0 writes it)
    rank-0000k.pt       "shards": per shard, the ids of its rows, the rows, and the optimiser's state of them
                        (Adam's moments row by row, its step count), keyed by (shard name = type, id)

A resume on the partition that wrote it reads its own file. A resume on another partition (another P) reads
the old ranks' files one at a time and keeps the rows whose ids it owns now: a rank holds at most its new shard
and one old shard at once, never a table. Every row of every shard must be found, or the resume is refused.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch


def sharded_rows(model) -> dict:
    """{state_dict name: (parameter, int64 ids of its rows)}; {} for a model whose parameters are all replicated."""
    rows = getattr(model, "sharded_rows", None)
    return rows() if rows is not None else {}


def _indices(optimizer) -> dict:
    """id(parameter) -> its index in optimizer.state_dict() (parameters numbered across groups, in order)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {id(p): i for i, p in enumerate(params)}


def replicated_state(model, optimizer) -> tuple[dict, dict]:
    """(model state_dict, optimiser state_dict) without the sharded rows and their optimiser state."""
    shards = sharded_rows(model)
    weights = {name: value for name, value in model.state_dict().items() if name not in shards}
    optimizer_state = optimizer.state_dict()
    if shards:
        index = _indices(optimizer)
        left_out = {index[id(p)] for p, _ in shards.values()}
        optimizer_state = {"state": {i: s for i, s in optimizer_state["state"].items() if i not in left_out},
                           "param_groups": optimizer_state["param_groups"]}
    return weights, optimizer_state


def own_rows(model, optimizer) -> dict:
    """This rank's part of a checkpoint: per shard, its rows' ids, the rows and their optimiser state."""
    def host_ids(ids) -> torch.Tensor:
        return torch.from_numpy(np.asarray(ids, dtype=np.int64))  # host: a checkpoint's, written from the host

    return {name: {"ids": host_ids(ids), "rows": p.detach(), "optimizer": dict(optimizer.state.get(p, {}))}
            for name, (p, ids) in sharded_rows(model).items()}


def restore(model, optimizer, weights: dict, optimizer_state: dict,
            old_shards: Iterable[Callable[[], dict]]) -> None:
    """Load the replicated state, then each shard's rows from the old ranks' files (old_shards: one loader per file
    that returns its "shards" entry, called one at a time). ValueError when a row or a weight is missing."""
    shards = _load_replicated(model, weights)
    if len(optimizer_state["param_groups"]) != len(optimizer.param_groups):
        optimizer_state = _regrouped(model, optimizer, optimizer_state)
    full = {"state": dict(optimizer_state["state"]), "param_groups": optimizer_state["param_groups"]}
    if shards:
        index = _indices(optimizer)
        for reshard in fill_rows(shards, old_shards, with_optimizer=True):
            if reshard.moments is not None:
                full["state"][index[id(reshard.parameter)]] = reshard.optimizer_entry()
    optimizer.load_state_dict(full)


def _regrouped(model, optimizer, optimizer_state: dict) -> dict:
    """A checkpoint's optimiser state written with the tables in their own group (--embedding-weight-decay) or
    without, renumbered for this run's groups, whose settings it takes. Written in one group, parameters are
    numbered in model order; in two, the tables follow the others (gnn_dist.training.setup.parameter_groups)."""
    tables = {id(p) for p, _ in sharded_rows(model).values()}
    everything = list(model.parameters())
    written = everything if len(optimizer_state["param_groups"]) == 1 else \
        [p for p in everything if id(p) not in tables] + [p for p in everything if id(p) in tables]
    now = _indices(optimizer)
    return {"state": {now[id(written[i])]: s for i, s in optimizer_state["state"].items()},
            "param_groups": optimizer.state_dict()["param_groups"]}


def restore_model(model, weights: dict, old_shards: Iterable[Callable[[], dict]]) -> None:
    """The model alone, as restore() loads it, without optimiser state (gnn-dist embed). ValueError when a
    weight or a row is missing."""
    fill_rows(_load_replicated(model, weights), old_shards)


def _load_replicated(model, weights: dict) -> dict:
    """Load the replicated weights; the model's shards (sharded_rows), which the weights must leave out."""
    shards = sharded_rows(model)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or set(missing) != set(shards):
        raise ValueError(f"weights missing {sorted(set(missing) - set(shards))}, unexpected {sorted(unexpected)}")
    return shards


def fill_rows(shards: dict, old_shards: Iterable[Callable[[], dict]], with_optimizer: bool = False) -> list:
    """Fill each shard ({name: (tensor, the int64 ids of its rows)}) with its rows by id from the old ranks'
    files, one file at a time (and, with_optimizer, gather their optimiser state); the _Reshards. ValueError when
    a row is in no file. A whole table is a shard whose ids are all of its type's (gnn-dist export)."""
    restored = {name: _Reshard(p, ids, with_optimizer) for name, (p, ids) in shards.items()}
    for load in old_shards:
        held = load()
        for name, rows in held.items():
            if name not in restored:
                raise ValueError(f"the checkpoint has a shard {name!r} this model lacks")
            restored[name].take(rows)
        del held
    for name, reshard in restored.items():
        reshard.check(name)
    return list(restored.values())


class _Reshard:
    """One shard being filled from the old ranks' rows: the rows this rank owns now, wherever they were."""

    def __init__(self, parameter: torch.Tensor, ids: np.ndarray, with_optimizer: bool):
        self.parameter, self.with_optimizer = parameter, with_optimizer
        self.order = np.argsort(ids, kind="stable")
        self.sorted_ids = np.asarray(ids, dtype=np.int64)[self.order]
        # the rows land in the shard itself: a second buffer of its size would double export's whole tables (a
        # resume that fails on a missing row stops the run, so a half-filled shard is never trained on)
        self.rows = parameter.detach()
        self.found = np.zeros(len(ids), dtype=bool)
        self.moments: dict | None = None  # optimiser state per row (Adam's exp_avg, exp_avg_sq)
        self.scalars: dict = {}            # optimiser state shared by the rows (Adam's step)

    def take(self, held: dict) -> None:
        """Copy in the rows of one old shard whose ids this rank owns."""
        old_ids = held["ids"].numpy()
        position = np.searchsorted(self.sorted_ids, old_ids).clip(max=max(len(self.sorted_ids) - 1, 0))
        mine = (self.sorted_ids[position] == old_ids) if len(self.sorted_ids) else np.zeros(len(old_ids), bool)
        found = self.order[position[mine]]
        target = torch.from_numpy(found).to(self.rows.device)
        source = torch.from_numpy(np.flatnonzero(mine))  # host: indexes the checkpoint's rows, read on the host
        self.rows[target] = held["rows"][source].to(self.rows)
        self.found[found] = True
        for key, value in held["optimizer"].items() if self.with_optimizer else ():
            if value.dim() >= 1 and value.shape[0] == len(old_ids):
                if self.moments is None:
                    self.moments = {}
                row_state = self.moments.setdefault(key, torch.zeros_like(self.rows, dtype=value.dtype))
                row_state[target] = value[source].to(row_state.device)
            else:
                self.scalars[key] = value

    def check(self, name: str) -> None:
        if not self.found.all():
            raise ValueError(f"{int((~self.found).sum())} rows of {name} are in none of the checkpoint's shards")
        if self.moments is None and self.scalars:
            self.moments = {}

    def optimizer_entry(self) -> dict:
        return {**self.scalars, **(self.moments or {})}
