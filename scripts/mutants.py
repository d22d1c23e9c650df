"""Named mutations of the checkpoint, schedule, sampling, halo and evaluation code, each run against its tests.

    python scripts/mutants.py                      # every mutant, on this checkout
    python scripts/mutants.py --only pipeline      # mutants whose name contains "pipeline"
    python scripts/mutants.py --tree ../old-copy --whole-files   # the same mutants on another checkout

Each mutant is a one-place change that breaks a feature on purpose: it is
applied to a fresh copy of the tree's tracked files, and the tests named for
it run there (python -m pytest -x, with PYTHONPATH pointing at the copy, so
mpiexec ranks import the mutated code too). A mutant is *killed* when a test
fails, *survives* when they all pass (a feature a test does not protect), and
is *n/a* when the tree has no such code: after a refactor that is a mutant to
retarget, so n/a fails the tool unless --allow-na says the tree is an older
checkout. `--check` only verifies that every mutant applies exactly once and
names tests that exist (seconds; tests/test_mutants.py runs it in CI). A kill counts only
when the failing test passes again on the unmutated tree; otherwise the mutant
is reported *flaky*, naming the test. --whole-files runs
the whole test files named for a mutant rather than its test ids (and, where
a file is missing in that tree, every test not marked mpi): the fair way to
ask an older checkout, whose tests have other names, whether anything catches
the mutant. The script exits
1 when any mutant survives. It takes minutes (MPI tests among them), so CI
does not run it; run it after changing the code it covers.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids or -k expressions ("-k EXPR" as one item)
    also: tuple[tuple[str, str], ...] = ()  # the same mutation as (old, new) where the code is spelt otherwise

    def edit(self, text: str) -> str | None:
        """The mutated text, or None when the code to mutate is not in it exactly once."""
        for old, new in ((self.old, self.new), *self.also):
            if text.count(old) == 1:
                return text.replace(old, new)
        return None


MUTANTS = [
    Mutant("pyg: halo degrees taken as one instead of exchanged",
           "gnn_dist/pyg/gcn_norm.py",
           '    degree = graph.input_with_halo(degree.unsqueeze(1), "gcn_norm degrees").squeeze(1)\n',
           "    degree = torch.cat([degree, degree.new_ones(graph.n_all - graph.n_owned)])\n",
           ("tests/test_your_model.py::test_an_unmodified_pyg_model_equals_the_whole_graph_at_any_p",)),
    Mutant("pyg: dropout keyed by local rows, not original ids",
           "gnn_dist/pyg/dropout.py", "            return apply_mask(input, row_hashes(graph.node_ids, key), p)",
           "            return apply_mask(input, row_hashes(torch.arange(graph.n_owned), key), p)",
           ("tests/test_your_model.py::test_dropout_draws_the_same_curve_at_any_p",)),
    Mutant("pyg: gradients not summed over ranks",
           "gnn_dist/pyg/wrapper.py", "                reduce(flat)\n", "",
           ("tests/test_your_model.py::test_an_unmodified_pyg_model_equals_the_whole_graph_at_any_p",)),
    Mutant("pyg: accumulated gradients summed again",
           "gnn_dist/pyg/wrapper.py",
           "                self._before[id(p)], p.grad = p.grad, None",
           "                self._before[id(p)] = p.grad.clone()",
           ("tests/test_your_model.py::test_gradients_accumulated_over_two_backwards_are_summed_once",)),
    Mutant("pyg: the first layer exchanges what data.x's cached rows give",
           "gnn_dist/pyg/halo_hooks.py", "        if full is None or not (self.pairs or self.whole_rows):",
           "        if True:",
           ("tests/test_your_model.py::test_the_first_layer_reads_cached_rows_and_later_layers_send_what_they_aggregate",)),
    Mutant("train --model MODULE:NAME: the model is built before torch is seeded",
           "gnn_dist/training/user_model.py", "    torch.manual_seed(config.seed)\n", "",
           ("tests/test_your_model_cli.py::test_pyg_gin_trains_at_p2_on_the_curve_of_one_process",)),
    Mutant("train --model MODULE:NAME: a resume restores the weights but not the step",
           "gnn_dist/pyg/checkpoint.py", '    model.step = int(state["step"])\n', "",
           ("tests/test_your_model_cli.py::test_a_model_from_a_file_resumes_at_another_p_on_the_same_curve_and_exports",)),
    Mutant("gd.NeighborLoader: hop h samples every node so far, not the nodes hop h-1 added",
           "gnn_dist/pyg/loader.py", "            frontier = nodes[start:]\n", "            frontier = nodes\n",
           ("tests/test_neighbor_loader.py::test_every_batch_is_the_dataset_subgraph_of_its_sampled_edges",)),
    Mutant("gd.NeighborLoader: every rank shuffles its seeds as rank 0 does",
           "gnn_dist/pyg/loader.py", "self.seed, epoch, self.graph.ctx.rank, self.items_per_epoch",
           "self.seed, epoch, 0, self.items_per_epoch",
           ("tests/test_neighbor_loader.py::test_the_loader_draws_the_seeds_and_neighbours_of_mode_sampled",)),
    Mutant("gd.distribute without data: every rank draws rank 0's dropout masks",
           "gnn_dist/pyg/dropout.py", "sampled_stream_key(batch.seed, 0, batch.step, batch.rank, batch.dropout_calls)",
           "sampled_stream_key(batch.seed, 0, batch.step, 0, batch.dropout_calls)",
           ("tests/test_neighbor_loader.py::test_dropout_on_mini_batches_is_keyed_so_a_rerun_draws_the_same_masks",)),
    Mutant("guard: never falls back",
           "gnn_dist/training/guard.py", "        self.exact_until = epoch + 1 + window\n", "",
           ("tests/test_guard.py::test_the_guard_rescues_a_diverging_run_and_leaves_healthy_runs_alone",
            "tests/test_guard.py::test_a_climbing_loss_fires_after_a_window_of_epochs_and_the_exact_window_doubles")),
    Mutant("guard: the loss rule compares single epochs, not means",
           "gnn_dist/training/guard.py", "        self.recent = (self.recent + [loss])[-self.rule.patience:]",
           "        self.recent = (self.recent + [loss] * self.rule.patience)[-self.rule.patience:]",
           ("tests/test_guard.py::test_noise_and_a_saw_tooth_around_a_falling_loss_never_fire",)),
    Mutant("guard: collapse fires on one dip",
           "gnn_dist/training/guard.py", "            if self.collapsed_in_a_row >= rule.collapse_patience:",
           "            if self.collapsed_in_a_row >= 1:",
           ("tests/test_guard.py::test_collapse_below_the_majority_rate_fires_only_when_it_lasts_after_the_warmup",)),
    Mutant("pipeline: gradients smoothed with the rows' G",
           "gnn_dist/schedules/pipeline.py",
           "            self._smooth(state.grads, state.recv_grads, self.grads_smoothing)",
           "            self._smooth(state.grads, state.recv_grads, self.rows_smoothing)",
           ("tests/test_schedules.py::test_pipeline_smooths_rows_and_gradients_each_with_its_own_rate",)),
    Mutant("sequential pipeline: blocks aggregated with this epoch's rows",
           "gnn_dist/schedules/pipeline.py",
           "    def block_rows(self, exchange, received):\n        return self.state.halo[",
           "    def block_rows(self, exchange, received):\n        return self.state.recv_halo[",
           ("tests/test_sequential.py::test_sequential_schedules_equal_resident_ones",)),
    Mutant("sequential: the next block is received from the wrong peer",
           "gnn_dist/halo/blocks.py",
           "sends, receive = post_transfers(transfers, rows, exchange.dest, buffer, exchange.src, tag)",
           "sends, receive = post_transfers(transfers, rows, exchange.dest, buffer, exchange.dest, tag)",
           ("tests/test_sequential.py::test_sequential_model_equals_pyg_on_the_whole_graph",)),
    Mutant("simulated ranks: a receive takes the newest message",
           "gnn_dist/comm/simulated_ranks.py", "            self.ticket = key + (world.posted.get(key, 0),)",
           "            self.ticket = key + (world.sent.get(key, 1) - 1,)",
           ("tests/test_sequential.py::test_sequential_schedules_equal_resident_ones",)),
    Mutant("bns sequential: kept rows land in the wrong rows of the block",
           "gnn_dist/schedules/bns.py", "        rows[self._kept_halo(exchange)] = received",
           "        rows[:received.shape[0]] = received",
           ("tests/test_sequential.py::test_sequential_schedules_equal_resident_ones",)),
    Mutant("plan: a model's update memory is not charged",
           "gnn_dist/plan/memory.py", "        scratch, saved = conv.update_memory(i, o, **options)",
           "        scratch, saved = 0, 0",
           ("tests/test_plugins.py::test_the_memory_plan_charges_what_a_plugin_model_keeps",
            "tests/test_plan.py")),

    Mutant("checkpoint: --resume silently starts over",
           "gnn_dist/resilience/checkpoint.py", "    if not found:\n        return None\n    path = found[-1]",
           "    if True:\n        return None\n    path = found[-1]",
           ("tests/test_resilience.py::test_stopped_and_resumed_run_equals_the_uninterrupted_one",
            "tests/test_resilience.py::test_sampled_run_resumes_where_it_stopped")),
    Mutant("stale: refreshes every epoch",
           "gnn_dist/schedules/stale.py", "refresh = ex.epoch % self.refresh_every == 0 or slot not in self.cache",
           "refresh = True", ("tests/test_schedules.py::test_stale_reuses_the_cache_and_sends_one_epoch_in_r",)),
    Mutant("plain pipeline: the last exchanged layer pipelined too",
           "gnn_dist/schedules/pipeline.py",
           "            return [every_layer] * (exchanged_layers - 1) + [ExactSchedule()]",
           "            return [every_layer] * exchanged_layers",
           ("tests/test_schedules.py::test_plain_pipeline_exchanges_its_last_layer_exactly",)),
    Mutant("pipeline: backward uses this epoch's gradients",
           "gnn_dist/schedules/pipeline.py", "        grad_owned.index_add_(0, plan.send_idx, state.grads)",
           "        grad_owned.index_add_(0, plan.send_idx, ex.exact_backward(grad_full) - grad_full[:plan.n_owned])",
           ("tests/test_schedules.py::test_pipeline_uses_the_previous_epochs_rows_and_gradients",)),
    Mutant("pipeline: gradients stay those of the first epoch (same bytes)",
           "gnn_dist/schedules/pipeline.py",
           "            self._smooth(state.grads, state.recv_grads, self.grads_smoothing)", "            pass",
           ("tests/test_schedules.py::test_pipeline_uses_the_previous_epochs_rows_and_gradients",)),
    Mutant("pipeline: forward uses this epoch's rows",
           "gnn_dist/schedules/pipeline.py", "        full[plan.n_owned:] = state.halo\n",
           "        full[plan.n_owned:] = ex.exact_forward(x_owned)[plan.n_owned:]\n",
           ("tests/test_schedules.py::test_pipeline_uses_the_previous_epochs_rows_and_gradients",)),
    Mutant("adaptive: skips blocks that changed a lot",
           "gnn_dist/schedules/adaptive.py", "changes[q] < self.eps and skips[q] < self.max_skips:",
           "changes[q] >= self.eps and skips[q] < self.max_skips:",
           ("tests/test_schedules.py::test_adaptive_sends_exactly_the_blocks_that_changed_more_than_eps",)),
    Mutant("adaptive: ignores the skip limit",
           "gnn_dist/schedules/adaptive.py", "changes[q] < self.eps and skips[q] < self.max_skips:",
           "changes[q] < self.eps:",
           ("tests/test_schedules.py::test_adaptive_skips_unchanged_blocks_within_the_bound",)),
    Mutant("adaptive: compares the rows as sent under dropout (Sancus's rule)",
           "gnn_dist/schedules/adaptive.py", "sending = self._choose(plan, slot, send, ex.shaping_parameters.pop(slot, None))",
           "sending = self._choose(plan, slot, send, None)",
           ("tests/test_schedules.py::test_adaptive_skips_under_dropout_by_measuring_parameter_drift",)),
    Mutant("adaptive: gradients of reused blocks still return",
           "gnn_dist/schedules/adaptive.py", "        sending, incoming = flags\n",
           "        sending, incoming = flags\n        sending, incoming = sending * 0 + 1, incoming * 0 + 1\n",
           ("tests/test_schedules.py::test_adaptive_returns_gradients_for_fresh_blocks_only",)),
    Mutant("per-layer: every layer follows the first entry",
           "gnn_dist/schedules/layered.py", "self._by_slot = {layer_slot(k + 1): schedule for k, schedule in enumerate(layers)}",
           "self._by_slot = {layer_slot(k + 1): layers[0] for k, schedule in enumerate(layers)}",
           ("tests/test_schedules.py::test_per_layer_schedules_apply_to_their_own_layer",)),
    Mutant("per-layer: inspect prices every layer with the first entry",
           "gnn_dist/plan/traffic.py", "    schedules = parse_schedule(schedule).per_layer(len(widths))\n",
           "    schedules = [parse_schedule(schedule).per_layer(len(widths))[0]] * len(widths)\n",
           ("tests/test_schedules.py::test_inspect_prediction_matches_the_written_out_formula",)),
    Mutant("bns: drops no rows",
           "gnn_dist/schedules/bns.py", "        full[plan.n_owned:] = 0\n        full[plan.n_owned + halo_rows] = received",
           "        full[plan.n_owned + halo_rows] = received",
           ("tests/test_schedules.py::test_bns_keeps_a_fraction_agreed_by_owner_and_receiver",)),
    Mutant("bns: rows aggregated without renormalising them over the entries kept",
           "gnn_dist/schedules/bns.py",
           "        return self._renormaliser.factors(ex.plan, operator, halo_keep, pattern=ex.epoch)",
           "        return None",
           ("tests/test_schedules.py::test_bns_renormalises_each_row_over_the_entries_it_keeps",)),
    Mutant("renormalise: factors cached by operator alone, whatever rows are present",
           "gnn_dist/schedules/renormalise.py", "        key = (id(operator), pattern)\n",
           "        key = (id(operator), None)\n",
           ("tests/test_schedules.py::test_row_renormaliser_factors_follow_each_pattern_of_present_rows",)),
    Mutant("adaptive: a skipped block reuses the rows last received (the rule before the absent block)",
           "gnn_dist/schedules/adaptive.py", "        reuses = slot not in ex.renormalising_slots\n",
           "        reuses = True\n",
           ("tests/test_schedules.py::test_adaptive_leaves_skipped_blocks_out_and_renormalises_each_row",)),
    Mutant("adaptive: an attention layer priced without the rows it last received",
           "gnn_dist/schedules/adaptive.py", "        return n_sent + n_halo\n", "        return n_sent\n",
           ("tests/test_plan.py::test_schedules_that_keep_halo_rows_between_epochs_plan_their_caches",)),
    Mutant("adaptive: skipped blocks left out without renormalising the rows",
           "gnn_dist/schedules/adaptive.py", "        if not absent:\n            return None\n",
           "        return None\n",
           ("tests/test_schedules.py::test_adaptive_leaves_skipped_blocks_out_and_renormalises_each_row",)),
    Mutant("bns sequential: a row's weight counted from its owned columns only",
           "gnn_dist/halo/blocks.py", "        for block in operator.blocks:\n            if block.rows.numel():",
           "        for block in ():\n            if block.rows.numel():",
           ("tests/test_sequential.py::test_sequential_schedules_equal_resident_ones",)),
    Mutant("halo: gradients of halo rows never return",
           "gnn_dist/halo/exchange.py", "        grad_owned.index_add_(0, plan.send_idx, returned)\n        return grad_owned",
           "        return grad_owned",
           ("tests/test_halo_fake.py::test_backward_returns_halo_gradients_to_their_owners",)),
    Mutant("halo: payload bytes not counted",
           "gnn_dist/halo/exchange.py", "        self.counters.halo_bytes += sent\n", "",
           # one host's GCN goes through shared memory (its own count): the communicator's count is the fakes'
           ("tests/test_mpi_train.py::test_metrics_contract_and_bytes_match_inspect",
            "tests/test_halo_fake.py::test_gather_delivers_exactly_the_halo_rows")),
    Mutant("inspect: adaptive's flags left out of the prediction",
           "gnn_dist/schedules/adaptive.py", "return exact_bytes + exchanged_layers * num_parts * (num_parts - 1) * 4",
           "return exact_bytes",
           ("tests/test_schedules.py::test_inspect_prediction_matches_the_written_out_formula",)),
    Mutant("sampling: one neighbour too many per hop",
           "gnn_dist/graph/sampler.py", "counts, sources = self.sample_hop(nodes, fanout, sample_key(",
           "counts, sources = self.sample_hop(nodes, fanout + 1, sample_key(",
           ("tests/test_sampled.py::test_every_hop_samples_its_whole_frontier_within_the_fanout",)),
    Mutant("sampling: the new frontier keeps repeated sources",
           "gnn_dist/graph/sampler.py", "            level = np.concatenate([nodes, new])\n            blocks.append(",
           "            new = np.concatenate([new, new[:1]])\n            level = np.concatenate([nodes, new])\n"
           "            blocks.append(",
           ("tests/test_sampled.py::test_every_hop_samples_its_whole_frontier_within_the_fanout",)),
    Mutant("sampling: remote frontier nodes get no neighbours",
           "gnn_dist/graph/sampler.py",
           "        if not self.local_only:\n            remote = np.flatnonzero(owners != self.rank)",
           "        if False:\n            remote = np.flatnonzero(owners != self.rank)",
           ("tests/test_sampled.py::test_every_hop_samples_its_whole_frontier_within_the_fanout",)),
    Mutant("relabel: a new sample still holds the last sample's nodes",
           "kernels/native_kernels.cpp", "    for (const uint64_t h : used_) table_[h].key = -1;\n", "",
           ("tests/test_sampled.py::test_native_relabel_matches_numpy_over_several_hops",)),
    Mutant("sampling: a row with more neighbours than the fanout keeps its first ones",
           "kernels/native_kernels.cpp", "        if (candidate < best.front()) {\n", "        if (false) {\n",
           ("tests/test_sampled.py::test_native_sampler_draws_exactly_what_the_numpy_path_draws",)),
    Mutant("hetero: the halo's embedding rows send no gradients back to their owners",
           "gnn_dist/halo/exchange.py", "            return ctx.ex.exact_backward(grad_full.contiguous()), None, None",
           "            return grad_full[:ctx.ex.plan.n_owned].contiguous(), None, None",
           ("tests/test_hetero.py::test_rgcn_logits_loss_and_gradients_equal_pyg_at_any_p[16-2-0-2-chosen]",)),
    Mutant("hetero: a relation's mean counts every in-edge of the node, not the relation's",
           "gnn_dist/hetero/typed_part.py", "    values = (1.0 / counts[rows]).astype(np.float32)",
           "    values = (1.0 / np.diff(part.indptr)[destination]).astype(np.float32)",
           ("tests/test_hetero.py::test_rgcn_logits_loss_and_gradients_equal_pyg_at_any_p[16-2-0-1-aggregate]",)),
    Mutant("hetero: a relation transformed first sums its sources instead of taking their mean",
           "gnn_dist/hetero/typed_part.py",
           "            operator = _operator(self._rows[entries] - self.offsets[r], cols, self._values[entries],",
           "            operator = _operator(self._rows[entries] - self.offsets[r], cols,\n"
           "                                 np.ones_like(self._values[entries]),",
           ("tests/test_hetero.py::test_rgcn_logits_loss_and_gradients_equal_pyg_at_any_p[16-2-0-2-transform]",)),
    Mutant("hetero: embedding shards join the gradient allreduce",
           "gnn_dist/steps/gradients.py", "    return chosen() if chosen is not None else list(model.parameters())",
           "    return list(model.parameters())",
           ("tests/test_hetero.py::test_rgcn_logits_loss_and_gradients_equal_pyg_at_any_p[16-2-0-2-chosen]",)),
    Mutant("hetero: bns leaves halo rows out of a relation's mean without renormalising it",
           "gnn_dist/models/rgcn.py", "        if not self.exchanger.reweights_rows(self.slot):\n            return None\n",
           "        return None\n",
           ("tests/test_hetero.py::test_bns_renormalises_each_relations_mean_over_the_sources_it_keeps",)),
    Mutant("hetero: inspect prices a typed graph's hidden layers as exact fp32 whatever the schedule and dtype",
           "gnn_dist/partition_report.py",
           "meta.num_classes, halo_dtype,\n" + " " * 51 + "schedule, meta.num_parts)",
           "meta.num_classes, \"fp32\",\n" + " " * 51 + "\"exact\", meta.num_parts)",
           ("tests/test_hetero.py::test_typed_bytes_under_a_schedule_and_a_halo_dtype_are_the_predicted_ones",)),
    Mutant("checkpoints: a resumed embedding shard's Adam moments restart from zero",
           "gnn_dist/resilience/sharded.py", "                row_state[target] = value[source].to(row_state.device)\n",
           "                pass\n",
           ("tests/test_hetero.py::test_a_typed_run_stopped_at_p2_resumes_at_p4_and_p2_on_the_uninterrupted_curve",)),
    Mutant("checkpoints: a resume at another P (or export's whole table) takes the old shards' rows by position, "
           "not by id",
           "gnn_dist/resilience/sharded.py", "        found = self.order[position[mine]]\n",
           "        found = np.flatnonzero(mine)[:len(self.order)]\n",
           ("tests/test_hetero.py::test_a_typed_run_stopped_at_p2_resumes_at_p4_and_p2_on_the_uninterrupted_curve",
            "tests/test_hetero_export.py::test_a_typed_model_exports_to_pyg_and_scores_as_the_run[rgcn]")),
    Mutant("hetero: a relation's added rows take their gradient from the output's first rows, not theirs",
           "gnn_dist/models/relational.py", "        return grad, None, grad.index_select(0, index)\n",
           "        return grad, None, grad[:len(index)]\n",
           ("tests/test_hetero.py::test_rgcn_logits_loss_and_gradients_equal_pyg_at_any_p[16-2-0-2-chosen]",)),
    Mutant("hetero sequential: the first layer's owned rows are dropped out by column position, not by node id",
           "gnn_dist/hetero/stack.py",
           "                h = conv([keyed_dropout(h, self.node_ids, key, p, self.training)])",
           "                h = conv([keyed_dropout(h, self.column_ids[:len(h)] - self.column_ids[0], key, p, "
           "self.training)])",
           ("tests/test_hetero.py::test_rgcn_with_sequential_halos_trains_one_curve_at_every_p_as_pyg",)),
    Mutant("hetero sequential: a layer's stacked rows are renumbered from 0 for every relation",
           "gnn_dist/hetero/typed_part.py",
           "            rows.append(self._rows[entries] - self.offsets[r] + first)",
           "            rows.append(self._rows[entries] - self.offsets[r])",
           ("tests/test_hetero.py::test_rgcn_with_sequential_halos_equals_pyg_at_any_p[16-2-0-2-3]",)),
    Mutant("training loop: the heap is trimmed before every epoch, not only when the phase changes",
           "gnn_dist/training/loop.py", "    if state.memory is not None and state.memory.phase == phase:\n        return\n", "",
           ("tests/test_workspace.py::test_the_heap_is_trimmed_when_the_phase_changes_and_never_between_epochs_of_one_phase",)),
    Mutant("typed inputs: each piece's gradient is read from the first rows, not the rows it was placed in",
           "gnn_dist/hetero/inputs.py", "return (None, None, *(grad.index_select(0, where) if needed",
           "return (None, None, *(grad[:len(where)] if needed",
           ("tests/test_hetero.py::test_rgcn_logits_loss_and_gradients_equal_pyg_at_any_p[16-2-0-2-chosen]",)),
    Mutant("hetero sequential: the typed inputs still fetch the featured halo's raw features",
           "gnn_dist/hetero/inputs.py", "                if not with_halo:\n                    continue\n", "",
           ("tests/test_hetero.py::test_the_typed_plan_counts_the_forms_and_shards_the_layers_build[4-sequential]",)),
    Mutant("plan: sequential typed halos keep the featured halo's features",
           "gnn_dist/plan/typed.py", "+ (0 if sequential else shape.halo_per_type[k])) * FLOAT",
           "+ shape.halo_per_type[k]) * FLOAT",
           ("tests/test_hetero.py::test_the_typed_plan_counts_the_forms_and_shards_the_layers_build[4-sequential]",)),
    Mutant("inspect: sequential typed halos priced as the embedding rows alone at layer 0",
           "gnn_dist/partition_report.py",
           "    layer0 = 2 * FP32_BYTES * model.hidden * total_halo if sequential else typed[\"embedding_halo_bytes_per_epoch\"]",
           "    layer0 = typed[\"embedding_halo_bytes_per_epoch\"]",
           ("tests/test_hetero.py::test_rgcn_with_sequential_halos_trains_one_curve_at_every_p_as_pyg",)),
    Mutant("loss: the chunked cross-entropy's gradient forgets the label's -1",
           "gnn_dist/nn/cross_entropy.py",
           "            probabilities.scatter_add_(1, chunk_labels, probabilities.new_full(chunk_labels.shape, -1.0))\n",
           "",
           ("tests/test_cross_entropy.py::test_rows_cross_entropy_is_torchs_on_the_rows_copy_in_value_and_gradient[7]",)),
    Mutant("loss: the chunked cross-entropy sums its first chunk only",
           "gnn_dist/nn/cross_entropy.py", "            total += (torch.logsumexp",
           "            total = 0 * total + (torch.logsumexp",
           ("tests/test_cross_entropy.py::test_rows_cross_entropy_is_torchs_on_the_rows_copy_in_value_and_gradient[7]",)),
    Mutant("rgcn: a relation's product chunks all land in its first nodes' rows",
           "gnn_dist/models/rgcn.py", "        add_rows_(out, chunk_nodes, times(chunk, weight))",
           "        add_rows_(out, nodes[:len(chunk)], times(chunk, weight))",
           ("tests/test_hetero.py::test_rgcn_products_in_chunks_of_rows_equal_pyg[resident]",)),
    Mutant("plan: a typed relation form shared by two layers is counted twice",
           "gnn_dist/plan/typed.py", "        elif aggregated and aggregated not in built:\n",
           "        elif aggregated:\n",
           ("tests/test_hetero.py::test_the_typed_plan_counts_the_forms_and_shards_the_layers_build[4-resident]",)),
    Mutant("rgat: no relation adds its bias",
           "gnn_dist/models/rgat.py", ".index_add(0, self._destination, self.bias)", "",
           ("tests/test_rgat.py::test_rgat_adds_every_relations_bias_to_the_nodes_it_does_not_reach",)),
    Mutant("rgat: the destinations' scores are taken with att_src, not att_dst",
           "gnn_dist/models/rgat.py", "                * self.att_dst[r].view(",
           "                * self.att_src[r].view(",
           ("tests/test_rgat.py::test_rgat_logits_loss_and_gradients_equal_pyg_heteroconv_at_any_p[8-2-2-2]",)),
    Mutant("plan: R-GAT's attention transposes are not counted",
           "gnn_dist/plan/typed.py", "                    forms += (relations[r][2] + 1 + 2 * relations[r][0]) * CSR_INDEX\n",
           "                    pass\n",
           ("tests/test_rgat.py::test_the_rgat_plan_counts_the_forms_and_parameters_set_up_builds[4]",)),
    Mutant("typed export: R-GAT's destination attention comes from the source vector",
           "gnn_dist/export/typed.py", "        gat.att_dst.copy_(ours[\"att_dst\"][r].view_as(gat.att_dst))\n",
           "        gat.att_dst.copy_(ours[\"att_src\"][r].view_as(gat.att_dst))\n",
           ("tests/test_hetero_export.py::test_a_typed_model_exports_to_pyg_and_scores_as_the_run[rgat]",)),
    Mutant("typed embed: the checkpoint's embedding rows are not read (the keyed initial rows stay)",
           "gnn_dist/embed.py", "        restore_model(model, weights, shard_files(config.checkpoint_dir))\n",
           "        model.load_state_dict(weights, strict=False)\n",
           ("tests/test_hetero_export.py::test_a_typed_model_embeds_at_another_p_as_pyg_computes_it[rgcn]",)),
    Mutant("ogbn-mag: each split's papers land one id off",
           "partition/ogb_mag.py", "        mask[ids] = True\n", "        mask[np.minimum(ids + 1, papers - 1)] = True\n",
           ("tests/test_ogbn_mag.py::test_ogbn_mag_reads_what_the_raw_files_hold",)),
    Mutant("hetero: every node type keeps METIS's parts, unbalanced",
           "partition/hetero_parts.py", "        parts = balance_types(adjacency.edge_index, parts, groups, num_parts)\n", "",
           ("tests/test_hetero.py::test_a_typed_partition_holds_every_typed_edge_once_and_balances_each_type",)),
    Mutant("typed partition: METIS weighs node counts, not each node's edges, by default",
           "partition/hetero_parts.py", 'TYPED_BALANCE = "edges"\n', 'TYPED_BALANCE = "nodes"\n',
           ("tests/test_hetero.py::test_a_typed_partition_evens_the_parts_edges_by_default_and_keeps_each_type_balanced",)),
    Mutant("typed partition: --balance is not handed to METIS",
           "partition/hetero_parts.py",
           "    parts = assign_parts(adjacency, num_parts, method=method, seed=seed, objective=objective, balance=balance)\n",
           "    parts = assign_parts(adjacency, num_parts, method=method, seed=seed, objective=objective)\n",
           ("tests/test_hetero.py::test_a_typed_partition_evens_the_parts_edges_by_default_and_keeps_each_type_balanced",)),
    Mutant("inspect: a typed partition is planned for train's default model",
           "gnn_dist/cli.py", '        options["model"] = options["model"] or default_model(load_meta(args.directory))\n',
           '        options["model"] = options["model"] or "gcn"\n',
           ("tests/test_hetero.py::test_inspect_plans_rgcn_on_a_typed_partition_unless_told_and_refuses_a_homogeneous_model",)),
    Mutant("hetero: a relation within one type is not made symmetric",
           "partition/hetero.py", "            if src == dst:\n", "            if False:\n",
           ("tests/test_hetero.py::test_reverse_relations_are_pyg_to_undirected",)),
    Mutant("sampled step: SAGE's root term dropped",
           "gnn_dist/models/sage.py",
           "        return out.addmm_(root, self.lin_r.weight.t())",
           "        return out",
           ("tests/test_sampled.py::test_a_sampled_step_equals_pyg_on_the_same_blocks",)),
    Mutant("sampled step: SAGE's fused block drops the root rows' input gradient",
           "gnn_dist/models/sage.py", "                grad_h[:block_op.shape[0]].addmm_(grad_out, weight_r)\n",
           "                pass\n",
           ("tests/test_sampled.py::test_a_sampled_step_equals_pyg_on_the_same_blocks",)),
    Mutant("sampled blocks: every operator built with its transpose, needed or not",
           "gnn_dist/models/base.py",
           "        return input_needs_grad or not aggregate_first\n",
           "        return True\n",
           ("tests/test_sampled.py::test_a_sampled_step_equals_pyg_on_the_same_blocks",)),
    Mutant("sampled blocks: a narrowing layer keeps the whole graph's order (transforms first) on every block",
           "gnn_dist/models/base.py",
           "        if cls.block_order_by_work and aggregating_first_is_cheaper(in_dim, out_dim, n_src, n_dst, entries):\n",
           "        if False:\n",
           ("tests/test_sampled.py::test_a_narrowing_layer_aggregates_a_block_first_where_that_multiplies_less",)),
    Mutant("sampled blocks: the operators' transposes follow the whole graph's order, not the block's",
           "gnn_dist/steps/mini_batch.py",
           "            needed = conv.block_needs_transpose(conv.aggregates_block_first(block.n_src, block.n_dst, entries),\n",
           "            needed = conv.block_needs_transpose(conv.aggregate_first or 0 * entries,\n",
           ("tests/test_sampled.py::test_a_sampled_step_equals_pyg_on_the_same_blocks",)),
    Mutant("sampled epochs: every rank fills every step's batch by recycling (n_max no longer ends the epoch)",
           "gnn_dist/steps/mini_batch.py", "self.items_per_epoch, self.config.batch_size, self.steps)",
           "self.steps * self.config.batch_size, self.config.batch_size, self.steps)",
           ("tests/test_sampled.py::test_ranks_with_unequal_training_nodes_run_the_same_steps",)),
    Mutant("sampled GCN block: no self loop",
           "gnn_dist/models/gcn.py", "rows, cols = with_self_loops(block.dst, block.src, 0, block.n_dst)",
           "rows, cols = block.dst, block.src",
           ("tests/test_sampled.py::test_a_sampled_step_equals_pyg_on_the_same_blocks",)),
    Mutant("evaluation: BatchNorm skipped in chunks",
           "gnn_dist/steps/layer_stack.py",
           "                    if self.norms is not None:\n                        y = self.norms[k](y)",
           "                    if False:\n                        y = self.norms[k](y)",
           ("tests/test_layerwise.py::test_chunked_evaluation_equals_pyg_on_the_whole_graph",)),
    Mutant("evaluation: the last partial chunk is left out",
           "gnn_dist/steps/layer_stack.py", "            for start in range(0, n, chunk_nodes):",
           "            for start in range(0, n - n % chunk_nodes, chunk_nodes):",
           ("tests/test_layerwise.py::test_chunked_evaluation_equals_pyg_on_the_whole_graph",)),
    Mutant("evaluation: GCN chunk rows lose the halo columns' degree",
           "gnn_dist/models/gcn.py", "values = 1.0 / np.sqrt((deg[rows + start] + 1.0) * (deg[cols] + 1.0))",
           "values = 1.0 / np.sqrt((deg[rows + start] + 1.0) * (deg[np.minimum(cols, start + n_rows - 1)] + 1.0))",
           ("tests/test_layerwise.py::test_chunked_evaluation_equals_pyg_on_the_whole_graph",)),
    Mutant("sampled mode: builds the whole-part operator again",
           "gnn_dist/training/setup.py", "whole_operator=config.mode == \"full\"", "whole_operator=True",
           ("tests/test_layerwise.py::test_only_full_batch_mode_builds_the_whole_part_operator",)),
    Mutant("memory: a phase that raised the high-water mark reports a sample",
           "gnn_dist/memory/rss.py", "peak = mark if mark > self._mark else", "peak = 0 if mark > self._mark else",
           ("tests/test_layerwise.py::test_phase_peaks_attribute_memory_to_the_phase_that_used_it",)),
    Mutant("validation: --eval-every 0 accepted",
           "gnn_dist/config.py", "\"--eval-every\": self.eval_every,", "\"--eval-every\": self.eval_every + 1,",
           ("tests/test_validation.py",)),
    Mutant("validation: --lr inf accepted",
           "gnn_dist/config.py", "if not self.lr > 0 or not math.isfinite(self.lr):", "if not self.lr > 0:",
           ("tests/test_validation.py",)),
    Mutant("supervise: retries a job that refused its input",
           "gnn_dist/resilience/supervise.py", "NEVER_RETRIED = (EXIT_USAGE, EXIT_SETUP)", "NEVER_RETRIED = (EXIT_USAGE,)",
           ("tests/test_supervise.py::test_bad_input_under_supervise_is_reported_once_and_never_retried",)),
    Mutant("supervise: restarts from scratch (no --resume)",
           "gnn_dist/resilience/supervise.py", "run = run + ([\"--resume\"] if restarts and \"--resume\" not in run else [])",
           "run = run",
           ("tests/test_supervise.py::test_a_killed_rank_is_restarted_and_the_run_equals_the_uninterrupted_one",)),
    Mutant("supervise: the final record does not count restarts",
           "gnn_dist/training/loop.py", "\"restarts\": restarts_so_far(),", "\"restarts\": 0,",
           ("tests/test_supervise.py::test_a_killed_rank_is_restarted_and_the_run_equals_the_uninterrupted_one",)),
    Mutant("checkpoint: none after the last epoch",
           "gnn_dist/training/loop.py", " or epoch == config.epochs - 1):", "):",
           ("tests/test_supervise.py::test_a_finished_run_continues_with_more_epochs",)),
    Mutant("partition: the halo keeps a row no edge uses",
           "partition/build.py", "        halos.append(np.unique(remote))",
           # the next part's first node joins every halo, with consistent send lists: only minimality breaks
           "        halos.append(np.unique(np.concatenate([remote, partptr[k + 1:k + 2] % partptr[-1]]))"
           " if num_parts > 1 else np.unique(remote))",
           ("tests/test_partition.py::test_round_trip_synthetic",)),
    Mutant("dropout: the native kernel's ReLU lets negative elements through",
           "kernels/native_kernels.cpp", "    if (RELU) kept &= -static_cast<int32_t>(v > 0.0f);", "",
           ("tests/test_dropout.py::test_native_and_torch_paths_draw_the_same_masks",)),
    Mutant("dropout: the native backward unpacks a mask bit into the wrong column",
           "kernels/native_kernels.cpp", "& 0x8040201008040201ull;", "& 0x4080201008040201ull;",
           ("tests/test_dropout.py::test_native_and_torch_paths_draw_the_same_masks",)),
    Mutant("sparse features: dropped-out values not rescaled",
           "gnn_dist/nn/sparse_features.py", "values = (matrix.values() * kept).mul_(1.0 / (1.0 - p))",
           "values = matrix.values() * kept",
           ("tests/test_sparse_features.py::test_dropping_out_the_copy_equals_the_keyed_mask_on_the_dense_features",)),
    Mutant("sparse features: the dropout keyed by row number, not original id",
           "gnn_dist/steps/layer_stack.py", "conv.input_features = sparse.dropped_out(graph.column_ids, key, p)",
           "conv.input_features = sparse.dropped_out(torch.arange(graph.column_ids.shape[0]), key, p)",
           ("tests/test_sparse_features.py::test_input_dropout_on_the_copy_trains_as_the_dense_path_does",)),
    Mutant("gat: the native kernel ignores attention dropout",
           "kernels/native_kernels.cpp", "    if (!on) return scalar_t(1);", "    return scalar_t(1);",
           ("tests/test_gat.py",)),
    Mutant("gat: attention dropout never applied",
           "gnn_dist/models/gat.py", "        if not self.training or self.attn_dropout == 0.0:\n            return None",
           "        if True:\n            return None",
           ("tests/test_gat_mpi.py::test_attention_dropout_changes_the_curve",)),
    Mutant("gat: attention dropout keyed by local column instead of original id",
           "gnn_dist/models/gat.py",
           "self.bias, self._edge_dropout(self.column_ids, n))",
           "self.bias, self._edge_dropout(torch.arange(self.column_ids.shape[0]), n))",
           ("tests/test_gat_mpi.py::test_gat_loss_curve_with_dropout_is_the_same_at_every_rank_count",)),
    Mutant("gat: merging column blocks ignores the second block's share",
           "kernels/attention.py", "    wa, wb = torch.exp(lse_a - safe), torch.exp(lse_b - safe)",
           "    wa, wb = torch.exp(lse_a - safe), torch.zeros_like(lse_b)",
           ("tests/test_gat.py::test_merging_column_blocks_equals_the_whole_rows",)),
    Mutant("gat torch formulation: only the first chunk of edges is aggregated",
           "kernels/attention.py", "    return [slice(start, min(start + step, n_edges)) for start in range(0, n_edges, step)]",
           "    return [slice(0, min(step, n_edges))]",
           ("tests/test_gat.py::test_each_kernel_equals_the_plain_autograd_reference",)),
    Mutant("gat torch formulation: the gradient reaching lse is dropped",
           "kernels/attention.py", "    shift = row_delta[row] if grad_lse is None else row_delta[row] - grad_lse[row]",
           "    shift = row_delta[row]",
           ("tests/test_gat.py::test_each_kernel_equals_the_plain_autograd_reference",)),
    Mutant("gat sequential: blocks differentiated with their own softmax sum",
           "gnn_dist/halo/attention_blocks.py", "grad_out[rows], delta[rows], heads,", "grad_out[rows], delta[rows] * 0, heads,",
           ("tests/test_gat.py::test_sequential_halos_equal_pyg_with_gat",)),
    Mutant("gat: att's gradient summed against the heads' weights in the wrong order",
           "gnn_dist/models/gat.py", "torch.bmm(weight.view(heads, width, -1), summed.unsqueeze(-1))",
           "torch.bmm(weight.view(heads, width, -1).flip(0), summed.unsqueeze(-1))",
           ("tests/test_gat.py::test_one_layer_equals_pyg_gatconv",)),
    Mutant("gat: scores ignore the attention vectors",
           "gnn_dist/models/gat.py", "att.shape[2]) * att).sum(-1)",
           "att.shape[2]) * torch.ones_like(att)).sum(-1)",
           ("tests/test_gat.py::test_one_layer_equals_pyg_gatconv",)),
    Mutant("gat: the source scores' gradient does not reach x W",
           "gnn_dist/models/gat.py", "        grad_x = (grad_scores * att).view(-1, heads * width)\n",
           "        grad_x = (grad_scores * att * 0).view(-1, heads * width)\n",
           ("tests/test_gat.py::test_one_layer_equals_pyg_gatconv",)),
    Mutant("gat: the source attention vector gets no gradient",
           "gnn_dist/models/gat.py",
           "            grad_att = torch.bmm(weight.view(heads, width, -1), summed.unsqueeze(-1)).view(1, heads, width)",
           "            grad_att = torch.zeros_like(att)",
           ("tests/test_gat.py::test_one_layer_equals_pyg_gatconv",)),
    Mutant("sequential: a block pass keeps the layer's input until the backward",
           "gnn_dist/halo/blocks.py", "        transfers.end_forward()\n", "",
           ("tests/test_sequential.py::test_a_sequential_forward_keeps_no_layer_input_for_the_backward",)),
    Mutant("sparse features: GCN's first layer multiplies the features densely",
           "gnn_dist/models/gcn.py", "linear(h, self.weight, self.input_features)", "h @ self.weight.t()",
           ("tests/test_sparse_features.py::test_the_sparse_first_layer_equals_pyg_on_the_whole_graph",)),
    Mutant("sparse features: the copy is made under input dropout for a layer whose root term reads X",
           "gnn_dist/nn/sparse_features.py", "and (config.model.dropout == 0 or not conv_class.needs_root)", "",
           ("tests/test_sparse_features.py::test_no_copy_where_the_first_layer_is_not_handed_the_features_themselves",)),
    Mutant("sparse features: the copy serves any tensor of the features' width",
           "gnn_dist/nn/sparse_features.py", "if features is not None and h is features.dense:",
           "if features is not None and h.shape[1] == features.dense.shape[1]:",
           ("tests/test_sparse_features.py::test_layerwise_evaluation_takes_the_dense_path_and_agrees",)),
    Mutant("link: negatives may be the source itself",
           "gnn_dist/link/negatives.py", "    return value + (value >= (sources[:, None] if sources.ndim == 1 else sources))",
           "    return value",
           ("tests/test_link.py::test_negatives_are_uniform_over_the_other_nodes_and_never_the_source",)),
    Mutant("link: negatives keyed by the rank's row instead of the global edge id",
           "gnn_dist/link/pairs.py",
           "negative_destinations(seed, epoch, self.train_eid[index], self.train_source_orig[index],",
           "negative_destinations(seed, epoch, index, self.train_source_orig[index],",
           ("tests/test_link.py::test_negatives_are_the_same_at_every_rank_count",)),
    Mutant("link: the pairs rule's sources keyed by the rank's row instead of the global edge id",
           "gnn_dist/link/pairs.py", "sources = negative_sources(seed, epoch, self.train_eid[index], num_nodes, ratio)",
           "sources = negative_sources(seed, epoch, index, num_nodes, ratio)",
           ("tests/test_link.py::test_negatives_are_the_same_at_every_rank_count",)),
    Mutant("link: the pairs rule scores its negatives against the positives' sources",
           "gnn_dist/link/full_batch.py", "z_pos, z_neg, z_neg_src)", "z_pos, z_neg, None)",
           ("tests/test_link.py::test_link_step_equals_pyg_on_the_whole_graph",)),
    Mutant("link: the pairs rule's sources drawn over the other nodes, never the last",
           "gnn_dist/link/negatives.py", "^ _SOURCES, edge_ids, ratio, num_nodes)",
           "^ _SOURCES, edge_ids, ratio, num_nodes - 1)",
           ("tests/test_link.py::test_pair_negatives_are_uniform_over_ordered_pairs_of_distinct_nodes",)),
    Mutant("link: the loss divided by the rank's pairs, not the global count",
           "gnn_dist/link/full_batch.py", "/ (pairs.num_train_total * (1 + self.ratio))",
           "/ (max(n, 1) * (1 + self.ratio))",
           ("tests/test_link.py::test_link_step_equals_pyg_on_the_whole_graph",)),
    Mutant("link: fetched rows' gradients never return to their owners",
           "gnn_dist/link/row_fetch.py", "        grad_owned.index_add_(0, request.serve_rows, returned)\n", "",
           ("tests/test_link.py::test_link_step_equals_pyg_on_the_whole_graph",)),
    Mutant("link: a held-out edge stays in the message-passing graph",
           "partition/link_split.py", "    return with_edges(graph, train), split", "    return graph, split",
           ("tests/test_link.py::test_no_held_out_edge_carries_messages",)),
    Mutant("link: AUC counts ties as wins",
           "gnn_dist/link/metrics.py", "    average_rank = np.cumsum(counts) - (counts - 1) / 2.0",
           "    average_rank = np.cumsum(counts).astype(np.float64)",
           ("tests/test_link.py::test_metrics_equal_direct_computations",)),
    Mutant("peers: a lost neighbour goes unreported",
           "gnn_dist/comm/peers.py", "                    print(line, file=sys.stderr, flush=True)\n", "",
           ("tests/test_peers.py::test_both_neighbours_name_a_killed_rank_and_its_host",)),
    Mutant("peers: a rank that said goodbye is reported lost",
           "gnn_dist/comm/peers.py", "if link not in self._said and not self._closing.is_set()",
           "if not self._closing.is_set()",
           ("tests/test_peers.py::test_a_rank_that_leaves_on_purpose_is_not_reported_lost",)),
    Mutant("peers: at P = 2 the one peer is reported once per link",
           "gnn_dist/comm/peers.py", " and peer.rank not in self._reported:", ":",
           ("tests/test_peers.py::test_two_ranks_report_the_one_peer_once",)),
    Mutant("workspace: cached blocks are never unmapped to stay under the high-water mark",
           "kernels/workspace_allocator.cpp",
           "    while (!cached_.empty() && alive_ + cached_bytes_ + extra > limit) evict_oldest();",
           "    (void)limit;",
           ("tests/test_workspace.py::test_the_workspace_never_holds_more_than_the_most_ever_alive",)),
    Mutant("workspace: a size missing from the cache resizes another size's block even with room to map its own",
           "kernels/workspace_allocator.cpp",
           "    if (slack_ > 0 && alive_ + cached_bytes_ + size <= mark(size)) return map_new(size);",
           "    if (false) return map_new(size);",
           ("tests/test_workspace.py::test_with_slack_for_every_size_the_steady_state_maps_and_faults_in_nothing",)),
    Mutant("workspace: no block is advised to use huge pages",
           "kernels/workspace_allocator.cpp",
           "    if (huge_from_ != 0 && size >= huge_from_ && madvise(ptr, size, MADV_HUGEPAGE) == 0) ++huge_advised_;",
           "    (void)huge_from_;",
           ("tests/test_workspace.py::test_blocks_of_a_huge_page_or_more_are_advised_to_use_huge_pages_unless_turned_off",)),
    Mutant("supervise: a shrinking relaunch takes the smallest partition that fits, not the largest",
           "gnn_dist/comm/hosts.py",
           "    return max(fitting) if fitting else None", "    return min(fitting) if fitting else None",
           ("tests/test_hosts.py::test_the_largest_partition_that_fits_and_its_placement",)),
    Mutant("supervise: the hosts are probed once, at the first launch only",
           "gnn_dist/resilience/supervise.py", "        alive, silent = answering(self.hosts, self.probe)",
           "        alive, silent = (self.hosts, []) if self.last is not None else answering(self.hosts, self.probe)",
           ("tests/test_supervise.py::test_a_job_that_lost_a_host_is_relaunched_smaller_on_the_hosts_that_answer",)),
    Mutant("watchdog: --timeout auto never leaves the first-round limit",
           "gnn_dist/resilience/watchdog.py", "        if phase not in self._completed or phase == \"set-up\":",
           "        if True:",
           ("tests/test_resilience.py::test_timeout_auto_fits_the_limit_to_the_steps_seen",)),
    Mutant("staging: a non-blocking staged receive is never copied back to its destination",
           "gnn_dist/comm/staging.py", "            self._staged.streams.to_device(host, target)\n", "            pass\n",
           ("tests/test_staging.py::test_a_non_blocking_receive_lands_only_at_wait",
            "tests/test_staging.py::test_a_staged_run_is_bit_identical_to_an_unstaged_one")),
    Mutant("staging: a moved batch is the host buffer the next batch refills",
           "gnn_dist/comm/staging.py", "            moved.append(target)\n", "            moved.append(host)\n",
           ("tests/test_staging.py::test_a_batch_mover_keeps_its_buffers_and_never_lets_a_batch_share_them",)),
    Mutant("staging: a staged send goes out from an unfilled host buffer",
           "gnn_dist/comm/staging.py", "        self.streams.to_host(tensor, host)\n", "",
           ("tests/test_staging.py::test_staged_exchanges_deliver_what_unstaged_ones_do",)),
    Mutant("device: the device scan accepts a factory call without device=",
           "tests/test_device_scan.py", "        elif not any(k.arg == \"device\" for k in node.keywords):",
           "        elif False:",
           ("tests/test_device_scan.py::test_the_scan_finds_what_it_is_meant_to_find",)),
    Mutant("staging: the host pool keeps a buffer for every payload size it sees",
           "gnn_dist/comm/staging.py", "        fits = [k for k, raw in enumerate(self._free) if raw.numel() >= nbytes]\n",
           "        fits = [k for k, raw in enumerate(self._free) if raw.numel() == nbytes]\n",
           ("tests/test_staging.py::test_the_host_pool_stays_bounded_when_every_exchange_has_a_new_size",)),
    Mutant("plan: a GPU rank's device plan counts the native ReLU and dropout (in place, a bit mask)",
           "gnn_dist/plan/memory.py", "            if training and p > 0 and z.torch_kernels:\n",
           "            if False:\n",
           ("tests/test_plan.py::test_a_gpu_ranks_device_peak_equals_a_count_by_hand",)),
    Mutant("plan: a GPU rank's host plan leaves out the pinned staging buffers",
           "gnn_dist/plan/host.py",
           "    train.alloc(\"pinned staging buffers\", staging_pool_bytes(shape, config, num_features, num_classes))\n",
           "",
           ("tests/test_plan.py::test_a_gpu_ranks_host_plan_is_the_process_its_part_file_and_the_staging_pool",)),
    Mutant("partition: --balance-edges splits by recursive bisection again",
           "partition/metis.py", "        recursive = False\n    if objective", "        recursive = True\n    if objective",
           ("tests/test_partition.py::test_balance_edges_evens_each_parts_edges_by_the_datasets_own_degrees",)),
    Mutant("overlap: the halo's share is added before the halo rows have arrived",
           "gnn_dist/halo/overlap.py",
           "    pending.wait()\n    with torch.profiler.record_function(\"spmm\"):\n        if shared is None:\n",
           "    with torch.profiler.record_function(\"spmm\"):\n        if shared is None:\n",
           ("tests/test_halo_fake.py::test_overlapped_aggregation_multiplies_owned_rows_while_the_halo_travels_and_"
            "equals_the_dense_products",
            "tests/test_halo_shared.py::test_peers_read_the_rows_where_their_owner_wrote_them_and_the_products_equal_"
            "the_dense_ones")),
    Mutant("overlap: the owned product never lets the transfer advance",
           "gnn_dist/halo/overlap.py", "        multiply(start, min(start + step, n_rows))\n        pending.progress()\n",
           "        multiply(start, min(start + step, n_rows))\n",
           ("tests/test_halo_fake.py::test_overlapped_aggregation_multiplies_owned_rows_while_the_halo_travels_and_"
            "equals_the_dense_products",)),
    Mutant("shared halo: a rank reads an owner's rows from the start of the owner's slot, not where its own begin",
           "gnn_dist/halo/shared.py", "self.rows_of(q, int(send_starts[q, me]), int(rows[q, me]))",
           "self.rows_of(q, 0, int(rows[q, me]))",
           ("tests/test_halo_shared.py::test_peers_read_the_rows_where_their_owner_wrote_them_and_the_products_equal_"
            "the_dense_ones",)),
    Mutant("shared halo: an owner reads its returned gradients from the start of the reader's slot",
           "gnn_dist/halo/shared.py", "self.rows_of(r, int(halo_starts[r, me]), int(rows[me, r]))",
           "self.rows_of(r, 0, int(rows[me, r]))",
           ("tests/test_halo_shared.py::test_peers_read_the_rows_where_their_owner_wrote_them_and_the_products_equal_"
            "the_dense_ones",)),
    Mutant("shared halo: the returned gradients are added to the first send rows, whoever returned them",
           "gnn_dist/halo/overlap.py", "plan.send_idx[first:first + rows.shape[0]], rows)",
           "plan.send_idx[:rows.shape[0]], rows)",
           ("tests/test_halo_shared.py::test_peers_read_the_rows_where_their_owner_wrote_them_and_the_products_equal_"
            "the_dense_ones",)),
    Mutant("shared halo: a rank writes its next rows before every peer has read the last (one slot)",
           "gnn_dist/halo/shared.py", "            _timed_wait(self.read, counters)\n", "            pass\n",
           ("tests/test_halo_shared.py::test_a_rank_writes_its_next_rows_only_after_every_peer_has_read_the_last",)),
    Mutant("shared halo: the job ends with the readers' last barrier in flight and the window held",
           "gnn_dist/halo/exchange.py", "        if self.shared is not None:\n            self.shared.close()\n", "",
           ("tests/test_halo_shared.py::test_peers_read_the_rows_where_their_owner_wrote_them_and_the_products_equal_"
            "the_dense_ones",)),
    Mutant("shared halo: ranks that see GNN_DIST_SHARED_HALO differently are not refused",
           "gnn_dist/halo/shared.py", "        if len({enabled for enabled, _ in seen}) > 1:\n", "        if False:\n",
           ("tests/test_halo_shared.py::test_ranks_that_see_gnn_dist_shared_halo_differently_are_refused_in_one_"
            "line",)),
    Mutant("shared halo: the bytes through shared memory are not counted",
           "gnn_dist/halo/shared.py", "        ex.counters.halo_bytes += rows * self.width * self.dtype.itemsize\n", "",
           ("tests/test_halo_shared.py::test_peers_read_the_rows_where_their_owner_wrote_them_and_the_products_equal_"
            "the_dense_ones",)),
    Mutant("overlap: the halo gradients returned to their owners are dropped",
           "gnn_dist/halo/overlap.py", "    grad_owned.index_add_(0, plan.send_idx, returned)", "    pass",
           ("tests/test_halo_fake.py::test_overlapped_aggregation_multiplies_owned_rows_while_the_halo_travels_and_"
            "equals_the_dense_products",
            "tests/test_halo_fake.py::test_distributed_model_equals_pyg_on_the_whole_graph")),
    Mutant("overlap: an accumulating product overwrites its rows",
           "kernels/native_kernels.cpp", "    } else if (!accumulate) {\n", "    } else {\n",
           ("tests/test_kernels.py::test_owned_and_halo_entry_ranges_recompose_the_dense_product_and_its_transpose",)),
    Mutant("overlap: ranks that see GNN_DIST_OVERLAP differently are not refused (their exchanges would not match)",
           "gnn_dist/halo/overlap.py", "    if len(set(seen)) > 1:\n", "    if False:\n",
           ("tests/test_halo_fake.py::test_ranks_that_see_gnn_dist_overlap_differently_are_refused_before_any_exchange",)),
    Mutant("plan: the overlapped exchange is charged [owned | halo] rows",
           "gnn_dist/plan/memory.py", "_overlapped_halo_rows(z) * w * FLOAT if training", "(n + z.h) * w * FLOAT if training",
           ("tests/test_plan.py::test_an_overlapped_exchange_is_planned_with_the_halos_rows_and_gradients_alone",)),
    Mutant("plan: an exchange through shared memory is charged the halo's rows besides its slots",
           "gnn_dist/plan/memory.py", "    return 0 if z.shared else z.h\n", "    return z.h\n",
           ("tests/test_plan.py::test_an_overlapped_exchange_is_planned_with_the_halos_rows_and_gradients_alone",
            "tests/test_plan.py::test_training_peak_equals_a_count_by_hand")),
    Mutant("plan: the shared halo slots are not charged",
           "gnn_dist/plan/memory.py", "        persistent[\"shared halo slots\"] = 2 * max(S, h)", "        _ = 2 * max(S, h)",
           ("tests/test_plan.py::test_an_overlapped_exchange_is_planned_with_the_halos_rows_and_gradients_alone",
            "tests/test_plan.py::test_training_peak_equals_a_count_by_hand")),
    Mutant("typed sampling: one fanout shared by every relation (the homogeneous rule)",
           "gnn_dist/hetero/sampler.py",
           "        counts, picked = zip(*(csr.sample(local_rows, fanout, key) for csr, key in zip(self.relation_csrs, keys)))",
           "        counts, picked = zip(*(csr.sample(local_rows, max(fanout // len(keys), 1), key)\n"
           "                               for csr, key in zip(self.relation_csrs, keys)))",
           ("tests/test_hetero_sampled.py::test_the_typed_sampler_draws_up_to_the_fanout_per_relation_and_never_depends_on_p",)),
    Mutant("typed sampling: a remote frontier node's relations come back in the wrong order",
           "gnn_dist/hetero/sampler.py", "            got_counts = got_counts.reshape(-1, R)\n",
           "            got_counts = got_counts.reshape(-1, R)[:, ::-1]\n",
           ("tests/test_hetero_sampled.py::test_the_typed_sampler_draws_up_to_the_fanout_per_relation_and_never_depends_on_p",)),
    Mutant("typed sampling: the draw keyed by the asking rank",
           "gnn_dist/hetero/sampler.py",
           "            keys = [sample_key(self.seed, epoch, step, hop, relation=r) for r in range(self.num_relations)]",
           "            keys = [sample_key(self.seed + self.rank, epoch, step, hop, relation=r)\n"
           "                    for r in range(self.num_relations)]",
           ("tests/test_hetero_sampled.py::test_the_typed_sampler_draws_up_to_the_fanout_per_relation_and_never_depends_on_p",)),
    Mutant("typed sampled: fetched embedding rows keep their gradients (never sent home)",
           "gnn_dist/hetero/batch_inputs.py", "        summed.index_add_(0, position, torch.cat([grad[own_at], back]))",
           "        summed.index_add_(0, position, torch.cat([grad[own_at], back.zero_()]))",
           ("tests/test_hetero_sampled.py::test_a_sampled_step_equals_pyg_replaying_the_same_blocks",)),
    Mutant("typed sampled: the tables step with Adam and weight decay like the other weights",
           "gnn_dist/hetero/mini_batch.py", "        optimizer.step()\n        if not self.shards:",
           "        for name, grad in self.inputs.table_gradients(1.0 / global_terms).items():\n"
           "            self.shards[name].grad = grad.to_dense()\n"
           "        optimizer.step()\n        return\n        if not self.shards:",
           ("tests/test_hetero_sampled.py::test_a_sampled_step_equals_pyg_replaying_the_same_blocks",)),
    Mutant("typed sampled: the table's moments decay only, the step's gradient left out of the second",
           "gnn_dist/hetero/mini_batch.py", "    exp_avg_sq.add_(values.pow(2).sub_(exp_avg_sq).mul_(1 - beta2))",
           "    exp_avg_sq.mul_(beta2)",
           ("tests/test_hetero_sampled.py::test_the_tables_update_is_torch_sparse_adams_over_several_steps",
            "tests/test_hetero_sampled.py::test_a_sampled_step_equals_pyg_replaying_the_same_blocks")),
    Mutant("sparse_adam_rows: the second moment never takes the step's gradient",
           "kernels/native_kernels.cpp", "        const float square = vi[c] + (gi[c] * gi[c] - vi[c]) * b2;",
           "        const float square = vi[c] - vi[c] * b2;",
           ("tests/test_hetero_sampled.py::test_the_tables_update_is_torch_sparse_adams_over_several_steps",)),
    Mutant("typed sampled: the table's step count starts again every step",
           "gnn_dist/hetero/mini_batch.py", '    state["step"] += 1\n', '    state["step"] = torch.tensor(1.0)\n',
           ("tests/test_hetero_sampled.py::test_the_tables_update_is_torch_sparse_adams_over_several_steps",)),
    Mutant("typed evaluation in chunks: the root term reads the first rows, not the chunk's own",
           "gnn_dist/models/rgcn.py", "x_src[:relations.n_owned] if x_dst is None else x_dst, self.root, self.bias)",
           "x_src[:relations.n_owned], self.root, self.bias)",
           ("tests/test_hetero_sampled.py::test_sampled_evaluation_layer_by_layer_in_chunks_equals_pyg_on_the_whole_graph",)),
    Mutant("typed evaluation in chunks: the later layers' halo rows are never exchanged",
           "gnn_dist/hetero/stack.py", "            full = h if k == 0 else self.exchanger.gather(h, conv.slot)",
           "            full = h if k == 0 else torch.cat([h, h.new_zeros(self.inputs.n_halo, h.shape[1])])",
           ("tests/test_hetero_sampled.py::test_sampled_evaluation_layer_by_layer_in_chunks_equals_pyg_on_the_whole_graph",)),
    Mutant("typed sampled: R-GCN's block forgets the root weight",
           "gnn_dist/models/rgcn.py",
           "        out = times(x_src[:relations.n_owned] if x_dst is None else x_dst, self.root, self.bias)",
           "        out = self.bias.expand(relations.n_owned, -1).clone()",
           ("tests/test_hetero_sampled.py::test_a_sampled_step_equals_pyg_replaying_the_same_blocks",)),
    Mutant("typed sampled: R-GAT's block adds one bias, not every relation's into the type",
           "gnn_dist/models/rgat.py", "        out = self._type_bias().index_select(0, dst_type)\n        for r in range(",
           "        out = self.bias[0].expand(len(dst_type), -1).clone()\n        for r in range(",
           ("tests/test_hetero_sampled.py::test_a_sampled_step_equals_pyg_replaying_the_same_blocks",)),
    Mutant("typed sampled: an owner serves the row at the node's local position, not its type's row",
           "gnn_dist/graph/feature_store.py",
           "            return self.x_full[torch.from_numpy(local if self.served_rows is None else self.served_rows[local])]",
           "            return self.x_full[torch.from_numpy(local)]",
           ("tests/test_hetero_sampled.py::test_a_sampled_step_equals_pyg_replaying_the_same_blocks",)),
    Mutant("typed sampled: the cache's budget is shared out to no type",
           "gnn_dist/hetero/batch_inputs.py", "int(budget_bytes * wanted[name] / total) if total else 0",
           "0",
           ("tests/test_hetero_sampled.py::test_sampled_typed_training_learns_and_the_per_type_cache_changes_no_number",)),
    Mutant("typed sampler set-up: a relation's CSR takes every relation's entries",
           "gnn_dist/hetero/sampler.py", "            of_r = edge_type == r\n",
           "            of_r = edge_type >= r\n",
           ("tests/test_hetero_sampled.py::test_the_typed_sampler_draws_up_to_the_fanout_per_relation_and_never_depends_on_p",)),
    Mutant("embedding rows' initial values: every chunk written over the first rows",
           "kernels/keyed_random.py", "            out[start:start + len(base)] = ",
           "            out[:len(base)] = ",
           ("tests/test_dropout.py::test_embedding_rows_start_as_box_muller_of_the_keyed_words_in_any_chunking",)),
    Mutant("typed sampled plan: the shards' SparseAdam moments are not charged",
           "gnn_dist/plan/typed_sampled.py", '        "parameters, Adam": replicated * FLOAT * 5 + shard_bytes * 3,',
           '        "parameters, Adam": replicated * FLOAT * 5 + shard_bytes,',
           ("tests/test_hetero_sampled.py::test_the_sampled_plan_counts_what_set_up_and_training_keep",)),
    Mutant("typed sampled plan: a batch's aggregated rows counted as its edges",
           "gnn_dist/plan/typed_sampled.py",
           "            reached.append(int(np.count_nonzero(pair[1:] != pair[:-1])) + (1 if len(pair) else 0))",
           "            reached.append(len(pair))",
           ("tests/test_hetero_sampled.py::test_the_sampled_plan_counts_what_set_up_and_training_keep",)),
    Mutant("typed sampled plan: a chunk's distinct sources counted as its entries",
           "gnn_dist/plan/typed_sampled.py",
           "                  np.bincount(np.unique(relation * columns + indices[entries]) // columns, minlength=num_relations)]",
           "                  np.bincount(relation, minlength=num_relations)]",
           ("tests/test_hetero_sampled.py::test_the_sampled_plan_counts_what_set_up_and_training_keep",)),
    Mutant("typed sampled plan: the last layer's chunks run over every owned row",
           "gnn_dist/plan/typed_sampled.py",
           "                                     for rows, relations in (chunks.target if last else chunks.owned)),",
           "                                     for rows, relations in chunks.owned),",
           ("tests/test_hetero_sampled.py::test_the_sampled_plans_evaluation_takes_each_layers_costliest_chunk_of_its_own_rows",)),
    Mutant("typed sampled: nothing is refused at set-up, before the features and shards are built",
           "gnn_dist/training/setup.py",
           '        if config.mode == "full" or device.type == "cpu" or meta.hetero is not None else (None, None)',
           '        if config.mode == "full" else (None, None)',
           ("tests/test_hetero_sampled.py::test_sampled_typed_training_refuses_a_job_over_its_memory_limit_and_records_the_plan",)),
    Mutant("sampled plans (typed and homogeneous): the whole plan is made but nothing is refused",
           "gnn_dist/training/setup.py",
           "    reason = host_refusal(ctx, config, host)\n    if reason is not None:\n        raise SetupError(reason)\n"
           "    return host.peak\n",
           "    return host.peak\n",
           ("tests/test_hetero_sampled.py::test_sampled_typed_training_refuses_a_job_over_its_memory_limit_and_records_the_plan",
            "tests/test_sampled.py::test_sampled_training_refuses_a_job_over_its_memory_limit_and_records_the_plan")),
    Mutant("embedding weight decay: the tables' group takes the run's --weight-decay",
           "gnn_dist/training/setup.py",
           '            {"params": tables, "weight_decay": config.embedding_weight_decay}]',
           '            {"params": tables}]',
           ("tests/test_hetero.py::test_embedding_weight_decay_decays_the_tables_alone_as_pyg_param_groups",)),
    Mutant("embedding weight decay: a checkpoint's Adam state keeps its numbering in the other grouping",
           "gnn_dist/resilience/sharded.py",
           '    return {"state": {now[id(written[i])]: s for i, s in optimizer_state["state"].items()},',
           '    return {"state": dict(optimizer_state["state"]),',
           ("tests/test_hetero.py::test_a_typed_run_stopped_at_p2_resumes_at_p4_and_p2_on_the_uninterrupted_curve",)),
    Mutant("sampled plan: a homogeneous sampled job is not refused at set-up, before the halo's features come",
           "gnn_dist/training/setup.py",
           '        if config.mode == "full" or device.type == "cpu" or meta.hetero is not None else (None, None)',
           '        if config.mode == "full" or meta.hetero is not None else (None, None)',
           ("tests/test_sampled.py::test_sampled_training_refuses_a_job_over_its_memory_limit_and_records_the_plan",)),
    Mutant("sampled plan: a batch's edges listed hop 1 first, not from the outermost layer",
           "gnn_dist/plan/sampled.py", "tuple(int(len(b.dst)) for b in reversed(blocks))",
           "tuple(int(len(b.dst)) for b in blocks)",
           ("tests/test_sampled.py::test_a_batch_shape_counts_the_levels_and_every_hops_draws",)),
    Mutant("rss: the sampler wakes at a fixed interval (a hundred times a second in every phase)",
           "gnn_dist/memory/rss.py", "            interval = self._interval if rose else min(2 * interval, self._max_interval)\n",
           "            interval = self._interval\n",
           ("tests/test_layerwise.py::test_phase_peaks_attribute_memory_to_the_phase_that_used_it",)),
    Mutant("rss: a new phase is not sampled densely from its start",
           "gnn_dist/memory/rss.py", "            self._sampled = current_rss_bytes()\n        self._new_phase.set()\n",
           "            self._sampled = current_rss_bytes()\n",
           ("tests/test_layerwise.py::test_phase_peaks_attribute_memory_to_the_phase_that_used_it",)),
]


def tracked_files(tree: Path) -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=tree,
                            capture_output=True, text=True, check=True)
    return [line for line in listed.stdout.splitlines() if line]


def selected_tests(mutant: Mutant, tree: Path, whole_files: bool) -> list[str]:
    """pytest arguments for a mutant: its test ids, or with whole_files the files that hold them."""
    if not whole_files:
        args = []
        for test in mutant.tests:
            args += test.split(" ", 1) if test.startswith("-k ") else [test]
        return args
    names = sorted({test.split("::")[0] for test in mutant.tests if not test.startswith("-k ")})
    present = [name for name in names if (tree / name).exists()]
    return present or ["tests", "-m", "not mpi"]


def copy_tree(tree: Path, files: list[str], copy: Path) -> None:
    shutil.rmtree(copy, ignore_errors=True)
    for name in files:
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tree / name, target)


def test_env(copy: Path, work: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(copy), "TORCH_EXTENSIONS_DIR": str(work / "ext")}


def build_native_kernel(tree: Path, files: list[str], python: str, work: Path) -> None:
    """Compile the native kernel once, from the unmutated tree, before any mutant runs.

    Built lazily instead, the first test to need it compiles it inside simulated
    ranks' threads, and such a first test can fail on timing alone: a mutant
    would then count as killed by a failure it did not cause.
    """
    copy = work / "tree"
    copy_tree(tree, files, copy)
    subprocess.run([python, "-c", "from gnn_dist.kernels.native import native_module; native_module()"], cwd=copy,
                   env=test_env(copy, work), capture_output=True, text=True, check=True)


def run_mutant(mutant: Mutant, tree: Path, files: list[str], python: str, work: Path,
               whole_files: bool = False) -> tuple[str, float, str]:
    """Run one mutant in work/tree. Every mutant of a run uses that same path, so the native kernel
    (built under work/torch_extensions, apart from the user's cache) compiles once per run, not per mutant."""
    source = tree / mutant.file
    mutated = mutant.edit(source.read_text()) if source.exists() else None
    if mutated is None:
        return "n/a", 0.0, f"the code to mutate is not (exactly once) in {mutant.file}"
    copy = work / "tree"
    copy_tree(tree, files, copy)
    (copy / mutant.file).write_text(mutated)
    args = selected_tests(mutant, tree, whole_files)
    start = time.perf_counter()
    done = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args], cwd=copy,
                          capture_output=True, text=True, env=test_env(copy, work))
    elapsed = time.perf_counter() - start
    if done.returncode == 1:
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        if not failed:
            return "killed", elapsed, "a test failed"
        # The control: the failing test must pass on the unmutated tree, or the kill proves nothing.
        test_id = failed[0][len("FAILED "):].split(" - ")[0]  # ids may hold spaces; pytest ends them with " - "
        copy_tree(tree, files, copy)
        control = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_id], cwd=copy,
                                 capture_output=True, text=True, env=test_env(copy, work))
        if control.returncode != 0:
            return "flaky", elapsed, f"{test_id} fails without the mutation too"
        return "killed", elapsed, failed[0]
    if done.returncode == 0:
        return "survived", elapsed, "every selected test passed"
    return "error", elapsed, (done.stdout + done.stderr).strip().splitlines()[-1]


def check(tree: Path) -> list[str]:
    """Problems that would make mutants n/a or their tests unrunnable: code not found exactly once, a test id
    that names no test file or function."""
    problems = []
    for mutant in MUTANTS:
        source = tree / mutant.file
        if not source.exists() or mutant.edit(source.read_text()) is None:
            problems.append(f"{mutant.name}: the code to mutate is not (exactly once) in {mutant.file}")
        for test in mutant.tests:
            if test.startswith("-k "):
                continue
            path, _, name = test.partition("::")
            function = name.split("[")[0]
            if not (tree / path).exists() or (function and f"def {function}(" not in (tree / path).read_text()):
                problems.append(f"{mutant.name}: no test {test}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that every mutant applies exactly once and names tests that exist")
    parser.add_argument("--allow-na", action="store_true",
                        help="an older checkout (--tree): mutants of code it does not have are n/a, not failures")
    parser.add_argument("--tree", default=str(ROOT), help="checkout to mutate (default: this one)")
    parser.add_argument("--only", default="", help="run only mutants whose name contains this text")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--whole-files", action="store_true",
                        help="run the whole test files named for each mutant (for checkouts whose tests differ)")
    args = parser.parse_args(argv)
    tree = Path(args.tree).resolve()
    if args.check:
        problems = check(tree)
        for problem in problems:
            print(problem)
        print(f"{len(MUTANTS)} mutants, {len(problems)} problem(s)")
        return 1 if problems else 0
    files = tracked_files(tree)
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="gnn-dist-mutants-") as tmp:
        work = Path(tmp)
        # The tests find ../shared/data beside the tree: give the copy the same neighbour.
        shared = tree.parent / "shared"
        if shared.exists():
            (work / "shared").symlink_to(shared.resolve())
        build_native_kernel(tree, files, args.python, work)
        for mutant in MUTANTS:
            if args.only not in mutant.name:
                continue
            verdict, elapsed, detail = run_mutant(mutant, tree, files, args.python, work, args.whole_files)
            counts[verdict] = counts.get(verdict, 0) + 1
            print(f"{verdict:8s} {elapsed:6.1f}s  {mutant.name}: {detail}", flush=True)
    print("summary: " + ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items())))
    failed = counts.get("survived") or counts.get("error") or counts.get("flaky")
    return 1 if failed or (counts.get("n/a") and not args.allow_na) else 0


if __name__ == "__main__":
    sys.exit(main())
