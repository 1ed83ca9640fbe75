"""Multi-process training under torchrun: detect it, set up the process group, reduce sums.

``torchrun --nproc_per_node N -m slimming train ...`` sets RANK, WORLD_SIZE and LOCAL_RANK;
slimming then wraps the model in DistributedDataParallel (NCCL on CUDA, gloo on the CPU),
gives each rank its shard of the data, and lets only rank 0 write files and progress bars.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(use_cuda: bool) -> DistInfo:
    """Join the process group torchrun describes (a no-op without torchrun)."""
    if not launched_by_torchrun():
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    info = DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    return info


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over all ranks in place (identity when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
