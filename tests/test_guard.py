"""The divergence guard of lossy schedules (gnn_dist.training.guard): when it fires and when it must not."""
from __future__ import annotations

import pytest
import torch

from gnn_dist.schedules import register_schedule
from gnn_dist.schedules.exact import ExactSchedule
from gnn_dist.training.guard import DivergenceGuard, GuardRule
from tests.conftest import train_many


def test_a_climbing_loss_fires_after_a_window_of_epochs_and_the_exact_window_doubles():
    guard = DivergenceGuard(rule=GuardRule(rise=0.1, patience=3, window=4))
    losses = [1.0, 0.8, 0.6, 0.5, 0.5, 0.5, 0.9, 0.9, 0.9]  # best 3-epoch mean 0.5
    fired = [guard.observe(epoch, loss, None) is not None for epoch, loss in enumerate(losses)]
    # epoch 6 averages (0.5 + 0.5 + 0.9) / 3 = 0.63, more than 0.1 x the first loss (1.0) above 0.5: it fires
    assert fired == [False] * 6 + [True, False, False]
    assert [guard.exact_now(e) for e in range(7, 13)] == [True, True, True, True, False, False]  # the next 4
    assert guard.guard_epochs == 2  # epochs 7 and 8 trained exactly so far
    for epoch in range(9, 11):
        guard.observe(epoch, 0.5, None)
    assert guard.observe(11, 3.0, None) is not None  # fires again at once after its window: twice as long
    assert guard.exact_until == 12 + 8 and guard.guard_epochs == 4


def test_a_loss_near_zero_may_double_without_firing():
    """Late in training, dropout alone moves a small loss by a large fraction of itself."""
    guard = DivergenceGuard(rule=GuardRule(rise=0.1, patience=2))
    fired = [guard.observe(epoch, loss, None) for epoch, loss in enumerate([2.0, 0.06, 0.05, 0.11, 0.12, 0.13])]
    assert fired == [None] * 6


def test_noise_and_a_saw_tooth_around_a_falling_loss_never_fire():
    """Noise, a saw-tooth and one-epoch spikes (0.7 x the first loss, every 12 epochs) never fire: the rule reads
    5-epoch means, in which a lone spike weighs a fifth."""
    guard = DivergenceGuard(rule=GuardRule())
    generator = torch.Generator().manual_seed(0)
    for epoch in range(200):
        trend = 0.6 + 1.4 * 0.97 ** epoch
        saw_tooth = 0.04 * (epoch % 4)  # stale:4 refreshes every 4 epochs
        noise = 0.03 * float(torch.randn(1, generator=generator))
        spike = 1.4 if epoch >= 20 and epoch % 12 == 0 else 0.0  # the first loss is about 2.0
        assert guard.observe(epoch, trend * (1 + noise) + saw_tooth + spike, 0.6) is None, epoch


def test_collapse_below_the_majority_rate_fires_only_when_it_lasts_after_the_warmup():
    guard = DivergenceGuard(majority_rate=0.63, rule=GuardRule(warmup=10, collapse=0.05, collapse_patience=3))
    assert guard.observe(3, 1.0, 0.37) is None  # early epochs may predict the other class
    assert guard.observe(4, 1.0, 0.37) is None and guard.observe(5, 1.0, 0.37) is None
    assert guard.observe(12, 1.0, 0.60) is None  # below the majority rate, within the margin
    assert guard.observe(13, 1.0, 0.55) is None  # one dip, then it recovers
    assert guard.observe(14, 1.0, 0.66) is None
    assert guard.observe(15, 1.0, 0.55) is None and guard.observe(16, 1.0, None) is None  # not evaluated
    assert guard.observe(17, 1.0, 0.50) is None
    assert "for 3 evaluations (0.4000 at epoch 18)" in guard.observe(18, 1.0, 0.40)


def test_state_round_trips_for_checkpoints():
    guard = DivergenceGuard(majority_rate=0.5, rule=GuardRule(patience=2))
    for epoch, loss in enumerate([1.0, 0.5, 0.5, 2.0, 2.0]):
        guard.observe(epoch, loss, None)
    copy = DivergenceGuard(majority_rate=0.5, rule=GuardRule(patience=2))
    copy.load_state_dict(guard.state_dict())
    assert copy.state_dict() == guard.state_dict() and copy.exact_now(5) and copy.firings == 1


@register_schedule
class DivergingSchedule(ExactSchedule):
    """A lossy schedule made to diverge (tests only): from epoch 20 on, halo rows arrive negated while their
    gradients return as if they had not been, so the boundary's share of every gradient points the wrong way."""

    kind = "test-diverge"
    form = "test-diverge"
    name = "test-diverge"

    @classmethod
    def parse(cls, arg, seed):
        return cls() if arg is None else None

    def forward(self, ex, slot, x_owned):
        full, info = super().forward(ex, slot, x_owned)
        if ex.epoch >= 20:
            full[ex.plan.n_owned:] *= -1
        return full, info

    def block_pass(self, ex, slot, x_owned):
        raise NotImplementedError


@pytest.mark.mpi
def test_the_guard_rescues_a_diverging_run_and_leaves_healthy_runs_alone(cora_root, tmp_path):
    from gnn_dist.partition.datasets import load_dataset
    from gnn_dist.partition.partitioner import partition_graph

    parts = tmp_path / "cora4"
    # a random partition cuts most edges, so the boundary carries most of every node's aggregation
    partition_graph(load_dataset("planetoid:Cora", str(cora_root)), 4, parts, method="random")
    runs = ["--schedule exact", "--schedule test-diverge", "--schedule test-diverge --schedule-guard off",
            "--schedule pipeline", "--schedule stale:4"]
    records = train_many(4, ["--parts", str(parts), "--epochs", "150", "--plugin", __file__], runs)
    exact, rescued, left_alone = (records[run] for run in runs[:3])
    assert exact["guard_epochs"] == 0 and exact["schedule_guard"] == "off"  # nothing to fall back to
    assert left_alone["guard_epochs"] == 0 and left_alone["test_acc"] < exact["test_acc"] - 0.1  # it diverges
    assert rescued["guard_epochs"] > 0 and rescued["test_acc"] >= exact["test_acc"] - 0.02
    for healthy in runs[3:]:
        assert records[healthy]["guard_epochs"] == 0, healthy
