"""Sampled mini-batch training across partitions (`--mode sampled`).

Each rank draws batches from the training nodes it owns, shuffled per epoch
by a generator keyed on (seed, epoch, rank). All ranks run the same number of
steps per epoch, agreed up front (the largest ceil(n_train / batch) over
ranks); a rank with fewer training nodes recycles its shuffled list (a rank
with none runs empty steps, still answering sampling and feature requests),
so no rank waits at a collective. Gradients of the summed loss are summed
with one Allreduce per step, which also carries the global number of seeds
that scales them. Validation and test accuracy come from the exact
full-batch forward (gnn_dist.trainer.evaluate).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from gnn_dist.dropout import sampled_stream_key
from gnn_dist.flat import pack_into, unpack_from
from gnn_dist.model import forward_blocks
from gnn_dist.sampling import Block, DistributedSampler, FeatureStore
from gnn_dist.kernels.spmm import SparseOperator


@dataclass(frozen=True)
class SampledConfig:
    fanouts: tuple = (15, 10, 5)
    batch_size: int = 1024
    sampling: str = "remote"  # or "local"
    feature_cache_mb: float = 0.0
    cache_count_steps: int = 8

    def validate(self, num_layers: int) -> None:
        if len(self.fanouts) != num_layers:
            raise ValueError(f"--fanouts has {len(self.fanouts)} values but the model has {num_layers} layers: "
                             f"give one fanout per layer (e.g. --fanouts {','.join(['10'] * num_layers)})")
        if any(f < 1 for f in self.fanouts):
            raise ValueError(f"--fanouts must be positive integers, got {list(self.fanouts)}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.sampling not in ("remote", "local"):
            raise ValueError(f"--sampling must be remote or local, got {self.sampling!r}")
        if self.feature_cache_mb < 0:
            raise ValueError(f"--feature-cache-mb must be 0 or more, got {self.feature_cache_mb}")


def block_operator(block: Block, model: str) -> SparseOperator:
    counts = torch.bincount(block.dst, minlength=block.n_dst).to(torch.float32)
    if model == "sage":
        values = 1.0 / counts[block.dst]
        return SparseOperator.from_coo(block.dst, block.src, values, (block.n_dst, block.n_src))
    # GCN on a block: mean over the sampled neighbours and the node itself (a self loop per target).
    loops = torch.arange(block.n_dst, dtype=torch.int64)
    rows = torch.cat([block.dst, loops])
    cols = torch.cat([block.src, loops])
    values = 1.0 / (counts[rows] + 1.0)
    return SparseOperator.from_coo(rows, cols, values, (block.n_dst, block.n_src))


class SampledRun:
    def __init__(self, state, part, config: SampledConfig):
        self.state = state
        self.config = config
        ctx = state.ctx
        self.sampler = DistributedSampler(ctx.comm, part, list(config.fanouts), state.config.seed,
                                          local_only=config.sampling == "local")
        self.store = FeatureStore(ctx.comm, self.sampler, state.x_full)
        self.train_local = np.flatnonzero(part.train_mask)
        steps = torch.tensor([float(-(-len(self.train_local) // config.batch_size))], dtype=torch.float64)
        if ctx.size > 1:
            ctx.comm.allreduce_(steps, op="max")
        self.steps = int(steps.item())
        self.labels = state.graph.y
        self.caching = config.feature_cache_mb > 0 and config.sampling == "remote"
        if self.caching:
            self._fill_cache()
            # The first epoch trained records every remote request; the next epoch starts by refilling
            # the cache from those counts (a whole epoch estimates the hot set far better than the
            # counting pass's few steps). The refill fetches only rows not cached yet.
            self.store.count_requests = True
        self.epochs_trained = 0

    def batches(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.state.config.seed, epoch, self.state.ctx.rank])
        if len(self.train_local) == 0:
            return [np.zeros(0, dtype=np.int64)] * self.steps
        needed = self.steps * self.config.batch_size
        order = np.concatenate([rng.permutation(self.train_local)
                                for _ in range(-(-needed // len(self.train_local)))])
        b = self.config.batch_size
        return [order[i * b:(i + 1) * b] for i in range(self.steps)]

    def _fill_cache(self) -> None:
        """Counting pass: sample the first steps of epoch 0 and cache the remote nodes seen most often."""
        for step, batch in enumerate(self.batches(0)[:self.config.cache_count_steps]):
            nodes, _ = self.sampler.sample(batch + self.sampler.first, 0, step)
            self.store.count_remote(nodes)
        ids, hits = self.store.request_counts()
        self.store.fill_cache(ids, hits, int(self.config.feature_cache_mb * 2**20))
        self.sampler.counters.reset()

    def train_epoch(self, epoch: int) -> dict:
        state = self.state
        model, counters = state.model, self.sampler.counters
        counters.reset()
        if self.store.count_requests and self.epochs_trained == 1:
            start = time.perf_counter()
            ids, hits = self.store.request_counts()
            self.store.count_requests = False
            self.store.fill_cache(ids, hits, int(self.config.feature_cache_mb * 2**20))
            counters.fetch_s += time.perf_counter() - start
        model.train()
        losses, seeds_total, compute_s = [], 0, 0.0
        for step, batch in enumerate(self.batches(epoch)):
            nodes, blocks = self.sampler.sample(batch + self.sampler.first, epoch, step)
            x = self.store.gather(nodes)
            start = time.perf_counter()
            operators = [block_operator(b, state.config.model.model) for b in reversed(blocks)]
            state.optimizer.zero_grad(set_to_none=False)
            keys = [sampled_stream_key(state.config.seed, epoch, step, state.ctx.rank, k)
                    for k in range(len(operators))]
            logits = forward_blocks(model, x, operators, torch.from_numpy(nodes), keys)
            loss_sum = F.cross_entropy(logits, self.labels[torch.from_numpy(batch)], reduction="sum") \
                if len(batch) else logits.sum() * 0.0
            loss_sum.backward()
            params = list(model.parameters())
            flat = state.flat_sampled
            pack_into(params, flat[:-2], grads=True)
            flat[-2] = loss_sum.detach()
            flat[-1] = float(len(batch))
            state.exchanger.allreduce_(flat)
            global_seeds = float(flat[-1])
            flat[:-2].div_(max(global_seeds, 1.0))
            unpack_from(params, flat[:-2], grads=True)
            state.optimizer.step()
            compute_s += time.perf_counter() - start
            losses.append(float(flat[-2]) / max(global_seeds, 1.0))
            seeds_total += int(global_seeds)
            state.watchdog.beat(f"epoch {epoch}: sampled step {step}")
        self.epochs_trained += 1
        return {"loss": float(np.mean(losses)) if losses else 0.0, "seeds": seeds_total, "compute_s": compute_s,
                "sample_s": counters.sample_s, "fetch_s": counters.fetch_s, "sample_bytes": counters.sample_bytes,
                "feature_bytes": counters.feature_bytes, "cache_hits": counters.cache_hits,
                "cache_misses": counters.cache_misses, "halo_hits": counters.halo_hits}
