"""3-D medical networks (issue 47, item 3): MONAI's UNet normalises with an InstanceNorm without
affine (nothing scores its channels: gates, also before its transposed convolutions), its
BasicUNet with an affine one (the gamma scores them), SegResNet with GroupNorm. Written the
way MONAI writes them (``Convolution`` = conv -> norm -> dropout -> PReLU, ``SkipConnection``
concatenating a block's input and output, a transposed convolution up), and on MONAI's own
classes where installed."""

import warnings

import pytest
import torch
from conftest import rel_diff, sparsity_shaped, zeroed
from torch import nn

import slimming


class Convolution(nn.Sequential):
    """MONAI's ``Convolution``: a convolution (or a transposed one), then norm, dropout, PReLU."""

    def __init__(self, cin: int, cout: int, stride: int = 1, transposed: bool = False, affine: bool = False):
        conv = nn.ConvTranspose3d(cin, cout, 3, stride, 1, output_padding=stride - 1) if transposed \
            else nn.Conv3d(cin, cout, 3, stride, 1)
        super().__init__(conv, nn.InstanceNorm3d(cout, affine=affine), nn.Dropout(0.0), nn.PReLU())


class SkipConnection(nn.Module):
    def __init__(self, submodule: nn.Module):
        super().__init__()
        self.submodule = submodule

    def forward(self, x):
        return torch.cat([x, self.submodule(x)], dim=1)


class MonaiStyleUNet(nn.Module):
    """MONAI's ``UNet`` of two levels: down by strided convolutions, up by transposed ones that
    read the skip's concatenation."""

    def __init__(self, channels=(8, 16, 32), affine: bool = False):
        super().__init__()
        c0, c1, c2 = channels
        inner = nn.Sequential(Convolution(c0, c1, 2, affine=affine),
                              SkipConnection(Convolution(c1, c2, affine=affine)),
                              Convolution(c1 + c2, c0, 2, transposed=True, affine=affine))
        self.model = nn.Sequential(Convolution(1, c0, 2, affine=affine), SkipConnection(inner),
                                   nn.ConvTranspose3d(2 * c0, 2, 3, 2, 1, output_padding=1))

    def forward(self, x):
        return self.model(x)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("affine", [False, True])
def test_a_monai_style_3d_unet_is_cut_exactly_by_its_instance_norms_or_by_gates(affine, seed):
    """Affine: the InstanceNorms' gammas score the channels. Without (MONAI's default): "no
    channel can be cut" before; add_gates(everywhere=True) now gates every convolution that
    reads them, the transposed ones of the decoder too (the gate folds into their weight's
    input dim, the first). Both exact on other inputs, at least 20% of the parameters cut."""
    torch.manual_seed(seed)
    model, x = MonaiStyleUNet(affine=affine).eval(), torch.zeros(1, 1, 16, 16, 16)
    if not affine:
        gated = slimming.add_gates(model, x, everywhere=True)
        assert any(isinstance(model.get_submodule(n), nn.ConvTranspose3d) for n in gated)
    sparsity_shaped(model, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.4, example_inputs=x, compensate=False)
    assert slimming.count_params(result.model) < 0.8 * slimming.count_params(model) and not result.retries
    probe = torch.randn(2, 1, 16, 16, 16)
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5
    assert not any(hasattr(m, "slimming_gate") for m in result.model.modules())  # folded away


MONAI = {
    "UNet (InstanceNorm without affine, gated)": (
        lambda n: n.UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(8, 16, 32), strides=(2, 2)),
        (1, 1, 16, 16, 16), True),
    "BasicUNet (affine InstanceNorm)": (
        lambda n: n.BasicUNet(spatial_dims=3, in_channels=1, out_channels=2, features=(8, 8, 16, 32, 64, 8)),
        (1, 1, 32, 32, 32), False),
    "SegResNet (GroupNorm)": (
        lambda n: n.SegResNet(spatial_dims=3, in_channels=1, out_channels=2, init_filters=8),
        (1, 1, 16, 16, 16), False),
}


@pytest.mark.parametrize("name", list(MONAI))
def test_monai_own_3d_networks_are_cut_exactly(name):
    """MONAI's own classes, where installed: at least 20% of the parameters cut at 30% of the
    channels, exact on another input."""
    nets = pytest.importorskip("monai.networks.nets")
    build, shape, gates = MONAI[name]
    torch.manual_seed(0)
    model, x = build(nets).eval(), torch.zeros(*shape)
    if gates:
        slimming.add_gates(model, x, everywhere=True)
    sparsity_shaped(model, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert slimming.count_params(result.model) < 0.8 * slimming.count_params(model)
    probe = torch.randn(*shape)
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5


@pytest.mark.slow
def test_monai_swin_unetr_is_cut_exactly_through_its_gates():
    """MONAI's SwinUNETR (needs einops, in ``[dev]``): a Swin encoder whose output stages are
    normalised by a LayerNorm without a scale and a decoder of InstanceNorms without affine, so
    nothing scores a channel ("no channel can be cut", naming ``add_gates``, the model as it
    was); gated, its heads and MLP widths are cut, exact on another input, at least 20% of the
    parameters."""
    pytest.importorskip("einops")
    nets = pytest.importorskip("monai.networks.nets")
    torch.manual_seed(0)
    model = nets.SwinUNETR(in_channels=1, out_channels=2, feature_size=12, depths=(1, 1, 1, 1),
                           num_heads=(1, 2, 3, 6), spatial_dims=3).eval()
    x, probe = torch.zeros(1, 1, 64, 64, 64), torch.randn(1, 1, 64, 64, 64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        reference = model(probe)
    with pytest.raises(slimming.SlimmingError, match="add_gates"):
        slimming.prune(model, percent=0.3, example_inputs=x)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(model(probe), reference)
    slimming.add_gates(model, x)
    sparsity_shaped(model, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert slimming.count_params(result.model) < 0.8 * slimming.count_params(model)
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5
