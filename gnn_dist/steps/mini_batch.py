"""Sampled mini-batch training across partitions (`--mode sampled`).

Each rank draws batches from the training nodes it owns, shuffled per epoch
by a generator keyed on (seed, epoch, rank). All ranks run the same number of
steps per epoch, agreed up front: every rank draws as many training nodes
as the rank with the most (n_max), in ceil(n_max / batch) steps, the last
one partial where the batch does not divide n_max; a rank with fewer
recycles its shuffled list up to n_max (a rank with none runs empty steps,
still answering sampling and feature requests), so no rank waits at a
collective and every node is drawn at least once an epoch. Gradients of the
summed loss are summed with one Allreduce per step, which also carries the
global number of seeds that scales them. Validation and test accuracy come from the exact
full-batch forward (gnn_dist.steps.evaluation.evaluate).

What a batch is and what its loss is belong to the task: `MiniBatchMode`
draws batches of training nodes and scores them with cross-entropy;
link prediction's mode (gnn_dist.link.mini_batch) overrides
`training_items`, `batch_seeds` and `batch_loss` to draw positive edges and
score pairs. Sampling, feature fetching, the cache and the gradient
synchronisation are shared.

Step k+1's batch is prepared (sampled, gathered, its copies to the device
queued: gnn_dist.comm.staging.BatchMover) between step k's backward and its
gradient allreduce, so on a GPU the host's sampling overlaps the device's
compute. Every rank prepares in the same order, so the sampler's collectives
still pair up, and the draws are keyed by (epoch, step), so the order changes
no number.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch
import torch.nn.functional as F

from gnn_dist.comm.staging import BatchMover, staging_forced
from gnn_dist.graph.feature_store import FeatureStore
from gnn_dist.graph.sampler import DistributedSampler
from gnn_dist.kernels.keyed_random import sampled_stream_key
from gnn_dist.models import model_class
from gnn_dist.steps.full_batch import check_finite
from gnn_dist.steps.gradients import flat_buffer, replicated_parameters, sync_gradients
from gnn_dist.steps.layer_stack import forward_blocks
from gnn_dist.steps.state import max_over_ranks, sum_over_ranks


@dataclasses.dataclass
class PreparedBatch:
    """A step's batch, sampled, gathered and on the device: what the step trains on."""

    x: torch.Tensor       # [n_nodes, F]: the input rows of every sampled node
    blocks: list          # gnn_dist.graph.sampler.Block, outermost level first
    node_ids: torch.Tensor  # int64 [n_nodes]: their global ids (keys of the dropout masks)
    targets: object       # what batch_loss needs of the batch


class MiniBatchMode:
    def __init__(self, state, part):
        self.state = state
        self.config = config = state.config.sampled
        ctx = state.ctx
        self.build_sampling(part)
        self.model_class = model_class(state.config.model.model)
        self.params = replicated_parameters(state.model)
        self.flat = flat_buffer(self.params, extras=2)  # gradients, then the loss sum and the number of seeds
        self.train_local = self.training_items(part)
        largest = torch.tensor([float(len(self.train_local))],
                               dtype=torch.float64)  # host: a count reduced over the host communicator
        if ctx.size > 1:
            ctx.comm.allreduce_(largest, op="max")
        # every rank draws as many items an epoch as the rank with the most: its own, then its list again
        self.items_per_epoch = int(largest.item())
        self.steps = -(-self.items_per_epoch // config.batch_size)
        self.labels = state.graph.y
        self.caching = config.feature_cache_mb > 0 and config.sampling == "remote"
        if self.caching:
            self._fill_cache()
            # The first epoch trained records every remote request; the next epoch starts by refilling
            # the cache from those counts (a whole epoch estimates the hot set far better than the
            # counting pass's few steps). The refill fetches only rows not cached yet.
            self.count_requests(True)
        self.epochs_trained = 0
        self.mover = BatchMover(state.device, always=staging_forced())

    def build_sampling(self, part) -> None:
        """The sampler and the feature store of the batches."""
        config = self.config
        self.sampler = DistributedSampler(self.state.exchanger.comm, part, list(config.fanouts), self.state.config.seed,
                                          local_only=config.sampling == "local")
        self.store = FeatureStore(self.state.exchanger.comm, self.sampler, self.state.x_full)

    def first_batch(self) -> tuple[np.ndarray, list]:
        """Epoch 0's first batch as the sampler draws it (its levels' nodes, the blocks), for the memory plan
        before training (collective: every rank samples it); training samples it again, the same, and counts it
        then."""
        batches = self.batches(0)
        seeds = self.batch_seeds(0, batches[0])[0] if batches else np.zeros(0, dtype=np.int64)
        nodes, blocks = self.sampler.sample(seeds, 0, 0)
        self.sampler.counters.reset()
        return nodes, blocks

    def count_requests(self, on: bool | None = None) -> bool:
        """Whether the store records remote requests (for the cache's refill); `on` sets it."""
        if on is not None:
            self.store.count_requests = on
        return self.store.count_requests

    def count_remote(self, nodes: np.ndarray) -> None:
        self.store.count_remote(nodes)

    def cache_from_counts(self, budget_bytes: int) -> None:
        """(Re)fill the cache with the remote rows counted most often since the last fill (collective)."""
        ids, hits = self.store.request_counts()
        self.store.fill_cache(ids, hits, budget_bytes)

    # Loss terms per training item (a node here; a positive and its negatives for link prediction): the global
    # count of terms that scales each step's gradient, divided by this, is the items the step processed.
    terms_per_item = 1

    def training_items(self, part) -> np.ndarray:
        """What batches are drawn from: this rank's training nodes (local ids)."""
        return np.flatnonzero(part.train_mask)

    def batch_seeds(self, epoch: int, batch: np.ndarray):
        """(the global ids the batch's neighbourhoods are sampled from, what batch_loss needs of the batch)."""
        return batch + self.sampler.first, batch

    def batch_loss(self, out: torch.Tensor, targets) -> tuple[torch.Tensor, int]:
        """(the summed loss of the batch from the seeds' outputs, its number of terms)."""
        if len(targets) == 0:
            return out.sum() * 0.0, 0
        picked = torch.from_numpy(targets).to(self.labels.device)
        return F.cross_entropy(out[:len(targets)], self.labels[picked], reduction="sum"), len(targets)

    def batches(self, epoch: int) -> list[np.ndarray]:
        return shuffled_batches(self.train_local, self.state.config.seed, epoch, self.state.ctx.rank,
                                self.items_per_epoch, self.config.batch_size, self.steps)

    def _fill_cache(self) -> None:
        """Counting pass: sample the first steps of epoch 0 and cache the remote nodes seen most often."""
        for step, batch in enumerate(self.batches(0)[:self.config.cache_count_steps]):
            nodes, _ = self.sampler.sample(self.batch_seeds(0, batch)[0], 0, step)
            self.count_remote(nodes)
        self.cache_from_counts(int(self.config.feature_cache_mb * 2**20))
        self.sampler.counters.reset()

    def prepare(self, epoch: int, step: int, batch: np.ndarray) -> tuple[PreparedBatch, float]:
        """Sample the step's neighbourhoods, gather their input rows and queue their copies to the device;
        (the batch, the seconds spent moving it, which count as compute as they always have)."""
        seeds, targets = self.batch_seeds(epoch, batch)
        nodes, blocks = self.sampler.sample(seeds, epoch, step)
        x = self.store.gather(nodes)
        start = time.perf_counter()
        edges = [t for b in blocks for t in (b.dst, b.src)]
        ids = torch.from_numpy(nodes)  # host: the mover takes it to the device with the rest of the batch
        x, node_ids, *edges = self.mover.move([x, ids, *edges])
        blocks = [dataclasses.replace(b, dst=edges[2 * i], src=edges[2 * i + 1]) for i, b in enumerate(blocks)]
        return PreparedBatch(x, blocks, node_ids, targets), time.perf_counter() - start

    def forward_batch(self, batch: PreparedBatch, layer_keys: list[int]) -> torch.Tensor:
        """The seeds' outputs (the first rows) of a prepared batch; layer_keys key each layer's dropout."""
        return forward_blocks(self.state.model, batch.x, self.block_operators(batch), batch.node_ids, layer_keys)

    def block_operators(self, batch: PreparedBatch) -> list:
        """Each layer's block operator, outermost first; a transpose only where a gradient flows through it."""
        operators, input_needs_grad = [], batch.x.requires_grad
        for conv, block in zip(self.state.model.convs, reversed(batch.blocks)):
            # the order forward_block will take on the operator, from the block's counts before it is built
            entries = len(block.dst) + (block.n_dst if self.model_class.self_loops else 0)
            needed = conv.block_needs_transpose(conv.aggregates_block_first(block.n_src, block.n_dst, entries),
                                                input_needs_grad)
            operators.append(self.model_class.block_operator(block, needed))
            input_needs_grad = True  # every later layer's input depends on the weights below it
        return operators

    def optimizer_step(self, global_terms: float) -> None:
        """Step the weights once their gradients are summed over ranks (divided by global_terms, the loss's
        terms over every rank)."""
        self.state.optimizer.step()

    def train_epoch(self, epoch: int) -> dict:
        state = self.state
        model, counters = state.model, self.sampler.counters
        counters.reset()
        if self.caching and self.count_requests() and self.epochs_trained == 1:
            start = time.perf_counter()
            self.count_requests(False)
            self.cache_from_counts(int(self.config.feature_cache_mb * 2**20))
            counters.fetch_s += time.perf_counter() - start
        model.train()
        losses, seeds_total, compute_s = [], 0, 0.0
        batches = self.batches(epoch)
        upcoming, move_s = self.prepare(epoch, 0, batches[0]) if batches else (None, 0.0)
        for step in range(len(batches)):
            batch, compute_s = upcoming, compute_s + move_s
            start = time.perf_counter()
            state.optimizer.zero_grad(set_to_none=False)
            keys = [sampled_stream_key(state.config.seed, epoch, step, state.ctx.rank, k)
                    for k in range(len(batch.blocks))]
            out = self.forward_batch(batch, keys)
            loss_sum, terms = self.batch_loss(out, batch.targets)
            loss_sum.backward()
            compute_s += time.perf_counter() - start
            # The next batch is sampled, gathered and queued for the device while the device computes this one
            # (on a GPU the kernels above run asynchronously); its draws are keyed by (epoch, step), not by when.
            if step + 1 < len(batches):
                upcoming, move_s = self.prepare(epoch, step + 1, batches[step + 1])
            start = time.perf_counter()
            global_loss_sum, global_terms = sync_gradients(state.exchanger, self.params, self.flat,
                                                           [loss_sum.detach(), float(terms)],
                                                           divisor=lambda totals: max(totals[1], 1.0))
            losses.append(global_loss_sum / max(global_terms, 1.0))
            check_finite(losses[-1], epoch)
            with torch.profiler.record_function("optimizer step"):
                self.optimizer_step(max(global_terms, 1.0))
            compute_s += time.perf_counter() - start
            seeds_total += int(round(global_terms)) // self.terms_per_item
            state.watchdog.beat(f"epoch {epoch}: sampled step {step}")
        self.epochs_trained += 1
        return {"loss": float(np.mean(losses)) if losses else 0.0, "seeds": seeds_total, "compute_s": compute_s,
                "sample_s": counters.sample_s, "fetch_s": counters.fetch_s, "sample_bytes": counters.sample_bytes,
                "feature_bytes": counters.feature_bytes, "cache_hits": counters.cache_hits,
                "cache_misses": counters.cache_misses, "halo_hits": counters.halo_hits}

    def epoch_metrics(self, figures: dict, epoch_s: float) -> dict:
        """Per-epoch figures of sampled training: traffic summed over ranks, times of the slowest rank."""
        ctx = self.state.ctx
        sums = sum_over_ranks(ctx, [figures["sample_bytes"], figures["feature_bytes"], figures["cache_hits"],
                                    figures["cache_misses"], figures["halo_hits"]])
        slowest = max_over_ranks(ctx, [figures["sample_s"], figures["fetch_s"], figures["compute_s"]])
        sample_bytes, feature_bytes, hits, misses, halo_hits = (int(v) for v in sums)
        return {
            "halo_bytes": sample_bytes + feature_bytes, "sample_bytes": sample_bytes, "feature_bytes": feature_bytes,
            "cache_hits": hits, "cache_misses": misses, "halo_hits": halo_hits,
            "cache_hit_rate": hits / (hits + misses) if hits + misses else 1.0,
            "seeds": figures["seeds"], "seeds_per_s": figures["seeds"] / epoch_s if epoch_s else 0.0,
            "sample_s": slowest[0], "fetch_s": slowest[1], "compute_s": slowest[2],
        }


def shuffled_batches(items: np.ndarray, seed: int, epoch: int, rank: int, needed: int, batch_size: int,
                     steps: int) -> list[np.ndarray]:
    """An epoch's batches of a rank's items: shuffled by a generator keyed on (seed, epoch, rank), recycled up to
    `needed` (the largest rank's count, so every rank runs `steps` steps), cut into batches of batch_size."""
    if len(items) == 0:
        return [np.zeros(0, dtype=np.int64)] * steps
    rng = np.random.default_rng([seed, epoch, rank])
    order = np.concatenate([rng.permutation(items) for _ in range(-(-needed // len(items)))])[:needed]
    # the last batch is partial where the largest count is not a multiple of the batch (as DGL's and PyG's
    # loaders end an epoch), rather than recycling nodes to fill it
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(steps)]
