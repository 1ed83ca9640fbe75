"""Layers whose forward computes the weight it convolves with (issue 34's fourth class, weight
standardisation): timm's ``StdConv2d`` (BiT ResNet-V2), ``StdConv2dSame`` (ViT hybrids, SAME
padding), ``ScaledStdConv2d`` (NFNets, with a per-row gain), and a detector's ``ConvWS2d``
written with means and deviations, as detection codebases write it. Before, every such layer
kept its channels ("a layer whose tensors are not one module's parameters"), so BiT was refused
whole. Now the weight the forward computed is baked into the plain layer it ran where the cut
touches it, and the pruned network equals the original with the cut channels zeroed, at the
example's size and at others; it saves, loads and saves again.
"""

from __future__ import annotations

import warnings
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from conftest import refiled, rel_diff, sparsity_shaped, zeroed
from torch import nn

import slimming
from slimming.layers.baked import BAKED, Conv2dSame, baked_layers

timm = pytest.importorskip("timm")
from timm.layers import GroupNormAct, ScaledStdConv2d, StdConv2d, StdConv2dSame  # noqa: E402
from timm.models.resnetv2 import ResNetV2  # noqa: E402


def bit(conv=StdConv2d, stem="fixed") -> nn.Module:
    """A BiT ResNet-V2 in small: pre-activation bottlenecks of weight-standardised convolutions
    and GroupNorms (timm's own classes)."""
    return ResNetV2(layers=[1, 1], channels=(32, 64), num_classes=5, stem_chs=16, stem_type=stem,
                    conv_layer=conv, norm_layer=partial(GroupNormAct, num_groups=8)).eval()


def cut(model: nn.Module, x: torch.Tensor, seed: int = 0, **options):
    sparsity_shaped(model, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return slimming.prune(model, percent=0.4, example_inputs=x, compensate=False, **options)


def exact(model: nn.Module, result, *shapes) -> float:
    """The largest relative difference of the pruned network from the original with the cut
    channels zeroed, over random inputs of ``shapes``."""
    worst, reference = 0.0, zeroed(model, result.masks)
    with torch.no_grad():
        for shape in shapes:
            x = torch.randn(shape)
            worst = max(worst, rel_diff(result.model(x), reference(x)))
    return worst


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_bit_resnet_of_standardised_convolutions_is_cut_exactly(seed):
    """Refused whole before ('no channel of ResNetV2 can be cut'); now its convolutions lose
    input and output channels, each baked into an ``nn.Conv2d`` holding the standardised weight,
    and the network is exact."""
    torch.manual_seed(seed)
    model = bit()
    before = sum(p.numel() for p in model.parameters())
    result = cut(model, torch.zeros(1, 3, 32, 32), seed)
    assert not result.retries
    assert sum(p.numel() for p in result.model.parameters()) < 0.8 * before
    baked = baked_layers(result.model)
    assert baked and set(baked) == set(result.baked)
    for name in baked:
        layer = result.model.get_submodule(name)
        assert type(layer) is nn.Conv2d and getattr(layer, BAKED) == "StdConv2d"
        assert isinstance(model.get_submodule(name), StdConv2d)  # the original is untouched
    assert exact(model, result, (2, 3, 32, 32), (1, 3, 48, 40)) < 1e-5


def test_same_padding_is_baked_into_a_convolution_that_pads_alike_at_every_size():
    """``StdConv2dSame`` pads its input as TensorFlow's SAME does, by an amount its input's size
    decides: baked, it is a ``Conv2dSame`` that pads alike, exact at odd sizes the example was
    not."""
    torch.manual_seed(0)
    model = bit(partial(StdConv2dSame, eps=1e-8), stem="same")
    result = cut(model, torch.zeros(1, 3, 33, 33))
    kinds = {type(result.model.get_submodule(n)) for n in baked_layers(result.model)}
    assert Conv2dSame in kinds
    assert exact(model, result, (1, 3, 33, 33), (2, 3, 37, 29)) < 1e-5


class NormFree(nn.Module):
    """An NFNet-like stack of timm's ``ScaledStdConv2d`` (a per-row ``gain`` parameter) with no
    normalisation: its widths are scored by gates (``add_gates(everywhere=True)``)."""

    def __init__(self):
        super().__init__()
        self.stem = ScaledStdConv2d(3, 16, 3, stride=2)
        self.conv1 = ScaledStdConv2d(16, 32, 3)
        self.conv2 = ScaledStdConv2d(32, 32, 1)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = F.relu(self.conv1(x))
        return self.head((x + F.relu(self.conv2(x))).mean((2, 3)))


def gated_norm_free():
    """``NormFree`` (seed 0) gated everywhere, its gains as training leaves them; its example."""
    torch.manual_seed(0)
    model = NormFree().eval()
    x = torch.zeros(1, 3, 24, 24)
    slimming.add_gates(model, x, everywhere=True)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, ScaledStdConv2d):
                m.gain.uniform_(0.5, 2.0)  # a trained gain, not its initial ones
    return model, x


def test_scaled_standardised_convolutions_lose_their_gain_when_baked():
    model, x = gated_norm_free()
    result = cut(model, x)
    baked = baked_layers(result.model)
    assert baked
    for name in baked:
        layer = result.model.get_submodule(name)
        assert "gain" not in dict(layer.named_parameters()) and type(layer) is nn.Conv2d
    assert exact(model, result, (2, 3, 24, 24)) < 1e-5


class ConvWS2d(nn.Conv2d):
    """Weight standardisation as detection codebases write it: means and deviations."""

    def forward(self, x):
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        std = (w - mean).flatten(1).std(dim=1).view(-1, 1, 1, 1)
        return F.conv2d(x, (w - mean) / (std + 1e-5), self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class AddsAfter(ConvWS2d):
    """A standardised convolution that does more than convolve: not baked (a plain convolution
    would lose the shift), its channels kept."""

    def forward(self, x):
        return super().forward(x) + 1.0


class Detector(nn.Module):
    def __init__(self, conv=ConvWS2d, first=None):
        super().__init__()
        self.c1, self.n1 = (first or conv)(3, 16, 3, padding=1), nn.GroupNorm(4, 16)
        self.c2, self.n2 = conv(16, 32, 3, padding=1, bias=True), nn.GroupNorm(8, 32)
        self.c3 = conv(32, 8, 1)

    def forward(self, x):
        return self.c3(F.relu(self.n2(self.c2(F.relu(self.n1(self.c1(x)))))))


def test_a_standardised_convolution_of_your_own_is_baked_by_what_its_forward_computes():
    torch.manual_seed(0)
    model = Detector().eval()
    result = cut(model, torch.zeros(1, 3, 20, 20))
    assert set(baked_layers(result.model)) == {"c1", "c2", "c3"}  # c1 its outputs, c3 its inputs
    assert result.model.c1.in_channels == 3 and result.model.c3.out_channels == 8
    assert result.model.c2.out_channels < 32 and result.model.c3.in_channels == result.model.c2.out_channels
    assert exact(model, result, (2, 3, 20, 20)) < 1e-5


def test_a_computed_weight_in_a_layer_that_does_more_is_not_baked():
    """Every convolution here shifts its output after convolving: baking would lose the shift,
    so their channels stay, and with nothing else to cut the refusal is one line saying why."""
    from slimming.pruning.graph import GraphError

    torch.manual_seed(0)
    model = Detector(AddsAfter).eval()
    with pytest.raises(GraphError, match="computing its weight that does more than convolve with it"):
        cut(model, torch.zeros(1, 3, 20, 20))
    assert all(type(m) is AddsAfter for m in (model.c1, model.c2, model.c3))


class Observed(nn.Conv2d):
    """A convolution whose weight is scaled by a buffer its forward fills from its input (an
    observer's statistic): the weight depends on the input, so it is not baked."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("seen", torch.ones(()))

    def forward(self, x):
        self.seen.copy_(x.detach().abs().mean())
        return F.conv2d(x, self.weight * self.seen, self.bias, self.stride, self.padding)


class SizeScaled(nn.Conv2d):
    """A convolution whose weight is scaled by its input's width, a Python number."""

    def forward(self, x):
        return F.conv2d(x, self.weight * (x.shape[-1] / 20), self.bias, self.stride, self.padding)


@pytest.mark.parametrize("verify", [True, False])
def test_a_weight_computed_from_what_the_input_wrote_into_a_buffer_is_not_baked(verify):
    """Baked, the first layer's weight would hold the example's statistic for good (zeros: a
    wrong network that runs, unchecked); the trace knows the buffer holds the input's now and
    keeps that layer's channels, and the rest is cut exactly."""
    torch.manual_seed(0)
    model = Detector(first=Observed).eval()
    result = cut(model, torch.zeros(1, 3, 20, 20), verify=verify)
    assert "c1" not in result.baked and set(result.baked) == {"c2", "c3"}
    assert exact(model, result, (2, 3, 20, 20)) < 1e-5


def test_a_weight_computed_from_the_input_size_is_checked_at_another_size():
    """A weight scaled by the input's width is a function of parameters at one size only: the
    check runs at a second size where layers were baked, fails there, and the prune keeps them."""
    torch.manual_seed(0)
    model = Detector(first=SizeScaled).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sparsity_shaped(model, seed=0)
        result = slimming.prune(model, percent=0.4, example_inputs=torch.zeros(1, 3, 20, 20),
                                compensate=False)
    assert "c1" not in result.baked and result.retries
    assert exact(model, result, (2, 3, 20, 20), (1, 3, 28, 24)) < 1e-5


class Reader(nn.Module):
    """A GroupNorm's groups read by a standardised 1x1 convolution with a bias."""

    def __init__(self):
        super().__init__()
        self.c1, self.n1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), ConvWS2d(16, 8, 1)

    def forward(self, x):
        return self.c2(F.relu(self.n1(self.c1(x))))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compensation_reads_the_weight_the_layer_computed(seed):
    """A cut channel's constant (its GroupNorm's beta, through the ReLU) reaches its 1x1 reader
    through the standardised weight, not the raw one: compensated, the pruned network equals the
    original with the cut gammas alone at zero (0.23 off, seed 0, folded with the raw weight)."""
    torch.manual_seed(seed)
    model = Reader().eval()
    sparsity_shaped(model, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 12, 12))
    assert result.compensation["folded"] > 0 and result.compensation["applied"]
    target = zeroed(model, {"n1": result.masks["n1"]}, beta=False)  # beta's constant stays
    with torch.no_grad():
        y = torch.randn(2, 3, 12, 12)
        assert rel_diff(result.model(y), target(y)) < 1e-5


def test_baked_layers_save_load_and_save_again(tmp_path):
    """The file names the baked layers; a fresh ResNet-V2 takes them as plain convolutions and
    computes what the pruned one does; loaded, it saves the same list again. A file naming a
    layer that is no convolution is refused in one line, the fresh instance left as built."""
    from slimming.errors import CheckpointError

    torch.manual_seed(0)
    model = bit()
    result = cut(model, torch.zeros(1, 3, 32, 32))
    path = tmp_path / "bit.pth"
    slimming.save_pruned(result.model, path)
    blob = torch.load(path, weights_only=True)
    assert sorted(blob["baked"]) == sorted(baked_layers(result.model))
    loaded = slimming.load_pruned(path, bit())
    x = torch.randn(2, 3, 40, 40)
    with torch.no_grad():
        assert torch.equal(loaded(x), result.model(x))
    assert sorted(baked_layers(loaded)) == sorted(blob["baked"])
    slimming.save_pruned(loaded, tmp_path / "again.pth")
    assert sorted(torch.load(tmp_path / "again.pth", weights_only=True)["baked"]) == sorted(blob["baked"])
    for forged in (["stem.conv", "stages.0.blocks.0.norm1"], "stem.conv", [3]):
        refiled(blob, tmp_path / "forged.pth", baked=forged)
        fresh = bit()
        with pytest.raises(CheckpointError, match="bakes|baked layers"):
            slimming.load_pruned(tmp_path / "forged.pth", fresh)
        assert not baked_layers(fresh)
        assert all(type(fresh.get_submodule(n)) is StdConv2d for n in blob["baked"])


BIT_MODULE = '''
from functools import partial

from timm.layers import GroupNormAct, StdConv2d
from timm.models.resnetv2 import ResNetV2


def small_bit(num_classes=5):
    return ResNetV2(layers=[1, 1], channels=(32, 64), num_classes=num_classes, stem_chs=16,
                    conv_layer=StdConv2d, norm_layer=partial(GroupNormAct, num_groups=8))
'''


def test_a_checkpoint_of_a_baked_network_rebuilds_it(tmp_path, monkeypatch):
    """The CLI's checkpoints (``checkpoint_dict``) list the baked layers too; ``load_model``
    rebuilds the network from its builder, bakes them, and computes what the pruned one does."""
    from slimming import checkpoint_dict, load_model, models, save_checkpoint

    (tmp_path / "my_bits.py").write_text(BIT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.manual_seed(0)
    model = models.build("my_bits:small_bit", num_classes=5).eval()
    result = cut(model, torch.zeros(1, 3, 32, 32))
    save_checkpoint(checkpoint_dict(result.model), tmp_path / "p.pth")
    assert sorted(torch.load(tmp_path / "p.pth", weights_only=True)["baked"]) == sorted(result.baked)
    rebuilt = load_model(tmp_path / "p.pth", arch="my_bits:small_bit")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(rebuilt(x), result.model.eval()(x))
    assert sorted(baked_layers(rebuilt)) == sorted(result.baked)


@pytest.mark.parametrize("percent", [0.02, 0.1, 0.4])
def test_a_gate_before_a_standardised_convolution_folds_into_its_baked_weight(percent):
    """A gate is folded into the layer it feeds after the check: into a layer that standardises
    its weight, a column scaled by the gate is standardised again, and the network was wrong
    (0.93 and 0.12 off at 2% and 10%, 'verified' 0.0). Such a layer is baked wherever a gate
    feeds it, cut or not, so the fold is exact."""
    model, x = gated_norm_free()
    sparsity_shaped(model, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=percent, example_inputs=x, compensate=False)
    assert not any(n.endswith("slimming_gate") for n, _ in result.model.named_modules())
    assert exact(model, result, (2, 3, 24, 24)) < 1e-5


def test_no_gate_goes_before_a_layer_computing_its_weight_that_does_more():
    """Its gate could not be folded in: add_gates puts none there; one put there by hand is a
    one-line refusal, not a wrong network."""
    from slimming.pruning.graph import GraphError

    torch.manual_seed(0)
    model = Detector(conv=AddsAfter)
    model.c3 = ConvWS2d(32, 8, 1)
    x = torch.zeros(1, 3, 20, 20)
    assert "c2" not in slimming.add_gates(model.eval(), x, everywhere=True)
    slimming.add_gates(model, x, at=["c2"])
    with pytest.raises(GraphError, match="c2 computes its weight.*cannot be folded"):
        slimming.prune(model, percent=0.3, example_inputs=x)
