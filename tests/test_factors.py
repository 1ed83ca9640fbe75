"""Scaling factors beyond BatchNorm: networks that normalise with GroupNorm are slimmed by its
per-channel scale, cut by whole groups, exactly (the pruned network equals the original with the
cut groups' gamma and beta zeroed), trained sparse by ``slimming.Sparsity``, and saved and loaded
back thinner. Real networks others wrote where a library has them (timm's GroupNorm ResNets and
EfficientNets, torchvision's ResNet given a GroupNorm), and one of ours without any BatchNorm."""

import math
import random
import warnings

import pytest
import torch
from conftest import rel_diff, sparsity_shaped, zeroed
from torch import nn

import slimming


class GroupNormHead(nn.Module):
    """A detection-style tower without any BatchNorm: convolutions with GroupNorm(8) (FCOS,
    RetinaNet v2), a residual sum tying two of them, a GroupNorm(32, 32) (one channel a group:
    cut channel by channel) and a 1x1 output convolution."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU())
        self.a = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(64, 32, 3, padding=1), nn.GroupNorm(8, 32))
        self.c = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(32, 32), nn.ReLU())
        self.out = nn.Conv2d(32, 5, 1)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.b(self.a(x)))
        return self.out(self.c(x))


def _tv_resnet18():
    torchvision = pytest.importorskip("torchvision")
    return torchvision.models.resnet18(weights=None, num_classes=10, norm_layer=lambda c: nn.GroupNorm(8, c))


def _timm(name):
    def build():
        timm = pytest.importorskip("timm")
        return timm.create_model(name, pretrained=False, num_classes=10)
    return build


NETWORKS = {"GroupNormHead": GroupNormHead, "torchvision resnet18 (GroupNorm)": _tv_resnet18,
            "timm test_efficientnet_gn": _timm("test_efficientnet_gn"),
            "timm resnet50_gn": _timm("resnet50_gn")}


def group_norms(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.GroupNorm)]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(NETWORKS))
def test_a_groupnorm_network_is_cut_by_whole_groups_exactly(name, seed, tmp_path):
    torch.manual_seed(seed)
    model = NETWORKS[name]().eval()
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    sparsity_shaped(model, seed)
    percent = random.Random(seed).uniform(0.2, 0.5)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=percent, example_inputs=x[:1], compensate=False)
    with torch.no_grad():
        assert rel_diff(result.model(x), zeroed(model, result.masks)(x)) < 1e-4
    assert sum(p.numel() for p in result.model.parameters()) < sum(p.numel() for p in model.parameters())
    sizes = []
    for gn_name, gn in group_norms(model):  # whole groups, and num_groups follows them
        blocks = result.masks[gn_name].view(gn.num_groups, -1)
        assert (blocks.all(1) | ~blocks.any(1)).all(), gn_name
        assert result.model.get_submodule(gn_name).num_groups == int(blocks.all(1).sum())
        sizes.append(blocks.shape[1])
    ranked, cut = result.ranked  # the count asked for, within one group
    asked = math.floor(percent * ranked)
    assert asked - max(sizes) < cut <= asked
    slimming.save_pruned(result.model, tmp_path / "gn.pth")
    loaded = slimming.load_pruned(tmp_path / "gn.pth", NETWORKS[name]()).eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), result.model(x))


def test_the_groups_with_the_smallest_gammas_are_the_ones_cut():
    """GroupNorm's gammas are the scores: the two groups given tiny gammas are cut, whole, and
    nothing else (a percent of exactly their channels)."""
    torch.manual_seed(0)
    model = GroupNormHead().eval()
    with torch.no_grad():
        for _, gn in group_norms(model):
            gn.weight.uniform_(0.5, 1.0)
        model.a[1].weight[8:16] = 1e-3  # group 1 of a's eight groups of 8
        model.a[1].weight[40:48] = -2e-3  # group 5: |gamma| ranks it
    ranked = slimming.prune(model, percent=0.0, compensate=False, example_inputs=torch.zeros(1, 3, 32, 32))
    result = slimming.prune(model, percent=16 / ranked.ranked[0] + 1e-6, compensate=False,
                            example_inputs=torch.zeros(1, 3, 32, 32))
    cut = {n: (~m).nonzero().flatten().tolist() for n, m in result.masks.items() if not m.all()}
    assert cut == {"a.1": [*range(8, 16), *range(40, 48)]}
    assert result.model.a[1].num_groups == 6 and result.model.b[0].in_channels == 48


def test_sparsity_trains_every_groupnorm_gamma_and_bnsparsity_is_the_same_term():
    model = GroupNormHead()
    sparsity = slimming.Sparsity(model, strength=1e-2)
    assert {id(p) for p in sparsity.params} == {id(m.weight) for _, m in group_norms(model)}
    assert slimming.BNSparsity is slimming.Sparsity
    assert [id(m) for m in slimming.prunable_factors(model)] == [id(m) for _, m in group_norms(model)]
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    before = [p.grad.clone() for p in sparsity.params]
    sparsity.apply()
    for p, g in zip(sparsity.params, before):
        assert torch.equal(p.grad, g + 1e-2 * torch.sign(p.detach()))


def test_a_network_without_any_scaling_factor_is_refused_in_one_line():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    with pytest.raises(slimming.SlimmingError, match="no BatchNorm or GroupNorm layer") as e:
        slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 16, 16))
    assert "\n" not in str(e.value)


def test_a_groupnorm_network_from_the_command_line(tmp_path, capsys):
    """train --sparsity on GroupNorm gammas; prune cuts whole groups and saves a file that eval
    rebuilds (timm's test EfficientNet with GroupNorm, no BatchNorm at all)."""
    pytest.importorskip("timm")
    from slimming.cli import main

    data = ["--dataset", "synthetic", "--cpu", "--batch-size", "128"]
    arch = ["--arch", "timm:test_efficientnet_gn"]
    assert main(["train", *arch, "--epochs", "1", "--sparsity", "1e-2", "--seed", "0",
                 "--save", str(tmp_path / "t"), *data]) == 0
    assert "|gamma|<1e-2" in capsys.readouterr().out  # the GroupNorm gammas, measured
    trained = slimming.load_model(tmp_path / "t" / "last.pth")
    assert main(["prune", "--checkpoint", str(tmp_path / "t" / "last.pth"), "--percent", "0.3",
                 "--save", str(tmp_path / "p"), "--cpu", "--no-eval"]) == 0
    out = capsys.readouterr().out
    assert "BatchNorm / GroupNorm layers changed" in out and "checked: equals the original" in out
    pruned = slimming.load_model(tmp_path / "p" / "pruned.pth")
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in trained.parameters())
    assert main(["eval", "--checkpoint", str(tmp_path / "p" / "pruned.pth"), *data]) == 0
