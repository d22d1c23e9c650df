"""A rank's link-prediction pairs (`LinkPairs`), in global ids: the partition's contiguous numbering, where
part k owns [partptr[k], partptr[k+1]), so a node's owner and its row on that owner are arithmetic.

The part files store pairs by original id (partition/link_split.py), the same in every partition of the
graph; set-up maps them through the inverse of node_map.npy. That inverse is one int per node on every rank
(int32 below 2**31 nodes), which the memory plan counts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn_dist.link.negatives import negative_destinations, negative_sources
from gnn_dist.partition.format import PartData, load_node_map

PHASES = ("val", "test")


@dataclass
class LinkPairs:
    """train: [T, 2] global ids, the source owned here; train_eid: [T] global edge ids (they key the negatives);
    train_source_orig: [T] the sources' original ids. For phase in val, test: {phase}_pos, {phase}_neg: [M, 2]
    (sources owned here); {phase}_mrr: [M_pos, R] negative destinations of each positive's own source."""

    train: np.ndarray
    train_eid: np.ndarray
    train_source_orig: np.ndarray
    val_pos: np.ndarray
    val_neg: np.ndarray
    val_mrr: np.ndarray
    test_pos: np.ndarray
    test_neg: np.ndarray
    test_mrr: np.ndarray
    global_of: np.ndarray   # [N] original id -> global id
    first: int              # this rank's first global id
    n_owned: int
    num_train_total: int    # training positives over all ranks

    @classmethod
    def from_part(cls, directory: str, part: PartData) -> LinkPairs:
        meta = part.meta
        node_map = load_node_map(directory)
        global_of = np.empty(meta.num_nodes, dtype=np.int32 if meta.num_nodes < 2**31 else np.int64)
        global_of[node_map] = np.arange(meta.num_nodes, dtype=global_of.dtype)
        del node_map
        arrays = part.arrays

        def to_global(name: str) -> np.ndarray:
            return global_of[arrays[name]].astype(np.int64)

        first = int(meta.partptr[part.part_id])
        pairs = cls(train=to_global("link_train"), train_eid=arrays["link_train_eid"],
                    train_source_orig=arrays["link_train"][:, 0].copy(),
                    **{f"{phase}_{kind}": to_global(f"link_{phase}_{kind}")
                       for phase in PHASES for kind in ("pos", "neg", "mrr")},
                    global_of=global_of, first=first, n_owned=part.n_owned,
                    num_train_total=int(meta.link["train"]))
        for name in ("train", "val_pos", "val_neg", "test_pos", "test_neg"):
            sources = getattr(pairs, name)[:, 0]
            if sources.size and (sources.min() < first or sources.max() >= first + part.n_owned):
                raise ValueError(f"{directory}: part {part.part_id}'s link_{name} has sources it does not own: "
                                 f"re-run gnn-dist partition --task link")
        return pairs

    def negatives(self, seed: int, epoch: int, index: np.ndarray, ratio: int,
                  rule: str = "source") -> tuple[np.ndarray | None, np.ndarray]:
        """The keyed negatives of the training positives `index`, in global ids: (sources, destinations), each
        [len(index), ratio]. Under the `source` rule the sources are the positives' own, and None is returned
        for them."""
        num_nodes = len(self.global_of)
        if rule == "pairs":
            sources = negative_sources(seed, epoch, self.train_eid[index], num_nodes, ratio)
            drawn = negative_destinations(seed, epoch, self.train_eid[index], sources, num_nodes, ratio)
            return self.global_of[sources].astype(np.int64), self.global_of[drawn].astype(np.int64)
        drawn = negative_destinations(seed, epoch, self.train_eid[index], self.train_source_orig[index], num_nodes,
                                      ratio)
        return None, self.global_of[drawn].astype(np.int64)
