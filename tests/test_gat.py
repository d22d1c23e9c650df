"""GAT (--model gat): the attention kernels against their torch fallback, PyG's GATConv and gradcheck; the
distributed model against PyG's GATConv stack on the whole graph at P = 1, 2, 4; keyed attention dropout."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gnn_dist.config import ModelConfig, TrainConfig
from gnn_dist.kernels.attention import EdgeDropout, attention, merge
from gnn_dist.kernels.native import native_module
from gnn_dist.kernels.spmm import SparseOperator
from gnn_dist.partition.datasets import load_dataset
from tests.test_halo_fake import assert_equal_to_pyg, one_step_on_every_rank


def random_operator(n_rows: int, n_cols: int, nnz: int, seed: int, loops: bool = True,
                    empty_rows: int = 0, loop_only_rows: int = 0) -> SparseOperator:
    """A random pattern without repeated entries; self loops (i, i) on every row but the last `empty_rows`, which
    have no entry at all (a row of a column block that has none); the `loop_only_rows` rows before those have
    their self loop only (a node without in-neighbours)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, n_rows - empty_rows - loop_only_rows, (nnz,), generator=g)
    cols = torch.randint(0, n_cols, (nnz,), generator=g)
    if loops:
        rows = torch.cat([rows, torch.arange(n_rows - empty_rows)])
        cols = torch.cat([cols, torch.arange(n_rows - empty_rows)])
    unique = torch.unique(rows * n_cols + cols)
    rows, cols = unique // n_cols, unique % n_cols
    return SparseOperator.from_coo(rows, cols, torch.ones(rows.shape[0]), (n_rows, n_cols))


def reference_attention(op: SparseOperator, source: torch.Tensor, dst_score: torch.Tensor, heads: int,
                        bias: torch.Tensor | None, dropout: EdgeDropout | None, slope: float = 0.2):
    """The attention of kernels/attention.py written the plain way, each edge's [H x C] product formed and autograd
    left to differentiate it: the reference both kernels are held to. Returns (out, lse)."""
    crow, col = op.matrix.crow_indices().to(torch.int64), op.matrix.col_indices().to(torch.int64)
    n_rows = op.shape[0]
    row = torch.repeat_interleave(torch.arange(n_rows), crow[1:] - crow[:-1])
    hc = source.shape[1] - heads
    x, a_src = source[:, :hc].view(-1, heads, hc // heads), source[:, hc:]
    e = torch.nn.functional.leaky_relu(a_src[col] + dst_score[row], slope)  # [E, H]
    index = row[:, None].expand(-1, heads)
    peak = torch.full((n_rows, heads), float("-inf"), dtype=e.dtype).scatter_reduce(0, index, e, "amax")
    w = torch.exp(e - peak.detach()[row])
    total = torch.zeros(n_rows, heads, dtype=e.dtype).index_add(0, row, w)
    alpha = w / total[row]
    lse = torch.where(total > 0, peak.detach() + torch.log(total), torch.full_like(total, float("-inf")))
    if dropout is not None:
        alpha = alpha * dropout.factors(row, col, alpha.dtype)
    out = torch.zeros(n_rows, heads, hc // heads, dtype=source.dtype).index_add(0, row, alpha[:, :, None] * x[col])
    out = out.view(n_rows, hc)
    return (out if bias is None else out + bias), lse


def inputs(op: SparseOperator, heads: int, width: int, seed: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    source = torch.randn(op.shape[1], heads * width + heads, generator=g, dtype=dtype).requires_grad_()
    dst = torch.randn(op.shape[0], heads, generator=g, dtype=dtype).requires_grad_()
    bias = torch.randn(heads * width, generator=g, dtype=dtype).requires_grad_()
    return source, dst, bias


def dropout_for(op: SparseOperator, heads: int, p: float = 0.4) -> EdgeDropout:
    return EdgeDropout.keyed(torch.arange(op.shape[0]) * 13 + 5, torch.arange(op.shape[1]) * 13 + 5, heads, 987, p)


KERNEL_CASES = [
    # (heads, width, empty rows, self-loop-only rows): several heads; a single head; odd widths; rows with no
    # entry; zero-in-degree rows (the self loop alone)
    (4, 8, 0, 0), (1, 7, 0, 2), (3, 5, 3, 2), (2, 1, 0, 0),
]


@pytest.fixture(params=["native", "torch"])
def kernel(request, monkeypatch):
    """Each attention kernel in turn: the native one, and the torch formulation (what a GPU runs) with its edges
    cut into chunks of a few entries (8 at width 32), so the chunking itself is exercised."""
    from gnn_dist.kernels import attention as module

    if request.param == "native":
        if native_module() is None:
            pytest.skip("the native kernel could not be built here")
    else:
        monkeypatch.setattr(module, "native_module", lambda: None)
        monkeypatch.setattr(module, "EDGE_CHUNK_ELEMENTS", 256)
    return request.param


@pytest.mark.parametrize("heads, width, empty_rows, loop_only_rows", KERNEL_CASES)
@pytest.mark.parametrize("with_dropout", [False, True])
def test_each_kernel_equals_the_plain_autograd_reference(kernel, heads, width, empty_rows, loop_only_rows,
                                                         with_dropout):
    op = random_operator(30, 45, 160, seed=heads * 10 + width, empty_rows=empty_rows, loop_only_rows=loop_only_rows)
    source, dst, bias = inputs(op, heads, width, seed=1)
    drop = dropout_for(op, heads) if with_dropout else None
    out, lse = attention(op, source, dst, heads, bias, drop, with_lse=True)
    ref_out, ref_lse = reference_attention(op, source, dst, heads, bias, drop)
    assert torch.allclose(out, ref_out, atol=1e-12) and torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert torch.allclose(lse[finite], ref_lse[finite], atol=1e-12)
    if with_dropout:  # the mask is applied, not only computed
        assert not torch.allclose(out, attention(op, source, dst, heads, bias))
    g = torch.randn_like(out)
    gl = torch.where(finite, torch.randn_like(lse), torch.zeros_like(lse))
    ours = torch.autograd.grad((out * g).sum() + (torch.where(finite, lse, 0) * gl).sum(), [source, dst, bias])
    theirs = torch.autograd.grad((ref_out * g).sum() + (torch.where(finite, ref_lse, 0) * gl).sum(),
                                 [source, dst, bias])
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, atol=1e-12)
    if empty_rows:  # a row with no entry aggregates nothing: the bias alone
        assert torch.equal(out[-empty_rows:], bias.detach().expand(empty_rows, -1))
    if loop_only_rows and not with_dropout:  # a node without in-neighbours attends to itself alone
        rows = slice(30 - empty_rows - loop_only_rows, 30 - empty_rows)
        own = source.detach()[rows, :heads * width]
        assert torch.allclose(out[rows], own + bias.detach(), atol=1e-12)


@pytest.mark.parametrize("heads, width, empty_rows, loop_only_rows", KERNEL_CASES)
def test_each_kernel_passes_gradcheck(kernel, heads, width, empty_rows, loop_only_rows):
    op = random_operator(12, 16, 40, seed=heads + width, empty_rows=empty_rows, loop_only_rows=loop_only_rows)
    source, dst, bias = inputs(op, heads, width, seed=2)
    drop = dropout_for(op, heads, 0.3)
    finite = torch.arange(12) < 12 - empty_rows

    def f(source, dst, bias):
        out, lse = attention(op, source, dst, heads, bias, drop, with_lse=True)
        return out, lse[finite]

    assert torch.autograd.gradcheck(f, (source, dst, bias))


def test_the_torch_formulation_forms_no_edge_by_feature_tensor(monkeypatch):
    """What a GPU runs must not form [E x H x C]: every tensor made in its forward and backward, recorded as it is
    made, holds at most max(one chunk, E x H, nodes x width) elements, against E x H x C = 16x that bound here."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from gnn_dist.kernels import attention as module

    monkeypatch.setattr(module, "native_module", lambda: None)
    monkeypatch.setattr(module, "EDGE_CHUNK_ELEMENTS", 4096)
    heads, width = 4, 64
    op = random_operator(200, 200, 6000, seed=11)
    n_edges = op.matrix.col_indices().numel()
    source, dst, bias = inputs(op, heads, width, seed=12, dtype=torch.float32)
    drop = dropout_for(op, heads, 0.3)

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            for t in result if isinstance(result, (tuple, list)) else (result,):
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return result

    with Largest():
        out, lse = attention(op, source, dst, heads, bias, drop, with_lse=True)
        (out * out).sum().backward()
    bound = max(4096, n_edges * heads, 200 * (heads * width + heads))
    assert n_edges * heads * width >= 16 * bound
    assert 0 < Largest.numel <= bound, (Largest.numel, bound)
    ref_out, _ = reference_attention(op, source.detach(), dst.detach(), heads, bias.detach(), drop)
    assert torch.allclose(out, ref_out, atol=1e-5)


def test_attention_dropout_keeps_its_share_and_depends_on_the_ids_only():
    op = random_operator(400, 400, 6000, seed=3)
    crow = op.matrix.crow_indices().to(torch.int64)
    rows = torch.repeat_interleave(torch.arange(400), crow[1:] - crow[:-1])
    cols = op.matrix.col_indices().to(torch.int64)
    ids = torch.randperm(400, generator=torch.Generator().manual_seed(0)) * 3
    kept = EdgeDropout.keyed(ids, ids, 4, 77, 0.25).factors(rows, cols, torch.float64) > 0
    assert abs(kept.double().mean().item() - 0.75) < 0.02
    # the same (destination id, source id) pairs, listed in another order, keep the same entries
    order = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(1))
    perm_ids = EdgeDropout.keyed(ids[rows[order]], ids[cols[order]], 4, 77, 0.25)
    again = perm_ids.factors(torch.arange(rows.shape[0]), torch.arange(rows.shape[0]), torch.float64) > 0
    assert torch.equal(again, kept[order])
    # heads and keys draw apart
    assert not torch.equal(kept[:, 0], kept[:, 1])
    other = EdgeDropout.keyed(ids, ids, 4, 78, 0.25).factors(rows, cols, torch.float64) > 0
    assert (other != kept).double().mean() > 0.2


@pytest.mark.parametrize("split", [0, 20, 45])
def test_merging_column_blocks_equals_the_whole_rows(split):
    op = random_operator(30, 45, 200, seed=5)
    source, dst, _ = inputs(op, 3, 4, seed=3)
    whole = attention(op, source, dst, 3, with_lse=True)
    left, right = op.split_columns(split)
    parts = merge(attention(left, source[:split], dst, 3, with_lse=True),
                  attention(right, source[split:], dst, 3, with_lse=True), 3)
    assert torch.allclose(parts[0], whole[0], atol=1e-12) and torch.allclose(parts[1], whole[1], atol=1e-12)


def test_one_layer_equals_pyg_gatconv():
    from torch_geometric.nn import GATConv

    from gnn_dist.models.gat import DistGATConv

    g = torch.Generator().manual_seed(4)
    n, f, heads, width = 50, 6, 3, 5
    edge_index = torch.randint(0, n, (2, 300), generator=g)
    edge_index = torch.unique(edge_index[:, edge_index[0] != edge_index[1]], dim=1)
    theirs = GATConv(f, width, heads=heads).double()
    rows, cols, values = DistGATConv.normalise(edge_index[1].numpy(), edge_index[0].numpy(), None, 0, n)
    op = SparseOperator.from_coo(torch.from_numpy(rows), torch.from_numpy(cols), torch.from_numpy(values), (n, n))
    ours = DistGATConv(f, heads * width, op, None, "layer0", heads=heads).double()
    with torch.no_grad():
        for name in DistGATConv.pyg_parameter_names():
            ours.get_parameter(name).copy_(theirs.get_parameter(name))
    x = torch.randn(n, f, generator=g, dtype=torch.float64)
    ours_x, theirs_x = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours_out, theirs_out = ours(x_full=ours_x), theirs(theirs_x, edge_index)
    assert (ours_out - theirs_out).abs().max() <= 1e-12
    # and the gradients of every parameter and of the input, under an arbitrary upstream gradient
    upstream = torch.randn(ours_out.shape, generator=g, dtype=torch.float64)
    ours_out.backward(upstream)
    theirs_out.backward(upstream)
    assert (ours_x.grad - theirs_x.grad).abs().max() <= 1e-12
    for name, theirs_name in DistGATConv.pyg_parameter_names().items():
        assert (ours.get_parameter(name).grad - theirs.get_parameter(theirs_name).grad).abs().max() <= 1e-12, name


@pytest.mark.parametrize("num_parts", [1, 2, 4])
@pytest.mark.parametrize("hidden, heads, num_layers", [(8, 4, 3), (5, 1, 2)])
def test_distributed_gat_equals_pyg_on_the_whole_graph(partitioned, num_parts, hidden, heads, num_layers):
    directory = partitioned("synthetic:tiny", num_parts)
    config = TrainConfig(parts=str(directory), epochs=0, progress=False, seed=3,
                         model=ModelConfig(model="gat", hidden=hidden, heads=heads, num_layers=num_layers,
                                           dropout=0.0))
    results = one_step_on_every_rank(config, num_parts)
    assert_equal_to_pyg(results, config, load_dataset("synthetic:tiny"))


def test_heads_are_refused_for_models_without_attention():
    with pytest.raises(ValueError, match="--heads applies to attention models \\(gat or rgat\\), not --model gcn"):
        ModelConfig(model="gcn", heads=4).validate()


def test_hidden_widths_are_heads_times_hidden():
    layers = ModelConfig(model="gat", hidden=8, heads=4, num_layers=3).layers(100, 7)
    assert [(i, o) for i, o, _ in layers] == [(100, 32), (32, 32), (32, 7)]
    assert [options["heads"] for *_, options in layers] == [4, 4, 1]
    assert np.all([options["attn_dropout"] == 0.5 for *_, options in layers])


@pytest.mark.parametrize("use_native", [True, False])
def test_blockwise_backward_with_the_whole_rows_statistics_equals_the_whole_backward(use_native, monkeypatch):
    """What sequential halos do: the rows' columns in two blocks, each differentiated with the whole rows' lse and
    <grad, out>; the gradients add up to those of the whole rows (autograd through the torch forward)."""
    from gnn_dist.kernels import attention as module

    if not use_native:
        monkeypatch.setattr(module, "native_module", lambda: None)
    elif native_module() is None:
        pytest.skip("the native kernel could not be built here")
    heads, split = 3, 25
    op = random_operator(30, 45, 220, seed=7)
    source, dst, _ = inputs(op, heads, 4, seed=8)
    drop = dropout_for(op, heads, 0.3)
    out, lse = reference_attention(op, source, dst, heads, None, drop)
    g = torch.randn_like(out)
    want_source, want_dst = torch.autograd.grad((out * g).sum(), [source, dst])
    delta = (g.view(30, heads, -1) * out.detach().view(30, heads, -1)).sum(-1)
    left, right = op.split_columns(split)
    grads = [module.partial_backward(half, source.detach()[cols], dst.detach(), lse.detach(), g, delta, heads,
                                     drop.restricted(cols=cols))
             for half, cols in ((left, slice(0, split)), (right, slice(split, 45)))]
    assert torch.allclose(torch.cat([grads[0][0], grads[1][0]]), want_source, atol=1e-12)
    assert torch.allclose(grads[0][1] + grads[1][1], want_dst, atol=1e-12)


@pytest.mark.parametrize("num_parts", [2, 4])
def test_sequential_halos_equal_pyg_with_gat(partitioned, num_parts):
    directory = partitioned("synthetic:tiny", num_parts)
    config = TrainConfig(parts=str(directory), epochs=0, progress=False, seed=3, halo_memory="sequential",
                         halo_block_rows=7,
                         model=ModelConfig(model="gat", hidden=5, heads=3, num_layers=3, dropout=0.0))
    results = one_step_on_every_rank(config, num_parts)
    assert all(r[5].blocked is not None for r in results)  # the blocked operator really ran
    assert_equal_to_pyg(results, config, load_dataset("synthetic:tiny"))
