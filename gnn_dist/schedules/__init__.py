"""Communication schedules for hidden-layer halos (`--schedule`): one file per schedule.

Each schedule decides, per layer (slot) and epoch of training, what the
forward and backward of the halo exchange send. Evaluation always uses the
exact exchange, so reported accuracies are of the trained model itself.
Input-feature halos are fetched once at start-up under every schedule.

    exact          every epoch, every halo row forward and every halo gradient back.
    stale:R        delayed halos, as the DistGNN paper (Md et al., SC21) delays
                   remote aggregates: exchange on epochs 0, R, 2R, ...; in between the forward reuses the cached halo rows and the
                   backward treats them as constants: their gradients are
                   discarded and nothing is sent back. stale:1 is exact.
    pipeline[:G[:H]]  PipeGCN: epoch e uses the halo rows and halo gradients of
                   epoch e-1 while epoch e's travel with non-blocking MPI,
                   overlapping compute. Epoch 0 is exact (nothing to reuse yet).
                   Stale values are smoothed, v <- G v + (1 - G) v_new (rows with
                   G, gradients with H); plain `pipeline` smooths both with 0.95
                   and exchanges its last exchanged layer (the class scores)
                   exactly, blocking.
    bns:P          BNS-GCN: each epoch each receiving rank keeps a random fraction
                   P of its halo rows, chosen by a hash of (seed, epoch, node,
                   receiver) that owner and receiver both compute, so no ids
                   travel. Dropped rows contribute nothing, and each owned row's
                   aggregation is renormalised to its whole-graph weight over the
                   entries it still has (BNS-GCN's code divides kept rows by P
                   instead: see bns.py for why not). Gradients flow back for
                   kept rows only. bns:1 is exact.
    adaptive:E[:K] Sancus-style skipping: per peer, a rank skips sending a block when
                   what shapes it changed by less than E (relative) since it was last
                   sent, at most K (default 4) times in a row; the receiver leaves the
                   block out and renormalises each row over what it still has, as bns
                   does (attention layers reuse the last block received), and no
                   gradient travels back for a skipped block.
                   "What shapes it": the rows themselves with dropout off; with
                   dropout on, the parameters of the layers below (the rows' change is
                   then mostly the dropout sample). One int32 flag per peer tells
                   receivers what comes (gnn_dist.schedules.adaptive).
    S1,S2,...      one of the above per exchanged layer (every layer but the first),
                   e.g. "stale:4,exact" for 3 layers (gnn_dist.schedules.layered).

The contract every schedule keeps, and how to add one, is in gnn_dist.schedules.base
(and docs/extending.md).

May import: halo, kernels, plugins
"""
from gnn_dist.plugins.registry import import_modules_of
from gnn_dist.schedules.base import Schedule, layer_slot, register_schedule, schedule_forms
from gnn_dist.schedules.spec import parse_schedule, schedule_for_model

# Every module of this folder registers its schedule when imported; exact, the reference, is listed first.
import_modules_of(__name__, __path__, first=("base", "exact"))

__all__ = ["Schedule", "layer_slot", "parse_schedule", "register_schedule", "schedule_for_model", "schedule_forms"]
