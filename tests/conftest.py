import atexit
import copy
import math
import os
import random
import shutil
import struct
import tempfile
import zlib

import pytest
import torch
from torch import nn

from slimming import models
from slimming.layers.rules import is_factor_layer
from slimming.measure import latency
from slimming.models.vgg import DEFAULT_CFGS
from slimming.utils.modules import modes_kept

TINY_VGG = [8, "M", 16, "M", 16, 16, "M", 24, "M", 24]  # 32x32 in, fast on a CPU

# latency tables (slimming.measure.latency) in a folder of the test run's, not the user's cache
os.environ[latency.CACHE_ENV] = tempfile.mkdtemp(prefix="slimming-test-latency-")
atexit.register(shutil.rmtree, os.environ[latency.CACHE_ENV], True)

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n N: N workers share the cores, so each one
    # computes on one thread, and so do the processes it starts (threads on more threads than
    # cores spin and wait on each other: the suite took four times as long)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def randomize_bn(model: nn.Module, gen: torch.Generator, zero_frac: float = 0.0) -> None:
    """Random gamma (some near zero), beta and running statistics in every BatchNorm2d."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.weight.copy_(torch.randn(n, generator=gen))
                if zero_frac:
                    m.weight.mul_((torch.rand(n, generator=gen) > zero_frac).float() + 1e-3)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.5)
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)


def sparsity_shaped(model: nn.Module, seed: int = 0, small: float = 0.5) -> None:
    """Gammas as sparsity training leaves them, in every scaling factor (BatchNorm, GroupNorm,
    LayerNorm, gate): a fraction ``small`` near zero (1e-3 of their size), the rest in (0.1, 1),
    signs mixed; random betas and running statistics."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if is_factor_layer(m) and getattr(m, "weight", None) is not None:
                n = m.weight.numel()
                w = (torch.rand(n, generator=g) * 0.9 + 0.1) * torch.sign(torch.randn(n, generator=g))
                w[torch.rand(n, generator=g) < small] *= 1e-3
                m.weight.copy_(w.view_as(m.weight))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(torch.randn(n, generator=g).view_as(m.bias) * 0.3)
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)


def zeroed(model: nn.Module, masks, *, beta: bool = True) -> nn.Module:
    """The one reference every cut is held to: a copy of ``model`` with gamma and beta zeroed
    where ``masks`` cut, what a pruned network must equal. ``masks``: factor layer name -> keep
    (a BatchNorm, a GroupNorm, a LayerNorm), or a family's ``cfg_mask`` (one per BatchNorm2d, in
    order). ``beta=False`` zeroes gamma alone, beta's constant kept: what sparsity training
    approaches and what compensation reproduces."""
    if not isinstance(masks, dict):
        names = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
        assert len(names) == len(masks), (len(names), len(masks))
        masks = dict(zip(names, masks))
    z = copy.deepcopy(model)
    with torch.no_grad():
        for name, keep in masks.items():
            layer = z.get_submodule(name)
            for t in (layer.weight, getattr(layer, "bias", None) if beta else None):
                if t is not None:
                    t[~keep] = 0
    if any(normalises(z.get_submodule(n)) and not m.all() for n, m in masks.items()):
        return KeptStatistics(z, masks)
    return z


def normalises(module: nn.Module) -> bool:
    """A LayerNorm, or a layer whose rule normalises over its channels (an RMSNorm)."""
    from slimming.layers.rules import RULES, module_kind

    kind = module_kind(module)
    return isinstance(module, nn.LayerNorm) or (kind is not None and RULES[kind].normalises)


class KeptStatistics(nn.Module):
    """A network whose LayerNorms (RMSNorms) that lose channels normalise over the kept ones
    (what a cut norm promises: ``slimming.pruning.norms``)."""

    def __init__(self, model: nn.Module, masks: dict[str, torch.Tensor]):
        super().__init__()
        self.model, self.masks = model, masks

    def forward(self, *args):
        from slimming.pruning.norms import kept_statistics

        with kept_statistics(self.model, self.masks):
            return self.model(*args)


def refiled(blob: dict, path, **fields) -> None:
    """``blob`` (a loaded save_pruned file) with ``fields`` replaced, written to ``path`` with a
    checksum that fits: a forged file only the field checks can refuse."""
    from slimming.utils.safeload import checksum

    bad = {**blob, **fields}
    bad["checksum"] = checksum(bad)
    torch.save(bad, path)


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def random_cfg(arch: str, rng: random.Random, depth: int = 11, lo: int = 1, hi: int = 24) -> list:
    """A cfg of the family's shape with random widths."""
    if arch == "nin":
        return [rng.randint(lo, hi) for _ in range(8)]
    return [v if v == "M" else rng.randint(lo, hi) for v in DEFAULT_CFGS[depth]]


@pytest.fixture
def tiny_vgg():
    torch.manual_seed(0)
    return models.build("vgg", cfg=TINY_VGG)


@pytest.fixture(scope="module")
def one_thread():
    """Many tiny convolutions: one thread is faster, and steady when the cores are busy."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def macs_ms(spec, in_ch: int, out_ch: int) -> float:
    """A deterministic device: a layer costs its multiply-adds (1e-6 ms each) plus 1e-3."""
    positions = spec.positions
    kernel = math.prod(spec.kernel) if spec.kernel else 1
    reads = 1 if spec.depthwise else in_ch
    return 1e-6 * positions * kernel * reads * out_ch + 1e-3


@pytest.fixture
def steady_clock(monkeypatch):
    """``MeasuredLatency`` with a deterministic clock instead of the machine's: a layer costs
    ``macs_ms``, a network the sum of its layers' (its table, cache, memory, runtime context
    and records as they are). What a real timing gives is benchmarks' to say: a test that
    times for real fails on a busy machine, where a latency budget is refused."""
    def time_layer(self, spec, in_ch, out_ch):
        return [macs_ms(spec, in_ch, out_ch)] * 7

    def network(self, models, inputs):
        out = []
        for m in models:
            with modes_kept(m):
                m.eval()
                specs = latency.layer_specs(m, inputs)
            out.append([sum(macs_ms(s, s.full_in, s.full_out) for s in specs.values())] * self.repeats)
        return out

    monkeypatch.setattr(latency.MeasuredLatency, "_time", time_layer)
    monkeypatch.setattr(latency.MeasuredLatency, "network", network)


@pytest.fixture
def init_calls(monkeypatch):
    """Records (initialiser name, whether its tensor was on the meta device) for every
    ``nn.init`` call made while the test runs."""
    calls = []
    for name in ("kaiming_normal_", "kaiming_uniform_", "normal_", "uniform_", "constant_", "zeros_"):
        real = getattr(nn.init, name)

        def spy(tensor, *a, _real=real, _name=name, **k):
            calls.append((_name, tensor.is_meta))
            return _real(tensor, *a, **k)

        monkeypatch.setattr(nn.init, name, spy)
    return calls


def chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png(width: int, height: int, depth: int, color: int, raw: bytes) -> bytes:
    """A PNG written by hand: ``raw`` is the filtered scanlines (filter byte 0 + row bytes)."""
    header = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))
