"""Schedules and halo codecs on simulated ranks (FakeComm): what travels, and what the receiver uses."""
from __future__ import annotations

import pytest
import torch

from gnn_dist.comm.codec import make_codec
from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import ModelConfig, TrainConfig
from gnn_dist.context import RankContext
from gnn_dist.halo.exchange import HaloExchanger
from gnn_dist.halo.plan import HaloPlan
from gnn_dist.partition.format import load_part
from gnn_dist.schedules import parse_schedule, schedule_for_model
from gnn_dist.schedules.adaptive import AdaptiveSchedule
from gnn_dist.schedules.bns import BoundarySamplingSchedule
from gnn_dist.schedules.exact import ExactSchedule
from gnn_dist.schedules.pipeline import PipelineSchedule
from gnn_dist.schedules.stale import StaleSchedule
from gnn_dist.training import setup


def values(ids, width: int, epoch: int) -> torch.Tensor:
    """A value per (original id, column, epoch) any rank can compute: the truth to compare with."""
    ids = torch.as_tensor(ids, dtype=torch.float32)
    return torch.cos(ids[:, None] * 0.1 + torch.arange(width)[None, :] + 0.5 * epoch)


@pytest.mark.parametrize("spec", ["stale", "stale:0", "bns:0", "bns:1.5", "pipeline:1", "pipeline:0.5:1", "adaptive",
                                  "adaptive:x", "fast", "adaptive:0.1:0"])
def test_bad_schedule_lists_the_valid_forms(spec):
    with pytest.raises(ValueError, match=r"valid forms: exact, .*stale:R"):
        parse_schedule(spec)


def test_degenerate_parameters_are_exact():
    assert isinstance(parse_schedule("stale:1"), ExactSchedule)
    assert isinstance(parse_schedule("bns:1.0"), ExactSchedule)
    assert isinstance(parse_schedule("stale:3"), StaleSchedule)
    assert isinstance(parse_schedule("pipeline:0.3"), PipelineSchedule)
    assert isinstance(parse_schedule("adaptive:0.1:2"), AdaptiveSchedule)


def ones_upstream(ids, width: int, epoch: int, rank: int) -> torch.Tensor:
    return torch.ones(len(ids), width)


def varying_upstream(ids, width: int, epoch: int, rank: int) -> torch.Tensor:
    """An upstream gradient per (original id, column, epoch, receiving rank): stale and fresh ones differ."""
    ids = torch.as_tensor(ids, dtype=torch.float32)
    return torch.sin(ids[:, None] * 0.07 + 0.3 * torch.arange(width)[None, :] + 0.9 * epoch + 1.7 * rank)


def run_epochs(directory, num_parts, schedule_factory, epochs, width=4, codec="fp32", values_at=values,
               upstream_at=ones_upstream):
    """Each rank gathers `values_at(owned ids, epoch)` every epoch and backpropagates
    `upstream_at([owned | halo] ids, epoch, rank)`; returns per rank (part, halo per epoch, (bytes, skipped, grad))."""

    def rank_fn(comm):
        part = load_part(directory, comm.rank)
        ex = HaloExchanger(comm, HaloPlan.from_part(part), codec=make_codec(codec, 0, comm.rank),
                           schedule=schedule_factory())
        halos, sent = [], []
        for epoch in range(epochs):
            ex.begin_pass(epoch, training=True)
            ex.counters.reset()
            x = values_at(part.node_ids, width, epoch).requires_grad_(True)
            full = ex.gather(x, "layer1")
            halos.append(full[part.n_owned:].detach().clone())
            full.backward(upstream_at(list(part.node_ids) + list(part.halo_ids), width, epoch, comm.rank))
            sent.append((ex.counters.halo_bytes, ex.counters.halo_rows_skipped, x.grad.clone()))
        ex.drain()
        return part, halos, sent

    return run_fake_ranks(num_parts, rank_fn)


def test_stale_reuses_the_cache_and_sends_one_epoch_in_r(partitioned):
    directory = partitioned("synthetic:tiny", 3)
    exact = run_epochs(directory, 3, ExactSchedule, 4)
    stale = run_epochs(directory, 3, lambda: StaleSchedule(2), 4)
    for (part, halos, sent), _ in zip(stale, exact):
        truth = [values(part.halo_ids, 4, e) for e in range(4)]
        assert torch.equal(halos[0], truth[0]) and torch.equal(halos[1], truth[0])  # epoch 1 reuses epoch 0
        assert torch.equal(halos[2], truth[2]) and torch.equal(halos[3], truth[2])
        assert sent[1][0] == 0 and sent[3][0] == 0
    total_stale = sum(s[0] for _, _, sent in stale for s in sent)
    total_exact = sum(s[0] for _, _, sent in exact for s in sent)
    assert total_stale * 2 == total_exact


def expected_owned_grads(parts, width: int, epoch: int, halo_epoch: int) -> list[torch.Tensor]:
    """Per rank, the gradient of each owned row: its own upstream gradient at `epoch` plus, from every rank
    holding it in its halo, that rank's upstream gradient for it at `halo_epoch` (computed from the parts)."""
    holders: dict[int, list[int]] = {}
    for rank, part in enumerate(parts):
        for node in part.halo_ids.tolist():
            holders.setdefault(node, []).append(rank)
    out = []
    for rank, part in enumerate(parts):
        grad = varying_upstream(part.node_ids, width, epoch, rank)
        for row, node in enumerate(part.node_ids.tolist()):
            for holder in holders.get(node, []):
                grad[row] += varying_upstream([node], width, halo_epoch, holder)[0]
        out.append(grad)
    return out


@pytest.mark.parametrize("schedule, lag", [(ExactSchedule, 0), (lambda: PipelineSchedule(0.0), 1)])
def test_pipeline_uses_the_previous_epochs_rows_and_gradients(partitioned, schedule, lag):
    directory = partitioned("synthetic:tiny", 3)
    results = run_epochs(directory, 3, schedule, 4, upstream_at=varying_upstream)
    parts = [part for part, _, _ in results]
    assert all(part.n_halo > 0 for part in parts)
    for epoch in range(4):
        # epoch 0 has nothing stale to use: rows and gradients are that epoch's own
        used = max(epoch - lag, 0)
        expected = expected_owned_grads(parts, 4, epoch, used)
        for rank, (part, halos, sent) in enumerate(results):
            assert torch.equal(halos[epoch], values(part.halo_ids, 4, used))
            assert torch.allclose(sent[epoch][2], expected[rank], atol=1e-6), (epoch, rank)


def test_pipeline_specs_name_their_smoothing():
    default = parse_schedule("pipeline")
    assert (default.rows_smoothing, default.grads_smoothing, default.name) == (0.95, 0.95, "pipeline")
    assert [layer.name for layer in default.per_layer(3)] == ["pipeline:0.95", "pipeline:0.95", "exact"]
    assert [layer.name for layer in default.per_layer(1)] == ["pipeline"]  # a single exchanged layer pipelines
    assert [layer.name for layer in parse_schedule("pipeline:0.95").per_layer(2)] == ["pipeline:0.95"] * 2
    plain = parse_schedule("pipeline:0")
    assert (plain.rows_smoothing, plain.grads_smoothing, plain.name) == (0.0, 0.0, "pipeline:0")
    split = parse_schedule("pipeline:0.9:0")
    assert (split.rows_smoothing, split.grads_smoothing, split.name) == (0.9, 0.0, "pipeline:0.9:0")
    assert parse_schedule("pipeline:0.9").name == "pipeline:0.9"


def test_plain_pipeline_exchanges_its_last_layer_exactly(partitioned):
    """Plain `pipeline` on two exchanged layers: the inner layer's halo is the previous epoch's rows (smoothed
    with 0.95 from epoch 2 on), the last layer's halo and returned gradients are this epoch's own; both checked
    against values computed from the dataset's ids."""
    directory = partitioned("synthetic:tiny", 3)

    def rank_fn(comm):
        part = load_part(directory, comm.rank)
        ex = HaloExchanger(comm, HaloPlan.from_part(part), schedule=schedule_for_model("pipeline", 0, 2))
        seen = []
        for epoch in range(3):
            ex.begin_pass(epoch, training=True)
            inner = values(part.node_ids, 4, epoch).requires_grad_(True)
            last = values(part.node_ids, 4, epoch).requires_grad_(True)
            inner_full, last_full = ex.gather(inner, "layer1"), ex.gather(last, "layer2")
            upstream = varying_upstream(list(part.node_ids) + list(part.halo_ids), 4, epoch, comm.rank)
            (last_full * upstream).sum().backward()
            inner_full.sum().backward()
            seen.append((inner_full[part.n_owned:].detach().clone(), last_full[part.n_owned:].detach().clone(),
                         last.grad.clone()))
        ex.drain()
        return part, seen

    results = run_fake_ranks(3, rank_fn)
    parts = [part for part, _ in results]
    for epoch in range(3):
        expected = expected_owned_grads(parts, 4, epoch, epoch)
        for rank, (part, seen) in enumerate(results):
            inner_halo, last_halo, last_grad = seen[epoch]
            truth = [values(part.halo_ids, 4, e) for e in range(3)]
            assert torch.equal(last_halo, truth[epoch])
            assert torch.allclose(last_grad, expected[rank], atol=1e-6)
            stale = {0: truth[0], 1: truth[0], 2: 0.95 * truth[0] + 0.05 * truth[1]}[epoch]
            assert torch.allclose(inner_halo, stale, atol=1e-6), (epoch, rank)


def test_pipeline_smooths_rows_and_gradients_each_with_its_own_rate(partitioned):
    """pipeline:G:H: halo rows are smoothed with G, the gradients returned to owners with H (here 0: the last
    epoch's own), each checked against values computed from the dataset's ids."""
    directory = partitioned("synthetic:tiny", 3)
    results = run_epochs(directory, 3, lambda: PipelineSchedule(0.5, 0.0), 4, upstream_at=varying_upstream)
    parts = [part for part, _, _ in results]
    # epoch 3 uses epoch 2's gradients unsmoothed; smoothing them with the rows' 0.5 would mix in epoch 1's
    expected = expected_owned_grads(parts, 4, 3, 2)
    for rank, (part, halos, sent) in enumerate(results):
        v0, v1, v2 = (values(part.halo_ids, 4, e) for e in range(3))
        assert torch.allclose(halos[3], 0.5 * (0.5 * v0 + 0.5 * v1) + 0.5 * v2)
        assert torch.allclose(sent[3][2], expected[rank], atol=1e-6)


def test_pipeline_smoothing(partitioned):
    directory = partitioned("synthetic:tiny", 2)
    results = run_epochs(directory, 2, lambda: PipelineSchedule(0.5), 3)
    for part, halos, _ in results:
        v0, v1 = values(part.halo_ids, 4, 0), values(part.halo_ids, 4, 1)
        assert torch.allclose(halos[1], v0)
        assert torch.allclose(halos[2], 0.5 * v0 + 0.5 * v1)


def test_bns_keeps_a_fraction_agreed_by_owner_and_receiver(partitioned):
    directory = partitioned("synthetic:small", 4)
    results = run_epochs(directory, 4, lambda: BoundarySamplingSchedule(0.3, seed=1), 2, width=3)
    kept_total, halo_total = 0, 0
    for part, halos, _ in results:
        truth = values(part.halo_ids, 3, 0)
        kept = (halos[0] != 0).any(1)
        assert torch.equal(halos[0][kept], truth[kept])  # what arrives is right, what does not is zero
        kept_total += int(kept.sum())
        halo_total += part.n_halo
        assert not torch.equal(kept, (halos[1] != 0).any(1))  # a new sample every epoch
    assert abs(kept_total / halo_total - 0.3) < 0.03
    forward_bytes = sum(s[0][0] for _, _, s in results) / 2  # forward and backward carry the same rows
    assert forward_bytes == kept_total * 3 * 4


def test_bns_gradients_return_for_kept_rows_only(partitioned):
    directory = partitioned("synthetic:tiny", 3)
    results = run_epochs(directory, 3, lambda: BoundarySamplingSchedule(0.5, seed=2), 1)
    # reference: an owned node's gradient is 1 (its own row) + the number of ranks that kept it
    kept_copies = {}
    for part, halos, _ in results:
        for node, row in zip(part.halo_ids, halos[0]):
            if bool((row != 0).any()):
                kept_copies[node] = kept_copies.get(node, 0) + 1
    for part, _, sent in results:
        grad = sent[0][2]
        for row, node in enumerate(part.node_ids):
            assert torch.all(grad[row] == 1 + kept_copies.get(node, 0))


def test_adaptive_skips_unchanged_blocks_within_the_bound(partitioned):
    directory = partitioned("synthetic:tiny", 3)
    still = lambda ids, width, epoch: values(ids, width, 0)  # noqa: E731 - activations that never change
    results = run_epochs(directory, 3, lambda: AdaptiveSchedule(0.01, max_skips=2), 7, values_at=still)
    for part, halos, sent in results:
        assert part.n_halo > 0
        for halo in halos:
            assert torch.equal(halo, values(part.halo_ids, 4, 0))
        payload = [s[0] for s in sent]
        flags_only = min(payload)
        # epochs 0, 3 and 6 send (first epoch, then after 2 skips in a row); the rest only flags
        assert [p > flags_only for p in payload] == [True, False, False, True, False, False, True]


# Every owned row scaled by one factor per epoch: each peer block's relative change since it was last sent
# is then exactly |factor_now / factor_sent - 1|, which the test knows without running the schedule.
ADAPTIVE_EPS = 0.05
SCALES = [1.0, 1.02, 1.04, 1.12, 1.13, 1.30]  # change since the last block sent: .02 .04 .12 .0089 .16


def scaled_values(ids, width: int, epoch: int) -> torch.Tensor:
    return values(ids, width, 0) * SCALES[epoch]


def test_adaptive_sends_exactly_the_blocks_that_changed_more_than_eps(partitioned):
    directory = partitioned("synthetic:tiny", 3)
    results = run_epochs(directory, 3, lambda: AdaptiveSchedule(ADAPTIVE_EPS, max_skips=10), len(SCALES),
                         values_at=scaled_values)
    # The analytic schedule: send when the change since the last sent scale reaches eps.
    sent_scale, expected_send, delivered_scale = SCALES[0], [True], [SCALES[0]]
    for scale in SCALES[1:]:
        send = abs(scale / sent_scale - 1) >= ADAPTIVE_EPS
        sent_scale = scale if send else sent_scale
        expected_send.append(send)
        delivered_scale.append(sent_scale)
    assert expected_send == [True, False, False, True, False, True]
    for part, halos, sent in results:
        assert part.n_halo > 0
        payload = [s[0] for s in sent]
        flags_only = min(payload)
        assert [p > flags_only for p in payload] == expected_send
        for epoch, halo in enumerate(halos):
            truth = scaled_values(part.halo_ids, 4, epoch)
            assert torch.allclose(halo, values(part.halo_ids, 4, 0) * delivered_scale[epoch])
            # what the receiver uses stays within eps (relative) of the truth
            assert float(torch.linalg.vector_norm(halo - truth) / torch.linalg.vector_norm(truth)) < ADAPTIVE_EPS


def test_adaptive_returns_gradients_for_fresh_blocks_only(partitioned):
    """Every owned row's gradient is its own upstream 1 plus 1 per peer that received it fresh this epoch:
    a reused block is a constant (as under stale:R), so its gradient stays with the receiver."""
    directory = partitioned("synthetic:tiny", 3)
    still = lambda ids, width, epoch: values(ids, width, 0)  # noqa: E731
    results = run_epochs(directory, 3, lambda: AdaptiveSchedule(0.01, max_skips=2), 4, values_at=still)
    for part, _, sent in results:
        copies = torch.zeros(part.n_owned)
        copies.index_add_(0, torch.as_tensor(part.send_idx), torch.ones(len(part.send_idx)))
        for epoch, (_, skipped, grad) in enumerate(sent):
            fresh = epoch in (0, 3)  # the first epoch, then after 2 skips in a row
            assert torch.equal(grad, (1 + copies * fresh)[:, None].expand_as(grad))
            assert (skipped == 0) == fresh


def test_adaptive_skips_under_dropout_by_measuring_parameter_drift(partitioned):
    """lr 1e-9 all but freezes the weights, so between epochs only the dropout sample changes the rows: the
    parameters' drift stays below E and adaptive skips every block it may (K=3: epochs 0 and 4 send).
    Comparing the rows as sent would send every epoch: two epochs' masks make them differ by far more than E."""
    directory = partitioned("synthetic:small", 2)
    config = TrainConfig(parts=str(directory), schedule="adaptive:0.01:3", progress=False, lr=1e-9,
                         model=ModelConfig(hidden=24, num_layers=3, dropout=0.5))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        skipped = []
        for epoch in range(6):
            state.exchanger.counters.reset()
            state.mode.train_epoch(epoch)
            skipped.append(state.exchanger.counters.halo_rows_skipped)
        plan = state.exchanger.plan
        return plan.rows_sent_to_peers + plan.n_halo, skipped

    for rows_per_layer, skipped in run_fake_ranks(2, rank_fn):
        assert skipped == [0, 2 * rows_per_layer, 2 * rows_per_layer, 2 * rows_per_layer, 0, 2 * rows_per_layer]


def test_adaptive_with_zero_eps_is_exact(partitioned):
    directory = partitioned("synthetic:tiny", 3)
    adaptive = run_epochs(directory, 3, lambda: AdaptiveSchedule(0.0), 3)
    for part, halos, sent in adaptive:
        for epoch, halo in enumerate(halos):
            assert torch.equal(halo, values(part.halo_ids, 4, epoch))
        assert all(s[1] == 0 for s in sent)


@pytest.mark.parametrize("codec, row_bytes", [("fp32", 4 * 8), ("fp16", 2 * 8 + 4), ("bf16", 2 * 8), ("int8", 8 + 4)])
def test_codecs_put_the_promised_bytes_on_the_wire(partitioned, codec, row_bytes):
    directory = partitioned("synthetic:tiny", 3)
    results = run_epochs(directory, 3, ExactSchedule, 1, width=8, codec=codec)
    halo_rows = sum(part.n_halo for part, _, _ in results)
    assert sum(s[0][0] for _, _, s in results) == 2 * halo_rows * row_bytes
    for part, halos, _ in results:
        truth = values(part.halo_ids, 8, 0)
        tolerance = {"fp32": 0, "fp16": 1e-3, "bf16": 1e-2, "int8": 1.0 / 127 + 1e-6}[codec]
        assert (halos[0] - truth).abs().max() <= tolerance


@pytest.mark.parametrize("seed", range(5))
def test_fp16_keeps_tiny_gradients(seed):
    codec = make_codec("fp16")
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(50, 8, generator=generator) * 1e-9  # a mean loss over many nodes gives gradients this small
    assert (rows.half().float() == 0).all()  # a plain fp16 cast flushes all of them to zero
    out = torch.empty_like(rows)
    codec.decode(codec.encode(rows), out)
    # fp16's bound on row-scaled values: half an ulp of the element (11-bit significand), or of
    # the smallest subnormal step when the element is below 2**-14 of its row's largest
    row_max = rows.abs().amax(1, keepdim=True)
    bound = 2.0**-11 * rows.abs() + 2.0**-25 * row_max
    assert ((out - rows).abs() <= bound * 1.001).all()
    assert (out[rows != 0] != 0).float().mean() > 0.99


def test_int8_rounding_is_unbiased():
    codec = make_codec("int8", seed=3)
    x = torch.randn(200, 16)
    out = torch.empty_like(x)
    mean = torch.zeros_like(x)
    for _ in range(400):
        codec.decode(codec.encode(x), out)
        mean += out / 400
    scale = x.abs().amax(1, keepdim=True) / 127
    assert ((mean - x).abs() / scale).max() < 0.25  # within a quarter step on average, not a full one


def train_losses(directory, spec, epochs=40, config=None):
    """The loss of every epoch on 2 simulated ranks (the same on both): GCN 3x32 under `spec`, or `config`."""
    config = config or TrainConfig(parts=str(directory), schedule=spec, progress=False,
                                   model=ModelConfig(hidden=32, num_layers=3, dropout=0.5))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        losses = [state.mode.train_epoch(epoch)["loss"] for epoch in range(epochs)]
        state.exchanger.drain()
        return losses

    losses = run_fake_ranks(2, rank_fn)
    assert losses[0] == losses[1]
    return losses[0]


@pytest.mark.parametrize("spec", ["stale:3", "pipeline", "pipeline:0.5", "bns:0.5", "adaptive:0.05"])
def test_schedules_train_end_to_end_on_simulated_ranks(partitioned, spec):
    directory = partitioned("synthetic:small", 2)
    exact = train_losses(directory, "exact")
    losses = train_losses(directory, spec)
    assert losses[-1] < 0.5 * losses[0]
    assert abs(losses[-1] - exact[-1]) < 0.15 * exact[-1]
    if spec.startswith("pipeline"):
        assert losses[0] == exact[0]  # epoch 0 has nothing stale to use: it is exact


def per_epoch_halo_bytes(directory, spec, epochs):
    """Per rank: (rows it sends per exchanged layer, its training halo bytes per epoch).

    GCN 64 -> 24 -> 24 -> 10 on synthetic:small."""
    config = TrainConfig(parts=str(directory), schedule=spec, progress=False,
                         model=ModelConfig(hidden=24, num_layers=3, dropout=0.5))
    config.validate()

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        sent = []
        for epoch in range(epochs):
            state.exchanger.counters.reset()
            state.mode.train_epoch(epoch)
            sent.append(state.exchanger.counters.halo_bytes)
        state.exchanger.drain()
        plan = state.exchanger.plan
        return plan.rows_sent_to_peers + plan.n_halo, sent  # rows out forward, gradients of halo rows back

    return run_fake_ranks(2, rank_fn)


@pytest.mark.parametrize("spec, every_epoch_width, refreshed_width", [
    ("stale:4,exact", 10, 24), ("exact,stale:4", 24, 10), ("exact,exact", 24 + 10, 0)])
def test_per_layer_schedules_apply_to_their_own_layer(partitioned, spec, every_epoch_width, refreshed_width):
    """The second layer sends its 24-wide input, the third its 10-wide output (fp32). Under "A,B" the second
    layer follows A and the third B: each rank's bytes per epoch, counted from its rows, say which did."""
    directory = partitioned("synthetic:small", 2)
    for rows_out, sent in per_epoch_halo_bytes(directory, spec, epochs=6):
        expected = [rows_out * 4 * (every_epoch_width + (refreshed_width if epoch % 4 == 0 else 0))
                    for epoch in range(6)]
        assert sent == expected


def test_per_layer_schedule_of_one_kind_is_that_schedule(partitioned):
    directory = partitioned("synthetic:small", 2)
    assert train_losses(directory, "exact,exact", epochs=8) == train_losses(directory, "exact", epochs=8)
    assert train_losses(directory, "stale:3,stale:3", epochs=8) == train_losses(directory, "stale:3", epochs=8)
    assert train_losses(directory, "stale:3,exact", epochs=8) != train_losses(directory, "stale:3", epochs=8)


def test_per_layer_schedule_needs_one_entry_per_exchanged_layer(partitioned):
    config = TrainConfig(parts="unused", schedule="stale:4,exact,exact", model=ModelConfig(num_layers=3))
    with pytest.raises(ValueError, match="gives 3 per-layer entries but the model exchanges 2 layers"):
        config.validate()
    with pytest.raises(ValueError, match="valid forms"):
        parse_schedule("stale:4,fast")


# synthetic:small has 64 features and 10 classes. With --hidden 24 --num-layers 3 (64 -> 24 -> 24 -> 10) the
# first layer exchanges nothing per epoch (cached input features), the second sends its 24-wide input and the
# third its 10-wide output (the narrower side). Bytes per row on the wire, written out per dtype:
# fp32 4 per value; fp16 2 per value plus a 4-byte row scale; bf16 2 per value; int8 1 per value plus the scale.
LAYER_ROW_BYTES = {"fp32": (4 * 24, 4 * 10), "fp16": (2 * 24 + 4, 2 * 10 + 4), "bf16": (2 * 24, 2 * 10),
                   "int8": (24 + 4, 10 + 4)}  # (second layer, third layer)
WIRE_ROW_BYTES = {dtype: sum(pair) for dtype, pair in LAYER_ROW_BYTES.items()}


def formula_bytes_per_epoch(spec: str, dtype: str, halo_rows: int, num_parts: int) -> float:
    exact = 2 * halo_rows * WIRE_ROW_BYTES[dtype]  # each halo row forward, its gradient back
    kind, _, arg = spec.partition(":")
    if spec == "stale:4,exact":  # the second layer one epoch in 4, the third every epoch
        second, third = LAYER_ROW_BYTES[dtype]
        return 2 * halo_rows * (second / 4 + third)
    if kind == "stale":
        return exact / int(arg)  # one epoch in R exchanges
    if kind == "bns":
        return exact * float(arg)  # the expected kept fraction
    if kind == "adaptive":
        return exact + 2 * num_parts * (num_parts - 1) * 4  # + one int32 flag per peer and layer (forward only)
    return exact  # exact and pipeline send every row once per epoch


@pytest.mark.parametrize("spec", ["exact", "stale:4", "pipeline", "pipeline:0.5", "bns:0.25", "adaptive:0.1",
                                  "stale:4,exact"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "int8"])
def test_inspect_prediction_matches_the_written_out_formula(partitioned, spec, dtype):
    from gnn_dist.partition_report import inspect_partition

    num_parts = 4
    directory = partitioned("synthetic:small", num_parts)
    halo_rows = sum(load_part(directory, k).n_halo for k in range(num_parts))
    report = inspect_partition(directory, ModelConfig(hidden=24, num_layers=3), schedule=spec, halo_dtype=dtype)
    assert report["total_halo_rows"] == halo_rows
    assert report["predicted_halo_bytes_per_epoch"] == pytest.approx(
        formula_bytes_per_epoch(spec, dtype, halo_rows, num_parts), rel=1e-12)


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16", "int8"])
@pytest.mark.parametrize("width", [7, 16])
def test_codecs_move_zero_rows(name, width):
    """A peer that gets no rows this epoch (adaptive and bns skip whole blocks) is encoded and decoded as nothing;
    rows around it still arrive intact."""
    codec = make_codec(name)
    empty = torch.zeros(0, width)
    wire = codec.encode(empty)
    assert wire.shape[0] == 0 and wire.shape == codec.empty_wire(0, width, torch.device("cpu")).shape
    out = torch.empty(0, width)
    codec.decode(wire, out)
    rows = torch.linspace(-1, 1, 3 * width).reshape(3, width)
    decoded = torch.empty_like(rows)
    codec.decode(codec.encode(rows), decoded)
    assert (decoded - rows).abs().max() <= 1.0 / 127 + 1e-6


def _forward_on_every_rank(directory, num_parts: int, model: str, hidden: int, schedule: str, epochs: list[int],
                           prepare=None):
    """Per rank, one forward per epoch in `epochs` in training mode (dropout off) under `schedule`, then after the
    last one: (node ids, halo ids, the halo rows present in the last forward, logits, parameters). prepare(state,
    epoch) runs before each forward and returns the halo rows that forward will have present (bool [n_halo])."""
    config = TrainConfig(parts=str(directory), epochs=0, progress=False, seed=5, schedule=schedule,
                         model=ModelConfig(model=model, hidden=hidden, num_layers=2, dropout=0.0))

    def rank_fn(comm):
        state = setup(RankContext(comm), config)
        state.model.train()
        for epoch in epochs:
            state.model.epoch = epoch
            halo_present = prepare(state, epoch)
            with torch.no_grad():
                logits = state.model(state.x_full)
        params = {name: p.detach().double() for name, p in state.model.named_parameters()}
        return state.graph.node_ids, state.graph.halo_ids, halo_present, logits, params

    return run_fake_ranks(num_parts, rank_fn)


def _bns_kept_rows(state, epoch):
    exchanger = state.model.exchanger
    exchanger.begin_pass(epoch, True)
    return exchanger.schedule._keep(exchanger)[1]


def _assert_rows_renormalised_over_what_is_present(graph, model: str, hidden: int, results) -> int:
    """Each rank's second-layer rows against the whole graph's PyG layers: row i aggregates only the edges from
    the rank's own nodes and from the halo rows present, scaled by R_i / R'_i (the sum of row i's normalised
    entries over the sum of those present), then adds the bias. For SAGE (mean aggregation, R_i = 1) that is
    PyG's SAGEConv on the present edges alone. Returns how many rows lost an entry (so the rule was exercised)."""
    from torch_geometric.nn import GCNConv, SAGEConv
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    params = results[0][4]
    x = torch.as_tensor(graph.x).double()
    edges = torch.as_tensor(graph.edge_index)
    if model == "gcn":
        first = GCNConv(graph.num_features, hidden).double()
        first.lin.weight.data, first.bias.data = params["convs.0.weight"], params["convs.0.bias"]
    else:
        first = SAGEConv(graph.num_features, hidden).double()
        first.lin_l.weight.data, first.lin_l.bias.data = params["convs.0.lin_l.weight"], params["convs.0.lin_l.bias"]
        first.lin_r.weight.data = params["convs.0.lin_r.weight"]
    with torch.no_grad():
        h = torch.relu(first(x, edges))  # the first layer exchanges nothing: exact under every schedule
    checked_rows = rescaled_rows = 0
    for node_ids, halo_ids, halo_present, logits, _ in results:
        present = torch.zeros(graph.num_nodes, dtype=torch.bool)
        present[torch.as_tensor(node_ids)] = True
        present[torch.as_tensor(halo_ids)[halo_present]] = True
        owned = torch.zeros(graph.num_nodes, dtype=torch.bool)
        owned[torch.as_tensor(node_ids)] = True
        with torch.no_grad():
            if model == "gcn":
                loops, weights = gcn_norm(edges, num_nodes=graph.num_nodes, add_self_loops=True)
                src, dst = loops
                kept = present[src]
                whole = torch.zeros(graph.num_nodes, dtype=torch.float64).index_add_(0, dst, weights.double())
                some = torch.zeros(graph.num_nodes, dtype=torch.float64).index_add_(
                    0, dst[kept], weights.double()[kept])
                transformed = h @ params["convs.1.weight"].t()
                aggregated = torch.zeros(graph.num_nodes, transformed.shape[1], dtype=torch.float64).index_add_(
                    0, dst[kept], weights.double()[kept, None] * transformed[src[kept]])
                expected = aggregated * (whole / some)[:, None] + params["convs.1.bias"]
                rescaled_rows += int(((whole / some - 1).abs() > 1e-6)[owned].sum())
            else:
                second = SAGEConv(hidden, graph.num_classes).double()
                second.lin_l.weight.data = params["convs.1.lin_l.weight"]
                second.lin_l.bias.data = params["convs.1.lin_l.bias"]
                second.lin_r.weight.data = params["convs.1.lin_r.weight"]
                kept_edges = edges[:, present[edges[0]]]
                expected = second(h, kept_edges)
                rescaled_rows += int((torch.bincount(kept_edges[1], minlength=graph.num_nodes)
                                      < torch.bincount(edges[1], minlength=graph.num_nodes))[owned].sum())
        assert (logits.double() - expected[torch.as_tensor(node_ids)]).abs().max() <= 1e-5
        checked_rows += len(node_ids)
    assert checked_rows == graph.num_nodes
    return rescaled_rows


@pytest.mark.parametrize("model, hidden", [("gcn", 8), ("gcn", 2), ("sage", 8)])
def test_bns_renormalises_each_row_over_the_entries_it_keeps(partitioned, tiny_graph, model, hidden):
    """bns's rule: the rows a rank's second layer keeps this epoch, renormalised (against PyG)."""
    num_parts = 3
    results = _forward_on_every_rank(partitioned("synthetic:tiny", num_parts), num_parts, model, hidden, "bns:0.4",
                                     [1], _bns_kept_rows)
    assert _assert_rows_renormalised_over_what_is_present(tiny_graph, model, hidden, results) > 20


def _adaptive_sends_to_the_next_rank_only(state, epoch):
    """Epoch 0 sends every block (nothing was sent before); later, under adaptive with a large EPS, every block
    would be skipped, but a skip count at the bound makes each rank send to rank + 1: each rank receives only
    rank - 1's block. Returns the halo rows that come (all of them at epoch 0)."""
    plan = state.model.exchanger.plan
    schedule = state.model.exchanger.schedule
    if epoch > 0:
        schedule.skips_in_a_row["layer1"][(plan.rank + 1) % plan.num_parts] = schedule.max_skips
        return plan.halo_owner == (plan.rank - 1) % plan.num_parts
    return torch.ones(plan.n_halo, dtype=torch.bool)


@pytest.mark.parametrize("model, hidden", [("gcn", 8), ("sage", 8)])
def test_adaptive_leaves_skipped_blocks_out_and_renormalises_each_row(partitioned, tiny_graph, model, hidden):
    """adaptive's rule for a linear aggregation: a skipped block is absent, not the rows last received. At epoch 1
    each rank's second layer aggregates its own rows and the one block that came (rank - 1's), each row
    renormalised over those entries, against PyG on the whole graph. Reusing the epoch-0 rows instead would match
    exact (the weights did not move), which misses the expected rows wherever a block was skipped."""
    num_parts = 3
    results = _forward_on_every_rank(partitioned("synthetic:tiny", num_parts), num_parts, model, hidden,
                                     "adaptive:1e9", [0, 1], _adaptive_sends_to_the_next_rank_only)
    assert all(not bool(present.all()) and bool(present.any()) for _, _, present, _, _ in results)
    assert _assert_rows_renormalised_over_what_is_present(tiny_graph, model, hidden, results) > 20


def test_row_renormaliser_factors_follow_each_pattern_of_present_rows():
    """R_i / R'_i against a dense count, for patterns that alternate (a cached pattern must not answer for
    another) and more patterns than the cache holds; a row with nothing present gets 0."""
    from types import SimpleNamespace

    from gnn_dist.kernels.spmm import SparseOperator
    from gnn_dist.schedules.renormalise import RowRenormaliser

    n_owned, n_halo = 3, 4
    dense = torch.tensor([[0.5, 0.0, 0.0, 0.25, 0.25, 0.0, 0.0],
                          [0.0, 0.2, 0.1, 0.0, 0.3, 0.4, 0.0],
                          [0.0, 0.0, 0.0, 0.0, 0.0, 0.6, 0.4]])
    rows, cols = torch.nonzero(dense, as_tuple=True)
    operator = SparseOperator.from_coo(rows, cols, dense[rows, cols], (n_owned, n_owned + n_halo))
    plan = SimpleNamespace(n_owned=n_owned, n_halo=n_halo, device=torch.device("cpu"))
    renormaliser = RowRenormaliser(capacity=2)
    patterns = [(1, 0, 1, 1), (0, 1, 0, 0), (1, 0, 1, 1), (1, 1, 0, 0), (0, 0, 1, 1), (0, 1, 0, 0)]
    for pattern in patterns:
        present = torch.tensor([1.0] * n_owned + list(pattern))
        kept = dense @ present
        expected = torch.where(kept > 0, dense.sum(1) / kept.clamp_min(1e-30), torch.zeros(n_owned))
        got = renormaliser.factors(plan, operator, torch.tensor(pattern, dtype=torch.bool), pattern=pattern)
        assert torch.allclose(got, expected), pattern
    assert float(renormaliser.factors(plan, operator, torch.tensor([0, 0, 0, 0], dtype=torch.bool), 0)[2]) == 0
