"""Latency as the device runs it: networks timed end to end, interleaved, and single layers
timed at candidate widths into a lookup table (HALP's, NeurIPS 2022), kept on disk per device,
torch version, runtime and thread count.

A ``LatencyModel`` is what a latency budget asks (``slimming.pruning.speed``): ``layer(spec,
in_ch, out_ch)``, the milliseconds of one layer at those widths, and ``network(models,
inputs)``, milliseconds per forward of each model, sampled in turn (so that a slow spell of
the machine falls on all of them alike). ``MeasuredLatency`` times them on the device the
model is on (the CPU with ``torch.get_num_threads()`` threads as set, or CUDA with
synchronisation), in eager, torch.export or onnxruntime (``runtimes``); tests inject a
deterministic model instead. What a figure is made of, and when it is too noisy to use:
``slimming.measure.timing``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from ..errors import SlimmingError, clip, first_line
from ..utils.files import human_bytes, read_regular, write_text
from ..utils.modules import hooked
from . import timing
from .runtimes import check_runtime, prepared, version

CACHE_ENV = "SLIMMING_CACHE_DIR"  # where the tables live; default ~/.cache/slimming
MAX_TABLE_BYTES = 16 * 2**20  # a table file over this is not read (a table is a few hundred KiB)
LAYER_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)  # what the table times; others: the rest
TABLE_FORMAT = 2  # 2: low quantiles, noisy timings left out (1's medians are not read)
LAYER_NOISE = 0.25  # a layer's samples agree when their median is within 25% of their low quantile
LAYER_JITTER_MS = 0.01  # or within 10 us: a layer of a few microseconds jitters by that, busy or not
LAYER_TRIES = 3  # samples of a layer taken at most this many times over while they disagree
SLOWER = 1.25  # a layer timed narrower but this much slower than at its full widths is timed again
TABLE_NAME = re.compile(r"[0-9a-f]{16}\.json")  # a table's file name: its context's digest


def cache_dir() -> Path:
    """The folder of the latency tables: ``$SLIMMING_CACHE_DIR``, else ``$XDG_CACHE_HOME/slimming``,
    else ``~/.cache/slimming``; the tables are in its ``latency/``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "latency"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slimming" / "latency"


def _tables(folder: Path) -> list[Path]:
    """The table files in ``folder``: regular files named as slimming names them (16 hex digits,
    ``.json``), in a folder that is not a symlink (what it points to is not slimming's to count
    or empty)."""
    if folder.is_symlink() or not folder.is_dir():
        return []
    return [f for f in folder.iterdir()
            if TABLE_NAME.fullmatch(f.name) and f.is_file() and not f.is_symlink()]


def cache_info() -> tuple[Path, int, int]:
    """(folder, number of tables, bytes) of the latency cache."""
    folder = cache_dir()
    files = _tables(folder)
    return folder, len(files), sum(f.stat().st_size for f in files)


def clear_cache() -> int:
    """Remove every latency table (only those, never through a symlink); returns the bytes freed."""
    folder, _, size = cache_info()
    for f in _tables(folder):
        f.unlink(missing_ok=True)
    return size


def _milliseconds(value) -> float | None:
    """A table entry as a time: a finite number >= 0, else None (a string, a bool, NaN, an
    integer too large for a float: 10**400)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if 0 <= value < math.inf else None


def device_context(device: torch.device, runtime: str = "eager") -> dict:
    """What a timing depends on beyond the layer: the device, torch's version, the runtime,
    the threads (and the table's format)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = " ".join(filter(None, (platform.machine(), platform.processor(), f"{os.cpu_count()} cores")))
    return {"device": f"{device.type}: {name}", "torch": str(torch.__version__),  # a plain str: it goes
            # into checkpoints, whose loader takes plain values only (TorchVersion is a class)
            "threads": torch.get_num_threads(), "runtime": version(runtime), "format": TABLE_FORMAT}


@dataclass(frozen=True)
class LayerSpec:
    """One convolution or linear layer as the lookup table times it: its kind and
    hyper-parameters, the input it saw (``shape``: the input's shape with the channel dim set
    to 0), and its widths in the network (``full_in``, ``full_out``). A depthwise layer
    (``groups == in_channels``) stays depthwise at every width (``out = in * mult``)."""

    kind: str  # "Conv1d", "Conv2d", "Conv3d", "Linear"
    shape: tuple[int, ...]
    full_in: int
    full_out: int
    kernel: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    padding: tuple | str = ()
    dilation: tuple[int, ...] = ()
    groups: int = 1  # 0: depthwise
    bias: bool = False
    dtype: str = "float32"
    channels_last: bool = False

    @property
    def depthwise(self) -> bool:
        return self.groups == 0

    @property
    def positions(self) -> int:
        """Output positions per channel (batch x output pixels, or the linear's leading dims)."""
        if self.kind == "Linear":
            return math.prod(self.shape[:-1])
        return self.shape[0] * math.prod(-(-s // t) for s, t in zip(self.shape[2:], self.stride))

    def key(self, in_ch: int, out_ch: int) -> str:
        return json.dumps([self.kind, self.shape, in_ch, out_ch, self.kernel, self.stride, self.padding,
                           self.dilation, self.groups, self.bias, self.dtype, self.channels_last])

    def build(self, in_ch: int, out_ch: int, device: torch.device) -> tuple[nn.Module, torch.Tensor]:
        """The layer at these widths (random weights) and an input for it, on ``device``."""
        dtype = getattr(torch, self.dtype)
        shape = list(self.shape)
        if self.kind == "Linear":
            shape[-1] = in_ch
            layer = nn.Linear(in_ch, out_ch, bias=self.bias)
        else:
            shape[1] = in_ch
            groups = in_ch if self.depthwise else math.gcd(self.groups, math.gcd(in_ch, out_ch))
            layer = getattr(nn, self.kind)(in_ch, out_ch, self.kernel, self.stride, self.padding,
                                           self.dilation, groups=groups, bias=self.bias)
        layer = layer.to(device=device, dtype=dtype).eval()
        x = torch.randn(shape, device=device, dtype=dtype)
        if self.channels_last and x.dim() == 4:
            last = torch.channels_last
            layer, x = layer.to(memory_format=last), x.contiguous(memory_format=last)
        return layer, x


def spec_of(m: nn.Module, x: torch.Tensor) -> LayerSpec | None:
    """``m`` (a convolution or linear layer of torch's, or a subclass) on its input ``x`` as a
    LayerSpec; None for anything else (a transposed convolution: the rest of the network)."""
    kind = next((t.__name__ for t in LAYER_TYPES if isinstance(m, t)), None)
    if kind is None or not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return None
    shape = list(x.shape)
    if kind == "Linear":
        shape[-1] = 0
        return LayerSpec(kind, tuple(shape), m.in_features, m.out_features, bias=m.bias is not None,
                         dtype=str(m.weight.dtype).removeprefix("torch."))
    if x.dim() < 2:
        return None
    shape[1] = 0
    depthwise = m.groups > 1 and m.groups == m.in_channels
    last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return LayerSpec(kind, tuple(shape), m.in_channels, m.out_channels, tuple(m.kernel_size),
                     tuple(m.stride), m.padding if isinstance(m.padding, str) else tuple(m.padding),
                     tuple(m.dilation), 0 if depthwise else m.groups, m.bias is not None,
                     str(m.weight.dtype).removeprefix("torch."), last)


@torch.no_grad()
def layer_specs(model: nn.Module, inputs: tuple) -> dict[str, LayerSpec]:
    """{name: LayerSpec} of every convolution and linear layer ``model`` runs on ``inputs``
    (one forward, in eval mode; the model's modes are the caller's to keep)."""
    specs = {}

    def seen(name):
        def hook(module, args):
            spec = spec_of(module, args[0]) if args else None
            if spec is not None:
                specs.setdefault(name, spec)
        return hook

    with hooked(pre=[(m, seen(name)) for name, m in model.named_modules() if isinstance(m, LAYER_TYPES)]):
        model(*inputs)
    return specs


class LatencyModel(Protocol):
    """What a latency budget asks of the device (``MeasuredLatency`` times it for real).
    Optional: ``max_seconds`` (how long one measurement may take more rounds to be precise),
    ``runtime`` (what it times in: ``slimming.measure.runtimes``), and ``recall(key)`` /
    ``remember(key, record)``, what it keeps of a network between prunes (its latency, how far
    the table's estimates were off)."""

    def layer(self, spec: LayerSpec, in_ch: int, out_ch: int) -> float:
        """Milliseconds of one forward of the layer ``spec`` at these widths."""

    def network(self, models: Sequence[nn.Module], inputs: tuple) -> list[list[float]]:
        """Milliseconds of one forward of each model on ``inputs``: samples per model, taken in
        turn (one round times each model once)."""


def _sync(device: torch.device):
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def time_calls(calls: Sequence[Callable[[], object]], repeats: int, warmup: int = 2,
               sync: Callable[[], None] = lambda: None) -> list[list[float]]:
    """Milliseconds of each of ``calls``, ``repeats`` samples each, taken in turn (call 1, call
    2, ..., call 1, ...) after ``warmup`` runs of each."""
    for call in calls:
        for _ in range(warmup):
            call()
    sync()
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for call, out in zip(calls, samples):
            start = time.perf_counter()
            call()
            sync()
            out.append(1000 * (time.perf_counter() - start))
    return samples


@torch.inference_mode()
def time_interleaved(models: Sequence[nn.Module], inputs: tuple, repeats: int = 15,
                     warmup: int = 2) -> list[list[float]]:
    """Milliseconds of one forward of each model, ``repeats`` samples each, taken in turn
    (model 1, model 2, ..., model 1, ...) after ``warmup`` forwards of each, in eval mode."""
    device = next(p.device for m in models for p in m.parameters())
    for m in models:
        m.eval()
    return time_calls([lambda m=m: m(*inputs) for m in models], repeats, warmup, _sync(device))


def layer_samples(run: Callable[[], object], sync: Callable[[], None], samples: int = 7,
                  least_ms: float = 1.0) -> list[float]:
    """Milliseconds of one ``run()`` (a layer's forward), ``samples`` times; each sample runs it
    often enough to last ``least_ms`` (a small layer's single run is under the clock's noise)."""
    run()
    sync()
    start = time.perf_counter()
    run()
    sync()
    once = max(time.perf_counter() - start, 1e-7)
    runs = max(1, min(1000, math.ceil(least_ms / 1000 / once)))
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(runs):
            run()
        sync()
        times.append(1000 * (time.perf_counter() - start) / runs)
    return times


class MeasuredLatency:
    """The latency model of the device ``device`` in ``runtime`` (``slimming.measure.runtimes``):
    layers timed alone at their widths, kept in a table on disk (``cache=False``: in memory
    only), and networks timed end to end, interleaved (``repeats`` rounds a call; a measurement
    takes more rounds, for at most ``max_seconds``, where it is too noisy to decide).

    A layer's figure is the low quantile of its samples (``timing``); samples that disagree by
    more than ``LAYER_NOISE`` are taken again (``LAYER_TRIES`` times), and a layer timed narrower
    yet slower than at its full widths is timed again (not a grouped one: narrower, it may have
    fewer groups, and be slower for real); what stays noisy is used for this prune
    but never written to the table (``noisy``), so that one busy spell does not steer later
    prunes. ``measured``/``seconds``: the layer timings this object made and what they took;
    ``path``: its table's file, which also keeps what ``remember`` is told of each network."""

    def __init__(self, device: torch.device | str = "cpu", repeats: int = 12, cache: bool = True,
                 runtime: str = "eager", max_seconds: float = timing.MAX_SECONDS):
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError):
            raise SlimmingError(f"MeasuredLatency takes a device ('cpu', 'cuda:0'), not "
                                f"{clip(repr(device))}", param="device") from None
        if self.device.type == "cuda" and not (torch.cuda.is_available()
                                               and (self.device.index or 0) < torch.cuda.device_count()):
            raise SlimmingError(f"MeasuredLatency: there is no {self.device} here to time on (no CUDA GPU "
                                "torch can use); time on 'cpu', or where the network will run",
                                param="device")
        self.repeats, self.cache = repeats, cache
        check_runtime(runtime, self.device)
        self.runtime, self.max_seconds = runtime, max_seconds
        self.context = device_context(self.device, runtime)
        digest = hashlib.sha256(json.dumps(self.context, sort_keys=True).encode()).hexdigest()[:16]
        self.path = cache_dir() / f"{digest}.json"
        self.entries, self.networks = self._read() if cache else ({}, {})
        self.noisy: set[str] = set()
        self.measured, self.seconds, self.dirty = 0, 0.0, False
        self._ready: dict[int, tuple] = {}  # id(model) -> (model, its forward in the runtime)

    def _read(self) -> tuple[dict[str, float], dict[str, dict]]:
        """The table on disk and its network records, or empty ones (missing, not a regular
        file, too large, not ours, or damaged: it is a cache, remade by timing again)."""
        try:
            data = json.loads(read_regular(self.path, MAX_TABLE_BYTES))
        except (OSError, ValueError, RecursionError):  # RecursionError: 100,000 nested brackets
            return {}, {}
        ours = isinstance(data, dict) and data.get("context") == self.context
        entries = data.get("entries") if ours else None
        if not isinstance(entries, dict):
            return {}, {}
        networks = data.get("networks")
        networks = {k: v for k, v in networks.items() if isinstance(k, str) and isinstance(v, dict)} \
            if isinstance(networks, dict) else {}
        times = {k: _milliseconds(v) for k, v in entries.items() if isinstance(k, str)}
        return {k: v for k, v in times.items() if v is not None}, networks

    def _time(self, spec: LayerSpec, in_ch: int, out_ch: int) -> list[float]:
        """Samples (ms) of the layer ``spec`` at these widths, in this runtime."""
        layer, x = spec.build(in_ch, out_ch, self.device)
        return layer_samples(prepared(layer, (x,), self.runtime), _sync(self.device))

    def layer(self, spec: LayerSpec, in_ch: int, out_ch: int) -> float:
        key = spec.key(in_ch, out_ch)
        if key not in self.entries:
            start = time.perf_counter()
            samples = self._time(spec, in_ch, out_ch)
            for _ in range(LAYER_TRIES - 1):
                if _agrees(samples):
                    break
                samples += self._time(spec, in_ch, out_ch)
            self.entries[key] = timing.low_quantile(samples)
            if not _agrees(samples):
                self.noisy.add(key)
            self.seconds += time.perf_counter() - start
            self.measured += 1
            self.dirty = True
            full = spec.key(spec.full_in, spec.full_out)
            if key != full and full in self.entries and self.entries[key] > SLOWER * self.entries[full] \
                    and spec.groups <= 1:  # a grouped layer narrower may have fewer groups: truly slower
                self._again(spec, key, full, in_ch, out_ch)
        return self.entries[key]

    def _again(self, spec: LayerSpec, key: str, full: str, in_ch: int, out_ch: int) -> None:
        """A layer timed narrower yet slower than at its full widths: both timed once more
        (noise only adds: the lower figure of each stands); still so, neither is written."""
        self.entries[key] = min(self.entries[key], timing.low_quantile(self._time(spec, in_ch, out_ch)))
        self.entries[full] = min(self.entries[full], timing.low_quantile(self._time(spec, spec.full_in,
                                                                                    spec.full_out)))
        if self.entries[key] > SLOWER * self.entries[full]:
            self.noisy |= {key, full}

    def network(self, models: Sequence[nn.Module], inputs: tuple) -> list[list[float]]:
        runs = []
        for m in models:
            held = self._ready.get(id(m))
            if held is None or held[0] is not m:
                m.eval()
                held = self._ready[id(m)] = (m, prepared(m, inputs, self.runtime))
                while len(self._ready) > 4:  # the original and the last few cuts
                    self._ready.pop(next(iter(self._ready)))
            runs.append(held[1])
        return time_calls(runs, self.repeats, 1, _sync(self.device))

    def recall(self, key: str) -> dict | None:
        """What ``remember`` was told of the network ``key`` (this table's, on this device)."""
        return self.networks.get(key)

    def remember(self, key: str, record: dict) -> None:
        self.networks[key] = record
        self.dirty = True

    def save(self) -> None:
        """Write the table (atomically) when this object timed anything new; the noisy
        timings stay out of it."""
        if self.cache and self.dirty:
            entries = {k: v for k, v in self.entries.items() if k not in self.noisy}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_text(self.path, json.dumps({"context": self.context, "entries": entries,
                                                  "networks": self.networks}))
            except (OSError, SlimmingError) as e:  # a cache: the result it timed stands
                warnings.warn(f"the latency table was not written ({first_line(e, 160)}): the result "
                              f"stands, and the next prune times these layers again (${CACHE_ENV} "
                              "sets where the tables go)", stacklevel=2)
            self.dirty = False

    def describe(self) -> dict:
        """The table's cost and size, as a result reports it."""
        size = self.path.stat().st_size if self.cache and self.path.is_file() else 0
        return {"entries": len(self.entries), "measured": self.measured, "seconds": round(self.seconds, 3),
                "noisy": len(self.noisy), "path": str(self.path) if self.cache else None, "bytes": size,
                "size": human_bytes(size), **self.context}


def _agrees(samples: list[float]) -> bool:
    """A layer's samples agree: their median within ``LAYER_NOISE`` of their low quantile (or
    within ``LAYER_JITTER_MS``)."""
    low = timing.low_quantile(samples)
    return statistics.median(samples) <= max((1 + LAYER_NOISE) * low, low + LAYER_JITTER_MS)


def layer_latencies(model: nn.Module, inputs: tuple, cost: LatencyModel | None = None) -> list[tuple]:
    """(name, in channels, out channels, ms) of every convolution and linear layer of ``model``
    on ``inputs``, each timed alone at its widths on the model's device (``cost``: the table,
    ``MeasuredLatency`` in memory by default): where the time goes, layer by layer."""
    device = next(model.parameters()).device
    cost = cost if cost is not None else MeasuredLatency(device, cache=False)
    was = model.training
    model.eval()
    try:
        specs = layer_specs(model, inputs)
    finally:
        model.train(was)
    return [(name, s.full_in, s.full_out, cost.layer(s, s.full_in, s.full_out)) for name, s in specs.items()]
