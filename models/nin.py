"""Network-in-Network (Lin et al., 2014) for 32x32 inputs, with BN after every conv."""

from __future__ import annotations

from torch import nn

from .common import conv_widths, init_weights
from .registry import register

DEFAULT_CFG = [192, 160, 96, 192, 192, 192, 192, 192]

# (kernel size, padding) of the nine convs; 'M' marks a 3x3/2 max-pool with padding 1.
LAYOUT = [(5, 2), (1, 0), (1, 0), "M", (5, 2), (1, 0), (1, 0), "M", (3, 1), (1, 0), (1, 0)]


def block(cin: int, cout: int, k: int, pad: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, padding=pad), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def read_structure(sd: dict, depth: int | None) -> tuple[dict, list]:
    """(options, cfg) of this family's network as the state_dict ``sd`` of one of the paper's
    files says (its entry layout converted in place); KeyError/ValueError on a misfit."""
    convs = conv_widths(sd, "feature")
    if depth is not None:
        raise ValueError("NIN takes no depth")
    return {"num_classes": convs[-1][1].shape[0]}, [w.shape[0] for _, w in convs[:-1]]


@register
class Net(nn.Module):
    """Nine conv-BN-ReLU blocks (conv bias on), the last one to ``num_classes``, then 8x8 avg pool.

    ``cfg`` holds the eight prunable widths; the last block's BN (``num_classes`` channels) is
    never pruned. Input (N, 3, 32, 32), output (N, num_classes) logits.
    """

    arch = "nin"
    aliases = ()
    input_size = (3, 32, 32)
    surgery = "chain"
    read_structure = staticmethod(read_structure)  # the paper's files (above)

    def __init__(self, cfg: list | None = None, num_classes: int = 10):
        super().__init__()
        cfg = list(DEFAULT_CFG if cfg is None else cfg)
        if len(cfg) != 8 or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in cfg):
            raise ValueError(f"a NIN cfg is eight positive widths, got {cfg!r}")
        self.cfg = cfg
        self.options = {"num_classes": num_classes}  # what build() needs besides cfg
        widths = iter(cfg + [num_classes])
        layers: list[nn.Module] = []
        cin = 3
        for item in LAYOUT:
            if item == "M":
                layers.append(nn.MaxPool2d(3, stride=2, padding=1))
            else:
                cout = next(widths)
                layers += block(cin, cout, *item)
                cin = cout
        self.feature = nn.Sequential(*layers)
        if layers[0].weight.is_meta:  # build(empty=True): weights come by assignment
            return
        init_weights(self, convs=False)

    def forward(self, x):
        x = nn.functional.avg_pool2d(self.feature(x), 8)
        return x.flatten(1)

    def prunable_bns(self) -> list[nn.BatchNorm2d]:
        # _BatchNorm: also SyncBatchNorm, which --sync-bn swaps in during training
        return [m for m in self.feature if isinstance(m, nn.modules.batchnorm._BatchNorm)][:-1]

    def pruned_cfg(self, kept: list[int]) -> list:
        return list(kept)
