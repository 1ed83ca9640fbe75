"""Writes the checkpoints of tests/data/v0.1/ with slimming 0.1.0 (the flat layout, commit
bae58f5), so that tests/test_layout.py can check that files written before the 0.2 layout still
load and compute the same. Run it from a checkout of that commit:
``PYTHONPATH=<that checkout> python tests/data/make_v01_checkpoints.py tests/data/v0.1``."""

import sys
from pathlib import Path

import torch

import slimming
from slimming import checkpoint_dict, models, save_checkpoint

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
g = torch.Generator().manual_seed(0)
x = torch.randn(2, 3, 32, 32, generator=g)
expected = {}
nets = {"vgg": models.build("vgg", cfg=[8, "M", 16, "M", 16, "M", 16, "M", 16], num_classes=10),
        "preresnet": models.build("preresnet", depth=20, num_classes=10),
        "densenet": models.build("densenet", depth=10, num_classes=10),
        "nin": models.build("nin", cfg=[8, 8, 8, 16, 16, 16, 16, 16], num_classes=10)}
for name, net in nets.items():
    for bn in slimming.prunable_bns(net):
        bn.weight.data = torch.rand(bn.num_features, generator=g)
        bn.bias.data = 0.1 * torch.randn(bn.num_features, generator=g)
    result = slimming.prune(net.eval(), percent=0.4)
    save_checkpoint(checkpoint_dict(result.model, cfg_mask=result.cfg_mask, threshold=result.threshold,
                                    acc=12.5), out / f"{name}-pruned.pth")
    if name in ("vgg", "nin"):  # the small ones: an unpruned file too
        save_checkpoint(checkpoint_dict(net, epoch=3, acc=10.0), out / f"{name}.pth")
    with torch.no_grad():
        expected[f"{name}-pruned"] = result.model.eval()(x)
        expected[name] = net.eval()(x)
torch.save({"input": x, **expected}, out / "expected.pt")
print(sorted(p.name for p in out.iterdir()))
