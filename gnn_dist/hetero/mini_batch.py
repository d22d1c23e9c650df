"""Sampled mini-batch training on a typed graph (`--mode sampled` on a typed partition).

The homogeneous mode's loop (gnn_dist.steps.mini_batch: batches of this rank's training nodes, all ranks the
same number of steps, the next batch prepared during this one's allreduce, one allreduce of the replicated
gradients per step) with a typed batch:
- the sample: per hop, up to the fanout per relation (gnn_dist.hetero.sampler);
- the inputs: each type's rows from its own source (gnn_dist.hetero.batch_inputs): featured types' raw features
  through their Linears, featureless types' embedding rows fetched from their owners when the step starts;
- the layers: the typed stack's own (R-GCN, R-GAT), each on its block's relations (forward_block), with keyed
  dropout before every layer as in homogeneous sampled training;
- the update: the replicated weights step with the run's Adam (weight decay included); each embedding shard
  steps with torch.optim.SparseAdam's rule (sparse_adam_step) on the rows the step touched on any rank (their
  gradients summed at the owner), with one step count for the table and no weight decay, as a single process
  trains an nn.Embedding(sparse=True) with SparseAdam. Full-batch training instead moves every row every step
  (docs/hetero.md says so). The table's moments live in the run's optimizer state, so checkpoints write and
  re-shard them by id as in full-batch training.

Validation and test accuracy come from the typed stack's exact evaluation, layer by layer in chunks
(TypedStack.forward_layerwise).
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import torch

from gnn_dist.hetero.batch_inputs import GatheredInputs, TypedBatchInputs
from gnn_dist.hetero.sampler import TypedSampler
from gnn_dist.hetero.typed_part import edges_operator
from gnn_dist.kernels.native import native_module
from gnn_dist.nn.dropout import keyed_dropout
from gnn_dist.steps.mini_batch import MiniBatchMode


@dataclasses.dataclass
class TypedPreparedBatch:
    gathered: GatheredInputs  # the raw features of featured nodes, the ids of featureless ones
    blocks: list              # gnn_dist.hetero.sampler.TypedBlock, hop 1 first
    operators: list           # each layer's RelationOperator, outermost first
    target_types: list        # each layer's targets' types (int64 [targets]), outermost first
    node_ids: torch.Tensor    # int64 [n_nodes]: global ids (keys of the dropout masks)
    targets: np.ndarray       # the seeds' local positions (their labels)


class TypedMiniBatchMode(MiniBatchMode):
    def __init__(self, state, part):
        super().__init__(state, part)
        # the seeds are owned positions (the target's training nodes among every type's): the part's labels, not
        # the graph's, which the stack's output rows restrict to the target
        self.labels = torch.from_numpy(np.asarray(part.y, dtype=np.int64))  # host: typed sampling runs on the CPU

    def build_sampling(self, part) -> None:
        state, config = self.state, self.config
        self.sampler = TypedSampler(state.exchanger.comm, part, list(config.fanouts), state.config.seed,
                                    local_only=config.sampling == "local")
        self.store = None
        self.inputs = TypedBatchInputs(self.sampler, state.model.inputs)
        self.shards = dict(state.model.inputs.shards.items())

    def count_requests(self, on: bool | None = None) -> bool:
        stores = self.inputs.stores.values()
        if on is not None:
            for store in stores:
                store.count_requests = on
        return any(store.count_requests for store in stores)

    def count_remote(self, nodes: np.ndarray) -> None:
        self.inputs.count_remote(nodes)

    def cache_from_counts(self, budget_bytes: int) -> None:
        self.inputs.fill_cache(budget_bytes)

    def batch_seeds(self, epoch: int, batch: np.ndarray):
        return self.sampler.names_of_owned(batch), batch

    def prepare(self, epoch: int, step: int, batch: np.ndarray) -> tuple[TypedPreparedBatch, float]:
        seeds, targets = self.batch_seeds(epoch, batch)
        names, blocks = self.sampler.sample(seeds, epoch, step)
        gathered = self.inputs.gather(names)
        start = time.perf_counter()
        sampler, device = self.sampler, self.state.device
        types = torch.from_numpy(sampler.type_of(names))  # host: typed sampling runs on the CPU
        operators = [edges_operator(b.dst.numpy(), b.src.numpy(), b.relation.numpy(), b.n_dst, b.n_src,
                                    sampler.num_relations, device) for b in reversed(blocks)]
        batch_ = TypedPreparedBatch(gathered, blocks, operators, [types[:b.n_dst] for b in reversed(blocks)],
                                    torch.from_numpy(sampler.global_of(names)), targets)  # host: CPU only
        return batch_, time.perf_counter() - start

    def forward_batch(self, batch: TypedPreparedBatch, layer_keys: list[int]) -> torch.Tensor:
        model = self.state.model
        h = self.inputs.rows(batch.gathered)  # collective: the embedding rows of this step
        p = model.config.dropout
        for k, (conv, operator, target_types) in enumerate(zip(model.convs, batch.operators, batch.target_types)):
            ids = batch.node_ids[:h.shape[0]]
            h = keyed_dropout(h, ids, layer_keys[k], p, model.training, relu=k > 0, inplace=k > 0)
            conv.pass_key = layer_keys[k]
            h = conv.forward_block(h, operator, target_types, ids)
        return h

    def optimizer_step(self, global_terms: float) -> None:
        """Adam on the replicated weights (the shards hold no dense gradient, so it leaves them), then each
        shard's SparseAdam step on its touched rows. Every rank steps every table every step, touched rows or
        none, so the table's one step count is the run's step count on every rank."""
        optimizer = self.state.optimizer
        optimizer.step()
        if not self.shards:
            return
        gradients = self.inputs.table_gradients(1.0 / global_terms)  # collective, in type order
        group = optimizer.param_groups[0]
        for name, shard in self.shards.items():
            # the shard's state is the run's optimizer's, which checkpoints write and resumes re-shard; laid out
            # as Adam's, so a checkpoint of either mode resumes in the other
            sparse_adam_step(shard, optimizer.state[shard], *gradients[name], group["lr"], group["betas"],
                             group["eps"])


@torch.no_grad()
def sparse_adam_step(parameter: torch.Tensor, state: dict, rows: torch.Tensor, values: torch.Tensor, lr: float,
                     betas: tuple, eps: float) -> None:
    """torch.optim.SparseAdam's update of `rows` (each once) by their gradients `values`: their moments decay,
    no other row's; one step count for the whole table; no weight decay. Index ops on those rows rather than
    torch's sparse_mask and sparse additions over the whole table, which took most of a step's update on
    ogbn-mag's shape; natively one pass over each row (kernels/native_kernels.cpp: sparse_adam_rows). Held to
    torch.optim.SparseAdam by tests/test_hetero_sampled.py, both ways."""
    if not state:
        step = torch.tensor(0.0)  # host: Adam keeps a parameter's step count on the host as well
        state.update(step=step, exp_avg=torch.zeros_like(parameter), exp_avg_sq=torch.zeros_like(parameter))
    state["step"] += 1
    if len(rows) == 0:
        return
    beta1, beta2 = betas
    step = float(state["step"])
    step_size = lr * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
    native = native_module()
    if native is not None and parameter.dtype == torch.float32 and not parameter.is_cuda:
        native.sparse_adam_rows(parameter, state["exp_avg"], state["exp_avg_sq"], rows, values, step_size, beta1,
                                beta2, eps)
        return
    exp_avg = state["exp_avg"].index_select(0, rows)
    exp_avg_sq = state["exp_avg_sq"].index_select(0, rows)
    exp_avg.add_(values.sub(exp_avg).mul_(1 - beta1))  # old + (1 - b) (new - old), as SparseAdam writes it
    exp_avg_sq.add_(values.pow(2).sub_(exp_avg_sq).mul_(1 - beta2))
    state["exp_avg"].index_copy_(0, rows, exp_avg)
    state["exp_avg_sq"].index_copy_(0, rows, exp_avg_sq)
    parameter.index_add_(0, rows, exp_avg.div_(exp_avg_sq.sqrt_().add_(eps)), alpha=-step_size)
