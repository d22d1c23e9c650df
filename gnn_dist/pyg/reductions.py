"""gd.init and the reductions over every rank: all_reduce, replicated, cross_entropy, accuracy.

A loss over a partitioned graph is a sum over every rank's rows divided by the global count: each rank's
share is its own rows' sum over that count, so that the gradients the wrapped model sums over ranks are the
whole graph's. The loss a rank returns has the global value (what a user prints) and its own share's gradient.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from gnn_dist.comm.communicator import make_world_comm
from gnn_dist.context import RankContext
from gnn_dist.memory.rss import use_workspace
from gnn_dist.pyg import passes

OPS = ("sum", "max", "min", "mean")


def init(threads: int | None = 1) -> RankContext:
    """The RankContext of this process over the MPI world (a single process is a world of one).

    threads: torch threads for this rank (one per rank is what mpiexec -n P on P cores wants; None leaves
    torch's setting). An exception escaping the script on any rank prints one line and brings the whole job
    down, so no rank waits forever on a collective that a failed rank will never join.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    # large tensors freed by one step serve the next (no page faults and zero-fill per step), as gnn-dist train
    use_workspace()
    ctx = RankContext(make_world_comm())
    passes.last_context(ctx)
    _abort_on_uncaught(ctx)
    return ctx


def _abort_on_uncaught(ctx: RankContext) -> None:
    previous = sys.excepthook

    def report_and_abort(kind, error, trace):
        if issubclass(kind, (ValueError, RuntimeError, OSError)) and not isinstance(error, KeyboardInterrupt):
            print(f"gnn-dist: rank {ctx.rank}: {error}", file=sys.stderr, flush=True)
        else:
            previous(kind, error, trace)
        if ctx.size > 1:
            ctx.comm.abort(1)

    sys.excepthook = report_and_abort


def context() -> RankContext:
    """The RankContext of the wrapped forward running now, else of the part this thread loaded last."""
    active = passes.current()
    if active is not None:
        return active.graph.ctx
    ctx = passes.last_context()
    if ctx is None:
        raise RuntimeError("no gnn-dist context on this process: call gd.init() (or gd.load_partition) first")
    return ctx


class _SumOverRanks(torch.autograd.Function):
    """Sum over ranks; its backward sums the gradients over ranks too (every rank's sum depends on each share)."""

    @staticmethod
    def forward(ctx, tensor, comm):  # type: ignore[override]
        ctx.comm = comm
        out = tensor.detach().clone().contiguous()
        comm.allreduce_(out)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        grad = grad.clone().contiguous()
        ctx.comm.allreduce_(grad)
        return grad, None


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """The reduction of tensor over every rank, on every rank (a collective). "sum" and "mean" are
    differentiable; "max" and "min" are not (their result is detached)."""
    if op not in OPS:
        raise ValueError(f"gd.all_reduce: unknown op {op!r}; valid: {', '.join(OPS)}")
    comm = context().comm
    if op in ("sum", "mean"):
        total = _SumOverRanks.apply(tensor, comm)
        return total / comm.size if op == "mean" else total
    out = tensor.detach().clone().contiguous()
    if op == "max":
        comm.allreduce_(out, "max")
    else:
        out.neg_()
        comm.allreduce_(out, "max")
        out.neg_()
    return out


def replicated(term: torch.Tensor) -> torch.Tensor:
    """A loss term every rank computes alike (a penalty on the parameters), divided by the rank count: the
    gradients the model sums over ranks then count it once."""
    return term / context().size


def _check_rows(out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None, what: str) -> None:
    if y.shape[0] != out.shape[0]:
        raise ValueError(f"{what}: {out.shape[0]} output rows but {y.shape[0]} labels: pass the rows of the "
                         f"rank's owned nodes (data.y)")
    if mask is not None and mask.shape[0] != out.shape[0]:
        raise ValueError(f"{what}: a mask of {mask.shape[0]} entries for {out.shape[0]} output rows: pass one of "
                         f"data.train_mask, data.val_mask, data.test_mask (one entry per owned node)")


def cross_entropy(out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The mean cross-entropy over every rank's rows where mask holds (all rows without a mask).

    The value is the global mean on every rank; its gradient is this rank's share (its rows' sum over the global
    count), which the distributed model's gradient sum adds up over ranks.
    """
    _check_rows(out, y, mask, "gd.cross_entropy")
    if mask is not None:
        out, y = out[mask], y[mask]
    comm = context().comm
    count = torch.tensor([float(y.shape[0])], dtype=torch.float64, device=out.device)
    comm.allreduce_(count)
    if count.item() == 0:
        raise ValueError("gd.cross_entropy: no rank has a row under the mask: check the partition's masks")
    share = F.cross_entropy(out, y, reduction="sum") / count.item()
    total = share.detach().clone().reshape(1).contiguous()
    comm.allreduce_(total)
    # share - share.detach() is exactly zero: the value is the global mean bit for bit on every rank
    return total.reshape(()) + (share - share.detach())


def accuracy(out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """The fraction of every rank's rows under the mask whose argmax is the label; the same float on every rank."""
    _check_rows(out, y, mask, "gd.accuracy")
    correct = out.argmax(dim=-1) == y
    if mask is not None:
        correct = correct[mask]
    counts = torch.tensor([float(correct.sum().item()), float(correct.shape[0])], dtype=torch.float64,
                          device=out.device)
    context().comm.allreduce_(counts)
    return float(counts[0] / counts[1]) if counts[1] > 0 else float("nan")


def degree_histogram(data) -> torch.Tensor:
    """The whole graph's in-degree histogram (PNAConv's `deg`), the same on every rank: each rank counts its
    owned nodes' in-degrees (all of their in-edges are local) and the counts are summed over ranks."""
    comm = context().comm
    degrees = torch.bincount(data.edge_index[1], minlength=data.num_nodes)
    longest = torch.tensor([int(degrees.max()) + 1 if degrees.numel() else 0], dtype=torch.int64,
                           device=degrees.device)
    comm.allreduce_(longest, "max")
    histogram = torch.bincount(degrees, minlength=int(longest.item())).to(torch.int64)
    comm.allreduce_(histogram)
    return histogram
