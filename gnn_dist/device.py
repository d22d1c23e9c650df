"""Where a rank computes (`--device cpu|cuda`), and what that changes in its communicator.

With `cuda`, rank r uses GPU (local rank mod visible GPUs), the local rank
being its rank among the ranks of its host (MPI's shared-memory split), so
ranks on one host share its GPUs round-robin and ranks on different hosts
each start at GPU 0. Two ranks may share one GPU (that is why NCCL, which
refuses it, is not used: docs/gpu.md).

Every exchange of device tensors is staged through pinned host buffers
(gnn_dist.comm.staging) unless the MPI library is CUDA-aware, which it says
through `GNN_DIST_CUDA_AWARE_MPI=1` (set it only when your MPI was built with
CUDA support: Open MPI reports it with `ompi_info --parsable --all | grep
mpi_built_with_cuda_support`; MPICH with `MPIR_CVAR_ENABLE_GPU`). The CPU path
is untouched: no staging, no copies.

May import: comm
"""
from __future__ import annotations

import os

import torch

from gnn_dist.comm.communicator import Comm
from gnn_dist.comm.staging import StagedComm, staging_forced

DEVICES = ("cpu", "cuda")  # --device
CUDA_AWARE_ENV = "GNN_DIST_CUDA_AWARE_MPI"
HOST = torch.device("cpu")  # the default device of everything a rank builds


def check_device(requested: str) -> None:
    """ValueError naming the fix when --device `requested` cannot run here (TrainConfig.validate calls it too)."""
    if requested not in DEVICES:
        raise ValueError(f"bad --device {requested!r}: use cpu or cuda")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA device visible: run with --device cpu")


def rank_device(requested: str, comm: Comm) -> torch.device:
    """The torch device of this rank for --device `requested`; ValueError naming the fix when there is none."""
    check_device(requested)
    if requested == "cpu":
        return HOST
    device = torch.device("cuda", comm.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def cuda_aware_mpi() -> bool:
    value = os.environ.get(CUDA_AWARE_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"bad {CUDA_AWARE_ENV}={value!r}: use 1 (the MPI library takes device buffers) or 0")
    return value == "1"


def device_comm(comm: Comm, device: torch.device) -> Comm:
    """The communicator training's exchanges use on `device`: staged through host buffers unless MPI takes device
    buffers itself (or unless nothing needs staging: host tensors on the host)."""
    forced = staging_forced()
    if device.type == "cpu" and not forced:
        return comm
    if device.type != "cpu" and cuda_aware_mpi() and not forced:
        return comm
    return StagedComm(comm, device, always=forced)


def peak_device_bytes(device: torch.device) -> int | None:
    """The most device memory this process has held (torch's allocator), or None on the host."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))
