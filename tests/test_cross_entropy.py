"""The chunked cross-entropy of full-batch training against torch's F.cross_entropy on the rows' copy."""
import pytest
import torch
import torch.nn.functional as F

from gnn_dist.nn import cross_entropy
from gnn_dist.nn.cross_entropy import rows_cross_entropy


@pytest.mark.parametrize("chunk_rows", [1, 7, 8192])
def test_rows_cross_entropy_is_torchs_on_the_rows_copy_in_value_and_gradient(monkeypatch, chunk_rows):
    monkeypatch.setattr(cross_entropy, "CHUNK_ROWS", chunk_rows)
    generator = torch.Generator().manual_seed(3)
    logits = (torch.randn(50, 9, generator=generator, dtype=torch.float64) * 4).requires_grad_()
    rows = torch.randperm(50, generator=generator)[:23]
    labels = torch.randint(0, 9, (23,), generator=generator)
    weight = torch.randn(50, 9, generator=generator, dtype=torch.float64)  # the loss feeds a later product

    ours = rows_cross_entropy(logits * weight, rows, labels)
    (grad_ours,) = torch.autograd.grad(ours * 0.37, logits)
    theirs = F.cross_entropy((logits * weight)[rows], labels, reduction="sum")
    (grad_theirs,) = torch.autograd.grad(theirs * 0.37, logits)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-12)
    assert (grad_ours - grad_theirs).abs().max() <= 1e-12
    # rows outside `rows` get no gradient
    outside = torch.ones(50, dtype=torch.bool)
    outside[rows] = False
    assert bool((grad_ours[outside] == 0).all())
