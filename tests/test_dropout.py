"""Keyed dropout: the hash equals a plain-Python reference; masks depend only on the key and node id."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gnn_dist.kernels.keyed_random import keyed_normal, mix32, mix32_reference, stream_key, wrap_int32
from gnn_dist.nn.dropout import keep_mask, keyed_dropout


def test_hash_matches_python_reference():
    values = torch.randint(0, 2**32, (2000,), dtype=torch.int64)
    ours = mix32(wrap_int32(values)).to(torch.int64) & 0xFFFFFFFF
    assert ours.tolist() == [mix32_reference(int(v)) for v in values]


def test_mask_of_a_node_does_not_depend_on_its_neighbours_or_order():
    ids = torch.randperm(5000)
    key = stream_key(seed=1, epoch=3, layer=1)
    full = keep_mask(ids, 40, key, 0.5)
    subset = torch.tensor([17, 3, 4999, 250])
    assert torch.equal(keep_mask(ids[subset], 40, key, 0.5), full[subset])
    assert not torch.equal(keep_mask(ids, 40, stream_key(1, 4, 1), 0.5), full)
    assert not torch.equal(keep_mask(ids, 40, stream_key(1, 3, 2), 0.5), full)


def test_keep_rate_and_scaling():
    ids = torch.arange(20000)
    for p in (0.1, 0.5, 0.8):
        rate = keep_mask(ids, 32, stream_key(0, 0, 0), p).float().mean().item()
        assert abs(rate - (1 - p)) < 0.005
    x = torch.ones(20000, 8)
    out = keyed_dropout(x, ids, stream_key(0, 0, 0), 0.5, training=True)
    assert set(out.unique().tolist()) == {0.0, 2.0}
    assert keyed_dropout(x, ids, 1, 0.5, training=False) is x


# Widths below, at and around the kernel's eight-column mask bytes and its vector lanes, and a wide one.
@pytest.mark.parametrize("width", [1, 8, 37, 300])
def test_native_and_torch_paths_draw_the_same_masks(monkeypatch, width):
    import gnn_dist.kernels.native as native
    from gnn_dist.nn import dropout

    ids = torch.randperm(3000)
    x = torch.randn(3000, width, requires_grad=True)
    key = stream_key(2, 5, 1)
    upstream = torch.randn(3000, width)
    outs = {}
    for kernel in ("native", "torch"):
        monkeypatch.setenv(native.KERNEL_ENV, kernel)
        for relu in (False, True):
            x.grad = None
            out = dropout.keyed_dropout(x, ids, key, 0.3, training=True, relu=relu)
            out.backward(upstream)
            outs[kernel, relu] = (out.detach(), x.grad.clone())
            # In place (a layer output no backward saved), the output is the input tensor, with the same values.
            overwritten = x.detach().clone()
            in_place = dropout.keyed_dropout(overwritten, ids, key, 0.3, training=True, relu=relu, inplace=True)
            assert torch.equal(in_place, outs[kernel, relu][0])
    for relu in (False, True):
        assert torch.equal(outs["native", relu][0], outs["torch", relu][0])
        assert torch.equal(outs["native", relu][1], outs["torch", relu][1])
    # Against the mask drawn independently of both kernels: ReLU, keep, scale; the gradient is the same mask.
    kept = keep_mask(ids, width, key, 0.3)
    expected = torch.relu(x.detach()) * kept / 0.7
    assert torch.allclose(outs["native", True][0], expected)
    assert torch.allclose(outs["native", False][1], upstream * kept / 0.7)


def _splitmix64_reference(x: int) -> int:
    """SplitMix64's finaliser on Python ints (Steele, Lea & Flood), the published constants."""
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def test_embedding_rows_start_as_box_muller_of_the_keyed_words_in_any_chunking():
    """keyed_normal (a featureless type's initial rows) hashes chunk by chunk: every chunking gives the values
    of Box-Muller on SplitMix64 words of (seed, id, column), computed here on Python ints, row by row."""
    ids, seed, width = np.array([0, 5, 6, 1 << 40, 123456789]), 3, 4
    mask = (1 << 64) - 1
    seed_word = _splitmix64_reference(seed ^ 0x6A09E667F3BCC909)
    expected = np.empty((len(ids), width))
    for i, node in enumerate(ids.tolist()):
        base = _splitmix64_reference(seed_word ^ node)
        words = [_splitmix64_reference(base ^ ((c * 0x9E3779B97F4A7C15) & mask)) for c in range(2 * width)]
        uniform = [((w >> 11) + 0.5) / float(1 << 53) for w in words]
        expected[i] = [math.sqrt(-2.0 * math.log(uniform[c])) * math.cos(2.0 * math.pi * uniform[width + c])
                       for c in range(width)]
    for chunk_rows in (1, 2, 4096):
        np.testing.assert_allclose(keyed_normal(ids, seed, width, chunk_rows=chunk_rows), expected, rtol=1e-12)
    as_float32 = keyed_normal(ids, seed, width, dtype=np.float32, chunk_rows=3)
    assert as_float32.dtype == np.float32
    np.testing.assert_allclose(as_float32, expected, rtol=1e-6)
