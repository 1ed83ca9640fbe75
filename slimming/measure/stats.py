"""What a network costs: parameters, FLOPs, size on disk and latency.

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode``, which counts a multiply-add as
two FLOPs, the paper's convention (CIFAR VGG-19: 7.97e8). Latency is the median wall time of a
forward pass under ``torch.inference_mode`` after warm-up runs, in milliseconds.
"""

from __future__ import annotations

import io
import statistics
import time

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..utils.modules import modes_kept

DEFAULT_INPUT_SIZE = (3, 32, 32)  # CIFAR's: what a network that does not say its own is measured at


def input_size_of(model: nn.Module) -> tuple[int, ...]:
    """The (C, H, W) ``model`` takes: its ``input_size`` (every family declares one, slimming's
    builders record one), else ``DEFAULT_INPUT_SIZE``."""
    return tuple(getattr(model, "input_size", None) or DEFAULT_INPUT_SIZE)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def count_flops(model: nn.Module, input_size: tuple[int, ...] = DEFAULT_INPUT_SIZE) -> int:
    """FLOPs of one forward pass of a single image of ``input_size`` (C, H, W)."""
    with modes_kept(model), FlopCounterMode(display=False) as counter:
        model.eval()
        model(torch.zeros(1, *input_size, device=_device(model)))
    return int(counter.get_total_flops())


def size_on_disk(model: nn.Module) -> int:
    """Bytes of the model's state_dict as ``torch.save`` writes it."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell()


@torch.inference_mode()
def latency_ms(model: nn.Module, batch_size: int, input_size: tuple[int, ...] = DEFAULT_INPUT_SIZE,
               warmup: int = 3, repeats: int = 10, channels_last: bool = False) -> float:
    """Median milliseconds of one forward pass of a batch, on the model's device; with
    ``channels_last``, model and batch in that memory format (the model is put back after)."""
    if channels_last:
        with torch.inference_mode(False):  # the weights, re-laid out, must stay trainable
            model.to(memory_format=torch.channels_last)
        try:
            return latency_ms(model, batch_size, input_size, warmup, repeats)
        finally:
            with torch.inference_mode(False):
                model.to(memory_format=torch.contiguous_format)
    model.eval()
    device = _device(model)
    x = torch.randn(batch_size, *input_size, device=device)
    if next(model.parameters()).dim() == 4 and next(model.parameters()).is_contiguous(
            memory_format=torch.channels_last) and len(input_size) == 3:
        x = x.contiguous(memory_format=torch.channels_last)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        model(x)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(x)
        sync()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def model_stats(model: nn.Module, input_size: tuple[int, ...] = DEFAULT_INPUT_SIZE,
                batch_sizes: tuple[int, ...] = (1, 64), repeats: int = 10) -> dict:
    """``{"params", "flops", "size_bytes", "latency_ms": {batch: ms},
    "latency_ms_channels_last": {batch: ms}}`` (the same forward in channels-last memory
    format, which often runs faster on CPUs for thin networks); no latency when ``repeats``
    is 0."""
    stats = {"params": count_params(model), "flops": count_flops(model, input_size),
             "size_bytes": size_on_disk(model), "latency_ms": {}, "latency_ms_channels_last": {}}
    if repeats > 0:
        for layout, key in ((False, "latency_ms"), (True, "latency_ms_channels_last")):
            stats[key] = {b: latency_ms(model, b, input_size, repeats=repeats, channels_last=layout)
                          for b in batch_sizes}
    return stats


def channels_last_note(stats: dict, gain: float = 1.1) -> str | None:
    """One line when channels-last is at least ``gain`` times faster at some batch size."""
    best = [(b, ms / cl) for b, ms in stats.get("latency_ms", {}).items()
            if (cl := stats.get("latency_ms_channels_last", {}).get(b))]
    wins = [(b, r) for b, r in best if r >= gain]
    if not wins:
        return None
    text = ", ".join(f"{r:.2f}x at batch {b}" for b, r in wins)
    return (f"channels-last runs this network faster here ({text}): "
            "model.to(memory_format=torch.channels_last) and the same for its inputs "
            "(channels_last=True when training, --channels-last)")


def _fmt(key: str, value: float) -> str:
    if key == "params":
        return f"{value / 1e6:.3f}M"
    if key == "flops":
        return f"{value:.3e}"
    if key == "size_bytes":
        return f"{value / 2**20:.2f} MiB"
    return f"{value:.2f} ms"


def format_stats(stats: dict, other: dict | None = None,
                 names: tuple[str, str] = ("model", "compare")) -> str:
    """A text table of ``stats``; with ``other``, both side by side and the ratio other/stats."""
    rows = [("parameters", "params"), ("FLOPs (multiply-add = 2)", "flops"),
            ("size on disk", "size_bytes")]
    lat = [(f"latency, batch {b}", ("latency_ms", b)) for b in stats["latency_ms"]]

    def get(s, key):
        return s[key[0]][key[1]] if isinstance(key, tuple) else s[key]

    header = f"{'':<26}{names[0]:>16}" + (f"{names[1]:>16}{'ratio':>10}" if other else "")
    lines = [header]
    for label, key in rows + lat:
        kind = key if isinstance(key, str) else "latency"
        a = get(stats, key)
        line = f"{label:<26}{_fmt(kind, a):>16}"
        if other is not None:
            b = get(other, key)
            line += f"{_fmt(kind, b):>16}{b / a:>9.3f}x"
        lines.append(line)
    return "\n".join(lines)
