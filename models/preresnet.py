"""Pre-activation bottleneck ResNet for CIFAR (He et al., 2016), laid out as in the
network-slimming paper's PyTorch code: depth 9n+2, three stages of n bottlenecks (16/32/64
planes, expansion 4), so ResNet-164 has n = 18 and about 1.70M parameters.

A block reads the residual stream x and adds its branch to it::

    select -> bn1 -> relu -> conv1 (1x1) -> bn2 -> relu -> conv2 (3x3, stride) -> bn3 -> relu
           -> conv3 (1x1, 4*planes)  (+ x, or + downsample(x) in a stage's first block)

Which BatchNorms slimming prunes, and how (all of them, as in the paper):

- ``bn2`` and ``bn3`` sit between two convs of the branch and nothing else reads them: their
  pruned channels go physically (the conv before loses output channels, the BN shrinks, the
  conv after loses input channels).
- ``bn1`` and the final ``bn`` read the stream. In a pre-activation ResNet the stream has no
  BatchNorm of its own: it is the sum of the conv3 (and downsample) outputs and the skip, and it
  is read by every later block's ``bn1`` of the stage, by the next stage's ``downsample`` conv
  (raw, not normalised, every channel) and at the end by ``bn``. A channel one reader finds
  useless another may need, so the stream keeps its full width (conv3 and downsample are never
  cut on their output side) and each entry BN prunes only its own reading: ``select`` keeps its
  channels, then ``bn1`` (holding just those) and ``conv1`` (just those inputs) follow.
  (A stream channel every reader drops could go too; with the downsample convs reading all of
  stages 1-2 that is only possible in stage 3, and the paper does not do it either.)

``cfg`` follows the paper's code: one width per BatchNorm2d in modules() order, three per block
(channels bn1 keeps of the stream, bn2's width, bn3's width) and one for the final ``bn``, so a
cfg saved by the paper's resprune.py rebuilds the same shapes here.
"""

from __future__ import annotations

import torch
from torch import nn

from .common import (
    ChannelSelect,
    ChannelSlices,
    StreamNet,
    bn_slices,
    check_widths,
    count_blocks,
    entry_slices,
    paper_entry,
)
from .registry import register

EXPANSION = 4
PLANES = (16, 32, 64)


def blocks_per_stage(depth: int) -> int:
    if not isinstance(depth, int) or not 11 <= depth <= 1001 or (depth - 2) % 9:
        raise ValueError(f"pre-activation ResNet depth must be 9n+2 with n >= 1 (11, 20, ..., "
                         f"164, ..., 1001), got {depth}")
    return (depth - 2) // 9


def stream_widths(n: int) -> list[int]:
    """The residual-stream width each block reads, then the width the final BN reads."""
    widths, inplanes = [], 16
    for planes in PLANES:
        for _ in range(n):
            widths.append(inplanes)
            inplanes = planes * EXPANSION
    return widths + [inplanes]


def default_cfg(n: int) -> list[int]:
    cfg = []
    for inplanes, planes in zip(stream_widths(n), [p for p in PLANES for _ in range(n)]):
        cfg += [inplanes, planes, planes]
    return cfg + [PLANES[-1] * EXPANSION]


class Bottleneck(nn.Module):
    """cfg = (channels bn1 keeps of the ``inplanes``-wide stream, bn2 width, bn3 width).
    (N, inplanes, H, W) -> (N, 4 * planes, H / stride, W / stride)."""

    def __init__(self, inplanes: int, planes: int, cfg: list[int], stride: int = 1):
        super().__init__()
        # registration order = modules() order = the paper's: bn1 before select and conv1
        self.bn1 = nn.BatchNorm2d(cfg[0])
        self.select = ChannelSelect(cfg[0], inplanes)
        self.conv1 = nn.Conv2d(cfg[0], cfg[1], 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cfg[1])
        self.conv2 = nn.Conv2d(cfg[1], cfg[2], 3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(cfg[2])
        self.conv3 = nn.Conv2d(cfg[2], planes * EXPANSION, 1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes * EXPANSION:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * EXPANSION, 1, stride=stride, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.relu(self.bn1(self.select(x))))
        out = self.conv2(self.relu(self.bn2(out)))
        out = self.conv3(self.relu(self.bn3(out)))
        if self.downsample is not None:
            x = self.downsample(x)
        return out + x


def read_structure(sd: dict, depth: int | None) -> tuple[dict, list]:
    """(options, cfg) of this family's network as the state_dict ``sd`` of one of the paper's
    files says (its entry layout converted in place); KeyError/ValueError on a misfit."""
    n = count_blocks(sd, "layer1")
    if n == 0 or count_blocks(sd, "layer2") != n or count_blocks(sd, "layer3") != n:
        raise ValueError("layer1..3 do not hold the same number of blocks")
    if depth is not None and depth != 9 * n + 2:
        raise ValueError(f"it has {n} blocks a stage: depth {9 * n + 2}, not {depth}")
    cfg = []
    for s in range(1, 4):
        for k in range(n):
            p = f"layer{s}.{k}."
            paper_entry(sd, p + "bn1", p + "select")
            w1, w2 = sd[p + "conv1.weight"], sd[p + "conv2.weight"]
            cfg += [w1.shape[1], w1.shape[0], w2.shape[0]]
    paper_entry(sd, "bn", "select")
    return {"depth": 9 * n + 2, "num_classes": sd["fc.weight"].shape[0]}, cfg + [sd["fc.weight"].shape[1]]


@register
class Net(StreamNet, nn.Module):
    """Pre-activation ResNet: 3x3 stem conv (16) -> layer1..3 -> select -> bn -> ReLU -> 8x8
    average pool -> ``fc``. Input (N, 3, 32, 32), output (N, num_classes) logits."""

    arch = "preresnet"
    aliases = ("resnet",)  # the paper's name
    input_size = (3, 32, 32)
    surgery = "sliced"
    read_structure = staticmethod(read_structure)  # the paper's files (above)

    def __init__(self, depth: int = 164, cfg: list | None = None, num_classes: int = 10):
        super().__init__()
        n = blocks_per_stage(depth)
        streams = stream_widths(n)
        cfg = default_cfg(n) if cfg is None else list(cfg)
        # entry BNs (every third, and the last) read at most the stream; bn2/bn3 are free
        check_widths("pre-activation ResNet", cfg,
                     [streams[i // 3] if i % 3 == 0 else 0 for i in range(9 * n)] + [streams[-1]])
        self.cfg = cfg
        self.options = {"depth": depth, "num_classes": num_classes}  # what build() needs besides cfg
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        for s, planes in enumerate(PLANES):
            blocks = [Bottleneck(streams[s * n + k], planes, cfg[3 * (s * n + k):3 * (s * n + k) + 3],
                                 stride=2 if s and not k else 1) for k in range(n)]
            setattr(self, f"layer{s + 1}", nn.Sequential(*blocks))
        self.add_head(cfg[-1], num_classes, streams[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer3(self.layer2(self.layer1(self.conv1(x)))))

    def channel_slices(self) -> ChannelSlices:
        """Per BatchNorm2d (modules() order), the (state_dict key, dim) its keep-mask cuts."""
        plan: ChannelSlices = []
        for s in range(1, 4):
            for k in range(len(getattr(self, f"layer{s}"))):
                p = f"layer{s}.{k}."
                plan.append(entry_slices(p + "bn1", p + "select", p + "conv1"))
                plan.append([(p + "conv1.weight", 0), *bn_slices(p + "bn2"), (p + "conv2.weight", 1)])
                plan.append([(p + "conv2.weight", 0), *bn_slices(p + "bn3"), (p + "conv3.weight", 1)])
        plan.append(entry_slices("bn", "select", "fc"))
        return plan
