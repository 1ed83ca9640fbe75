"""DenseNet for CIFAR (Huang et al., 2017) as in the network-slimming paper's PyTorch code:
depth 3n+4, growth rate 12, three dense blocks of n single 3x3-conv layers, transitions without
compression; DenseNet-40 (n = 12) has about 1.06M parameters.

Every BatchNorm here is an entry BN (pre-activation): a dense layer's ``bn1`` normalises the
concatenation of all earlier features, which every later layer of the block (and the transition)
reads as well; a transition's ``bn1`` and the final ``bn`` read a whole block's output. So no BN
is pruned physically: each one drops channels from its own layer's reading only, through a
``ChannelSelect`` placed before it (select -> bn1 -> relu -> conv1); the features themselves,
and so every conv's output, keep their width. ``cfg`` has one width per BatchNorm2d in modules()
order (the channels it keeps), as in the paper's code, so its pruned cfgs rebuild here.
"""

from __future__ import annotations

import torch
from torch import nn

from .common import (
    ChannelSelect,
    ChannelSlices,
    StreamNet,
    check_widths,
    count_blocks,
    entry_slices,
    paper_entry,
)
from .registry import register

GROWTH = 12


def layers_per_block(depth: int) -> int:
    if not isinstance(depth, int) or not 7 <= depth <= 301 or (depth - 4) % 3:
        raise ValueError(f"DenseNet depth must be 3n+4 with n >= 1 (7, 10, ..., 40, ..., 301), "
                         f"got {depth}")
    return (depth - 4) // 3


def input_widths(n: int) -> list[int]:
    """The width each BN reads: n dense layers, a transition, ..., the final BN (3n+3 in all)."""
    widths, channels = [], 2 * GROWTH
    for _ in range(3):
        for _ in range(n):
            widths.append(channels)
            channels += GROWTH
        widths.append(channels)  # transition (no compression) or, after block 3, the final BN
    return widths


class Layer(nn.Module):
    """select -> bn1 -> ReLU -> conv1 (``conv_out`` channels, 3x3 in a dense layer, 1x1 in a
    transition). (N, C, H, W) -> (N, conv_out, H, W), C >= ``width`` = channels kept."""

    def __init__(self, width: int, conv_out: int, kernel_size: int, in_channels: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(width)
        self.select = ChannelSelect(width, in_channels)
        self.conv1 = nn.Conv2d(width, conv_out, kernel_size, padding=kernel_size // 2, bias=False)
        self.relu = nn.ReLU(inplace=True)

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv1(self.relu(self.bn1(self.select(x))))


class DenseLayer(Layer):
    """Appends ``GROWTH`` new channels to its input: (N, C, H, W) -> (N, C + 12, H, W)."""

    def __init__(self, width: int, in_channels: int):
        super().__init__(width, GROWTH, 3, in_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.branch(x)], 1)


class Transition(Layer):
    """1x1 conv keeping the width C it reads (no compression), then 2x2 average pool:
    (N, C, H, W) -> (N, C, H / 2, W / 2)."""

    def __init__(self, width: int, channels: int):
        super().__init__(width, channels, 1, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.avg_pool2d(self.branch(x), 2)


def read_structure(sd: dict, depth: int | None) -> tuple[dict, list]:
    """(options, cfg) of this family's network as the state_dict ``sd`` of one of the paper's
    files says (its entry layout converted in place); KeyError/ValueError on a misfit."""
    n = count_blocks(sd, "dense1")
    if n == 0 or count_blocks(sd, "dense2") != n or count_blocks(sd, "dense3") != n:
        raise ValueError("dense1..3 do not hold the same number of layers")
    if depth is not None and depth != 3 * n + 4:
        raise ValueError(f"it has {n} layers a dense block: depth {3 * n + 4}, not {depth}")
    cfg = []
    for b in range(1, 4):
        for p in [f"dense{b}.{i}" for i in range(n)] + ([f"trans{b}"] if b < 3 else []):
            paper_entry(sd, p + ".bn1", p + ".select")
            w = sd[p + ".conv1.weight"]
            if p.startswith("dense") and w.shape[0] != GROWTH:
                raise ValueError(f"growth rate {w.shape[0]}; only {GROWTH} is supported")
            cfg.append(w.shape[1])
    paper_entry(sd, "bn", "select")
    return {"depth": 3 * n + 4, "num_classes": sd["fc.weight"].shape[0]}, cfg + [sd["fc.weight"].shape[1]]


@register
class Net(StreamNet, nn.Module):
    """DenseNet: 3x3 stem conv (24) -> dense1 -> trans1 -> dense2 -> trans2 -> dense3 -> select
    -> bn -> ReLU -> 8x8 average pool -> ``fc``. Input (N, 3, 32, 32), output (N, num_classes)."""

    arch = "densenet"
    aliases = ()
    input_size = (3, 32, 32)
    surgery = "sliced"
    read_structure = staticmethod(read_structure)  # the paper's files (above)

    def __init__(self, depth: int = 40, cfg: list | None = None, num_classes: int = 10):
        super().__init__()
        n = layers_per_block(depth)
        widths = input_widths(n)
        cfg = list(widths) if cfg is None else list(cfg)
        check_widths("DenseNet", cfg, widths)
        self.cfg = cfg
        self.options = {"depth": depth, "num_classes": num_classes}  # what build() needs besides cfg
        self.conv1 = nn.Conv2d(3, 2 * GROWTH, 3, padding=1, bias=False)
        for b in range(3):
            first = b * (n + 1)
            layers = (DenseLayer(cfg[first + i], widths[first + i]) for i in range(n))
            setattr(self, f"dense{b + 1}", nn.Sequential(*layers))
            if b < 2:
                setattr(self, f"trans{b + 1}", Transition(cfg[first + n], widths[first + n]))
        self.add_head(cfg[-1], num_classes, widths[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.trans1(self.dense1(self.conv1(x)))
        return self.head(self.dense3(self.trans2(self.dense2(x))))

    def channel_slices(self) -> ChannelSlices:
        """Per BatchNorm2d (modules() order), the (state_dict key, dim) its keep-mask cuts."""
        plan: ChannelSlices = []
        for b in range(1, 4):
            names = [f"dense{b}.{i}" for i in range(len(getattr(self, f"dense{b}")))]
            for p in names + ([f"trans{b}"] if b < 3 else []):
                plan.append(entry_slices(p + ".bn1", p + ".select", p + ".conv1"))
        plan.append(entry_slices("bn", "select", "fc"))
        return plan
