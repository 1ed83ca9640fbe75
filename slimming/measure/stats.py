"""What a network costs: parameters, FLOPs, size on disk and latency.

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode``, which counts a multiply-add as
two FLOPs, the paper's convention (CIFAR VGG-19: 7.97e8). Latency is the wall time of a forward
pass under ``torch.inference_mode`` after warm-up runs, in milliseconds, as
``slimming.measure.timing`` estimates it (the fastest tenth of the runs, with its spread);
networks compared are timed together, in turn, and their ratio is the median of the rounds'.
"""

from __future__ import annotations

import contextlib
import io

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..utils import progress
from ..utils.modules import modes_kept
from . import timing
from .latency import time_interleaved

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
def count_flops(model: nn.Module, input_size: tuple[int, ...] = DEFAULT_INPUT_SIZE,
                inputs: tuple | None = None) -> int:
    """FLOPs of one forward pass of a single image of ``input_size`` (C, H, W); ``inputs``: of
    the forward on these inputs instead (a model of several: an image and a timestep)."""
    with modes_kept(model), FlopCounterMode(display=False) as counter:
        model.eval()
        if inputs is None:
            inputs = (torch.zeros(1, *input_size, device=_device(model)),)
        model(*inputs)
    return int(counter.get_total_flops())


def size_on_disk(model: nn.Module) -> int:
    """Bytes of the model's state_dict as ``torch.save`` writes it."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell()


@torch.inference_mode()
def latencies(models: list[nn.Module], batch_size: int, input_size: tuple[int, ...] = DEFAULT_INPUT_SIZE,
              repeats: int = 10, channels_last: bool = False, warmup: int = 3
              ) -> tuple[list[timing.Estimate], list[timing.Estimate]]:
    """The latency of each of ``models`` (ms per forward of a batch, on their device) and its
    ratio to the first's, from ``repeats`` rounds that run each once, in turn (a slow spell of
    the machine falls on all of them): ``slimming.measure.timing``'s estimates, with spreads.
    ``channels_last``: models and batch in that memory format (the models put back after)."""
    if channels_last:
        with torch.inference_mode(False):  # the weights, re-laid out, must stay trainable
            for m in models:
                m.to(memory_format=torch.channels_last)
        try:
            return latencies(models, batch_size, input_size, repeats, False, warmup)
        finally:
            with torch.inference_mode(False):
                for m in models:
                    m.to(memory_format=torch.contiguous_format)
    device = _device(models[0])
    x = torch.randn(batch_size, *input_size, device=device)
    first = next(models[0].parameters())
    if first.dim() == 4 and first.is_contiguous(memory_format=torch.channels_last) and len(input_size) == 3:
        x = x.contiguous(memory_format=torch.channels_last)
    with contextlib.ExitStack() as kept:
        for m in models:
            kept.enter_context(modes_kept(m))
        samples = time_interleaved(models, (x,), repeats, warmup)
    return [timing.estimate(s) for s in samples], [timing.ratio(samples[0], s) for s in samples]


def latency_ms(model: nn.Module, batch_size: int, input_size: tuple[int, ...] = DEFAULT_INPUT_SIZE,
               warmup: int = 3, repeats: int = 10, channels_last: bool = False) -> float:
    """Milliseconds of one forward pass of a batch, on the model's device (the fastest tenth of
    ``repeats``: ``slimming.measure.timing``); with ``channels_last``, in that memory format."""
    return latencies([model], batch_size, input_size, repeats, channels_last, warmup)[0][0].value


def model_stats(model: nn.Module, input_size: tuple[int, ...] = DEFAULT_INPUT_SIZE,
                batch_sizes: tuple[int, ...] = (1, 64), repeats: int = 10) -> dict:
    """``{"params", "flops", "size_bytes", "latency_ms": {batch: ms}, "latency_spread": {batch:
    ms}, "latency_ms_channels_last": {batch: ms}}`` (the same forward in channels-last memory
    format, which often runs faster on CPUs for thin networks); no latency when ``repeats``
    is 0."""
    return compare_stats([model], input_size, batch_sizes, repeats)[0]


def compare_stats(models: list[nn.Module], input_size: tuple[int, ...] = DEFAULT_INPUT_SIZE,
                  batch_sizes: tuple[int, ...] = (1, 64), repeats: int = 10) -> list[dict]:
    """``model_stats`` of each of ``models``, their latencies timed together, in turn, so that
    each but the first also has ``latency_ratio``: ``{batch: [its latency over the first's,
    spread]}``, the figure two runs agree on within the spread (a busy machine slows whatever
    runs, so separate timings of two networks can differ by any factor)."""
    out = [{"params": count_params(m), "flops": count_flops(m, input_size), "size_bytes": size_on_disk(m),
            "latency_ms": {}, "latency_spread": {}, "latency_ms_channels_last": {}} for m in models]
    if repeats <= 0:
        return out
    timings = [(b, layout, key) for b in batch_sizes
               for layout, key in ((False, "latency_ms"), (True, "latency_ms_channels_last"))]
    for b, layout, key in progress.bar(timings, desc=f"latency of {len(models)} network(s)", unit="timing"):
        times, ratios = latencies(models, b, input_size, repeats, channels_last=layout)
        for stats, t, r in zip(out, times, ratios):
            stats[key][b] = t.value
            if not layout:
                stats["latency_spread"][b] = t.spread
                if stats is not out[0]:
                    stats.setdefault("latency_ratio", {})[b] = [r.value, r.spread]
    return out


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


def _fmt(key: str, value: float, spread: float | None = None) -> str:
    if key == "params":
        return f"{value / 1e6:.3f}M"
    if key == "flops":
        return f"{value:.3e}"
    if key == "size_bytes":
        return f"{value / 2**20:.2f} MiB"
    return f"{value:.2f} ms" if spread is None else f"{value:.2f} +- {spread:.2g} ms"


def format_stats(stats: dict, other: dict | None = None,
                 names: tuple[str, str] = ("model", "compare")) -> str:
    """A text table of ``stats``; with ``other``, both side by side and the ratio other/stats
    (a latency's from ``compare_stats``, timed together, with its spread)."""
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
        spread = stats.get("latency_spread", {}).get(key[1]) if kind == "latency" else None
        line = f"{label:<26}{_fmt(kind, a, spread):>16}"
        if other is not None:
            b = get(other, key)
            theirs = other.get("latency_spread", {}).get(key[1]) if spread is not None else None
            line += f"{_fmt(kind, b, theirs):>16}"
            ratio = other.get("latency_ratio", {}).get(key[1]) if kind == "latency" else None
            line += f"{ratio[0]:>9.3f}x +- {ratio[1]:.3f}" if ratio else f"{b / a:>9.3f}x"
        lines.append(line)
    return "\n".join(lines)
