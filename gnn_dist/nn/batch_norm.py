"""BatchNorm whose batch statistics span every rank's owned rows (`--batch-norm`), like SyncBatchNorm."""
from __future__ import annotations

import torch
from torch import nn

from gnn_dist.halo.exchange import HaloExchanger


class DistBatchNorm(nn.Module):
    """BatchNorm1d whose batch statistics span all ranks' owned rows (like SyncBatchNorm).

    Training normalises with the global mean and biased variance and updates
    running statistics with the unbiased variance (momentum 0.1), as
    torch.nn.BatchNorm1d does on the whole graph; evaluation uses the running
    statistics.

    Shapes:
        x: [n_owned, C] -> [n_owned, C]
    """

    def __init__(self, num_features: int, exchanger: HaloExchanger, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_features))  # host: moved with its module
        self.bias = nn.Parameter(torch.zeros(num_features))  # host: moved with its module
        self.register_buffer("running_mean", torch.zeros(num_features))  # host: a buffer, moved with its module
        self.register_buffer("running_var", torch.ones(num_features))  # host: a buffer, moved with its module
        self.exchanger = exchanger
        self.eps = eps
        self.momentum = momentum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return (x - self.running_mean) / torch.sqrt(self.running_var + self.eps) * self.weight + self.bias
        return synchronised_batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, self.eps,
                                       self.momentum, self.exchanger.allreduce_)


def synchronised_batch_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, running_mean: torch.Tensor,
                            running_var: torch.Tensor, eps: float, momentum: float, allreduce_) -> torch.Tensor:
    """Training BatchNorm of x [n, C] whose statistics span every rank's rows (allreduce_ sums a tensor over
    ranks in place); running statistics are updated in place. Parameter gradients stay this rank's share."""
    return _SyncBatchNorm.apply(x, weight, bias, _Statistics(running_mean, running_var, eps, momentum, allreduce_))


class _Statistics:
    """What the synchronised BatchNorm reads and updates besides its inputs."""

    def __init__(self, running_mean, running_var, eps, momentum, allreduce_):
        self.running_mean, self.running_var = running_mean, running_var
        self.eps, self.momentum, self.allreduce_ = eps, momentum, allreduce_


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, module: _Statistics):  # type: ignore[override]
        c = x.shape[1]
        stats = torch.cat([x.sum(0), (x * x).sum(0), torch.tensor([float(x.shape[0])], dtype=x.dtype, device=x.device)])
        module.allreduce_(stats)
        count = stats[-1]
        if count < 2:
            raise ValueError("BatchNorm needs at least two nodes across all ranks")
        mean = stats[:c] / count
        var = (stats[c:2 * c] / count - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + module.eps)
        x_hat = (x - mean) * invstd
        with torch.no_grad():
            m = module.momentum
            module.running_mean.mul_(1 - m).add_(mean, alpha=m)
            module.running_var.mul_(1 - m).add_(var * count / (count - 1), alpha=m)
        ctx.save_for_backward(x_hat, invstd, weight)
        ctx.count = count
        ctx.module = module
        return x_hat * weight + bias

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        x_hat, invstd, weight = ctx.saved_tensors
        c = x_hat.shape[1]
        local_sum_dy = grad_out.sum(0)
        local_sum_dy_xhat = (grad_out * x_hat).sum(0)
        sums = torch.cat([local_sum_dy, local_sum_dy_xhat])
        ctx.module.allreduce_(sums)
        sum_dy, sum_dy_xhat = sums[:c], sums[c:]
        grad_x = (weight * invstd / ctx.count) * (ctx.count * grad_out - sum_dy - x_hat * sum_dy_xhat)
        # Parameter gradients stay local: the trainer sums all gradients across ranks.
        return grad_x, local_sum_dy_xhat, local_sum_dy, None
