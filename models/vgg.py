"""CIFAR VGG with BatchNorm, laid out as in the network-slimming paper's PyTorch code.

Module names (``feature.N``, ``classifier``) match that code, so its state_dicts load unchanged.
"""

from __future__ import annotations

from torch import nn

from .common import conv_widths, init_weights
from .registry import register

# 'M' is a 2x2 max-pool; a number is a 3x3 conv + BN + ReLU of that width.
DEFAULT_CFGS: dict[int, list] = {
    11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512],
    13: [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512],
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
         512, 512, 512, 512],
}


def make_layers(cfg: list, in_channels: int = 3) -> nn.Sequential:
    layers: list[nn.Module] = []
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            layers += [nn.Conv2d(in_channels, v, 3, padding=1, bias=False), nn.BatchNorm2d(v),
                       nn.ReLU(inplace=True)]
            in_channels = v
    return nn.Sequential(*layers)


def check_cfg(cfg: list) -> None:
    widths = [v for v in cfg if v != "M"]
    if not widths or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in widths):
        raise ValueError(f"a VGG cfg is a list of positive widths and 'M', got {cfg!r}")
    if cfg[-1] == "M":
        raise ValueError("a VGG cfg must end with a conv width, not 'M'")
    pools = cfg.count("M")
    if pools != 4:  # 32 -> 16 -> 8 -> 4 -> 2, then the 2x2 average pool before the classifier
        raise ValueError(f"a VGG cfg for 32x32 inputs needs exactly four 'M' (2x2 max-pools), "
                         f"got {pools}")


def read_structure(sd: dict, depth: int | None) -> tuple[dict, list]:
    """(options, cfg) of this family's network as the state_dict ``sd`` of one of the paper's
    files says (its entry layout converted in place); KeyError/ValueError on a misfit."""
    cfg, i = [], 0
    for j, w in conv_widths(sd, "feature"):  # conv j, BN j+1, ReLU j+2, a max-pool in a gap
        if j - i not in (0, 1):
            raise ValueError(f"feature.{j} is not where a VGG conv can be")
        cfg += ["M"] * (j - i) + [w.shape[0]]
        i = j + 3
    shape = ["M" if v == "M" else 0 for v in cfg]
    same = [d for d, c in DEFAULT_CFGS.items() if ["M" if v == "M" else 0 for v in c] == shape]
    if depth is None:
        depth = same[0] if same else 19  # a custom cfg: build() keeps depth 19 as its option
    elif depth not in same:
        raise ValueError(f"its {sum(v != 'M' for v in cfg)} convs and max-pools are not VGG-{depth}'s")
    return {"depth": depth, "num_classes": sd["classifier.weight"].shape[0]}, cfg


@register
class Net(nn.Module):
    """VGG for 32x32 inputs: ``feature`` -> 2x2 average pool -> ``Linear(cfg[-1], num_classes)``.

    Input (N, 3, 32, 32), output (N, num_classes) logits. cfg needs four 'M' for 32x32 inputs.
    """

    arch = "vgg"
    aliases = ()
    input_size = (3, 32, 32)
    surgery = "chain"
    read_structure = staticmethod(read_structure)  # the paper's files (above)

    def __init__(self, cfg: list | None = None, depth: int = 19, num_classes: int = 10):
        super().__init__()
        if cfg is None:
            if depth not in DEFAULT_CFGS:
                raise ValueError(f"VGG depth must be one of {sorted(DEFAULT_CFGS)}, got {depth}")
            cfg = DEFAULT_CFGS[depth]
        cfg = list(cfg)
        check_cfg(cfg)
        self.cfg = cfg
        self.options = {"depth": depth, "num_classes": num_classes}  # what build() needs besides cfg
        self.feature = make_layers(cfg)
        self.classifier = nn.Linear(cfg[-1], num_classes)
        if self.classifier.weight.is_meta:  # build(empty=True): weights come by assignment
            return
        init_weights(self, linear_std=0.01)

    def forward(self, x):
        x = self.feature(x)
        x = nn.functional.avg_pool2d(x, 2)
        return self.classifier(x.flatten(1))

    def prunable_bns(self) -> list[nn.BatchNorm2d]:
        # _BatchNorm: also SyncBatchNorm, which --sync-bn swaps in during training
        return [m for m in self.feature if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def pruned_cfg(self, kept: list[int]) -> list:
        """The cfg with each width replaced by ``kept`` (one count per prunable BN, in order)."""
        it = iter(kept)
        return [v if v == "M" else next(it) for v in self.cfg]
