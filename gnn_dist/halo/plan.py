"""The halo plan of a part: built once from the part file, never changed.

Which owned rows each peer needs (send lists, grouped by peer) and how many halo rows arrive from each peer
(grouped by owner, in the part file's halo order). Every exchange (gnn_dist.halo.exchange, the sequential
blocks, the shared-memory slots) moves exactly these rows and nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gnn_dist.device import HOST
from gnn_dist.partition.format import PartData


@dataclass(frozen=True)
class HaloPlan:
    rank: int
    num_parts: int
    n_owned: int
    n_halo: int
    send_idx: torch.Tensor    # int64 [S]: owned rows to send, grouped by peer
    send_counts: np.ndarray   # int64 [P]: rows to each peer
    recv_counts: np.ndarray   # int64 [P]: halo rows from each peer (halo is grouped by owner)
    send_peer: torch.Tensor   # int64 [S]: the peer each send row goes to
    send_node_ids: torch.Tensor  # int64 [S]: original ids of the rows sent
    halo_ids: torch.Tensor    # int64 [n_halo]: original ids of halo rows
    halo_owner: torch.Tensor  # int64 [n_halo]

    @classmethod
    def from_part(cls, part: PartData, device: torch.device = HOST) -> HaloPlan:
        """The plan of a part, its index tensors on `device` (the rank's compute device)."""
        num_parts = part.meta.num_parts
        send_counts = np.diff(part.send_ptr).astype(np.int64)
        return cls(
            rank=part.part_id,
            num_parts=num_parts,
            n_owned=part.n_owned,
            n_halo=part.n_halo,
            send_idx=torch.from_numpy(part.send_idx).to(device),
            send_counts=send_counts,
            recv_counts=np.bincount(part.halo_owner, minlength=num_parts).astype(np.int64),
            send_peer=torch.from_numpy(np.repeat(np.arange(num_parts, dtype=np.int64), send_counts)).to(device),
            send_node_ids=torch.from_numpy(part.node_ids[part.send_idx]).to(device),
            halo_ids=torch.from_numpy(part.halo_ids).to(device),
            halo_owner=torch.from_numpy(part.halo_owner.astype(np.int64)).to(device),
        )

    @property
    def device(self) -> torch.device:
        """Where the rank computes: its rows, buffers and index tensors live there."""
        return self.send_idx.device

    @property
    def rows_sent(self) -> int:
        return int(self.send_counts.sum())

    @property
    def rows_sent_to_peers(self) -> int:
        """Rows one exact exchange puts on the wire (a rank sends nothing to itself)."""
        return self.rows_sent - int(self.send_counts[self.rank])

    def send_segments(self) -> list[slice]:
        """The slice of the send layout (rows of send_idx) going to each peer."""
        return _segments(self.send_counts)

    def recv_segments(self) -> list[slice]:
        """The slice of the halo coming from each peer."""
        return _segments(self.recv_counts)


    def restricted(self, halo_rows: np.ndarray, send_rows: np.ndarray, send_index: np.ndarray | None = None) -> HaloPlan:
        """The plan of a subset of the halo: the halo rows where halo_rows (bool [n_halo]) holds, and the send rows
        where send_rows (bool [S]) holds. Sender and receiver must pick alike (a property of the node, as its type
        is), and then the peer slices still line up. send_index: where each kept send row is read from (default:
        its owned row; a tensor holding only some owned rows passes their positions in it).

        Used by typed graphs: embedding rows of featureless types travel every step, one type's raw features once.
        """
        send_rows = np.asarray(send_rows, dtype=bool)
        halo_rows = np.asarray(halo_rows, dtype=bool)
        device = self.device
        kept_peer = self.send_peer.cpu().numpy()[send_rows]
        index = self.send_idx.cpu().numpy()[send_rows] if send_index is None else np.asarray(send_index)
        owner = self.halo_owner.cpu().numpy()[halo_rows]
        return HaloPlan(
            rank=self.rank, num_parts=self.num_parts, n_owned=self.n_owned, n_halo=int(halo_rows.sum()),
            send_idx=torch.from_numpy(index.astype(np.int64)).to(device),
            send_counts=np.bincount(kept_peer, minlength=self.num_parts).astype(np.int64),
            recv_counts=np.bincount(owner, minlength=self.num_parts).astype(np.int64),
            send_peer=torch.from_numpy(kept_peer.astype(np.int64)).to(device),
            send_node_ids=self.send_node_ids[torch.from_numpy(send_rows).to(device)],
            halo_ids=self.halo_ids[torch.from_numpy(halo_rows).to(device)],
            halo_owner=torch.from_numpy(owner.astype(np.int64)).to(device))


def _segments(counts: np.ndarray) -> list[slice]:
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return [slice(int(offsets[q]), int(offsets[q + 1])) for q in range(len(counts))]
