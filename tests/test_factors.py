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
from slimming.layers.rules import is_factor_layer
from slimming.pruning.trace import trace


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


def cut_at_random(model, seed):
    """``model`` pruned (no compensation) at a seeded random percent on a seeded batch of two,
    after the check that it equals its zeroed original; (result, batch, percent)."""
    percent = random.Random(seed).uniform(0.2, 0.5)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=percent, example_inputs=x[:1], compensate=False)
    with torch.no_grad():
        assert rel_diff(result.model(x), zeroed(model, result.masks)(x)) < 1e-4
    return result, x, percent


def group_norms(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.GroupNorm)]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(NETWORKS))
@pytest.mark.slow
def test_a_groupnorm_network_is_cut_by_whole_groups_exactly(name, seed, tmp_path):
    torch.manual_seed(seed)
    model = NETWORKS[name]().eval()
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    sparsity_shaped(model, seed)
    result, x, percent = cut_at_random(model, seed)
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
    with pytest.raises(slimming.SlimmingError, match="no BatchNorm, GroupNorm, LayerNorm or affine") as e:
        slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 16, 16))
    assert "\n" not in str(e.value) and "add_gates" in str(e.value)


INSTANCE = {1: (nn.Conv1d, nn.InstanceNorm1d), 2: (nn.Conv2d, nn.InstanceNorm2d),
            3: (nn.Conv3d, nn.InstanceNorm3d)}


def instance_normed(dims: int, affine: bool) -> nn.Module:
    """A 3-D medical or style network's pattern: convolutions, each followed by an InstanceNorm
    (MONAI's UNet default: no affine; its BasicUNet: affine)."""
    conv, norm = INSTANCE[dims]
    return nn.Sequential(conv(2, 16, 3, padding=1), norm(16, affine=affine), nn.ReLU(),
                         conv(16, 8, 3, padding=1), norm(8, affine=affine), nn.ReLU(), conv(8, 3, 1)).eval()


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_an_affine_instance_norm_is_a_scaling_factor_and_one_without_takes_gates(dims, seed):
    """Issue 47, item 3: an affine InstanceNorm's gamma scores its channels as a BatchNorm's
    does (each channel normalised alone: a cut leaves the others as they were), so the cut is
    exact; without affine nothing scores them ("no channel can be cut", naming add_gates), and
    add_gates puts a gate before each convolution that reads them, which the cut then uses."""
    torch.manual_seed(seed)
    x, probe = torch.zeros(1, 2, *[8] * dims), torch.randn(2, 2, *[8] * dims)
    model = instance_normed(dims, affine=True)
    sparsity_shaped(model, seed)
    result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert set(result.cfg) == {"1", "4"} and result.cfg["1"] < 16 and result.cfg["4"] < 8
    assert result.model[1].num_features == result.model[0].out_channels == result.cfg["1"]
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5
    plain = instance_normed(dims, affine=False)
    with pytest.raises(slimming.SlimmingError, match="add_gates") as e:
        slimming.prune(plain, percent=0.3, example_inputs=x)
    assert "\n" not in str(e.value)
    assert slimming.add_gates(plain, x, everywhere=True) == ["3", "6"]
    sparsity_shaped(plain, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gated = slimming.prune(plain, percent=0.3, example_inputs=x, compensate=False)
    assert gated.model[3].in_channels + gated.model[6].in_channels < 24
    with torch.no_grad():
        assert rel_diff(gated.model(probe), zeroed(plain, gated.masks)(probe)) < 1e-5


@pytest.mark.slow
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
    assert "layers with a scaling factor changed" in out and "checked: equals the original" in out
    pruned = slimming.load_model(tmp_path / "p" / "pruned.pth")
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in trained.parameters())
    assert main(["eval", "--checkpoint", str(tmp_path / "p" / "pruned.pth"), *data]) == 0


# ---------------------------------------------------------------- LayerNorm over the channels


class LayerNorm2d(nn.LayerNorm):
    """ConvNeXt's channels-first LayerNorm, as torchvision and timm write it: to channels-last,
    F.layer_norm, back."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """torchvision's CNBlock: a depthwise 7x7, a channels-last LayerNorm, the pointwise MLP
    (4x), a layer scale, a residual sum."""

    def __init__(self, dim: int):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim, 1, 1), 0.5))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(nn.functional.gelu(self.fc1(self.norm(y)))).permute(0, 3, 1, 2)
        return x + self.gamma * y


class TinyConvNeXt(nn.Module):
    """Stem (4x4 stride 4, LayerNorm2d), two stages of blocks joined by a LayerNorm2d and a 2x2
    stride-2 convolution, a head of pool, LayerNorm, linear."""

    def __init__(self, dims=(16, 32), num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))
        self.stage1 = nn.Sequential(ConvNeXtBlock(dims[0]), ConvNeXtBlock(dims[0]))
        self.down = nn.Sequential(LayerNorm2d(dims[0], eps=1e-6), nn.Conv2d(dims[0], dims[1], 2, 2))
        self.stage2 = nn.Sequential(ConvNeXtBlock(dims[1]), ConvNeXtBlock(dims[1]))
        self.norm, self.head = nn.LayerNorm(dims[1]), nn.Linear(dims[1], num_classes)

    def forward(self, x):
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(self.norm(x.mean((2, 3))))


class ViTBlock(nn.Module):
    """A pre-norm transformer block as timm writes it: LayerNorm, fused qkv, heads, scaled dot
    product attention, projection, residual; LayerNorm, MLP, residual."""

    def __init__(self, dim: int, heads: int, norm=nn.LayerNorm):
        super().__init__()
        self.heads = heads
        self.norm1, self.qkv, self.proj = norm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm2, self.fc1, self.fc2 = norm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.inner = dim

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        o = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(o.transpose(1, 2).reshape(b, n, self.inner))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class TinyViT(nn.Module):
    """Patch embedding (a strided convolution, flattened to tokens), a class token, a position
    embedding, three blocks, a final LayerNorm, the class token's head."""

    def __init__(self, dim: int = 24, heads: int = 3, num_classes: int = 10, norm=nn.LayerNorm):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 17, dim) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads, norm) for _ in range(3)])
        self.norm, self.head = norm(dim), nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def _tv(name, **kw):
    def build():
        torchvision = pytest.importorskip("torchvision")
        return torchvision.models.get_model(name, weights=None, num_classes=10, **kw)
    return build


def _timm_kw(name, **kw):
    def build():
        timm = pytest.importorskip("timm")
        return timm.create_model(name, pretrained=False, num_classes=10, **kw)
    return build


LN_NETWORKS = {
    "TinyConvNeXt": TinyConvNeXt, "TinyViT": TinyViT,
    "torchvision convnext_tiny": _tv("convnext_tiny"), "timm convnext_atto": _timm_kw("convnext_atto"),
    "timm vit_tiny_patch16_224": _timm_kw("vit_tiny_patch16_224", img_size=32, patch_size=8),
    "timm swin (windows of 2)": _timm_kw("swin_tiny_patch4_window7_224", img_size=32, window_size=2,
                                         embed_dim=24, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4)),
}


def layer_norms(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(LN_NETWORKS))
@pytest.mark.slow
def test_a_layernorm_network_is_cut_exactly_by_its_gammas(name, seed, tmp_path):
    """ConvNeXt (both LayerNorm layouts, layer scale), vision transformers (class token,
    position embedding, fused qkv), Swin (windows, shifts): the embedding is cut, and the pruned
    network equals the original with the cut gammas and betas zeroed and each cut LayerNorm
    normalising over its kept channels; saved and loaded back, it is the same network."""
    torch.manual_seed(seed)
    model = LN_NETWORKS[name]().eval()
    sparsity_shaped(model, seed)
    result, x, percent = cut_at_random(model, seed)
    ranked, cut = result.ranked
    assert cut == math.floor(percent * ranked) and cut > 0
    for ln_name, ln in layer_norms(result.model):  # every LayerNorm set to its kept width
        assert ln.normalized_shape == (ln.weight.numel(),) == (int(result.masks[ln_name].sum()),)
    slimming.save_pruned(result.model, tmp_path / "ln.pth")
    loaded = slimming.load_pruned(tmp_path / "ln.pth", LN_NETWORKS[name]()).eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), result.model(x))


def test_a_cut_layernorm_normalises_over_its_kept_channels():
    """The reference a LayerNorm's cut is held to, written out: the kept channels normalised by
    their own mean and variance, scaled and shifted by their gamma and beta; the cut ones give
    their beta (zero once the reference zeroes it)."""
    from slimming.pruning.norms import kept_statistics

    ln = nn.LayerNorm(6)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 2)
        ln.bias.uniform_(-1, 1)
    x = torch.randn(4, 5, 6)
    keep = torch.tensor([True, False, True, True, False, True])
    with kept_statistics(nn.Sequential(ln), {"0": keep}):
        got = ln(x)
    kept = x[..., keep]
    mean, var = kept.mean(-1, keepdim=True), kept.var(-1, unbiased=False, keepdim=True)
    want = ln.bias.detach().expand_as(x).clone()
    want[..., keep] = (kept - mean) / torch.sqrt(var + ln.eps) * ln.weight[keep] + ln.bias[keep]
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(ln(x), want, atol=1e-3)  # and only inside the block


class LlamaRMSNorm(nn.Module):
    """An RMSNorm of a user's own, as LLaMA's code writes it: the trace does not know it until
    it is registered (one call)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


RMS_RULE = slimming.LayerRule(carries={"weight": 0}, gated=True, scores=True, normalises=True)


def _rms_vit_timm(norm_layer):
    def build():
        timm = pytest.importorskip("timm")
        layer = getattr(timm.layers, norm_layer) if isinstance(norm_layer, str) else norm_layer
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32,
                                 patch_size=8, norm_layer=layer)
    return build


RMS_NETWORKS = {  # (builder, the module type a user registers, or None: torch's nn.RMSNorm, built in)
    "TinyViT nn.RMSNorm": (lambda: TinyViT(norm=nn.RMSNorm), None),
    "timm vit_tiny nn.RMSNorm": (_rms_vit_timm(nn.RMSNorm), None),
    "TinyViT LlamaRMSNorm, registered": (lambda: TinyViT(norm=LlamaRMSNorm), LlamaRMSNorm),
    "timm vit_tiny timm RmsNorm, registered": (_rms_vit_timm("RmsNorm"), "RmsNorm"),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(RMS_NETWORKS))
@pytest.mark.slow
def test_an_rmsnorm_is_a_scaling_factor_in_one_rule(name, seed, tmp_path):
    """torch's nn.RMSNorm is one rule in the table (followed whole, scored by its gamma, cut
    normalising over its kept channels); an RMSNorm class of your own (timm's, LLaMA's) is one
    register_layer call. Exact against the zeroed original, the norms at their kept widths,
    saved and loaded back the same; trained sparse by Sparsity."""
    build, own = RMS_NETWORKS[name]
    if own == "RmsNorm":
        own = pytest.importorskip("timm").layers.RmsNorm
    registered = slimming.register_layer(own, RMS_RULE) if own is not None else None
    try:
        torch.manual_seed(seed)
        model = build().eval()
        norms = [(n, m) for n, m in model.named_modules() if isinstance(m, own or nn.RMSNorm)]
        assert norms and all(is_factor_layer(m) for _, m in norms)
        assert {id(m.weight) for _, m in norms} <= {id(p) for p in slimming.Sparsity(model, 1e-4).params}
        sparsity_shaped(model, seed)
        result, x, percent = cut_at_random(model, seed)
        ranked, cut = result.ranked
        assert cut == math.floor(percent * ranked) and cut > 0
        for n, _ in norms:
            small = result.model.get_submodule(n)
            assert small.weight.shape == (int(result.masks[n].sum()),)
            assert getattr(small, "normalized_shape", small.weight.shape) == small.weight.shape
        assert any(not bool(result.masks[n].all()) for n, _ in norms)
        slimming.save_pruned(result.model, tmp_path / "rms.pth")
        loaded = slimming.load_pruned(tmp_path / "rms.pth", build()).eval()
        with torch.no_grad():
            assert torch.equal(loaded(x), result.model(x))
    finally:
        if registered is not None:
            registered.remove()


def test_an_rmsnorm_not_over_its_channels_alone_is_kept():
    """An RMSNorm over more than the channels (here the last two dims) normalises each channel
    by others' statistics: kept, the rest still cut."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.RMSNorm([8, 8]),
                          nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    sparsity_shaped(model, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.3, example_inputs=torch.randn(1, 3, 8, 8), compensate=False)
    assert result.masks["1"].all() and not result.masks["4"].all()
    assert result.model[2].normalized_shape == (8, 8)


def test_sparsity_trains_the_layernorm_gammas_too():
    model = TinyViT()
    sparsity = slimming.Sparsity(model, strength=1e-3)
    assert {id(p) for p in sparsity.params} == {id(m.weight) for _, m in layer_norms(model)}


class WidthFromInput(nn.Module):
    """Attention whose heads' width comes from its input's (torchvision's MaxViT; timm's Swin-v2,
    which also holds that width in an attribute it never reads, ``held``): cut the channels it
    reads and its reshape fails. ``held="counted"``: the width counted off the input's size
    (``x.numel() // (b * n)``), a number the trace cannot tell from the attribute ``self.dim``."""

    def __init__(self, dim: int, heads: int, held: bool | str = True):
        super().__init__()
        if held:
            self.dim = dim
        self.counted = held == "counted"
        self.heads, self.norm, self.qkv, self.proj = heads, nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), \
            nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = (x.size(0), x.size(1), x.numel() // (x.size(0) * x.size(1))) if self.counted else x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        o = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
        return x + self.proj(o)


class ReadsItsWidth(nn.Module):
    def __init__(self, held: bool | str = True):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 24, 4, 4), nn.BatchNorm2d(24))
        self.attn, self.norm, self.head = WidthFromInput(24, 2, held), nn.LayerNorm(24), nn.Linear(24, 10)

    def forward(self, x):
        return self.head(self.norm(self.attn(self.stem(x).flatten(2).transpose(1, 2))).mean(1))


def test_a_block_whose_cut_fails_the_check_is_kept_whole_and_the_rest_still_cut():
    torch.manual_seed(0)
    model = ReadsItsWidth(held="counted").eval()
    sparsity_shaped(model, 0)
    x = torch.randn(2, 3, 32, 32)
    with pytest.warns(UserWarning, match="every WidthFromInput is kept whole"):
        result = slimming.prune(model, percent=0.3, example_inputs=x[:1], compensate=False)
    assert result.masks["stem.4"].all() and result.masks["attn.norm"].all()  # what it reads: kept
    assert not result.masks["stem.1"].all()  # the rest: cut, exactly
    *_, retry = result.retries  # what the check refused, in the result as in the warnings:
    assert [r.kept for r in result.retries] == ["sizes", "block"]  # heads first, then the block
    assert retry.kept == "block" and retry.modules == ["WidthFromInput"] and retry.failed == "match"
    assert str(retry).startswith("every WidthFromInput is kept whole: cut, the network did not match")
    with torch.no_grad():
        assert rel_diff(result.model(x), zeroed(model, result.masks)(x)) < 1e-4


@pytest.mark.parametrize("how", ["ignore", "keep_whole", "refused"])
def test_a_block_kept_is_said_to_be_kept_as_it_was_asked(how):
    """Hostile round 6, low: channels kept because a cut of their block failed the check (a
    diffusers UNet's ResNet blocks, timm's coat) were said to be "in ignore" with ``ignore=()``;
    each reason now names what kept them: the user's ignore, keep_whole, or the refused cut."""
    model = ReadsItsWidth().eval()
    kept = {how: "attn" if how == "ignore" else (WidthFromInput,)}
    traced = trace(model, torch.zeros(1, 3, 32, 32), **kept)
    said = {why for _, why in traced.graph.pins if why.startswith("attn")}
    assert said
    phrases = {"ignore": "is in ignore", "keep_whole": "is in keep_whole",
               "refused": "is kept whole (a cut of it failed the check, as warned)"}
    assert any(phrases[how] in why for why in said), said
    assert not [why for why in said for k, other in phrases.items() if k != how and other in why], said


@pytest.mark.parametrize("held", [False, True])
def test_a_block_reshaping_by_a_width_it_does_not_hold_is_kept_from_the_start(held):
    """The same attention holding no attribute of that width (EVA's, BEiT's ``reshape(B, N,
    C)``), or one it never reads (``held``: timm's Swin-v2 and PVT-v2, whose ``self.dim`` equals
    ``C``; before, cut, refused twice and kept whole): the trace sees that the cut cannot set
    it, and keeps what the retries kept before (what it reads, its heads) in the first cut,
    with no check refused."""
    torch.manual_seed(0)
    model = ReadsItsWidth(held=held).eval()
    sparsity_shaped(model, 0)
    x = torch.randn(2, 3, 32, 32)
    result = slimming.prune(model, percent=0.3, example_inputs=x[:1], compensate=False)
    assert not result.retries
    assert result.masks["stem.4"].all() and result.masks["attn.norm"].all()  # what it reads: kept
    assert not result.masks["stem.1"].all()
    with torch.no_grad():
        assert rel_diff(result.model(x), zeroed(model, result.masks)(x)) < 1e-4


class ResizedPositions(nn.Module):
    """A ViT whose position embedding is resampled to the input's grid in the forward, as
    Hugging Face's DPT (``_resize_pos_embed``) and timm's ``dynamic_img_size`` do: sliced, laid
    out as a grid, interpolated, laid back as tokens, the class token's put back in front."""

    def __init__(self, dim: int = 24, grid: int = 4):
        super().__init__()
        self.grid, self.patch = grid, nn.Conv2d(3, dim, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + grid * grid, dim))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 5)

    def forward(self, x):
        tokens = self.patch(x)
        h, w = tokens.shape[-2:]
        tokens = tokens.flatten(2).transpose(1, 2)
        prefix, grid = self.pos_embed[:, :1], self.pos_embed[0, 1:]
        grid = grid.reshape(1, self.grid, self.grid, -1).permute(0, 3, 1, 2)
        grid = nn.functional.interpolate(grid, size=(h, w), mode="bilinear", align_corners=False)
        pos = torch.cat([prefix, grid.permute(0, 2, 3, 1).reshape(1, h * w, -1)], dim=1)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), tokens], dim=1) + pos
        return self.head(self.norm(x)[:, 0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_position_embedding_resampled_in_the_forward_is_cut_along_its_channels(seed):
    """Issue 47, item 4: the resampled position embedding was "an op with a tensor over the
    channels that is no module's per-channel parameter" and kept every channel of the tokens
    (Hugging Face's DPT, timm's ViT with dynamic_img_size at another size than it was built
    for); now its channels are followed through the slice, grid, interpolation and tokens, and
    the parameter is cut along them with the LayerNorm's: exact at several sizes."""
    torch.manual_seed(seed)
    model = ResizedPositions().eval()
    sparsity_shaped(model, seed)
    result = slimming.prune(model, percent=0.3, example_inputs=torch.zeros(1, 3, 48, 48), compensate=False)
    kept = result.cfg["norm"]
    assert kept < 24 and result.model.pos_embed.shape == (1, 17, kept)
    assert result.model.norm.weight.numel() == kept == result.model.patch.out_channels
    assert result.model.cls_token.shape[-1] == kept
    reference = zeroed(model, result.masks)
    for side in (32, 48, 64):
        x = torch.randn(2, 3, side, side)
        with torch.no_grad():
            assert rel_diff(result.model(x), reference(x)) < 1e-5, side


def test_timms_vit_at_another_size_than_it_was_built_for_is_cut():
    """timm's ViT with ``dynamic_img_size=True`` run at 48x48 after being built for 64x64
    resamples its position embedding in every forward: cut as at its own size."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=64, dynamic_img_size=True)
    model.eval()
    sparsity_shaped(model, 0)
    result = slimming.prune(model, percent=0.3, example_inputs=torch.zeros(1, 3, 48, 48), compensate=False)
    assert result.model.pos_embed.shape[-1] == result.model.patch_embed.proj.out_channels < 192
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert rel_diff(result.model(x), zeroed(model, result.masks)(x)) < 1e-5
