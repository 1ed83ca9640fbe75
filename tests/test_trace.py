"""The real-forward trace (slimming.pruning.trace) on the patterns torch.fx refused or the graph
did not follow: CSP splits, C2f chunks kept in a Python list, channel slices, transposed
convolutions, grouped convolutions, functional layers, shape checks and Python indexing in
forward, nested outputs, a detection head kept by ``ignore=``, frozen BatchNorms; and the timm
and torchvision networks built from them.

The promise for each, over random sparsity-shaped gammas and several percents: the pruned
network's outputs equal the original's with the cut channels' gamma and beta zeroed in every
BatchNorm of their group, and the original is left untouched."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_diff, sparsity_shaped, zeroed
from torch import nn

import slimming
from slimming.layers.gates import gated_layers
from slimming.pruning.trace import trace

torchvision = pytest.importorskip("torchvision")


def cbr(i: int, o: int, k: int = 3, s: int = 1, g: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(i, o, k, s, k // 2, groups=g, bias=False), nn.BatchNorm2d(o), nn.SiLU())


class CSPSplit(nn.Module):
    """timm's CspStage: the expanded tensor split by a fixed size, one half through blocks."""

    def __init__(self):
        super().__init__()
        self.stem, self.exp = cbr(3, 16), cbr(16, 32, 1)
        self.blocks, self.trans_b = nn.Sequential(cbr(16, 16), cbr(16, 16)), cbr(16, 16, 1)
        self.trans, self.head = cbr(32, 24, 1), nn.Linear(24, 5)

    def forward(self, x):
        xs, xb = self.exp(self.stem(x)).split(16, dim=1)
        out = self.trans(torch.cat([xs, self.trans_b(self.blocks(xb))], dim=1))
        return self.head(out.mean((2, 3)))


class Bottleneck(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.cv1, self.cv2 = cbr(c, c), cbr(c, c)

    def forward(self, x):
        return x + self.cv2(self.cv1(x))


class C2f(nn.Module):
    """YOLOv8's block: chunk into a Python list, extend it with bottlenecks of the last piece."""

    def __init__(self, c1: int, c2: int, n: int = 2):
        super().__init__()
        self.c = c2 // 2
        self.cv1, self.cv2 = cbr(c1, 2 * self.c, 1), cbr((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class C2fNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.block, self.head = cbr(3, 16, 3, 2), C2f(16, 32), nn.Conv2d(32, 6, 1)

    def forward(self, x):
        return self.head(self.block(self.stem(x)))


class Ghost(nn.Module):
    """GhostNet's module: a cheap depthwise copy concatenated, then sliced to ``out``."""

    def __init__(self, i: int, out: int):
        super().__init__()
        init = (out + 1) // 2
        self.out, self.primary, self.cheap = out, cbr(i, init, 1), cbr(init, init, 3, g=init)

    def forward(self, x):
        x1 = self.primary(x)
        return torch.cat([x1, self.cheap(x1)], dim=1)[:, :self.out, :, :]


class GhostNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.g1, self.g2, self.g3 = cbr(3, 16), Ghost(16, 13), Ghost(13, 16), Ghost(16, 24)
        self.fc = nn.Linear(24, 4)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.g3(self.g2(self.g1(self.stem(x)))), 1), 1))


class RexSlice(nn.Module):
    """ReXNet's shortcut: added to the first channels only, the rest concatenated after."""

    def __init__(self):
        super().__init__()
        self.stem, self.exp, self.pwl, self.out = cbr(3, 16), cbr(16, 48, 1), cbr(48, 24, 1), cbr(24, 32)

    def forward(self, x):
        x = self.stem(x)
        y = self.pwl(self.exp(x))
        y = torch.cat([y[:, 0:16] + x, y[:, 16:]], dim=1)
        return self.out(y)


class Decoder(nn.Module):
    """A small UNet: a strided encoder, a transposed-convolution decoder, a skip concatenation,
    per-pixel logits."""

    def __init__(self):
        super().__init__()
        self.enc1, self.down = cbr(3, 16), cbr(16, 32, 3, 2)
        self.up = nn.Sequential(nn.ConvTranspose2d(32, 16, 2, 2), nn.BatchNorm2d(16), nn.ReLU())
        self.fuse, self.logits = cbr(32, 16), nn.Conv2d(16, 3, 1)

    def forward(self, x):
        e = self.enc1(x)
        return self.logits(self.fuse(torch.cat([e, self.up(self.down(e))], 1)))


class Grouped(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.g1, self.g2 = cbr(3, 32), cbr(32, 32, 3, g=4), cbr(32, 64, 3, g=4)
        self.pw, self.fc = cbr(64, 24, 1), nn.Linear(24, 3)

    def forward(self, x):
        return self.fc(self.pw(self.g2(self.g1(self.stem(x)))).mean((2, 3)))


class Checks(nn.Module):
    """Python the torch.fx tracer refused: shape checks, data-dependent branches, layers picked
    by index, a functional convolution with a module's parameters."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([cbr(3, 16), cbr(16, 16), cbr(16, 24)])
        self.conv, self.bn = nn.Conv2d(24, 24, 3, padding=1, bias=False), nn.BatchNorm2d(24)
        self.fc = nn.Linear(24, 2)

    def forward(self, x):
        assert x.dim() == 4, "an image batch"
        if x.shape[-1] != x.shape[-2]:
            raise ValueError("square images only")
        for i in range(len(self.layers)):
            x = self.layers[i](x)
            if x.shape[1] > 16 and float(x.abs().sum()) >= 0:
                x = x * 1.0
        x = F.relu(self.bn(F.conv2d(x, self.conv.weight, None, padding=1)))
        return self.fc(x.mean((2, 3)))


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.fc = cbr(3, 16), cbr(16, 24), cbr(24, 8), nn.Linear(8, 3)

    def forward(self, x):
        f1 = self.a(x)
        f2 = self.b(f1)
        f3 = self.c(f2)
        return {"logits": self.fc(f3.mean((2, 3))), "features": [f3, (F.max_pool2d(f3, 2),)]}


class Head(nn.Module):
    """A YOLO-style detect head with its eval-time decoding: views, a concatenation over the
    anchors, a split into boxes and classes, a softmax. Kept whole by ``ignore=``."""

    def __init__(self, chs=(16, 24), nc=3):
        super().__init__()
        self.no = 4 + nc
        self.cv = nn.ModuleList(nn.Sequential(cbr(c, 16), nn.Conv2d(16, self.no, 1)) for c in chs)

    def forward(self, xs):
        out = torch.cat([cv(x).view(x.shape[0], self.no, -1) for cv, x in zip(self.cv, xs)], 2)
        box, cls = out.split((4, self.no - 4), 1)
        return torch.cat([box.view(box.shape[0], 4, -1).permute(0, 2, 1).softmax(-1),
                          cls.sigmoid().transpose(1, 2)], 2)


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.p3 = nn.Sequential(cbr(3, 16, 3, 2), cbr(16, 16))
        self.p4, self.head = nn.Sequential(cbr(16, 24, 3, 2), cbr(24, 24)), Head()

    def forward(self, x):
        a = self.p3(x)
        return self.head([a, self.p4(a)])


class FrozenBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.frozen = torchvision.ops.FrozenBatchNorm2d(16)
        self.conv2, self.bn = nn.Conv2d(16, 24, 3, padding=1, bias=False), nn.BatchNorm2d(24)
        self.conv3, self.bn3 = nn.Conv2d(24, 8, 1, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        x = F.relu(self.frozen(self.conv1(x)))
        return self.bn3(self.conv3(F.relu(self.bn(self.conv2(x)))))


def flat(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.flatten()
    values = out.values() if isinstance(out, dict) else out
    return torch.cat([flat(v) for v in values])


def check_exact(model: nn.Module, x: torch.Tensor, percents=(0.2, 0.5, 0.8), seed: int = 0, **kw):
    """Prune at each percent; the pruned network equals the zeroed original (and has fewer
    parameters); the original is untouched. Returns the last result."""
    model.eval()
    sparsity_shaped(model, seed)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = sum(p.numel() for p in model.parameters())
    for percent in percents:
        result = slimming.prune(model, percent=percent, example_inputs=x[:1], compensate=False, **kw)
        with torch.no_grad():
            a, b = flat(result.model(x)), flat(zeroed(model, result.masks)(x))
        assert rel_diff(a, b) < 1e-4, percent
        assert sum(p.numel() for p in result.model.parameters()) < params, percent
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    return result


class Picks(nn.Module):
    """Channels picked by an index list, a step and from the end: fixed positions, pinned up to
    the last one read (from the end: all)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = cbr(3, 16), cbr(16, 12), cbr(4 + 6, 8)

    def forward(self, x):
        y = self.b(self.a(x))
        last = y[:, -8:].mean(1, keepdim=True)
        return self.c(torch.cat([y[:, [0, 2, 3, 5]], y[:, ::2]], 1)) + last


class Maxed(nn.Module):
    """An element-wise max of two branches ties them, as a sum does; a one-slope PReLU keeps
    zeros."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.b = cbr(8, 8)[:2]
        self.act, self.c = nn.PReLU(), cbr(8, 6)

    def forward(self, x):
        y = self.act(self.a(x))
        return self.c(torch.max(y, self.b(y)))


PATTERNS = {"max-and-prelu": Maxed, "index-list-and-step": Picks, "csp-split": CSPSplit,
            "c2f-chunk-list": C2fNet,
            "ghost-slice": GhostNet, "rexnet-slice": RexSlice, "transposed-decoder": Decoder,
            "grouped": Grouped,
            "shape-checks-functional": Checks, "nested-outputs": Nested}


@pytest.mark.parametrize("name", PATTERNS)
@pytest.mark.parametrize("seed", [0, 1])
def test_pruned_equals_the_zeroed_original_on_every_pattern(name, seed):
    torch.manual_seed(seed)
    check_exact(PATTERNS[name](), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed)),
                seed=seed)


def test_a_c2f_chunk_is_cut_in_equal_halves_and_each_half_on_its_own():
    torch.manual_seed(0)
    model = C2fNet()
    result = check_exact(model, torch.randn(2, 3, 32, 32))
    half = result.masks["block.cv1.1"].view(2, -1).sum(1)
    assert half[0] == half[1]  # chunk(2) of the pruned tensor gives the pruned halves
    # the second half is tied to the bottlenecks' outputs (their residual sums), the first is not
    graph = trace(model, torch.zeros(1, 3, 32, 32)).graph
    second = next(g for g in graph.groups() if any(b[0] == "block.m.0.cv2.1" for b in g.bns))
    assert {b[0] for b in second.bns} >= {"block.cv1.1", "block.m.0.cv2.1", "block.m.1.cv2.1"}
    first = next(g for g in graph.groups() if any(b[0] == "block.cv1.1" and b[1] == 0 for b in g.bns))
    assert first is not second and first.prunable and second.prunable


def test_fixed_slices_and_splits_pin_the_channels_before_their_bounds():
    graph = trace(RexSlice(), torch.zeros(1, 3, 32, 32)).graph
    pwl = next(g for g in graph.groups() if any(b[0] == "pwl.1" for b in g.bns))
    assert pwl.prunable and pwl.pinned[:16].all() and not pwl.pinned[16:].any()
    graph = trace(CSPSplit(), torch.zeros(1, 3, 32, 32)).graph
    exp = next(g for g in graph.groups() if any(b[0] == "exp.1" for b in g.bns))
    assert not exp.prunable and "split into fixed sizes" in exp.reason


def test_a_transposed_convolution_is_cut_on_both_sides():
    torch.manual_seed(0)
    result = check_exact(Decoder(), torch.randn(2, 3, 32, 32), percents=(0.6,))
    up = result.model.up[0]
    assert up.weight.shape == (result.model.down[0].out_channels, up.out_channels, 2, 2)
    assert up.out_channels == int(result.masks["up.1"].sum()) < 16


def test_ignore_keeps_what_a_head_makes_and_keep_whole_what_it_reads_too():
    torch.manual_seed(0)
    model = Detector()
    x = torch.randn(2, 3, 32, 32)
    # the decoding works on the outputs' channels, which are kept: followed as opaque
    free = check_exact(model, x)
    assert free.model.head.cv[0][0][0].out_channels < 16
    # ignore=: the head's own widths stay; the features it reads are cut where they are made
    result = check_exact(model, x, ignore="head")
    for name, m in model.head.named_modules():
        new = result.model.head.get_submodule(name)
        if isinstance(m, nn.Conv2d):
            assert new.out_channels == m.out_channels, name
        elif isinstance(m, nn.BatchNorm2d):
            assert new.weight.shape == m.weight.shape, name
    assert result.model.head.cv[0][0][0].in_channels < 16 and result.model.p4[1][0].out_channels < 24
    # keep_whole=: every tensor of the head as it was, what it reads included
    whole = check_exact(model, x, keep_whole="head")
    for name, m in model.head.named_modules():
        if isinstance(m, (nn.Conv2d, nn.BatchNorm2d)):
            assert whole.model.head.get_submodule(name).weight.shape == m.weight.shape, name
    assert whole.model.p4[0][0].out_channels < 24 and whole.model.p4[1][0].out_channels == 24


@pytest.mark.parametrize("seed", [0, 1])
def test_frozen_batchnorms_score_their_channels_as_batchnorms_do(seed):
    """A frozen BatchNorm (a pretrained detector's backbone) carries a real signal in its gamma:
    it scores its channels, the cut equals the original with those gammas and betas zeroed,
    its buffers cut with them (issue 34; it was kept whole before)."""
    result = check_exact(FrozenBlock(), torch.randn(2, 3, 16, 16), percents=(0.3, 0.6), seed=seed)
    assert result.model.conv1.out_channels < 16 and result.model.frozen.weight.numel() < 16
    assert result.model.conv2.in_channels == result.model.conv1.out_channels


def test_a_torchvision_resnet_on_frozen_batchnorms_is_cut_and_unfrozen_for_sparsity_training():
    """torchvision's ResNet-18 built on ``FrozenBatchNorm2d`` (as its detection models build a
    pretrained backbone): cut exactly by its frozen gammas; ``unfreeze_batchnorms`` gives
    BatchNorms that compute the same in eval mode and whose gammas sparsity training moves."""
    from torchvision.ops import FrozenBatchNorm2d
    model = torchvision.models.resnet18(weights=None, num_classes=10, norm_layer=FrozenBatchNorm2d)
    x = torch.randn(2, 3, 32, 32)
    result = check_exact(model, x, percents=(0.4,))
    assert result.model.layer1[0].conv1.out_channels < 64
    with torch.no_grad():
        before = model(x)
    names = slimming.unfreeze_batchnorms(model)
    assert len(names) == 20 and not any(type(m) is FrozenBatchNorm2d for m in model.modules())
    with torch.no_grad():
        assert rel_diff(model.eval()(x), before) < 1e-5
    sparsity = slimming.Sparsity(model, strength=1e-2)
    assert len(sparsity.params) == 20
    model.train()
    model(x).sum().backward()
    gamma = model.bn1.weight.detach().clone()
    sparsity.apply()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.equal(model.bn1.weight.detach(), gamma)


def test_a_layer_the_example_never_runs_is_named_and_left_whole():
    class Either(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = cbr(3, 16), cbr(16, 16), cbr(16, 16)

        def forward(self, x):
            x = self.a(x)
            return self.c(x if x.shape[-1] < 64 else self.b(x))

    model = Either()
    sparsity_shaped(model, 1)
    with pytest.warns(UserWarning, match=r"2 layer\(s\) did not run .* b\.0, b\.1"):
        traced = trace(model, torch.zeros(1, 3, 32, 32))
    assert "b.1" in traced.coverage.unseen
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.5, example_inputs=torch.zeros(1, 3, 32, 32))
    assert result.model.b[0].weight.shape == model.b[0].weight.shape


TIMM = ["cspdarknet53", "res2net50_26w_4s", "ghostnet_100", "rexnet_100", "cspresnet50"]


@pytest.mark.parametrize("name", TIMM)
@pytest.mark.slow
def test_timm_networks_built_from_these_patterns(name):
    timm = pytest.importorskip("timm")
    model = timm.create_model(name, pretrained=False, num_classes=10)
    check_exact(model, torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2)),
                percents=(0.3, 0.7), seed=len(name))


@pytest.mark.parametrize("name", ["lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large"])
def test_torchvision_segmentation_models(name):
    build = getattr(torchvision.models.segmentation, name)
    model = build(weights=None, weights_backbone=None, num_classes=5)
    result = check_exact(model, torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3)),
                         percents=(0.3, 0.7))
    assert result.model(torch.zeros(1, 3, 64, 64))["out"].shape == (1, 5, 64, 64)


@pytest.mark.parametrize("make", [Grouped, Decoder, FrozenBlock, C2fNet], ids=lambda m: m.__name__)
def test_a_pruned_network_of_these_layers_saves_and_loads_into_a_fresh_instance(make, tmp_path):
    torch.manual_seed(0)
    model = make().eval()
    sparsity_shaped(model, 4)
    x = torch.randn(2, 3, 32, 32)
    result = slimming.prune(model, percent=0.5, example_inputs=x[:1])
    slimming.save_pruned(result.model, tmp_path / "pruned.pth")
    loaded = slimming.load_pruned(tmp_path / "pruned.pth", make()).eval()
    with torch.no_grad():
        assert torch.equal(flat(loaded(x)), flat(result.model.eval()(x)))
    assert sum(p.numel() for p in loaded.parameters()) < sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch,encoder", [("Unet", "resnet18"), ("FPN", "efficientnet-b0"),
                                          ("DeepLabV3Plus", "resnet18")])
@pytest.mark.slow
def test_segmentation_models_pytorch_decoders(arch, encoder):
    """Decoders others wrote (a test extra: segmentation-models-pytorch, MIT), their encoders'
    channels cut where a skip connection or a GroupNorm decoder reads them."""
    smp = pytest.importorskip("segmentation_models_pytorch")
    torch.manual_seed(0)
    model = getattr(smp, arch)(encoder, encoder_weights=None, classes=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_exact(model, torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5)),
                             percents=(0.3, 0.7))
    assert result.model(torch.zeros(1, 3, 64, 64)).shape == (1, 3, 64, 64)


@pytest.mark.parametrize("arch", ["Segformer", "UPerNet"])
@pytest.mark.slow
def test_mix_transformer_tokens_to_a_map_and_back_are_cut_exactly(arch):
    """smp's Mix-Transformer encoder (``mit_b0``, as PVT-v2 writes its blocks): a Mix-FFN makes
    its tokens (B, N, C) a map for a depthwise convolution and tokens again; its attention
    reads the tokens' width from their shape, which the cut cannot set, so it is kept whole
    (two cuts made again) and the rest is cut: the Mix-FFN's hidden widths (gated) and the
    decoder's channels, exactly."""
    smp = pytest.importorskip("segmentation_models_pytorch")
    if not hasattr(smp, arch):
        pytest.skip(f"{arch} is newer than this segmentation-models-pytorch")
    torch.manual_seed(0)
    model = getattr(smp, arch)("mit_b0", encoder_weights=None, classes=3).eval()
    result = gated_cut(model, torch.zeros(1, 3, 64, 64))
    hidden = [m.out_features for n, m in result.model.named_modules() if n.endswith("mlp.fc1")]
    assert len(hidden) == 8 and sum(hidden) < 2 * (128 + 256 + 640 + 1024)  # mit_b0's, before


def gated_cut(model: nn.Module, x: torch.Tensor, **options):
    """``add_gates``, sparsity-shaped factors, a 30% cut without compensation, checked here too
    against the original with the cut channels zeroed on another input: the result."""
    slimming.add_gates(model, x)
    sparsity_shaped(model, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False, **options)
    probe = torch.randn(2, *x.shape[1:], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5
    return result


def test_a_projection_after_heads_merged_by_a_kept_reshape_still_makes_channels_that_are_cut():
    """timm's MViTv2: an attention whose pooled heads the trace keeps (an einsum of relative
    positions, ``attn @ v + q``) merges them by a reshape and projects them with a linear layer.
    The projection reads what the trace kept but makes the residual stream's channels: those are
    cut (before, its output took the kept heads' dimension, the block's residual sum saw
    'operands with their channels in different dimensions' and no channel of the network was cut)."""
    mvitv2 = pytest.importorskip("timm.models.mvitv2")
    torch.manual_seed(0)
    model = mvitv2.MultiScaleVit(mvitv2.MultiScaleVitCfg(depths=(1, 2), embed_dim=16, num_heads=1),
                                 img_size=64, num_classes=5).eval()
    result = gated_cut(model, torch.zeros(1, 3, 64, 64))
    widths = {n: m.out_features for n, m in result.model.named_modules() if n.endswith("attn.proj")}
    assert len(widths) == 3 and sum(widths.values()) < 16 + 32 + 32  # the residual streams, cut


def test_transformer_in_transformer_pixel_tokens_are_cut():
    """timm's TNT: inner tokens of pixels (B * patches, pixels, inner_dim) and outer tokens of
    patches, the inner ones flattened into each patch's projection. Refused whole before
    ('no scaling factor scores any channel'): the linear layers reading what the trace keeps
    now make channels of their own, and the gated MLP widths are cut."""
    tnt = pytest.importorskip("timm.models.tnt")
    torch.manual_seed(0)
    model = tnt.TNT(img_size=32, patch_size=8, embed_dim=32, inner_dim=8, depth=2, num_heads_inner=2,
                    num_heads_outer=2, num_classes=5).eval()
    result = gated_cut(model, torch.zeros(1, 3, 32, 32))
    hidden = [m.out_features for n, m in result.model.named_modules() if n.endswith("mlp.fc1")]
    assert len(hidden) == 2 and sum(hidden) < 2 * 128  # the outer MLPs' hidden widths, cut


def test_bottleneck_self_attention_keeps_no_channel_of_its_block():
    """timm's sebotnet33ts_256: a bottleneck block whose 3x3 convolution is a self-attention with
    relative positions (its output projected by a 1x1 convolution, then the residual sum). Before,
    the projection's output took the attention's dimension, the sum saw 'operands with their
    channels in different dimensions' and kept 3072 channels (23.6% of the parameters cut, 41.0%
    now at 256x256)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("sebotnet33ts_256", pretrained=False, num_classes=5, img_size=64).eval()
    sparsity_shaped(model, 0)
    x = torch.zeros(1, 3, 64, 64)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert not [str(w.message) for w in said if "kept channels it cannot follow" in str(w.message)]
    attention = [n for n, m in model.named_modules() if type(m).__name__ == "SelfAttnBlock"]
    assert attention and all(result.model.get_submodule(f"{n}.conv1_1x1.conv").out_channels
                             < model.get_submodule(f"{n}.conv1_1x1.conv").out_channels for n in attention)
    probe = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5


class TokensIn(nn.Module):
    """A network fed tokens (B, N, C_in), as a point-cloud or sequence model is: embedded by a
    linear layer, then a pre-norm MLP block with a residual."""

    def __init__(self, c: int = 32):
        super().__init__()
        self.embed, self.norm0 = nn.Linear(12, c), nn.LayerNorm(c)
        self.norm1, self.fc1, self.fc2 = nn.LayerNorm(c), nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.norm2, self.head = nn.LayerNorm(c), nn.Linear(c, 5)

    def forward(self, x):
        x = self.norm0(self.embed(x))
        x = x + self.fc2(F.gelu(self.fc1(self.norm1(x))))
        return self.head(self.norm2(x).mean(1))


def test_a_token_input_is_not_taken_for_channels():
    """An input (B, N, C): the first linear layer reads its last dim, not dim 1, and makes
    channels of its own; before, its output took the tokens' dimension, add_gates found nothing
    and prune said 'no scaling factor scores any channel' beside three LayerNorms."""
    torch.manual_seed(0)
    model = TokensIn().eval()
    result = gated_cut(model, torch.randn(2, 16, 12), ignore="head")
    assert gated_layers(model) == {"fc2": 128}  # the gate add_gates found
    assert result.model.embed.out_features == result.model.norm2.normalized_shape[0]  # tied, followed
    assert result.model.fc1.out_features < 128


# Layout changes and their inverses, each (forward, inverse) on an (N, C, H, W) tensor, as
# channels-last and token networks write them
LAYOUTS = {
    "permute": (lambda x: x.permute(0, 2, 3, 1), lambda x: x.permute(0, 3, 1, 2)),
    "movedim": (lambda x: x.movedim(1, -1), lambda x: torch.movedim(x, 3, 1)),
    "transposes": (lambda x: x.transpose(1, 3).transpose(1, 2),
                   lambda x: x.transpose(1, 2).transpose(1, 3)),
    "tokens": (lambda x: x.flatten(2).transpose(1, 2).unflatten(1, x.shape[2:]),
               lambda x: x.flatten(1, 2).transpose(1, 2).reshape(x.shape[0], x.shape[3], *x.shape[1:3])),
    "view-tokens": (lambda x: x.reshape(*x.shape[:2], -1).mT.reshape(x.shape[0], *x.shape[2:], -1),
                    lambda x: x.reshape(x.shape[0], -1, x.shape[3]).mT.reshape(x.shape[0], x.shape[3],
                                                                                  x.shape[1], -1)),
}
# what runs on the channels-last tensor in between: element-wise, a per-channel scale of the
# last dim, a sum of two tokens views (a residual in that layout), a mean over the tokens added back
BETWEEN = {
    "gelu": lambda m, x: F.gelu(x),
    "scale": lambda m, x: x * m.gamma,
    "residual": lambda m, x: x + F.silu(x),
    "pooled": lambda m, x: x + x.mean((1, 2), keepdim=True),
}


class Layouts(nn.Module):
    """conv+BN, to channels-last by ``there``, ``between`` there, back by ``back``, conv+BN."""

    def __init__(self, there, back, between):
        super().__init__()
        self.a, self.b, self.fc = cbr(3, 16), cbr(16, 12), nn.Linear(12, 5)
        self.gamma = nn.Parameter(torch.rand(16) + 0.5)
        self.there, self.back, self.between = there, back, between

    def forward(self, x):
        y = self.back(self.between(self, self.there(self.a(x))))
        return self.fc(self.b(y).mean((2, 3)))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("between", BETWEEN)
def test_channels_followed_through_any_layout_and_back(layout, between):
    """The channel dimension is followed wherever permutes, views and token reshapes move it:
    the first BatchNorm's channels are cut (not kept), and the network is exact."""
    torch.manual_seed(0)
    model = Layouts(*LAYOUTS[layout], BETWEEN[between])
    x = torch.randn(2, 3, 8, 10)
    with torch.no_grad():
        model.eval()
        assert model.back(model.there(x)).equal(x)  # the pair is a round trip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = check_exact(model, x, percents=(0.5,))
    assert result.masks["a.1"].sum() < 16
    if between == "scale":  # the per-channel parameter of the last dim is cut with its channels
        assert result.model.gamma.shape[0] == result.masks["a.1"].sum()


@pytest.mark.slow
def test_a_detector_whose_proposals_flip_among_near_ties_is_checked_on_what_is_comparable():
    """torchvision's Faster R-CNN on a ResNet-18 FPN of frozen BatchNorms (how it is built on a
    pretrained backbone): at random weights every anchor scores about the same, so the RPN's
    top-k proposals flip under float rounding alone, and the check's fingerprint of ``rpn``
    differed and refused a right cut. Modules whose outputs jump when the original's weights
    are nudged by rounding's size are not compared; everything before them is, exactly."""
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
    from torchvision.ops import FrozenBatchNorm2d
    torch.manual_seed(0)
    backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, norm_layer=FrozenBatchNorm2d,
                                   trainable_layers=5)
    model = FasterRCNN(backbone, num_classes=5, min_size=224, max_size=224).eval()
    sparsity_shaped(model, 0)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.3, example_inputs=torch.zeros(1, 3, 224, 224),
                                compensate=False)
    assert result.verified < 1e-4 and not result.retries
    body = result.model.backbone.body
    assert body.layer1[0].conv1.out_channels < 64
    with torch.no_grad():  # the features the heads read: exact against the zeroed original
        ours = result.model.backbone(x)
        theirs = zeroed(model, result.masks).backbone(x)
    assert all(rel_diff(ours[k], theirs[k]) < 1e-4 for k in theirs)


def test_each_analysis_of_the_forward_listens_on_its_own():
    """``capture`` tells each listener in turn; the flow listeners (``slimming.pruning.flow``)
    need no channel walk: where the forward read a value into Python, the rows a bias was made
    of, what F.pad made and what was computed from parameters alone."""
    from slimming.pruning.capture import capture
    from slimming.pruning.flow import Inputs, Params, Piece

    class Flows(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.part = nn.Parameter(torch.ones(2))

        def forward(self, x):
            bias = torch.cat([self.part, self.part])  # a bias made row by row of a parameter
            weight = self.conv.weight - self.conv.weight.mean()  # computed from parameters alone
            self.kept = weight
            y = F.conv2d(F.pad(x, [1, 1, 1, 1]), weight, bias)
            return y if x.mean() > 0 else -y  # a Python read of what the input became

    model, x = Flows(), torch.randn(1, 3, 8, 8)
    told = []

    class Order:
        def __init__(self, tag):
            self.tag = tag

        def enter(self, *a):
            pass

        def leave(self, *a):
            pass

        def call(self, c):
            told.append(self.tag)

    inputs, params = Inputs(lambda t: True if t is x else None), Params(model)
    capture(model, (x,), [Order(0), inputs, params, Order(1)])
    assert told and told[::2] == [0] * (len(told) // 2) and told[1::2] == [1] * (len(told) // 2)
    assert inputs.reads == [""]  # the model's own forward read a value
    assert [p for _, p in params.rows.values()] == [(Piece("", "part", 2), Piece("", "part", 2))]
    assert params.alone(model.kept) and not params.alone(x)
    assert [list(p.pad) for p in params.pads.values()] == [[1, 1, 1, 1]]
