"""gd.load_partition: a rank's part as a torch_geometric Data, and the halo graph behind it (`PartGraph`).

What the user handles holds owned rows only: x, y, the masks and n_id (original ids) have one row per owned
node, and edge_index every in-edge of an owned node in local ids, sources in [owned | halo] (owned rows
first), targets always owned. The halo rows live in the PartGraph, which the wrapped model's layers ask for
them (gnn_dist.pyg.halo_hooks). data.x is a view of the owned rows of the cached [owned | halo] input features,
fetched once here, so a first layer reading data.x exchanges nothing per step (as --model gcn's first layer).
"""
from __future__ import annotations

import atexit
from dataclasses import dataclass, field

import numpy as np
import torch

from gnn_dist.comm.codec import make_codec
from gnn_dist.comm.communicator import first_failure
from gnn_dist.context import RankContext, SetupError
from gnn_dist.halo.exchange import HaloExchanger
from gnn_dist.halo.overlap import agreed_overlap
from gnn_dist.halo.plan import HaloPlan
from gnn_dist.halo.shared import SharedHalo
from gnn_dist.partition.format import load_meta, load_part
from gnn_dist.partition.graph import EDGE_ARRAYS
from gnn_dist.pyg.passes import last_loaded
from gnn_dist.schedules import parse_schedule

# The attribute of a tensor of owned rows that holds the same rows with the halo's appended, where gnn-dist
# knows them without an exchange (data.x, and what keyed dropout made of it).
WITH_HALO = "gnn_dist_with_halo"


@dataclass
class PartGraph:
    """The rank's halo: the plan, the exchanger, the original ids of [owned | halo] rows, caches of the part."""

    ctx: RankContext
    plan: HaloPlan
    exchanger: HaloExchanger
    all_ids: torch.Tensor     # int64 [n_owned + n_halo]: original ids of [owned | halo] rows (keys every dropout)
    edge_index: torch.Tensor  # int64 [2, E]: data.edge_index
    # gcn_norm's results for the part's own edges (gnn_dist.pyg.gcn_norm): (improved, self loops, dtype) -> ...
    norm_cache: dict = field(default_factory=dict)
    edge_weight: torch.Tensor | None = None  # data.edge_weight, where the partition has one
    part: object = None  # the part as loaded (partition.format.PartData): its CSR and halo, which gd.NeighborLoader samples
    x_full: torch.Tensor | None = None  # [owned | halo] rows of data.x: what a loader's feature store serves

    @property
    def n_owned(self) -> int:
        return self.plan.n_owned

    @property
    def n_all(self) -> int:
        return self.plan.n_owned + self.plan.n_halo

    @property
    def node_ids(self) -> torch.Tensor:
        return self.all_ids[:self.n_owned]

    @property
    def halo_ids(self) -> torch.Tensor:
        return self.all_ids[self.n_owned:]

    def configure(self, schedule: str, halo_dtype: str | None, seed: int) -> None:
        """The schedule and wire format of the model's exchanges (gd.distribute's options)."""
        self.exchanger.schedule = parse_schedule(schedule, seed)
        self.exchanger.codec = make_codec(halo_dtype or "fp32", seed, self.ctx.rank)

    def with_halo(self, x: torch.Tensor, slot: str) -> torch.Tensor:
        """[owned | halo] rows of x (differentiable; a collective: every rank calls it alike).

        Shapes: [n_owned, *] -> [n_owned + n_halo, *]
        """
        known = getattr(x, WITH_HALO, None)
        if known is not None:
            return known
        if x.shape[0] != self.n_owned:
            raise ValueError(f"{slot}: a tensor of {x.shape[0]} rows reached the halo exchange, which takes one row "
                             f"per owned node ({self.n_owned} on rank {self.ctx.rank})")
        if not x.is_floating_point():
            raise ValueError(f"{slot}: gnn-dist exchanges floating-point node tensors only (got {x.dtype})")
        flat = x.reshape(x.shape[0], -1)
        return self.exchanger.gather(flat, slot).reshape(self.n_all, *x.shape[1:])

    def check_complete(self, rows: torch.Tensor, slot: str) -> None:
        """Rows a layer computed from [owned | halo] inputs gnn-dist supplied must be [owned | halo] rows."""
        if rows.shape[0] != self.n_all:
            raise ValueError(f"{slot}: a layer given [owned | halo] input rows ({self.n_all}) passed {rows.shape[0]} "
                             f"rows to message passing; gnn-dist cannot tell which rows these are")

    def input_with_halo(self, x: torch.Tensor, slot: str) -> torch.Tensor:
        """[owned | halo] rows of a tensor that is an input of the model, exactly (fp32 rows, whatever the
        schedule and --halo-dtype): degrees for the normalisation. Differentiable."""
        flat = x.reshape(x.shape[0], -1)
        return self.exchanger.gather_inputs(flat, slot).reshape(self.n_all, *x.shape[1:])


def _build(ctx: RankContext, directory: str, dtype: torch.dtype | None):
    meta = load_meta(directory)
    ctx.check_num_parts(meta.num_parts, directory)
    if meta.hetero is not None:
        raise SetupError(f"{directory} holds a typed graph: gd.load_partition reads homogeneous partitions so far; "
                         f"train it with gnn-dist train --model rgcn|rgat")
    if meta.task != "node":
        raise SetupError(f"{directory} was partitioned for --task {meta.task}: gd.load_partition reads node "
                         f"classification partitions; re-partition without --task {meta.task}")
    part = load_part(directory, ctx.rank, meta)
    return meta, part


def _host(array: np.ndarray) -> torch.Tensor:
    """A part's array as a tensor of its own."""
    return torch.from_numpy(np.array(array))  # host: gd.load_partition's data stays on CPUs (the wrapper runs there)


def load_partition(directory: str, ctx: RankContext, dtype: torch.dtype | None = None):
    """This rank's part of a partition directory as a torch_geometric.data.Data of its owned rows.

    A collective: every rank calls it (the halo's input features are fetched here, once). dtype: the
    floating-point type of x (default: as stored, float32).
    """
    from torch_geometric.data import Data

    meta, part = _agreed(ctx, lambda: _build(ctx, str(directory), dtype))

    plan = HaloPlan.from_part(part)
    # exact exchanges of linear layers overlap the owned product where every rank agrees (gnn-dist train's rule)
    overlap = _agreed(ctx, lambda: agreed_overlap(ctx.comm))
    # one host: the overlapped exchanges' rows go through shared memory instead of MPI's copies
    shared = _agreed(ctx, lambda: SharedHalo.open(ctx.comm, np.diff(part.send_ptr))) if overlap else None
    exchanger = HaloExchanger(ctx.comm, plan, overlap=overlap, shared=shared)
    if ctx.comm.aborts_job:
        # before MPI finalises (mpi4py's own exit handler, registered earlier, runs later): complete what a
        # pipelined schedule still has in flight and free the shared regions, on every rank alike
        atexit.register(exchanger.drain)
    x = _host(part.x)
    if dtype is not None:
        x = x.to(dtype)
    halo_x = exchanger.fetch_once(x) if meta.num_parts > 1 else x[:0]
    x_full = torch.cat([x, halo_x])
    exchanger.counters.reset()  # set-up's fetch is not a step's traffic

    counts = np.diff(part.indptr)
    targets = np.repeat(np.arange(part.n_owned, dtype=np.int64), counts)
    edge_index = _host(np.stack([part.indices.astype(np.int64), targets]))
    # the part's own copy of x goes (data.x holds the rows); its CSR and halo stay for gd.NeighborLoader
    part.arrays["x"] = part.arrays["x"][:0]
    graph = PartGraph(ctx=ctx, plan=plan, exchanger=exchanger,
                      all_ids=_host(np.concatenate([part.node_ids, part.halo_ids])), edge_index=edge_index,
                      part=part, x_full=x_full)
    owned_x = x_full[:part.n_owned]
    setattr(owned_x, WITH_HALO, x_full)
    data = Data(x=owned_x, edge_index=edge_index, y=_host(part.y),
                train_mask=_host(part.train_mask), val_mask=_host(part.val_mask),
                test_mask=_host(part.test_mask), n_id=graph.node_ids,
                halo_n_id=graph.halo_ids, num_nodes=part.n_owned)
    for name in EDGE_ARRAYS:  # the values of each in-edge, in edge_index's order
        if name in part.arrays:
            data[name] = _host(part.arrays[name])
    graph.edge_weight = data.get("edge_weight")
    data.num_classes = int(meta.num_classes)
    data._gnn_dist = graph  # an underscore name: kept on the object, not among the Data's attributes
    last_loaded(graph)
    return data


def _agreed(ctx: RankContext, build):
    """build() on every rank; if it fails on any, every rank raises the same SetupError (no rank waits alone)."""
    try:
        result, error = build(), None
    except (ValueError, OSError, SetupError) as err:
        result, error = None, str(err)
    failure = first_failure(ctx.comm, error)
    if failure:
        rank, message, everyone_alike = failure
        raise SetupError(message if everyone_alike else f"rank {rank}: {message}")
    return result


def graph_of(data) -> PartGraph:
    """The PartGraph behind a Data that gd.load_partition returned."""
    graph = getattr(data, "_gnn_dist", None) if data is not None else None
    if graph is None:
        raise ValueError("gd.distribute(model, data) takes the data gd.load_partition returned (it carries the "
                         "rank's halo); load the partition with gd.load_partition(DIR, ctx)")
    return graph
