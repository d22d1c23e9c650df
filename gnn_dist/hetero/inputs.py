"""The typed inputs of a rank: every owned and halo row brought to one width (--hidden) before the first layer.

A featured type's rows go through that type's Linear (no activation after it), replicated on every rank like
every layer's weights; its halo rows' raw features are fetched once at set-up, one exchange per type (a
restricted halo plan: gnn_dist.halo.plan.HaloPlan.restricted), as a homogeneous graph's are.

A featureless type learns an embedding table whose rows live only on the rank that owns each node: the rank's
shard holds exactly its owned rows of that type, an ordinary dense parameter that the run's optimiser updates
every step like every other weight (so Adam's moments and weight decay are those of torch.nn.Embedding under
torch.optim.Adam). Its halo rows travel every step, always exactly and in fp32 (HaloExchanger.gather_inputs
over the featureless types' rows), and their gradients travel back to the owners, who add them in. No rank
ever holds a whole table. Each row starts as N(0, 1) values keyed by (seed, the node's id), so the table is
the same at every P (gnn_dist.kernels.keyed_random.keyed_normal).

Under --halo-memory sequential the inputs are the owned rows alone (with_halo=False): the first layer exchanges them
block by block, Linear outputs and embedding rows alike, as every later layer exchanges its input.

Shapes: forward() -> [n_owned + n_halo, hidden], owned rows first (the part's order), then the halo's
(with_halo=False: [n_owned, hidden]).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gnn_dist.halo.exchange import HaloExchanger
from gnn_dist.hetero.typed_part import TypedPart
from gnn_dist.kernels.keyed_random import keyed_normal
from gnn_dist.models.base import linear_uniform_
from gnn_dist.partition.format import PartData

EMBEDDINGS_SLOT = "embeddings"  # the exchange slot of the featureless types' rows


class TypedInputs(nn.Module):
    def __init__(self, part: PartData, typed: TypedPart, hidden: int, exchanger: HaloExchanger, seed: int,
                 with_halo: bool = True):
        """with_halo=False (--halo-memory sequential): the inputs are the owned rows alone, which the first layer
        exchanges block by block as every later layer does; no halo features are fetched and no embedding
        rows travel here."""
        super().__init__()
        self.with_halo = with_halo
        self.typed = typed
        self.n_owned, self.n_halo = part.n_owned, part.n_halo
        device = exchanger.plan.device
        self.linears = nn.ModuleDict()
        self.shards = nn.ParameterDict()
        self.owned_rows, self.halo_rows = {}, {}  # type -> positions among the owned / halo rows
        self.owned_x, self.halo_x = {}, {}        # featured type -> its raw features (constants)
        self.shard_ids: dict[str, np.ndarray] = {}  # featureless type -> its shard's type-local ids, row by row
        send_type = typed.owned_type[exchanger.plan.send_idx.cpu().numpy()]
        for k, name in enumerate(typed.node_types):
            owned = np.flatnonzero(typed.owned_type == k)
            halo = np.flatnonzero(typed.halo_type == k)
            self.owned_rows[name] = torch.from_numpy(owned).to(device)
            self.halo_rows[name] = torch.from_numpy(halo).to(device)
            if typed.featured(name):
                self.linears[name] = nn.Linear(typed.feature_widths[name], hidden)
                x = torch.from_numpy(part.arrays[f"x__{name}"]).to(device)
                self.owned_x[name] = x
                if not with_halo:
                    continue
                # the halo's raw features of this type, once: send rows are read from x__name's own rows
                position = np.full(part.n_owned, -1, dtype=np.int64)
                position[owned] = np.arange(len(owned))
                sends = send_type == k
                plan = exchanger.plan.restricted(typed.halo_type == k, sends,
                                                 position[exchanger.plan.send_idx.cpu().numpy()[sends]])
                self.halo_x[name] = HaloExchanger(exchanger.comm, plan, counters=exchanger.counters,
                                                  beat=exchanger.beat).fetch_once(x)
            else:
                ids = part.node_ids[owned]  # homogeneous ids: unique per (type, type-local id)
                rows = keyed_normal(ids, seed, hidden, dtype=np.float32)
                self.shards[name] = nn.Parameter(torch.from_numpy(rows).to(device))
                self.shard_ids[name] = ids - typed.offsets[k]  # the rows' type-local ids (checkpoints key on them)
        featureless = ~np.isin(np.arange(len(typed.node_types)), [typed.type_index(t) for t in self.linears])
        self.halo_featureless = torch.from_numpy(np.flatnonzero(featureless[typed.halo_type])).to(device)
        # the rows forward()'s pieces fill: the owned rows of each type in type order; the featured types' halo
        # rows, then the featureless ones as the embedding exchange lists them
        self.owned_positions = list(self.owned_rows.values())
        self.halo_positions = [self.halo_rows[name] for name in self.linears]
        # the embedding rows' exchange: the featureless types' halo rows and send rows only
        self.embeddings = None
        if featureless.any() and with_halo:
            plan = exchanger.plan.restricted(featureless[typed.halo_type], featureless[send_type])
            self.embeddings = HaloExchanger(exchanger.comm, plan, counters=exchanger.counters, beat=exchanger.beat)
            self.halo_positions.append(self.halo_featureless)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """The Linears' initial weights (torch's default rule, from the stack's generator). The embedding shards
        keep their keyed values: a table initialised per rank from a generator would depend on P."""
        for linear in self.linears.values():
            linear_uniform_(linear, generator)

    def replicated_parameters(self) -> list[nn.Parameter]:
        return list(self.linears.parameters())

    def sharded_parameters(self) -> list[nn.Parameter]:
        return list(self.shards.values())

    def sharded_rows(self) -> dict[str, tuple[nn.Parameter, np.ndarray]]:
        """featureless type -> (its shard, the type-local id of each of its rows): what a checkpoint keys on."""
        return {name: (shard, self.shard_ids[name]) for name, shard in self.shards.items()}

    def forward(self) -> torch.Tensor:
        """Each type's rows made in one piece, and each piece written straight to its rows of the output
        (_PlacedRows): no joined copy of the pieces, and a backward that reads each piece's gradient rows where
        a gather's would add into a zero tensor of the whole."""
        owned = _PlacedRows.apply(self.owned_positions, self.n_owned,
                                  *[self.linears[name](self.owned_x[name]) if name in self.linears
                                    else self.shards[name] for name in self.typed.node_types])
        if not self.with_halo:
            return owned
        halo_pieces = [self.linears[name](self.halo_x[name]) for name in self.linears]
        if self.embeddings is not None:
            # every rank takes part, even one without featureless rows to send or receive: it is a collective
            halo_pieces.append(self.embeddings.gather_inputs(owned, EMBEDDINGS_SLOT)[self.n_owned:])
        if self.n_halo == 0:
            return owned  # one rank: no halo rows to join
        return torch.cat([owned, _PlacedRows.apply(self.halo_positions, self.n_halo, *halo_pieces)])


class _PlacedRows(torch.autograd.Function):
    """rows[positions[k]] = pieces[k], for pieces that together fill every row once ([n, F] from pieces
    [m_k, F]); the backward hands each piece its rows of the gradient."""

    @staticmethod
    def forward(ctx, positions: list, n_rows: int, *pieces: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.positions = positions
        out = pieces[0].new_empty(n_rows, pieces[0].shape[1])  # every call has a piece: a type, or a halo row's
        for where, piece in zip(positions, pieces, strict=True):
            out.index_copy_(0, where, piece)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return (None, None, *(grad.index_select(0, where) if needed else None
                              for where, needed in zip(ctx.positions, ctx.needs_input_grad[2:], strict=True)))
