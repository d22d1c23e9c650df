"""A rank's view of the graph: its owned rows' data and the sparse operator over [owned | halo] columns."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from gnn_dist.device import HOST
from gnn_dist.halo.blocks import BlockedOperator, build_blocked_operator
from gnn_dist.kernels.spmm import SparseOperator
from gnn_dist.partition.format import PartData

# A model's normalisation of its operator (DistConv.normalise): (rows, cols, global degrees, first row, rows) ->
# (rows, cols, values). The graph sits beneath the models, so the caller hands it over.
Normalise = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]


def normalised_rows(part: PartData, normalise: Normalise, start: int, stop: int,
                    device: torch.device = HOST) -> tuple[torch.Tensor, ...]:
    """COO entries of the normalised operator's rows [start, stop): (rows - start, columns, float32 values),
    on `device`.

    Columns index [owned | halo]. Normalisation uses the global degrees of the
    part file, so these rows equal the whole-graph operator's rows. The whole
    part's operator and the row chunks of layer-wise evaluation both come from
    here, so they hold the same values in the same order.
    """
    lo, hi = int(part.indptr[start]), int(part.indptr[stop])
    rows = np.repeat(np.arange(stop - start, dtype=np.int64), np.diff(part.indptr[start:stop + 1]))
    cols = np.asarray(part.indices[lo:hi], dtype=np.int64)
    rows, cols, values = normalise(rows, cols, part.deg, start, stop - start)
    return (torch.from_numpy(rows).to(device), torch.from_numpy(cols).to(device),
            torch.from_numpy(values.astype(np.float32)).to(device))


@dataclass(frozen=True)
class RowChunk:
    """Evaluation's rows [start, stop) of a part's operator, over owned columns [0, n_owned) and halo columns.

    `ranges()` gives each row's owned and halo entries in place (what a linear aggregation multiplies with
    kernels.spmm.spmm_into); `split_operators()` copies them into two operators (what a model's own
    aggregate_rows takes).

    Shapes: rows [stop - start, n_owned + n_halo]; begin, mid, end: [stop - start]
    """

    start: int
    stop: int
    n_owned: int
    rows: SparseOperator       # the chunk's rows, or (matrix=) the whole operator whose rows the ranges index
    begin: torch.Tensor
    mid: torch.Tensor
    end: torch.Tensor

    def ranges(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(CSR matrix, begin, mid, end): row r's owned entries are [begin[r], mid[r]), its halo ones [mid[r], end[r])."""
        return self.rows.matrix, self.begin, self.mid, self.end

    def split_operators(self) -> tuple[SparseOperator, SparseOperator]:
        rows = self.rows if self.rows.shape[0] == self.stop - self.start else self.rows.row_slice(self.start, self.stop)
        return rows.split_columns(self.n_owned)


class OperatorRows:
    """Row chunks of an operator already built (full-batch mode): slices, no new entries."""

    def __init__(self, operator: SparseOperator, n_owned: int):
        self.operator = operator
        self.n_owned = n_owned

    def rows(self, start: int, stop: int) -> SparseOperator:
        return self.operator.row_slice(start, stop)

    def chunk(self, start: int, stop: int) -> RowChunk:
        begin, mid, end = (r[start:stop] for r in self.operator.column_ranges(self.n_owned))
        return RowChunk(start, stop, self.n_owned, self.operator, begin, mid, end)


class PartRows:
    """Row chunks built from the part's CSR when asked (sampled mode keeps no whole-part operator).

    Each chunk is forward-only and lives only while its rows are computed, so
    evaluation holds at most one chunk's entries at a time.
    """

    def __init__(self, part: PartData, normalise: Normalise, device: torch.device = HOST):
        self.part = part
        self.normalise = normalise
        self.n_cols = part.n_owned + part.n_halo
        self.device = device

    def rows(self, start: int, stop: int) -> SparseOperator:
        rows, cols, values = normalised_rows(self.part, self.normalise, start, stop, self.device)
        return SparseOperator.from_coo(rows, cols, values, (stop - start, self.n_cols), with_transpose=False)

    def chunk(self, start: int, stop: int) -> RowChunk:
        rows = self.rows(start, stop)
        return RowChunk(start, stop, self.part.n_owned, rows, *rows.column_ranges(self.part.n_owned))


@dataclass(frozen=True)
class LocalGraph:
    """Owned nodes' data and the sparse operators over [owned | halo] columns.

    Normalisation uses global degrees (stored in the part file), so the
    operators equal the whole-graph ones restricted to this rank's rows.
    `operator` (with its transpose, for training) exists only when built with
    whole_operator=True; `rows` gives any row range's operator either way.
    """

    n_owned: int
    n_halo: int
    node_ids: torch.Tensor  # int64 [n_owned] original ids (dropout keys, gathering results)
    halo_ids: torch.Tensor  # int64 [n_halo]
    column_ids: torch.Tensor  # int64 [n_owned + n_halo]: node_ids then halo_ids
    x: torch.Tensor         # float32 [n_owned, F]
    y: torch.Tensor         # int64 [n_owned]
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    operator: SparseOperator | None
    rows: OperatorRows | PartRows | None
    blocked: BlockedOperator | None = None

    @classmethod
    def from_part(cls, part: PartData, normalise: Normalise | None, whole_operator: bool = True,
                  blocked_by: tuple[np.ndarray, int] | None = None,
                  device: torch.device = HOST, row_access: bool = True) -> LocalGraph:
        """normalise: the model's (gnn_dist.models.model_class(name).normalise). whole_operator: build the
        part's operator (full-batch, resident halos). blocked_by: (the P x P
        send-count matrix, halo block rows) builds the column-blocked operator of sequential halos instead,
        and no row access to the part is kept (evaluation runs the sequential forward). row_access=False keeps
        none either (a typed graph's operator is its model's own, gnn_dist.hetero.typed_part), so the part's
        CSR is not held. Every tensor is placed on `device` (on the host, the part file's arrays are used
        without a copy)."""
        n_owned, n_halo = part.n_owned, part.n_halo
        operator, rows, blocked = None, PartRows(part, normalise, device) if row_access else None, None
        if blocked_by is not None:
            send_counts, block_rows = blocked_by
            recv_counts = np.bincount(part.halo_owner, minlength=part.meta.num_parts)
            blocked = build_blocked_operator(*normalised_rows(part, normalise, 0, n_owned, device), n_owned, part.part_id,
                                             send_counts, recv_counts, block_rows)
            rows = None
        elif whole_operator:
            operator = SparseOperator.from_coo(*normalised_rows(part, normalise, 0, n_owned, device),
                                               (n_owned, n_owned + n_halo))
            rows = OperatorRows(operator, n_owned)
        def placed(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(array).to(device)

        return cls(
            n_owned=n_owned, n_halo=n_halo,
            node_ids=placed(part.node_ids), halo_ids=placed(part.halo_ids),
            column_ids=placed(np.concatenate([part.node_ids, part.halo_ids])),
            x=placed(part.x), y=placed(part.y),
            train_mask=placed(part.train_mask), val_mask=placed(part.val_mask),
            test_mask=placed(part.test_mask), operator=operator, rows=rows, blocked=blocked,
        )

    @property
    def device(self) -> torch.device:
        """Where the rank computes. Sampled mode keeps x (served to peers) on the host whatever the device."""
        return self.node_ids.device
