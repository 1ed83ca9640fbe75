"""A residual branch whose width is cut whole is removed (``slimming.pruning.branches``): its
layers become what they still compute (``Emptied``: nothing; ``Constant``: the bias of a layer
that reads only cut channels), exactly as the original with the cut channels zeroed, on the
families users bring; a chain's width is never removed, a branch only thinned is cut as before;
the removed network saves, loads, shows and exports."""

import copy
import json
import random

import pytest
import timm
import torch
import torchvision
from conftest import refiled, rel_diff, sparsity_shaped, zeroed
from test_trace import C2fNet
from torch import nn

import slimming
from slimming import checkpoint_dict, count_flops, load_model, load_pruned, save_checkpoint, save_pruned
from slimming.cli import main
from slimming.errors import CheckpointError
from slimming.layers.gates import ATTR, gated_layers
from slimming.layers.removed import Constant, Emptied, removed_layers
from slimming.tools.export import export_model


def dense(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every scaling factor well away from zero (|gamma| in (0.5, 1.5)), random betas and
    statistics: a threshold then cuts only what a test drives to zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)) \
                    and m.weight is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                    m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model.eval()


def gated(make, x):
    def build():
        model = make().eval()
        slimming.add_gates(model, x)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name in gated_layers(model):
                getattr(model.get_submodule(name), ATTR).weight.copy_(torch.rand(1, generator=g) + 0.5)
        return model
    return build


def vit():
    return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3)


class HFViT(nn.Module):
    """Hugging Face's ViTModel as users call it, its last hidden state (built for 32x32)."""

    def __init__(self):
        super().__init__()
        import transformers
        cfg = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, image_size=32, patch_size=8)
        self.vit = transformers.ViTModel(cfg, add_pooling_layer=False)

    def forward(self, x):
        return self.vit(pixel_values=x).last_hidden_state


X32, X64 = torch.randn(1, 3, 32, 32), torch.randn(1, 3, 64, 64)

# name: (the network, its input, the factors driven to zero (a gate: its reader, "gate:"), the
# layers then removed: Emptied, Constant; whether compensation is exact there: a 1x1 reader)
FAMILIES = {
    "torchvision resnet18 (basic block)": (torchvision.models.resnet18, X64, ["layer3.1.bn1"],
                                           ["layer3.1.conv1", "layer3.1.bn1"], ["layer3.1.conv2"], False),
    "torchvision mobilenet_v2 (inverted residual)": (
        torchvision.models.mobilenet_v2, X64, ["features.3.conv.0.1", "features.3.conv.1.1"],
        ["features.3.conv.0.0", "features.3.conv.0.1", "features.3.conv.1.0", "features.3.conv.1.1"],
        ["features.3.conv.2"], True),
    "YOLO-style C2f bottleneck (shortcut)": (C2fNet, X32, ["block.m.0.cv1.1"],
                                              ["block.m.0.cv1.0", "block.m.0.cv1.1"], ["block.m.0.cv2.0"],
                                              False),
    # (the norm before them only they read: emptied too)
    "timm ViT, its MLP gated": (gated(vit, X32), X32, ["gate:blocks.1.mlp.fc2"],
                                ["blocks.1.norm2", "blocks.1.mlp.fc1"], ["blocks.1.mlp.fc2"], True),
    "timm ViT, every head of an attention gated off": (gated(vit, X32), X32, ["gate:blocks.1.attn.proj"],
                                                       ["blocks.1.norm1", "blocks.1.attn.qkv"],
                                                       ["blocks.1.attn.proj"], True),
}
SLOW_FAMILIES = {
    "torchvision resnet50 (bottleneck, middle width)": (
        torchvision.models.resnet50, X64, ["layer2.1.bn2"],
        ["layer2.1.conv1", "layer2.1.bn1", "layer2.1.conv2", "layer2.1.bn2"],  # conv1: only they read it
        ["layer2.1.conv3"], True),
    "torchvision resnext50_32x4d (grouped)": (
        torchvision.models.resnext50_32x4d, X64, ["layer2.1.bn2"],
        ["layer2.1.conv1", "layer2.1.bn1", "layer2.1.conv2", "layer2.1.bn2"], ["layer2.1.conv3"], True),
    "torchvision regnet_x_400mf": (
        torchvision.models.regnet_x_400mf, X64, ["trunk_output.block2.block2-1.f.b.1"],
        [f"trunk_output.block2.block2-1.f.{p}" for p in ("a.0", "a.1", "b.0", "b.1")],
        ["trunk_output.block2.block2-1.f.c.0"], True),
    "torchvision mobilenet_v3_small (squeeze-excitation)": (
        torchvision.models.mobilenet_v3_small, X64, ["features.5.block.0.1", "features.5.block.1.1"],
        ["features.5.block.0.0", "features.5.block.0.1", "features.5.block.1.0", "features.5.block.1.1",
         "features.5.block.2.fc2"], ["features.5.block.2.fc1", "features.5.block.3.0"], False),
    "torchvision efficientnet_b0": (
        torchvision.models.efficientnet_b0, X64, ["features.2.1.block.0.1", "features.2.1.block.1.1"],
        ["features.2.1.block.0.0", "features.2.1.block.0.1", "features.2.1.block.1.0",
         "features.2.1.block.1.1", "features.2.1.block.2.fc2"],
        ["features.2.1.block.2.fc1", "features.2.1.block.3.0"], False),
    "timm resnet18": (lambda: timm.create_model("resnet18"), X64, ["layer3.1.bn1"],
                      ["layer3.1.conv1", "layer3.1.bn1"], ["layer3.1.conv2"], False),
    "timm efficientnet_b0": (
        lambda: timm.create_model("efficientnet_b0"), X64, ["blocks.2.1.bn1", "blocks.2.1.bn2"],
        ["blocks.2.1.conv_pw", "blocks.2.1.bn1", "blocks.2.1.conv_dw", "blocks.2.1.bn2",
         "blocks.2.1.se.conv_expand"], ["blocks.2.1.se.conv_reduce", "blocks.2.1.conv_pwl"], False),
    "Hugging Face ViTModel, every head of an attention gated off": (
        gated(HFViT, X32), X32, ["gate:vit.layers.1.attention.o_proj"],
        ["vit.layers.1.layernorm_before", *(f"vit.layers.1.attention.{p}_proj" for p in "qkv")],
        ["vit.layers.1.attention.o_proj"], True),
    "timm convnext_atto, its MLP gated": (
        gated(lambda: timm.create_model("convnext_atto"), X64), X64, ["gate:stages.1.blocks.0.mlp.fc2"],
        [f"stages.1.blocks.0.{p}" for p in ("conv_dw", "norm", "mlp.fc1")], ["stages.1.blocks.0.mlp.fc2"],
        True),
}


def emptied(model: nn.Module, factors: list[str], scale: float = 1e-6, share: float = 1.0) -> nn.Module:
    """``model`` with the first ``share`` of each of ``factors``' gammas (a gate: its reader's
    gate) scaled by ``scale``: the branch sparsity training emptied, or thinned."""
    with torch.no_grad():
        for f in factors:
            layer = getattr(model.get_submodule(f[5:]), ATTR) if f.startswith("gate:") \
                else model.get_submodule(f)
            layer.weight[:round(share * layer.weight.numel())] *= scale
    return model


def cases(families: dict, mark=None):
    return [pytest.param(*v, id=k, marks=[mark] if mark else []) for k, v in families.items()]


@pytest.mark.parametrize("make, x, factors, emptied_layers, constants, exact_compensation",
                         cases(FAMILIES) + cases(SLOW_FAMILIES, pytest.mark.slow))
def test_a_branch_cut_whole_is_removed_exactly(make, x, factors, emptied_layers, constants,
                                               exact_compensation):
    model = emptied(dense(make()), factors)
    r = slimming.prune(model, threshold=1e-4, example_inputs=x, compensate=False)
    assert r.removed == {**{n: "Emptied" for n in emptied_layers}, **{n: "Constant" for n in constants}}
    assert all(isinstance(r.model.get_submodule(n), Emptied) for n in emptied_layers)
    assert all(isinstance(r.model.get_submodule(n), Constant) for n in constants)
    assert r.retries == [] and r.verified is not None
    probe = torch.randn(2, *x.shape[1:-2], x.shape[-2] + 32, x.shape[-1] + 32)  # another size, another batch
    if isinstance(model, (timm.models.VisionTransformer, HFViT)):  # built for one size
        probe = torch.randn(2, *x.shape[1:])
    assert rel_diff(r.model(probe), zeroed(model, r.masks)(probe)) < 1e-5
    # the same cut without removal keeps the branch at min_channels: one channel, every layer
    kept = slimming.prune(model, threshold=1e-4, example_inputs=x, compensate=False, remove_branches=False)
    assert kept.removed == {}
    for name, keep in r.masks.items():
        # (a grouped convolution's width: one channel in each group)
        assert torch.equal(kept.masks[name], keep) or (not keep.any() and 1 <= kept.masks[name].sum() <= 32)
    assert count_flops(r.model, inputs=(x,)) < count_flops(kept.model, inputs=(x,))
    # compensated: against the original with the cut gammas zero (their betas' constants kept),
    # at the example's size (a padded reader's fold is the mean over the example's positions)
    c = slimming.prune(model, threshold=1e-4, example_inputs=x)
    assert c.removed == r.removed
    probe = torch.randn(2, *x.shape[1:])
    near = zeroed(model, c.masks, beta=False)(probe)
    if exact_compensation:  # every reader of the cut channels a 1x1 convolution or linear layer
        assert rel_diff(c.model(probe), near) < 1e-4
    assert rel_diff(c.model(probe), near) <= rel_diff(r.model(probe), near) + 1e-6


@pytest.mark.parametrize("make, x, factors, emptied_layers, constants, exact_compensation", cases(FAMILIES))
def test_a_branch_only_thinned_is_cut_as_without_removal(make, x, factors, emptied_layers, constants,
                                                         exact_compensation):
    model = emptied(dense(make()), factors, share=0.5)
    r = slimming.prune(model, threshold=1e-4, example_inputs=x, compensate=False)
    kept = slimming.prune(model, threshold=1e-4, example_inputs=x, compensate=False, remove_branches=False)
    assert r.removed == {} and any(not m.all() for m in r.masks.values())
    assert all(torch.equal(kept.masks[n], m) for n, m in r.masks.items())
    assert torch.equal(r.model(x), kept.model(x))


@pytest.mark.parametrize("make, factor", [
    (lambda: torchvision.models.vgg11_bn(num_classes=10), "features.5"),  # a chain: no stream around it
    (torchvision.models.mobilenet_v2, "features.2.conv.0.1"),  # an inverted residual without its shortcut
])
def test_a_width_the_network_cannot_go_around_keeps_min_channels(make, factor):
    model = dense(make())
    factors = [factor, factor.replace("conv.0.1", "conv.1.1")] if "conv.0.1" in factor else [factor]
    emptied(model, factors)
    x = torch.randn(1, 3, 32, 32)
    for min_channels in (1, 3):
        r = slimming.prune(model, threshold=1e-4, min_channels=min_channels, example_inputs=x,
                           compensate=False)
        assert r.removed == {} and int(r.masks[factor].sum()) == min_channels
        assert rel_diff(r.model(x), zeroed(model, r.masks)(x)) < 1e-5


@pytest.mark.parametrize("seed", range(4))
def test_random_branches_emptied_under_random_cuts_are_removed_exactly(seed):
    """Property: on resnet18 and mobilenet_v2 with sparsity-shaped factors, three random
    branches emptied and a random share cut, exactly the widths the cut takes whole are
    removed, each of them a branch (never a chain's width), every other width keeps at least
    one channel, and the network is the zeroed original's."""
    rng = random.Random(seed)
    nets = ((torchvision.models.resnet18, [f"layer{i}.{j}.bn1" for i in (1, 2) for j in (0, 1)]),
            (torchvision.models.mobilenet_v2, [f"features.{i}.conv.0.1" for i in (3, 5, 6)]))
    for make, branches in nets:
        model = make(num_classes=7).eval()
        sparsity_shaped(model, seed)
        chosen = rng.sample(branches, 3)
        partners = {b: b.replace("conv.0.1", "conv.1.1") for b in branches if "conv.0.1" in b}
        emptied(model, chosen + [partners[b] for b in chosen if b in partners], 1e-4)
        x = torch.randn(1, 3, 48, 48)
        r = slimming.prune(model, percent=rng.uniform(0.3, 0.5), example_inputs=x, compensate=False)
        whole = {n for n, m in r.masks.items() if not m.any()}
        assert set(chosen) <= whole <= set(branches) | set(partners.values()), (chosen, whole)
        assert {n for n in r.removed if n in r.masks} == whole
        probe = torch.randn(3, 3, 40, 40)
        assert rel_diff(r.model(probe), zeroed(model, r.masks)(probe)) < 1e-5


@pytest.fixture(scope="module")
def removed_resnet18():
    model = emptied(dense(torchvision.models.resnet18(num_classes=10)), ["layer2.1.bn1", "layer3.0.bn1"])
    model.arch, model.options, model.cfg = "torchvision:resnet18", {"num_classes": 10}, {}
    return model, slimming.prune(model, threshold=1e-4, example_inputs=X64)


def test_a_removed_branch_saves_and_loads_exactly(removed_resnet18, tmp_path):
    model, r = removed_resnet18
    assert "layer2.1.conv2" in r.removed and "layer3.0.conv2" in r.removed
    x = torch.randn(2, 3, 64, 64)
    save_pruned(r.model, tmp_path / "p.pt")
    back = load_pruned(tmp_path / "p.pt", torchvision.models.resnet18(num_classes=10))
    assert torch.equal(back(x), r.model(x)) and removed_layers(back) == r.removed
    assert not any("layer2.1.conv1." in k or "layer2.1.bn1." in k for k in back.state_dict())
    r.model.arch, r.model.options = model.arch, model.options
    save_checkpoint(checkpoint_dict(r.model), tmp_path / "c.pth")
    again = load_model(tmp_path / "c.pth")
    assert torch.equal(again(x), r.model(x)) and removed_layers(again) == r.removed


def convnext10():
    return timm.create_model("convnext_atto", num_classes=10)


def resnet50_10():
    return torchvision.models.resnet50(num_classes=10)


@pytest.mark.parametrize("fresh, make, arch, factor, unread", [
    (resnet50_10, resnet50_10, "torchvision:resnet50", "layer2.1.bn2", ["layer2.1.conv1", "layer2.1.bn1"]),
    (convnext10, gated(convnext10, X64), "timm:convnext_atto", "gate:stages.1.blocks.0.mlp.fc2",
     ["stages.1.blocks.0.conv_dw", "stages.1.blocks.0.norm"]),
])
def test_layers_only_a_removed_branch_read_save_and_load_emptied(fresh, make, arch, factor, unread, tmp_path):
    """Layers emptied for what reads them (a norm: cfg 0, no weights in the file), a
    bottleneck's first 1x1 and a ConvNeXt block's depthwise convolution and LayerNorm2d (its
    channels at dim 1), through both file formats, into a network built afresh."""
    model = emptied(dense(make()), [factor])
    model.arch, model.options, model.cfg = arch, {"num_classes": 10}, {}
    r = slimming.prune(model, threshold=1e-4, example_inputs=X64)
    assert all(r.removed.get(n) == "Emptied" for n in unread), r.removed
    x = torch.randn(2, 3, 64, 64)
    save_pruned(r.model, tmp_path / "p.pt")
    back = load_pruned(tmp_path / "p.pt", fresh())
    assert torch.equal(back(x), r.model(x)) and removed_layers(back) == r.removed
    r.model.arch, r.model.options = model.arch, model.options
    save_checkpoint(checkpoint_dict(r.model), tmp_path / "c.pth")
    again = load_model(tmp_path / "c.pth")
    assert torch.equal(again(x), r.model(x)) and removed_layers(again) == r.removed


@pytest.mark.parametrize("removed", [{"": "Emptied"}, {"layer1": "Emptied"}, {"layer2.1.bn1": "Constant"},
                                     {"layer2.1.conv1": "Gone"}, ["layer2.1.conv1"]])
def test_a_file_that_removes_what_it_cannot_is_refused_and_changes_nothing(removed_resnet18, tmp_path,
                                                                          removed):
    _, r = removed_resnet18
    save_pruned(r.model, tmp_path / "p.pt")
    blob = torch.load(tmp_path / "p.pt", weights_only=True)
    refiled(blob, tmp_path / "p.pt", removed=removed)
    fresh = torchvision.models.resnet18(num_classes=10)
    before = copy.deepcopy(fresh)
    with pytest.raises(CheckpointError) as e:
        load_pruned(tmp_path / "p.pt", fresh)
    assert "\n" not in str(e.value)
    assert [type(m) for m in fresh.modules()] == [type(m) for m in before.modules()]
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(fresh.eval()(x), before.eval()(x))


@pytest.mark.parametrize("fmt", ["torchscript", "export", "onnx"])
def test_a_removed_branch_exports(removed_resnet18, tmp_path, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    _, r = removed_resnet18
    out = tmp_path / ("m.pt2" if fmt == "export" else "m.bin")
    diff = export_model(r.model, out, fmt, input_size=(3, 64, 64), batch_size=2)
    assert diff <= 1e-4 and out.exists()


def test_stats_layers_shows_the_removed_layers(removed_resnet18, tmp_path, capsys):
    model, r = removed_resnet18
    r.model.arch, r.model.options = model.arch, model.options
    save_checkpoint(checkpoint_dict(r.model), tmp_path / "c.pth")
    full = copy.deepcopy(model)
    save_checkpoint(checkpoint_dict(full), tmp_path / "full.pth")
    command = ["stats", "--checkpoint", str(tmp_path / "full.pth"), "--compare", str(tmp_path / "c.pth"),
               "--layers", "--repeats", "1", "--input-size", "3,64,64", "--cpu"]
    assert main(command + ["--json"]) in (None, 0)
    rows = json.loads(capsys.readouterr().out)[str(tmp_path / "c.pth")]["layers"]
    shown = {row["name"]: row.get("removed") for row in rows}
    assert {n: shown.get(n) for n in r.removed if n.endswith(("conv1", "conv2"))} == \
        {n: w for n, w in r.removed.items() if n.endswith(("conv1", "conv2"))}
    assert main(command) in (None, 0)
    table = capsys.readouterr().out
    assert "removed" in table and "layer2.1.conv1" in table


def test_the_command_line_removes_branches_unless_told_to_keep_them(removed_resnet18, tmp_path):
    model, _ = removed_resnet18
    save_checkpoint(checkpoint_dict(model), tmp_path / "full.pth")
    x = torch.randn(2, 3, 64, 64)
    found = {}
    for flags in ([], ["--keep-branches"]):
        out = tmp_path / ("keep" if flags else "remove")
        assert main(["prune", "--checkpoint", str(tmp_path / "full.pth"), "--threshold", "1e-4", "--save",
                     str(out), "--cpu", "--no-compensate", "-q", *flags]) in (None, 0)
        found[bool(flags)] = load_model(out / "pruned.pth")
    assert {"layer2.1.conv1", "layer2.1.bn1", "layer2.1.conv2"} <= set(removed_layers(found[False]))
    assert removed_layers(found[True]) == {} and found[True].layer2[1].conv1.out_channels == 1
    reference = zeroed(model, {"layer2.1.bn1": torch.zeros(128, dtype=torch.bool),
                               "layer3.0.bn1": torch.zeros(256, dtype=torch.bool)})
    assert rel_diff(found[False](x), reference(x)) < 1e-5


class PooledBranch(nn.Module):
    """A residual branch that max-pools its inner width: torch's pooling refuses a tensor of no
    channels, so removing that branch cannot run."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.a = nn.Sequential(nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 1, 1)
        self.b = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.other = nn.Sequential(nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 1),
                                   nn.BatchNorm2d(16))
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.b(self.pool(self.a(x)))
        return self.head(x + self.other(x))


def test_a_removal_the_check_refuses_keeps_that_blocks_branches_and_says_so():
    model = emptied(dense(PooledBranch()), ["a.1", "other.1"])
    x = torch.randn(1, 3, 16, 16)
    with pytest.warns(UserWarning, match="branches of the network are kept at min_channels, not removed"):
        r = slimming.prune(model, threshold=1e-4, example_inputs=x, compensate=False)
    kept = slimming.prune(model, threshold=1e-4, example_inputs=x, compensate=False, remove_branches=False)
    assert [retry.kept for retry in r.retries] == ["branches"] and r.removed == {}
    assert all(torch.equal(kept.masks[n], m) for n, m in r.masks.items())
    assert rel_diff(r.model(x), zeroed(model, r.masks)(x)) < 1e-5


def test_an_attention_whose_forward_cannot_run_on_no_heads_keeps_one_and_says_so():
    """timm's Swin infers a head's width in its reshape (-1), which a tensor of no heads cannot
    give: the check's run fails, that block keeps its branches (one head), the cut is exact."""
    def swin():
        return timm.create_model("swin_tiny_patch4_window7_224", img_size=56, depths=(1, 1), num_heads=(2, 4),
                                 embed_dim=32, num_classes=10)
    x = torch.randn(1, 3, 56, 56)
    model = emptied(gated(swin, x)(), ["gate:layers.1.blocks.0.attn.proj"])
    with pytest.warns(UserWarning, match="layers.1.blocks.0.attn are kept at min_channels, not removed"):
        r = slimming.prune(model, threshold=1e-4, example_inputs=x, compensate=False)
    assert [(retry.kept, retry.modules) for retry in r.retries] == [("branches", ["layers.1.blocks.0.attn"])]
    assert r.removed == {} and int(r.masks["layers.1.blocks.0.attn.proj.slimming_gate"].sum()) == 1
    probe = torch.randn(2, 3, 56, 56)
    assert rel_diff(r.model(probe), zeroed(model, r.masks)(probe)) < 1e-5


@pytest.mark.parametrize("fmt", ["torchscript", "export", "onnx"])
def test_an_attention_removed_whole_loads_back_and_exports(tmp_path, fmt):
    model = emptied(gated(vit, X32)(), ["gate:blocks.1.attn.proj"])
    r = slimming.prune(model, threshold=1e-4, example_inputs=X32)
    assert r.model.blocks[1].attn.num_heads == 0 and "blocks.1.attn.proj" in r.removed
    save_pruned(r.model, tmp_path / "p.pt")
    back = load_pruned(tmp_path / "p.pt", vit().eval())
    probe = torch.randn(2, 3, 32, 32)
    assert back.blocks[1].attn.num_heads == 0 and torch.equal(back(probe), r.model(probe))
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    out = tmp_path / ("m.pt2" if fmt == "export" else "m.bin")
    assert export_model(r.model, out, fmt, input_size=(3, 32, 32), batch_size=2) <= 1e-4 and out.exists()


class ReadTwice(nn.Module):
    """A norm before a residual branch; ``how``: what else reads it: nothing ("only the
    branch"), another layer ("a layer"), Python ("a value"), or an in-place addition of it into
    a tensor that goes on, through the view the branch reads ("a write"). ``aux``: a layer
    computed and never used."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.norm = nn.BatchNorm2d(16)
        self.branch = nn.Sequential(nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 1))
        self.second = nn.Sequential(nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 1))
        self.other, self.aux, self.head = nn.Conv2d(16, 16, 1), nn.Conv2d(16, 4, 1), nn.Conv2d(16, 4, 1)

    def forward(self, x):
        x = self.stem(x)
        y = self.norm(x)
        self.aux(x)
        if self.how == "a write":  # into the tensor the branch reads, through a view of it
            base = x.clone()
            out = base + self.branch(base.view(base.shape).add_(y))
        else:
            out = x + self.branch(y)
        if self.how == "a layer":
            out = out + self.other(y)
        elif self.how == "a value" and y.amax() > 1e6:
            out = out * 2
        return self.head(out + self.second(out))


@pytest.mark.parametrize("how", ["only the branch", "a layer", "a value", "a write"])
def test_a_layer_only_an_emptied_branch_reads_is_emptied_with_it(how):
    model = emptied(dense(ReadTwice(how)), ["branch.1"])
    x = torch.randn(1, 3, 20, 20)  # (at 16x16 its norm's 16 channels could be any dim)
    r = slimming.prune(model, threshold=1e-4, example_inputs=x, compensate=False)
    branch = {"branch.0": "Emptied", "branch.1": "Emptied", "branch.3": "Constant"}
    assert r.removed == ({"norm": "Emptied", **branch} if how == "only the branch" else branch)
    assert not isinstance(r.model.aux, Emptied)  # unused before any cut: not the cut's business
    probe = torch.randn(2, 3, 24, 24)
    assert r.retries == [] and rel_diff(r.model(probe), zeroed(model, r.masks)(probe)) < 1e-5
