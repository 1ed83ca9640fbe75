"""Which device a command runs on, from ``--cpu`` and ``--device``, checked once.

CUDA when present (the paper's scripts do the same, pruning's rebuild included), else the CPU
with a one-line notice, printed once per command however many stages it runs.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from ..errors import SlimmingError

NO_CUDA_NOTICE = "slimming: no CUDA device found, running on the CPU"
_notice = {"shown": False}


def resolve_device(device: str | None = None, cpu: bool = False) -> torch.device:
    """The torch device for ``--device NAME`` / ``--cpu``: SlimmingError for a name torch does
    not know, a device other than cpu/cuda, a contradiction (``--cpu`` with a CUDA device) or a
    CUDA device this machine lacks. Neither flag: CUDA if available, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise SlimmingError(f"device {device[:40]!r} is not a device; use cpu, cuda or cuda:N",
                            param="device") from None
    if dev.type not in ("cpu", "cuda"):
        raise SlimmingError(f"device {device}: slimming runs on cpu or cuda devices", param="device")
    if cpu and dev.type != "cpu":
        raise SlimmingError(f"cpu and device {device} contradict each other: give one of them",
                            param=("cpu", "device"))
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SlimmingError(f"device {device}: no CUDA device is available here; use cpu",
                                param=("device", "cpu"))
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise SlimmingError(f"device {device}: this machine has {torch.cuda.device_count()} "
                                "CUDA device(s), numbered from 0", param="device")
    return dev


def new_command() -> None:
    """Start of a command: the CPU notice may be shown again (once)."""
    _notice["shown"] = False


def announce(device: torch.device, chosen: bool) -> None:
    """The CPU notice, unless the user chose the device (``chosen``) or it was already shown."""
    if device.type == "cpu" and not chosen and not _notice["shown"]:
        print(NO_CUDA_NOTICE, file=sys.stderr)
        _notice["shown"] = True


@contextlib.contextmanager
def full_precision():
    """TF32 off for CUDA matmuls and convolutions (cuDNN allows it by default), restored after:
    for numbers compared with the CPU's or another runtime's (export checks) or saved into a
    file that should not depend on the device (compensation's constants)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
