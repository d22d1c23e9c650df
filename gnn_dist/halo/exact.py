"""The exact exchange as a schedule object: what the exchanger runs when no schedule is configured, in
evaluation, and while the divergence guard holds training to exact exchanges.

It lives here, beside the exchanger, because the halo layer needs it without knowing the schedule registry
(gnn_dist.schedules sits above this layer); `--schedule exact` (gnn_dist.schedules.exact) is this behaviour
registered under its name. Every byte it moves goes through the exchanger's exact_forward / exact_backward.
"""
from __future__ import annotations

from gnn_dist.halo.blocks import BlockPass


class ExactExchange:
    """Every halo row forward, every halo gradient back; no state, nothing cached, nothing reweighted.

    It answers what the exchanger and the layers ask of the schedule of a pass (gnn_dist.schedules.base lists
    the whole protocol; a registered schedule's caches, state and predictions come from there).
    """

    kind = "exact"
    reweights_rows = False
    measures_parameter_drift = False

    @property
    def name(self) -> str:
        return self.kind

    def forward(self, ex, slot, x_owned):
        return ex.exact_forward(x_owned), None

    def backward(self, ex, slot, grad_full, info):
        return ex.exact_backward(grad_full)

    def block_pass(self, ex, slot, x_owned):
        return BlockPass(ex, x_owned)

    def aggregation_scale(self, ex, slot, operator):
        return None

    def for_slot(self, slot):
        return self

    def drain(self, ex) -> None:
        """Nothing is ever left in flight (the exchanger drains its schedule before the job ends)."""


EXACT = ExactExchange()  # stateless: one object serves every exchanger
