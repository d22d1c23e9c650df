"""Each owned row's aggregation renormalised over the halo rows still present (bns's sampled rows, adaptive's
fresh blocks): the factor R_i / R'_i, with R_i the sum of row i's operator entries and R'_i the sum over the
entries whose columns are present this pass (its owned columns and the halo rows that came).

A schedule that leaves halo rows out of an aggregation multiplies the row by this factor before the bias, so
the row keeps the weight that evaluation (the whole graph) gives it: the missing boundary's weight is spread
over what the row still sees, as GraphSAGE's mean over sampled neighbours does. Why this rule and not BNS-GCN's
division by the keep fraction: gnn_dist.schedules.bns and benchmarks/results/bns-rescaling.md.
"""
from __future__ import annotations

from collections.abc import Hashable

import torch

from gnn_dist.halo.blocks import row_masses


class RowRenormaliser:
    """R_i once per operator (a constant of the part), and the factors of the last `capacity` presence patterns
    (a pattern's factors are recomputed only when it changes: bns draws one per epoch, adaptive's recur)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._whole: dict = {}    # id(operator) -> (operator, R_i)
        self._factors: dict = {}  # (id(operator), pattern) -> (operator, factors), oldest first

    def factors(self, plan, operator, halo_present: torch.Tensor, pattern: Hashable) -> torch.Tensor:
        """R_i / R'_i per owned row (0 where nothing of the row is present: it aggregates nothing).

        operator: the layer's SparseOperator (resident halos) or BlockedOperator (sequential); halo_present:
        bool [n_halo]; pattern: names halo_present (equal patterns have equal masks). Shapes: -> [n_owned]
        """
        # the operator is held beside its id, so the id stays its own while the entry lives
        key = (id(operator), pattern)
        held = self._factors.get(key)
        if held is not None and held[0] is operator:
            return held[1]
        present = torch.ones(plan.n_owned + plan.n_halo, dtype=torch.float32, device=plan.device)
        present[plan.n_owned:] = halo_present.to(torch.float32)
        kept = row_masses(operator, present)
        factors = torch.where(kept > 0, self._row_weight(plan, operator) / kept.clamp_min(torch.finfo(torch.float32).tiny),
                              torch.zeros_like(kept))
        self._factors[key] = (operator, factors)
        while len(self._factors) > self.capacity:
            del self._factors[next(iter(self._factors))]
        return factors

    def _row_weight(self, plan, operator) -> torch.Tensor:
        """R_i, each owned row's whole weight: computed once per operator, not every pass."""
        held = self._whole.get(id(operator))
        if held is None or held[0] is not operator:
            ones = torch.ones(plan.n_owned + plan.n_halo, dtype=torch.float32, device=plan.device)
            held = self._whole[id(operator)] = (operator, row_masses(operator, ones))
        return held[1]

    def state_bytes(self, n_owned: int) -> int:
        """R_i and the kept factors, one float per owned row each, for the one operator a model's layers share."""
        return (1 + self.capacity) * 4 * n_owned
