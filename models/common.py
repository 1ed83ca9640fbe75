"""Pieces the pre-activation ResNet and DenseNet families share.

In both, a BatchNorm at a layer's entry normalises a tensor that other layers read too (the
residual stream, the concatenated features), so pruning it may only drop channels from *this*
layer's reading of that tensor, never from the tensor itself. ``ChannelSelect`` does that
reading: it picks the kept channels *before* the entry BN, so the BN and the conv after it hold
only the kept channels (the paper's code normalises every channel, then discards some).
"""

from __future__ import annotations

import re

import torch
from torch import nn

BN_STATE = ("weight", "bias", "running_mean", "running_var")

# One entry per BatchNorm2d of a network, in modules() order: the (state_dict key, dim) pairs
# whose extent along dim is that BN's channels, i.e. what a keep-mask over those channels cuts.
ChannelSlices = list[list[tuple[str, int]]]


class ChannelSelect(nn.Module):
    """``x[:, index]``: keep the input channels listed in ``index`` (sorted stream positions).

    ``index`` is a persistent int64 buffer, so it travels in the state_dict; ``arange(channels)``
    until a state_dict assigns the real positions. (N, in_channels, H, W) -> (N, len(index), H,
    W). One ``index_select``: no NumPy, no host sync, scriptable and exportable.
    """

    def __init__(self, channels: int, in_channels: int | None = None):
        super().__init__()
        self.in_channels = channels if in_channels is None else in_channels
        self.register_buffer("index", torch.arange(channels, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.index_select(1, self.index)

    def check_index(self) -> None:
        """Raise ValueError unless ``index`` is strictly increasing positions in
        [0, in_channels): what a loaded file must hold before the index is used."""
        i = self.index
        if i.dtype != torch.long or i.dim() != 1:
            raise ValueError(f"expected a 1-d int64 index, got {i.dtype} {tuple(i.shape)}")
        if i.numel() and (int(i.min()) < 0 or int(i.max()) >= self.in_channels
                          or not bool((i[1:] > i[:-1]).all())):
            raise ValueError(f"expected increasing positions in [0, {self.in_channels})")

    def extra_repr(self) -> str:
        return f"channels={self.index.numel()}, in_channels={self.in_channels}"


def bn_slices(prefix: str) -> list[tuple[str, int]]:
    """The tensors of BN ``prefix`` that its own channel mask cuts (all along dim 0)."""
    return [(f"{prefix}.{key}", 0) for key in BN_STATE]


def entry_slices(bn: str, select: str, reader: str) -> list[tuple[str, int]]:
    """A select -> BN -> ReLU -> ``reader`` entry: the mask cuts the BN, the select index and
    the input channels of ``reader`` (a conv, or the final linear layer: dim 1 in both)."""
    return [*bn_slices(bn), (f"{select}.index", 0), (f"{reader}.weight", 1)]


def check_widths(family: str, cfg: list, limits: list[int]) -> None:
    """``cfg`` must be one positive int per BN; an entry BN (limit > 0) reads at most ``limit``."""
    if len(cfg) != len(limits) or any(not isinstance(v, int) or isinstance(v, bool) or v < 1
                                      for v in cfg):
        raise ValueError(f"a {family} cfg here is {len(limits)} positive widths (one per "
                         f"BatchNorm2d), got {len(cfg)}: {cfg!r}")
    over = [i for i, (v, lim) in enumerate(zip(cfg, limits)) if lim and v > lim]
    if over:
        i = over[0]
        raise ValueError(f"{family} cfg[{i}] = {cfg[i]} selects more channels than the "
                         f"{limits[i]} its BatchNorm reads")


def init_weights(net: nn.Module, *, convs: bool = True, linear_std: float | None = None) -> None:
    """The paper's initialisation: He-normal convs (fan-out; ``convs=False`` keeps PyTorch's
    default, as the paper's NIN does), BN gamma 0.5 and beta 0 (the paper starts every gamma at
    0.5); linear layers N(0, ``linear_std``) with zero bias (its VGG), or PyTorch's default when
    None (its ResNet/DenseNet code)."""
    for m in net.modules():
        if isinstance(m, nn.Conv2d) and convs:
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.constant_(m.weight, 0.5)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and linear_std is not None:
            nn.init.normal_(m.weight, 0, linear_std)
            nn.init.zeros_(m.bias)


class StreamNet:
    """Mixin for the families whose layers read a shared stream (pre-activation ResNet,
    DenseNet): every BN is prunable, the cfg is one width per BN in ``modules()`` order, and
    the head is select -> BN -> ReLU -> 8x8 average pool -> linear, named as in the paper's code
    (``bn``, ``select``, ``fc``)."""

    def add_head(self, width: int, num_classes: int, in_channels: int) -> None:
        """The head (reading ``width`` of the stream's ``in_channels``), then the weight
        initialisation (skipped on the meta device: an empty build gets its weights by
        assignment). Call it last in ``__init__``."""
        self.bn = nn.BatchNorm2d(width)
        self.select = ChannelSelect(width, in_channels)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(width, num_classes)
        if not self.fc.weight.is_meta:
            init_weights(self)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn(self.select(x)))
        return self.fc(nn.functional.avg_pool2d(x, 8).flatten(1))

    def prunable_bns(self) -> list[nn.BatchNorm2d]:
        # _BatchNorm: also SyncBatchNorm, which --sync-bn swaps in during training
        return [m for m in self.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def pruned_cfg(self, kept: list[int]) -> list[int]:
        return list(kept)


# --------------------------------------------------------------------------- reading the paper's files

def conv_widths(sd: dict, prefix: str) -> list[tuple[int, torch.Tensor]]:
    """(N, weight) of every 4-d ``{prefix}.N.weight``, by N."""
    found = [(int(m.group(1)), v) for k, v in sd.items()
             if (m := re.fullmatch(rf"{re.escape(prefix)}\.(\d+)\.weight", k)) and v.dim() == 4]
    if not found:
        raise ValueError(f"no {prefix}.N conv weights")
    return sorted(found, key=lambda t: t[0])


def count_blocks(sd: dict, prefix: str) -> int:
    return len({m.group(1) for k in sd if (m := re.match(rf"{prefix}\.(\d+)\.", k))})


def paper_entry(sd: dict, bn: str, select: str) -> None:
    """The paper's full-width ``bn`` + float ``select.indexes`` -> our kept-channel ``bn`` and
    int64 ``select.index``, in place. A file already in our layout passes through."""
    indexes = sd.pop(f"{select}.indexes", None)
    if indexes is None:
        if f"{select}.index" not in sd:  # no selection at all: every channel is read
            sd[f"{select}.index"] = torch.arange(sd[f"{bn}.weight"].numel(), device=sd[f"{bn}.weight"].device)
        return
    width = sd[f"{bn}.weight"].numel()
    if indexes.dim() != 1 or indexes.numel() != width:
        raise ValueError(f"{select}.indexes has {indexes.numel()} entries for the {width} channels of {bn}")
    keep = indexes.nonzero().squeeze(1)
    for key in BN_STATE:
        sd[f"{bn}.{key}"] = sd[f"{bn}.{key}"].index_select(0, keep)
    sd[f"{select}.index"] = keep
