"""Gates: a per-channel scaling factor where a network has none (an MLP's hidden width in
ConvNeXt and vision transformers), and one per attention head. ``add_gates`` finds those widths
and heads by the trace, sparsity trains the gates, ``prune`` cuts by them exactly (heads whole,
``num_heads`` set) and folds them into the layers they feed, so the pruned network has no extra
module; checkpoints of a gated run rebuild their gates, pruned ones their numbers of heads."""

import copy
import re
import warnings

import pytest
import torch
from conftest import rel_diff, sparsity_shaped, zeroed
from test_factors import LN_NETWORKS, TinyConvNeXt, TinyViT, cut_at_random
from torch import nn

import slimming
from slimming.layers.gates import fold, gated_layers
from slimming.layers.rules import ChannelGate, HeadGate
from slimming.pruning.graph import GraphError
from slimming.pruning.trace import trace
from slimming.pruning.verify import TOLERANCE, check


def gates(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, ChannelGate)]


def reads(layer: nn.Module) -> int:
    return layer.in_features if isinstance(layer, nn.Linear) else layer.in_channels


EXPECTED = {  # where the trace must put gates: before every MLP's second layer, nowhere else
    "TinyConvNeXt": ["stage1.0.fc2", "stage1.1.fc2", "stage2.0.fc2", "stage2.1.fc2"],
    "TinyViT": ["blocks.0.fc2", "blocks.1.fc2", "blocks.2.fc2"],
    "torchvision convnext_tiny": [f"features.{s}.{b}.block.5" for s, n in ((1, 3), (3, 3), (5, 9), (7, 3))
                                  for b in range(n)],
    "timm convnext_atto": [f"stages.{s}.blocks.{b}.mlp.fc2" for s, n in enumerate((2, 2, 6, 2))
                           for b in range(n)],
    "timm vit_tiny_patch16_224": [f"blocks.{b}.mlp.fc2" for b in range(12)],
}


HEADS = {  # a gate per head before every attention's output projection: {layer: heads}
    "TinyViT": {f"blocks.{b}.proj": 3 for b in range(3)},
    "timm vit_tiny_patch16_224": {f"blocks.{b}.attn.proj": 3 for b in range(12)},
}


def in_order(model, names) -> list[str]:
    return [n for n, _ in model.named_modules() if n in set(names)]


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.slow
def test_gates_go_before_every_mlp_and_change_nothing_until_trained(name):
    torch.manual_seed(0)
    model = LN_NETWORKS[name]().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
    everything = in_order(model, [*EXPECTED[name], *HEADS.get(name, {})])
    assert slimming.add_gates(model, x[:1]) == everything
    assert sorted(gated_layers(model)) == sorted(EXPECTED[name])
    assert gated_layers(model, heads=True) == HEADS.get(name, {})
    with torch.no_grad():
        assert torch.equal(model(x), before)  # gates of ones
    assert slimming.add_gates(model, x[:1]) == everything  # again: the same gates, not two
    assert len(gates(model)) == len(everything)
    plain = LN_NETWORKS[name]()
    assert slimming.add_gates(plain, x[:1], heads=False) == EXPECTED[name]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", ["TinyConvNeXt", "TinyViT", "timm convnext_atto",
                                  "timm vit_tiny_patch16_224"])
@pytest.mark.slow
def test_a_gated_network_is_cut_exactly_and_its_gates_fold_away(name, seed, tmp_path):
    torch.manual_seed(seed)
    model = LN_NETWORKS[name]().eval()
    slimming.add_gates(model, torch.zeros(1, 3, 32, 32))
    sparsity_shaped(model, seed)  # the LayerNorms' gammas and the gates
    hidden = {n: reads(model.get_submodule(n)) for n in EXPECTED[name]}
    result, x, _ = cut_at_random(model, seed)
    assert not gates(result.model) and not any(m._forward_pre_hooks for m in result.model.modules())
    assert len(gates(model)) == len(EXPECTED[name]) + len(HEADS.get(name, {}))  # the original keeps them
    for reader, width in hidden.items():  # every hidden width cut by its gate's mask
        kept = int(result.masks[f"{reader}.slimming_gate"].sum())
        assert reads(result.model.get_submodule(reader)) == kept
        assert kept < width or seed  # the sparse half of the gates goes
    assert not any(".slimming_gate" in k for k in result.model.state_dict())
    assert not any(".slimming_gate" in k for k in result.cfg)
    fresh = LN_NETWORKS[name]()  # a pruned gated network loads into the plain class
    slimming.save_pruned(result.model, tmp_path / "g.pth")
    loaded = slimming.load_pruned(tmp_path / "g.pth", fresh).eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), result.model(x))


def test_fold_gives_the_same_network_without_its_gates():
    torch.manual_seed(0)
    model = TinyViT().eval()
    slimming.add_gates(model, at=["blocks.0.fc2", "blocks.1.proj"])
    with torch.no_grad():
        for _, m in gates(model):
            m.weight.uniform_(-2, 2)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
        assert sorted(fold(model)) == ["blocks.0.fc2", "blocks.1.proj"]
        assert not gates(model)
        assert rel_diff(model(x), want) < 1e-5


def test_sparsity_trains_the_gates():
    model = TinyConvNeXt()
    slimming.add_gates(model, torch.zeros(1, 3, 32, 32))
    params = {id(p) for p in slimming.Sparsity(model, 1e-3).params}
    assert {id(m.weight) for _, m in gates(model)} <= params


def test_a_gated_checkpoint_rebuilds_its_gates_and_a_bad_one_is_refused(tmp_path):
    pytest.importorskip("timm")
    model = slimming.models.build("timm:convnext_atto", num_classes=10, input_size=[3, 32, 32]).eval()
    slimming.add_gates(model)
    with torch.no_grad():
        for _, m in gates(model):
            m.weight.uniform_(0, 1)
    ckpt = slimming.checkpoint_dict(model, epoch=1)
    assert ckpt["gates"] == {n: 1280 if n.startswith("stages.3") else m
                             for n, m in gated_layers(model).items()}
    slimming.save_checkpoint(ckpt, tmp_path / "g.pth")
    loaded = slimming.load_model(tmp_path / "g.pth")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    ckpt["gates"] = {"stem.0": 3}  # a convolution reading 3 channels: a gate there is not the run's
    slimming.save_checkpoint(ckpt, tmp_path / "bad.pth")
    with pytest.raises(slimming.CheckpointError) as e:
        slimming.load_model(tmp_path / "bad.pth")
    assert "\n" not in str(e.value)
    ckpt["gates"] = {"head.fc": 10 ** 9}
    slimming.save_checkpoint(ckpt, tmp_path / "bad.pth")
    with pytest.raises(slimming.CheckpointError, match="gates do not fit"):
        slimming.load_model(tmp_path / "bad.pth")


def test_gates_at_a_layer_that_is_none_are_refused_in_one_line_and_change_nothing():
    model = TinyViT()
    keys = set(model.state_dict())
    for at in (["blocks.0.fc2", "blocks.0.norm1"], ["nope"]):
        with pytest.raises(slimming.SlimmingError) as e:
            slimming.add_gates(model, at=at)
        assert "\n" not in str(e.value)
        assert set(model.state_dict()) == keys


@pytest.mark.slow
def test_train_with_gates_prune_and_finetune_from_the_command_line(tmp_path, capsys):
    pytest.importorskip("timm")
    from slimming.cli import main

    data = ["--dataset", "synthetic", "--cpu", "--batch-size", "128"]
    assert main(["train", "--arch", "timm:convnext_atto", "--gates", "--sparsity", "1e-3", "--epochs", "1",
                 "--seed", "0", "--save", str(tmp_path / "t"), *data]) == 0
    assert "gates before 12 layers: stages.0.blocks.0.mlp.fc2" in capsys.readouterr().out
    assert len(gated_layers(slimming.load_model(tmp_path / "t" / "last.pth"))) == 12
    assert main(["prune", "--checkpoint", str(tmp_path / "t" / "last.pth"), "--percent", "0.4",
                 "--save", str(tmp_path / "p"), "--cpu", "--no-eval"]) == 0
    out = capsys.readouterr().out
    assert "stages.3.blocks.1.mlp.fc2.slimming_gate" in out and "checked: equals the original" in out
    pruned = slimming.load_model(tmp_path / "p" / "pruned.pth")
    assert not gates(pruned) and reads(pruned.stages[3].blocks[1].mlp.fc2) < 1280  # 1x1 convolutions
    left = len(pruned.cfg)  # prune and finetune count the same layers: the 12 gates fold away
    assert f"the file's cfg holds the widths of the {left} left (the 12 gates fold into" in out
    assert main(["finetune", "--checkpoint", str(tmp_path / "p" / "pruned.pth"), "--epochs", "1",
                 "--save", str(tmp_path / "f"), *data]) == 0
    assert f"cfg the widths of {left} layers with a scaling factor" in capsys.readouterr().out


def test_a_gates_field_that_is_not_names_and_widths_is_refused_in_one_line(tmp_path):
    for bad in ("fc2", {"blocks.0.fc2": -1}, {"blocks.0.fc2": "96"}):
        ckpt = {"format": "slimming", "version": 1, "arch": "timm:vit_tiny_patch16_224", "options": {},
                "gates": bad, "state_dict": {}}
        slimming.save_checkpoint(ckpt, tmp_path / "bad.pth")
        with pytest.raises(slimming.CheckpointError, match="its 'gates' is") as e:
            slimming.load_checkpoint(tmp_path / "bad.pth")
        assert "\n" not in str(e.value)


def test_a_timm_vision_transformer_is_built_for_the_image_size_asked():
    pytest.importorskip("timm")
    model = slimming.models.build("timm:vit_tiny_patch16_224", num_classes=10, input_size=[3, 32, 32],
                                  kwargs={"patch_size": 8})
    assert model.pos_embed.shape == (1, 17, 192)  # 4x4 patches and the class token
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    cnn = slimming.models.build("timm:convnext_atto", num_classes=10, input_size=[3, 32, 32])
    assert cnn(torch.zeros(2, 3, 32, 32)).shape == (2, 10)  # a CNN takes no img_size: built as it is


@pytest.mark.slow
def test_the_pipeline_with_gates_reports_every_cut_layer_gates_included(tmp_path):
    """A ConvNeXt through ``pipeline --gates``: the report lists the LayerNorms and the gates
    (folded away, so the pruned network has none) with their widths before and after."""
    pytest.importorskip("timm")
    import json

    from slimming.cli import main

    assert main(["pipeline", "--arch", "timm:convnext_atto", "--gates", "--dataset", "synthetic",
                 "--epochs", "1", "--finetune-epochs", "1", "--sparsity", "1e-3", "--percent", "0.3",
                 "--repeats", "0", "--seed", "0", "--cpu", "--batch-size", "128",
                 "--save", str(tmp_path / "run")]) == 0
    layers = {name: (before, after) for name, before, after in
              json.loads((tmp_path / "run" / "report.json").read_text())["layers"]}
    assert len(layers) == 29 and layers["stages.3.blocks.1.mlp.fc2.slimming_gate"][0] == 1280
    pruned = slimming.load_model(tmp_path / "run" / "pruned" / "pruned.pth")
    for name, (_, after) in layers.items():
        if not name.endswith("slimming_gate"):
            assert pruned.get_submodule(name).weight.numel() == after


HEAD_NETWORKS = {
    "TinyViT, 4 heads": lambda: TinyViT(dim=32, heads=4),
    "timm vit_tiny_patch16_224": LN_NETWORKS["timm vit_tiny_patch16_224"],
    "timm swin (windows of 2)": LN_NETWORKS["timm swin (windows of 2)"],
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(HEAD_NETWORKS))
@pytest.mark.slow
def test_attention_heads_are_cut_whole_and_their_number_follows(name, seed, tmp_path):
    """Gates per head, sparsity-shaped: the cut equals the original with the cut heads' gates
    zeroed (``cut_at_random``); every attention keeps whole heads, the ones with the largest
    gates, its number of heads set to them, its queries, keys and values three of each (and
    Swin's relative position bias one column per head), or none and is removed (its projection
    a constant); the pruned network saves and loads."""
    torch.manual_seed(seed)
    model = HEAD_NETWORKS[name]().eval()
    slimming.add_gates(model, torch.zeros(1, 3, 32, 32))
    heads = gated_layers(model, heads=True)
    assert heads and all(isinstance(model.get_submodule(f"{n}.slimming_gate"), HeadGate) for n in heads)
    sparsity_shaped(model, seed)
    result, x, _ = cut_at_random(model, seed)
    removed = 0
    for proj, count in heads.items():
        attn = result.model.get_submodule(proj.rpartition(".")[0])
        keep = result.masks[f"{proj}.slimming_gate"]
        gate = model.get_submodule(f"{proj}.slimming_gate").weight.detach().abs()
        kept = int(keep.sum())
        assert getattr(attn, "num_heads", getattr(attn, "heads", None)) == kept, proj
        if kept == 0:  # every head cut: the attention is removed, its projection the bias it adds
            assert result.removed[proj] == "Constant", proj
            removed += count
            continue
        width = reads(result.model.get_submodule(proj))
        assert width % kept == 0 and attn.qkv.out_features == 3 * width, proj
        if kept < count:
            assert gate[~keep].max() <= gate[keep].min(), proj
        table = getattr(attn, "relative_position_bias_table", None)
        assert table is None or table.shape[1] == kept
        removed += count - kept
    assert removed  # the sparse heads went
    assert not gates(result.model)
    fresh = HEAD_NETWORKS[name]()  # save_pruned keeps the numbers of heads
    slimming.save_pruned(result.model, tmp_path / "h.pth")
    loaded = slimming.load_pruned(tmp_path / "h.pth", fresh).eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), result.model(x))


def test_a_checkpoint_of_a_transformer_cut_by_heads_rebuilds_its_numbers_of_heads(tmp_path):
    """A timm ViT through ``checkpoint_dict`` / ``load_model`` (what the CLI writes and reads):
    rebuilt from its arch, it takes its integer attributes from the file (``widths``), so each
    attention runs with the heads it kept; a ``widths`` field of another type is refused."""
    pytest.importorskip("timm")
    model = slimming.models.build("timm:vit_tiny_patch16_224", num_classes=10, input_size=[3, 32, 32],
                                  kwargs={"patch_size": 8}).eval()
    slimming.add_gates(model)
    sparsity_shaped(model, 3)
    result, x, _ = cut_at_random(model, 3)
    numbers = [b.attn.num_heads for b in result.model.blocks]
    assert min(numbers) < 3
    ckpt = slimming.checkpoint_dict(result.model, epoch=0)
    assert ckpt["widths"]["blocks.0.attn.num_heads"] == numbers[0] and "head_gates" not in ckpt
    slimming.save_checkpoint(ckpt, tmp_path / "p.pth")
    loaded = slimming.load_model(tmp_path / "p.pth")
    assert [b.attn.num_heads for b in loaded.blocks] == numbers
    with torch.no_grad():
        assert torch.equal(loaded(x), result.model(x))
    ckpt["widths"] = {"blocks.0.attn.num_heads": "2"}
    slimming.save_checkpoint(ckpt, tmp_path / "bad.pth")
    with pytest.raises(slimming.CheckpointError, match="its 'widths' is") as e:
        slimming.load_model(tmp_path / "bad.pth")
    assert "\n" not in str(e.value)


def test_an_attention_run_with_its_old_number_of_heads_is_refused_by_the_check():
    """The check compares every module's outputs, not only the model's: the last block's
    attention run with its old number of heads (a cut that left ``heads`` as it was) groups the
    kept channels into wrong heads; with that block's projection small (as at a random start)
    the model's output moves less than the tolerance, and the check still names the block."""
    torch.manual_seed(0)
    model = TinyViT(dim=32, heads=4).eval()
    x = torch.zeros(1, 3, 32, 32)
    slimming.add_gates(model, x)
    with torch.no_grad():
        model.blocks[2].proj.weight.mul_(1e-4)  # its share of the residual stream: small
        model.blocks[2].proj.bias.zero_()
        model.blocks[2].proj.slimming_gate.weight[1] = 0
    result = slimming.prune(model, threshold=1e-6, example_inputs=x, compensate=False)
    assert result.model.blocks[2].heads == 3 and result.model.blocks[2].qkv.out_features == 72
    result.model.blocks[2].heads = 4  # runs: 72 channels read as 4 heads of 6
    probe = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < TOLERANCE
    with pytest.raises(GraphError, match="first in blocks.2.proj") as e:
        check(model, result, x)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kept", [{"ignore": "blocks.0"}, {"keep_whole": "blocks.0.qkv"}])
def test_heads_of_a_block_kept_by_ignore_or_keep_whole_stay_whole(kept):
    """A head whose gate is zero is cut in every block but the one ``ignore`` or
    ``keep_whole`` keeps: there the heads, their queries, keys and values stay as they were."""
    torch.manual_seed(0)
    model = TinyViT(dim=32, heads=4).eval()
    x = torch.zeros(1, 3, 32, 32)
    slimming.add_gates(model, x)
    with torch.no_grad():
        for block in model.blocks:
            block.proj.slimming_gate.weight[2] = 0
    result = slimming.prune(model, threshold=1e-6, example_inputs=x, compensate=False, **kept)
    assert [b.heads for b in result.model.blocks] == [4, 3, 3]
    assert result.model.blocks[0].qkv.out_features == 96 and result.model.blocks[1].qkv.out_features == 72


class ProductMerge(nn.Module):
    """Self-attention that merges its heads back to ``num_heads * head_dim``, a width it holds
    in no attribute of its own: the cut cannot set it, so its heads are kept."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.num_heads, self.head_dim = heads, dim // heads
        self.norm, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, x):
        b, n, _ = x.shape
        qkv = self.qkv(self.norm(x)).reshape(b, n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        y = ((q @ k.transpose(-2, -1)).softmax(-1) @ v).transpose(1, 2)
        y = y.reshape(b, n, self.num_heads * self.head_dim)
        return self.head(self.proj(y).mean(1))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_head_gate_trained_to_zero_that_the_graph_keeps_is_named_in_one_warning(seed):
    """Hostile round 6, low: a head whose gate is zero was kept without a word where the
    attention merges its heads by ``num_heads * head_dim``; now one warning names the gate and
    why its channels stay, the cut is exact, the heads all there. Where the heads are followed
    (TinyViT) the zero head goes and no such warning is given."""
    torch.manual_seed(seed)
    model, x = ProductMerge().eval(), torch.zeros(1, 5, 32)
    assert "proj" in slimming.add_gates(model, x)
    with torch.no_grad():
        model.proj.slimming_gate.weight[seed + 1] = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = slimming.prune(model, threshold=1e-6, example_inputs=x, compensate=False)
    said = [str(w.message) for w in caught if "whose gate is under" in str(w.message)]
    assert len(said) == 1 and said[0].startswith("1 head(s)") and "proj.slimming_gate" in said[0]
    assert "reshape to a width the module does not hold" in said[0]
    assert result.model.num_heads == 4 and result.masks["proj.slimming_gate"].all()
    probe = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5
    followed = TinyViT(dim=32, heads=4).eval()
    slimming.add_gates(followed, torch.zeros(1, 3, 32, 32))
    with torch.no_grad():
        followed.blocks[1].proj.slimming_gate.weight[seed] = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cut = slimming.prune(followed, threshold=1e-6, example_inputs=torch.zeros(1, 3, 32, 32),
                             compensate=False)
    assert cut.model.blocks[1].heads == 3
    assert not [w for w in caught if "whose gate is under" in str(w.message)]


@pytest.mark.slow
def test_a_vision_transformer_through_the_command_line_loses_whole_heads(tmp_path, capsys):
    """``train --gates`` on timm's ViT records its head gates; ``prune`` (here after two heads'
    gates were set to zero, as sparsity training would leave them) cuts those heads and the
    pruned checkpoint rebuilds with its numbers of heads, which ``finetune`` then trains."""
    pytest.importorskip("timm")
    from slimming.cli import main

    data = ["--dataset", "synthetic", "--cpu", "--batch-size", "128"]
    assert main(["train", "--arch", "timm:vit_tiny_patch16_224", "--model-kwargs",
                 '{"patch_size": 8, "depth": 6, "embed_dim": 96}', "--gates", "--sparsity", "1e-4",
                 "--epochs", "1", "--seed", "0", "--save", str(tmp_path / "t"), *data]) == 0
    assert "gates before 12 layers: blocks.0.attn.proj, blocks.0.mlp.fc2" in capsys.readouterr().out
    ckpt = slimming.load_checkpoint(tmp_path / "t" / "last.pth")
    assert ckpt["head_gates"] == {f"blocks.{b}.attn.proj": 3 for b in range(6)}
    ckpt["state_dict"]["blocks.4.attn.proj.slimming_gate.weight"][[0, 2]] = 0
    slimming.save_checkpoint(ckpt, tmp_path / "t" / "edited.pth")
    assert main(["prune", "--checkpoint", str(tmp_path / "t" / "edited.pth"), "--threshold", "1e-6",
                 "--save", str(tmp_path / "p"), "--cpu", "--no-eval"]) == 0
    assert re.search(r"blocks\.4\.attn\.proj\.slimming_gate +3 +1\n", capsys.readouterr().out)
    pruned = slimming.load_model(tmp_path / "p" / "pruned.pth")
    assert [b.attn.num_heads for b in pruned.blocks] == [3, 3, 3, 3, 1, 3]
    assert pruned.blocks[4].attn.qkv.out_features == 3 * 32 and not gates(pruned)
    assert main(["finetune", "--checkpoint", str(tmp_path / "p" / "pruned.pth"), "--epochs", "1",
                 "--save", str(tmp_path / "f"), *data]) == 0
    assert slimming.load_model(tmp_path / "f" / "last.pth").blocks[4].attn.num_heads == 1


def _timm_attention(name, **kw):
    def build():
        timm = pytest.importorskip("timm")
        return timm.create_model(name, pretrained=False, num_classes=10, img_size=32, **kw)
    return build


MET_TWICE = {  # attention the trace met twice before (a training-mode pass): refused whole
    "timm vit_relpos (relative positions)": _timm_attention(
        "vit_relpos_small_patch16_224", patch_size=8, depth=2, embed_dim=48, num_heads=3),
    "timm cait (class attention, talking heads)": _timm_attention(
        "cait_xxs24_224", patch_size=8, depth=2, embed_dim=48, num_heads=3, depth_token_only=1),
    "timm swinv2_cr (relative positions by an MLP)": _timm_attention(
        "swinv2_cr_tiny_ns_224", window_size=4, embed_dim=24, depths=(1, 1), num_heads=(3, 3)),
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(MET_TWICE))
def test_attentions_with_relative_positions_or_class_attention_are_cut_with_their_gates(name, seed):
    """Relative-position attention, class attention and talking heads apply a linear layer to
    the attention map, which carries no channels; the trace took those layers for never run,
    met every attention again in a training-mode forward, and refused the network ("a gate
    used twice"). Gated and sparsity-shaped, each is now cut, exactly."""
    torch.manual_seed(seed)
    model = MET_TWICE[name]().eval()
    slimming.add_gates(model, torch.zeros(1, 3, 32, 32))
    assert gates(model) and trace(model, torch.zeros(1, 3, 32, 32)).coverage.unseen == []  # they ran
    sparsity_shaped(model, seed)
    result, _, _ = cut_at_random(model, seed)
    size = [sum(p.numel() for p in m.parameters()) for m in (result.model, model)]
    assert size[0] < 0.95 * size[1]
    assert not gates(result.model)


class SharedProjection(nn.Module):
    """Two attentions whose merged heads one output projection reads (called twice): its head
    gate meets the heads of each, which no trace can show to be the same heads."""

    def __init__(self, dim: int = 24):
        super().__init__()
        self.patch, self.norm = nn.Conv2d(3, dim, 8, 8), nn.LayerNorm(dim)
        self.first, self.second = HFSelfAttention(dim, 3), HFSelfAttention(dim, 3)
        self.proj, self.final, self.head = nn.Linear(dim, dim), nn.LayerNorm(dim), nn.Linear(dim, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        h = self.norm(x)
        return self.head(self.final(x + self.proj(self.first(h)) + self.proj(self.second(h))).mean(1))


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("seed", [0, 1])
def test_a_gate_met_twice_on_other_channels_keeps_its_own_and_the_rest_is_cut(seed):
    """A module the trace meets twice on channels it cannot show to be the same (a head gate
    before a projection two attentions share) is one set of tensors: its heads are kept, not
    the whole network refused; everything else is cut, exactly."""
    torch.manual_seed(seed)
    model, x = SharedProjection().eval(), torch.zeros(1, 3, 32, 32)
    slimming.add_gates(model, x)
    assert gated_layers(model, heads=True) == {"proj": 3}
    sparsity_shaped(model, seed)
    with torch.no_grad():
        model.proj.slimming_gate.weight[seed] = 0  # a head sparsity would cut
    result = slimming.prune(model, threshold=0.01, example_inputs=x, compensate=False)
    assert bool(result.masks.get("proj.slimming_gate", torch.ones(1, dtype=torch.bool)).all())  # kept
    assert result.model.first.num_attention_heads == result.model.second.num_attention_heads == 3
    assert not bool(result.masks["norm"].all())  # the rest is cut
    probe = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-4


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("seed", [0, 1])
def test_a_network_without_normalisation_is_slimmed_by_gates_everywhere(seed):
    """torchvision's SqueezeNet has no normalisation: by default a gate goes only where one
    layer alone reads a width, and almost nothing can be cut; ``everywhere=True`` gates every
    layer reading a width nothing scores (both expand convolutions of each fire module, the
    squeeze convolution after their concatenation), and the cut is exact and large."""
    torchvision = pytest.importorskip("torchvision")
    x = torch.zeros(1, 3, 64, 64)
    few = slimming.add_gates(torchvision.models.squeezenet1_1(weights=None, num_classes=10).eval(), x)
    torch.manual_seed(seed)
    model = torchvision.models.squeezenet1_1(weights=None, num_classes=10).eval()
    gated = slimming.add_gates(model, x, everywhere=True)
    assert len(gated) > 4 * len(few)
    assert {"features.3.expand1x1", "features.3.expand3x3"} <= set(gated)  # one width, two readers
    sparsity_shaped(model, seed)
    result, _, _ = cut_at_random(model, seed)
    size = [sum(p.numel() for p in m.parameters()) for m in (result.model, model)]
    assert size[0] < 0.8 * size[1] and not gates(result.model)


@pytest.mark.slow
def test_gates_everywhere_from_the_command_line(tmp_path, capsys):
    """``--gates-everywhere``: a network without normalisation trains with a gate on every width
    it can cut, and its checkpoint prunes."""
    pytest.importorskip("torchvision")
    from slimming.cli import main

    data = ["--dataset", "synthetic", "--cpu", "--batch-size", "128"]
    assert main(["train", "--arch", "torchvision:squeezenet1_1", "--gates-everywhere", "--sparsity", "1e-3",
                 "--epochs", "1", "--seed", "0", "--save", str(tmp_path / "t"), *data]) == 0
    assert "features.3.expand1x1, features.3.expand3x3" in capsys.readouterr().out
    assert len(gated_layers(slimming.load_model(tmp_path / "t" / "last.pth"))) > 20
    assert main(["prune", "--checkpoint", str(tmp_path / "t" / "last.pth"), "--percent", "0.3",
                 "--save", str(tmp_path / "p"), "--cpu", "--no-eval"]) == 0
    assert "checked: equals the original" in capsys.readouterr().out
    assert not gates(slimming.load_model(tmp_path / "p" / "pruned.pth"))


@pytest.mark.parametrize("fmt,suffix", [("torchscript", ".pt"), ("export", ".pt2")])
def test_a_gated_network_not_yet_pruned_exports_in_every_format(tmp_path, fmt, suffix):
    """TorchScript cannot script the hooks that apply the gates: export folds them into the
    layers they feed in a copy (the same outputs), as ONNX and torch.export could run them."""
    from slimming.tools.export import export_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 1), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(1, 3, 16, 16)
    assert slimming.add_gates(model, x, everywhere=True)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, ChannelGate):
                m.weight.uniform_(0.1, 2.0)
    before = gated_layers(model)
    diff = export_model(model, tmp_path / f"m{suffix}", fmt, input_size=(3, 16, 16))
    assert diff <= 1e-5 and (tmp_path / f"m{suffix}").exists()
    assert gated_layers(model) == before  # the model itself keeps its gates


class ByWeight(nn.Module):
    """An MLP whose second layer is called through its weight (``F.linear(x, self.fc2.weight,
    ...)``), as torchvision's Swin calls its attention's projection: the layer's forward, and so
    a gate's hook on it, never runs."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        h = torch.nn.functional.linear(torch.relu(self.fc1(x)), self.fc2.weight, self.fc2.bias)
        return self.fc3(torch.relu(self.norm(h)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_gate_that_never_runs_is_neither_placed_nor_folded(seed):
    """Before, ``add_gates`` put a gate on a layer called through its weight, which never ran,
    and the cut multiplied its values into the layer after the check: torchvision's Swin came
    out 0.08 off its original, said to be exact. Now ``add_gates`` places none there, and one
    placed by hand (``at=``) is removed at the cut without being folded: the network is the
    one it was."""
    torch.manual_seed(seed)
    model = ByWeight().eval()
    x = torch.randn(2, 8)
    assert "fc2" not in slimming.add_gates(model, x)
    slimming.add_gates(model, at=["fc2"])
    sparsity_shaped(model, seed)  # the unrun gate far from ones, and some of the norm cut
    with pytest.warns(UserWarning, match="did not run"):
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert not hasattr(result.model.fc2, "slimming_gate")
    probe = torch.randn(5, 8, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5
    assert float((model.fc2.slimming_gate.weight - 1).abs().max()) > 0.1  # folding it would change fc2


def test_torchvision_swin_projection_gets_no_gate_and_is_exact():
    """torchvision's Swin calls ``self.proj.weight`` through ``F.linear``: no gate there, and
    the pruned network equals the original with its cut channels zeroed."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1],
                                               num_heads=[2, 4], window_size=[4, 4], num_classes=5).eval()
    x = torch.randn(1, 3, 32, 32)
    gated = slimming.add_gates(model, x)
    assert gated and not [n for n in gated if n.endswith("attn.proj")]
    sparsity_shaped(model, 0)
    result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    probe = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-5


class Branch(nn.Module):
    """A layer the example's path does not reach (``self.other`` off when it is traced), on
    the input itself (which no cut narrows)."""

    def __init__(self):
        super().__init__()
        self.other = False
        self.fc1, self.norm = nn.Linear(8, 16), nn.LayerNorm(16)
        self.fc2, self.fc2b = nn.Linear(16, 4), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2b(x) if self.other else self.fc2(torch.relu(self.norm(self.fc1(x))))


def test_a_gate_on_a_layer_the_example_does_not_reach_is_still_folded():
    """Only a gate whose layer is called through its weight is dropped unfolded: one on a layer
    that simply did not run on the example (a branch taken later) is folded, so the branch
    still computes what it did."""
    torch.manual_seed(0)
    model = Branch().eval()
    slimming.add_gates(model, at=["fc2b"])
    with torch.no_grad():
        model.fc2b.slimming_gate.weight.uniform_(0.2, 0.8)
        model.norm.weight.uniform_(0.1, 1.0)
    with pytest.warns(UserWarning, match="did not run"):
        result = slimming.prune(model, percent=0.2, example_inputs=torch.randn(2, 8), compensate=False)
    assert not hasattr(result.model.fc2b, "slimming_gate") and result.model.fc1.out_features < 16
    model.other = result.model.other = True
    x = torch.randn(5, 8)
    with torch.no_grad():
        assert rel_diff(result.model(x), model(x)) < 1e-5


class HFSelfAttention(nn.Module):
    """Self-attention as Hugging Face writes it (ViT, YOLOS, Swin-v2): the heads merged back by
    ``context.size()[:-2] + (self.all_head_size,)``, a width it holds beside its number of heads."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.num_attention_heads, self.attention_head_size = heads, dim // heads
        self.all_head_size = heads * (dim // heads)
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        shape = x.shape[0], -1, self.num_attention_heads, self.attention_head_size
        q, k, v = (layer(x).view(*shape).transpose(1, 2) for layer in (self.query, self.key, self.value))
        context = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)
        return context.reshape(context.size()[:-2] + (self.all_head_size,))


class HFBlock(nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.norm, self.attention, self.dense = nn.LayerNorm(dim), HFSelfAttention(dim), nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        return self.head((x + self.dense(self.attention(self.norm(x)))).mean(1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_unchecked_prune_sets_the_merged_width_the_attention_reads_and_cuts_as_the_checked_one(seed):
    """Issue 44, item 8: where the forward merges heads by an attribute it holds
    (``self.all_head_size``), the trace sees that very attribute read as the size (a tracked int),
    so the cut must set it; unchecked, it was left as it was (only the check could vouch), the
    pruned network failed its run and the heads were kept (Hugging Face's Swin-v2, YOLOS,
    MobileViT cut 19-34% against 21-44% checked). Now both cut the same, exactly, no retry."""
    torch.manual_seed(seed)
    model, x = HFBlock().eval(), torch.zeros(1, 6, 32)
    slimming.add_gates(model, x)
    with torch.no_grad():
        model.dense.slimming_gate.weight.copy_(torch.rand(4) + 0.5)
        model.dense.slimming_gate.weight[seed % 4] = 0
    results = {}
    for verify in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results[verify] = slimming.prune(model, threshold=1e-6, example_inputs=x, compensate=False,
                                             verify=verify)
    for r in results.values():
        assert not r.retries and r.model.attention.num_attention_heads == 3
        assert r.model.attention.all_head_size == 24
        sure = {(c.attr, c.sure) for c in r.widths}
        assert sure == {("num_attention_heads", True), ("all_head_size", True)}
        probe = torch.randn(2, 6, 32)
        with torch.no_grad():
            assert rel_diff(r.model(probe), zeroed(model, r.masks)(probe)) < 1e-5
    assert all(torch.equal(results[True].masks[k], results[False].masks[k]) for k in results[True].masks)


class AuxInTraining(nn.Module):
    """``body`` and, in training mode only, an auxiliary head on its output (a detector's
    auxiliary head; Hugging Face DPT's first fusion layer, which its example never reaches):
    the trace runs a training-mode forward for it, meeting every attention again."""

    def __init__(self, body: nn.Module, width: int):
        super().__init__()
        self.body, self.aux = body, nn.Linear(width, 2)

    def forward(self, x):
        out = self.body(x)
        out = getattr(out, "last_hidden_state", out)
        return (out, self.aux(out)) if self.training else out


def _hf_vit():
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=96)
    return transformers.ViTModel(config, add_pooling_layer=False), 48


AUX_BODIES = {
    "TinyViT": lambda: (TinyViT(), 10),
    "timm test_vit": lambda: (pytest.importorskip("timm").create_model(
        "test_vit", pretrained=False, num_classes=10, img_size=32), 10),
    "Hugging Face ViTModel": _hf_vit,
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(AUX_BODIES))
def test_an_attention_met_again_by_the_training_mode_forward_is_gated_and_cut_as_without_it(name, seed):
    """A second forward over the same attentions splits their heads as the first did, and
    counts each layer's reading once: the same gates as on the body alone (heads and MLPs;
    the heads had been "used twice on different channels" and the MLPs left without a gate,
    which left Hugging Face's DPT 3.4% cut through its gates), the same cut, exact."""
    torch.manual_seed(seed)
    body, width = AUX_BODIES[name]()
    body.eval()
    x = torch.zeros(1, 3, 32, 32)
    single = copy.deepcopy(body)
    alone = slimming.add_gates(single, x)
    assert gated_layers(single) and gated_layers(single, heads=True)  # MLPs and heads
    model = AuxInTraining(body, width).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert slimming.add_gates(model, x) == [f"body.{n}" for n in alone]
    sparsity_shaped(model, seed)
    plain = copy.deepcopy(model.body)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
        bare = slimming.prune(plain, percent=0.3, example_inputs=x, compensate=False)
    assert not result.retries
    assert {f"body.{k}": v.tolist() for k, v in bare.masks.items()} == \
        {k: v.tolist() for k, v in result.masks.items()}
    probe = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert rel_diff(result.model(probe), zeroed(model, result.masks)(probe)) < 1e-4


def test_hugging_face_dpt_is_cut_exactly_through_its_gates():
    """Hugging Face's DPT (a ViT read by a convolutional neck): its neck reads the encoder's
    residual stream before any LayerNorm, so the stream keeps its width and nothing is cut
    without gates (one line naming the layer); with them, heads, MLP widths and the neck's
    convolutions go, exact against the gates zeroed at the example's size and at another (its
    position embedding interpolated in the forward)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.DPTConfig(
        image_size=64, patch_size=16, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=128, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 32, 64, 64],
        fusion_hidden_size=32, reassemble_factors=[4, 2, 1, 0.5], head_in_index=-1)
    model, x = transformers.DPTForDepthEstimation(config).eval(), torch.zeros(1, 3, 64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(slimming.SlimmingError, match="readout_projects.0.0 reads it before any"):
            slimming.prune(model, percent=0.3, example_inputs=x)
        gated = slimming.add_gates(model, x)
        assert {f"dpt.encoder.layer.{b}.{n}" for b in range(4) for n in ("attention.output.dense",
                                                                        "output.dense")} <= set(gated)
        sparsity_shaped(model, 0)
        full = sum(p.numel() for p in model.parameters())
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert 1 - sum(p.numel() for p in result.model.parameters()) / full > 0.2
    heads = [result.model.get_submodule(f"dpt.encoder.layer.{b}.attention.attention").num_attention_heads
             for b in range(4)]
    assert min(heads) < 4
    reference = zeroed(model, result.masks)
    for size in (64, 96):
        probe = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
        with torch.no_grad():
            assert rel_diff(result.model(probe).predicted_depth, reference(probe).predicted_depth) < 1e-4


@pytest.mark.parametrize("gated", [False, True])
def test_hugging_face_swin_is_cut_exactly_with_or_without_gates(gated):
    """Hugging Face's Swin (windows, shifts, a relative position bias per head): through its
    LayerNorms as it is, and with gates on its heads and MLPs too, a fifth of its parameters
    or more go, exact against the cut channels zeroed, at once: its bias table, held by a
    module of its own inside the attention, loses the cut heads' columns (it was kept whole,
    the pruned attention failed, and the heads were kept on a retry)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2],
                                     num_heads=[2, 4], window_size=4, num_labels=5)
    model, x = transformers.SwinForImageClassification(config).eval(), torch.zeros(1, 3, 64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if gated:
            assert gated_layers(model) == {} and slimming.add_gates(model, x)
            assert len(gated_layers(model, heads=True)) == 4
        sparsity_shaped(model, 0)
        full = sum(p.numel() for p in model.parameters())
        result = slimming.prune(model, percent=0.3, example_inputs=x, compensate=False)
    assert 1 - sum(p.numel() for p in result.model.parameters()) / full > 0.2 and not result.retries
    attentions = [m for m in result.model.modules() if type(m).__name__ == "SwinAttention"]
    for attention in attentions:  # the bias table, in a module of its own, one column per head kept
        assert attention.relative_position_bias.relative_position_bias_table.shape[1] == \
            attention.num_attention_heads
    assert not gated or sum(a.num_attention_heads for a in attentions) < 2 + 2 + 4 + 4
    probe = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert rel_diff(result.model(probe).logits, zeroed(model, result.masks)(probe).logits) < 1e-4
