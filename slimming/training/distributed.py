"""Multi-process training under torchrun: detect it, own the process group, reduce sums.

``torchrun --nproc_per_node N -m slimming train ...`` sets RANK, WORLD_SIZE and LOCAL_RANK;
slimming then wraps the model in DistributedDataParallel (NCCL on CUDA, gloo on the CPU),
gives each rank its shard of the data, and lets only rank 0 write files and progress bars.

The group belongs to whoever created it, and only its owner tears it down:
``init_distributed``/``cleanup`` for one command, ``distributed_session`` for a caller that runs
several commands in one process (``pipeline``), whose commands' own ``cleanup`` then does
nothing. A group made outside this module is never destroyed here.

Why teardown is careful: gloo runs each collective on a worker thread, which may still hold
the last reference to the collective's tensor after ``wait()`` has returned. Freeing a tensor
made in Python takes the GIL; CPython ends a thread that takes the GIL while the interpreter
is finalizing with ``pthread_exit``, and that unwinding through gloo's C++ destructor calls
``std::terminate`` ("terminate called without an active exception", SIGABRT). Rank 1, with no
checkpoints to write, used to exit right after its last ``all_reduce`` and hit that now and
then; so did either rank after the pipeline's last ``broadcast_object_list`` (a core dump showed
the worker in ``~AsyncWork`` taking the GIL during ``Py_FinalizeEx``). Hence every collective
here (``all_reduce_sum``, ``broadcast_flag``) waits for the worker to let go of its tensor, and
the owner holds a barrier before destroying the group: no rank leaves while others still work, and
while a rank waits there (GIL released) its workers finish whatever they still hold.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

_BY_INIT = "init_distributed"
_owner: object | None = None  # who created the live group: _BY_INIT, a session's token, or None


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return group_exists()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def group_exists() -> bool:
    return dist.is_available() and dist.is_initialized()


def init_distributed(use_cuda: bool) -> DistInfo:
    """Join the process group torchrun describes (a no-op without torchrun, or when a group
    exists already: then this call does not own it and ``cleanup`` leaves it alone)."""
    global _owner
    if not launched_by_torchrun():
        return DistInfo()
    if not group_exists():
        dist.init_process_group("nccl" if use_cuda else "gloo")
        _owner = _BY_INIT
    info = DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    return info


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over all ranks in place (identity when not distributed).

    For a CPU tensor (gloo) this also waits until gloo's worker thread has dropped its
    reference to ``t``, so that the caller, not the worker, frees it (see the module docstring)."""
    if group_exists():
        _released(t, lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM))
    return t


def broadcast_flag(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank (``flag`` itself when not distributed); also a barrier.
    A tensor of our own, released as ``all_reduce_sum``'s is: ``broadcast_object_list`` leaves
    its tensors to gloo's worker, which then freed them while the interpreter exited (an abort
    caught in a core dump, 1 pipeline in 40 under load)."""
    if not group_exists():
        return flag
    t = torch.tensor([int(flag)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    _released(t, lambda: dist.broadcast(t, src=0))
    return bool(t.item())


def _released(t: torch.Tensor, collective) -> None:
    """Run ``collective`` on ``t``; for a CPU tensor (gloo), wait until gloo's worker thread
    has dropped its reference to ``t`` (at most 10 s)."""
    use_count = getattr(t, "_use_count", None)  # private torch API: skip the wait without it
    refs = use_count() if use_count else 0
    collective()
    if use_count and t.device.type == "cpu":
        deadline = time.monotonic() + 10.0
        while use_count() > refs and time.monotonic() < deadline:
            time.sleep(0.0005)  # releases the GIL, which the worker needs to let go


def barrier() -> None:
    """Wait until every rank gets here (a no-op when not distributed)."""
    if group_exists():
        dist.barrier()


def cleanup() -> None:
    """Tear down the group ``init_distributed`` created; a no-op when there is none or when
    someone else owns it (a ``distributed_session``, or the caller's own code).

    Called while an exception propagates, it skips the barrier: the other ranks may never get
    there, and torchrun stops them anyway once this one fails."""
    if _owner is _BY_INIT:
        _teardown(orderly=sys.exc_info()[0] is None)


@contextlib.contextmanager
def distributed_session(use_cuda: bool) -> Iterator[DistInfo]:
    """Hold one process group across several commands: ``with distributed_session(cuda) as
    info:`` joins the group torchrun describes (unless one exists) and yields its DistInfo;
    the commands' own ``init_distributed``/``cleanup`` inside the block reuse it and leave it
    alone. On exit the group is torn down (barrier first, unless leaving on an exception) only
    if this call created it, so sessions nest."""
    global _owner
    existed = group_exists()
    info = init_distributed(use_cuda)
    token = object()
    if group_exists() and not existed:
        _owner = token
    ok = False
    try:
        yield info
        ok = True
    finally:
        if _owner is token:
            _teardown(orderly=ok)


def _teardown(orderly: bool) -> None:
    """Barrier (when every rank is expected to arrive), then destroy the group."""
    global _owner
    _owner = None
    if not group_exists():
        return
    try:
        if orderly:
            barrier()
    finally:
        dist.destroy_process_group()
