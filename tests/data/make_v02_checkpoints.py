"""Writes the checkpoints of tests/data/v0.2/ with slimming 0.2.0 (the layout before the network
families moved to the top-level models/ folder, commit c03b04a), so that tests/test_layout.py can
check that files written before that move still load and compute the same: a family's cut
(``checkpoint_dict``), a timm network cut along its traced graph (rebuilt by ``resize_like``)
and a gated timm vision transformer cut by heads (``save_pruned``). Run it from a checkout of
that commit: ``PYTHONPATH=<that checkout> python tests/data/make_v02_checkpoints.py tests/data/v0.2``."""

import sys
from pathlib import Path

import torch

import slimming
from slimming import checkpoint_dict, models, save_checkpoint, save_pruned

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
g = torch.Generator().manual_seed(0)
expected = {"input32": torch.randn(2, 3, 32, 32, generator=g),
            "input64": torch.randn(2, 3, 64, 64, generator=g)}


vgg = models.build("vgg", cfg=[8, "M", 16, "M", 16, "M", 16, "M", 16], num_classes=10).eval()
for bn in slimming.prunable_bns(vgg):
    bn.weight.data = torch.rand(bn.num_features, generator=g)
    bn.bias.data = 0.1 * torch.randn(bn.num_features, generator=g)
result = slimming.prune(vgg, percent=0.4)
save_checkpoint(checkpoint_dict(result.model, cfg_mask=result.cfg_mask, threshold=result.threshold),
                out / "vgg-pruned.pth")
with torch.no_grad():
    expected["vgg-pruned"] = result.model.eval()(expected["input32"])

resnet = models.build("timm:test_resnet", num_classes=10, input_size=[3, 64, 64]).eval()
for m in resnet.modules():
    if isinstance(m, torch.nn.BatchNorm2d):
        m.weight.data = torch.rand(m.num_features, generator=g)
result = slimming.prune(resnet, percent=0.3, example_inputs=torch.zeros(1, 3, 64, 64))
save_checkpoint(checkpoint_dict(result.model, cfg_mask=result.cfg_mask, threshold=result.threshold),
                out / "timm-resnet-pruned.pth")
with torch.no_grad():
    expected["timm-resnet-pruned"] = result.model.eval()(expected["input64"])

vit = models.build("timm:test_vit", num_classes=10, input_size=[3, 64, 64]).eval()
slimming.add_gates(vit, example_inputs=torch.zeros(1, 3, 64, 64), heads=True)
for m in vit.modules():
    if type(m).__name__ in ("ChannelGate", "HeadGate"):
        m.weight.data = torch.rand(m.weight.shape, generator=g)
result = slimming.prune(vit, percent=0.3, example_inputs=torch.zeros(1, 3, 64, 64))
save_pruned(result.model, out / "timm-vit-gated-pruned.pt")
with torch.no_grad():
    expected["timm-vit-gated-pruned"] = result.model.eval()(expected["input64"])
torch.save(expected, out / "expected.pt")
print(sorted((p.name, p.stat().st_size) for p in out.iterdir()))
