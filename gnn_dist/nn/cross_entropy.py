"""Cross-entropy summed over some rows of a logits tensor (`rows_cross_entropy`), in chunks of rows.

F.cross_entropy(logits[rows], labels) makes whole [rows, classes] tensors: the rows' copy, their log-softmax
(kept for the backward), the backward's gradient of the picked entries (dense), the log-softmax's gradient
and its scatter into a zero tensor the size of the logits. With many classes they are the largest tensors of
a full-batch step: on ogbn-mag's shape (349 classes, 629k training papers) about 3.6 GiB at P=1, beside
1.0 GiB of logits. Here the forward keeps the logits (which the caller holds anyway) and makes CHUNK_ROWS rows
at a time; the backward writes softmax - one-hot into one gradient the size of the logits, chunk by chunk.
The values are F.cross_entropy's (log-sum-exp minus the label's logit), summed in chunks.
"""
from __future__ import annotations

import torch

CHUNK_ROWS = 8192  # rows of the logits alive at once in the loss's temporaries


class _RowsCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor):  # type: ignore[override]
        total = logits.new_zeros(())
        for start in range(0, len(rows), CHUNK_ROWS):
            picked = logits.index_select(0, rows[start:start + CHUNK_ROWS])
            chunk_labels = labels[start:start + CHUNK_ROWS].unsqueeze(1)
            total += (torch.logsumexp(picked, 1) - picked.gather(1, chunk_labels).squeeze(1)).sum()
        ctx.save_for_backward(logits, rows, labels)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        logits, rows, labels = ctx.saved_tensors
        grad_logits = torch.zeros_like(logits)
        for start in range(0, len(rows), CHUNK_ROWS):
            chunk = rows[start:start + CHUNK_ROWS]
            probabilities = torch.softmax(logits.index_select(0, chunk), 1)
            chunk_labels = labels[start:start + CHUNK_ROWS].unsqueeze(1)
            probabilities.scatter_add_(1, chunk_labels, probabilities.new_full(chunk_labels.shape, -1.0))
            grad_logits.index_copy_(0, chunk, probabilities.mul_(grad))
        return grad_logits, None, None


def rows_cross_entropy(logits: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """sum over i of cross_entropy(logits[rows[i]], labels[i]); differentiable in logits. rows are distinct.

    Shapes: logits [n, C], rows int64 [m], labels int64 [m] -> a scalar
    """
    return _RowsCrossEntropy.apply(logits, rows, labels)
