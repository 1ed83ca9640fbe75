"""Checkpoints written by the network-slimming paper's PyTorch code: built here in its documented
layout, loaded with ``--arch``, and compared with a hand-written forward pass of the paper's own
block order (bn -> select by a float 0/1 mask -> relu -> conv)."""

import random

import pytest
import torch
import torch.nn.functional as F
from conftest import randomize_bn, zeroed
from test_prune import rel_diff

from slimming import (
    CheckpointError,
    checkpoint_dict,
    load_checkpoint,
    load_model,
    models,
    prune,
    save_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


# --- the paper's layout, written from its description --------------------------------------

def add_bn(sd, prefix, n, gen):
    sd[f"{prefix}.weight"] = torch.randn(n, generator=gen)
    sd[f"{prefix}.bias"] = torch.randn(n, generator=gen) * 0.5
    sd[f"{prefix}.running_mean"] = torch.randn(n, generator=gen) * 0.2
    sd[f"{prefix}.running_var"] = torch.rand(n, generator=gen) + 0.5
    sd[f"{prefix}.num_batches_tracked"] = torch.tensor(100)


def conv_weight(cout, cin, k, gen):
    return torch.randn(cout, cin, k, k, generator=gen) * (2.0 / (cin * k * k)) ** 0.5


def keep_mask(width, pruned, rng):
    """The paper's select.indexes: a float 0/1 vector over the BN's channels (never all 0)."""
    mask = torch.ones(width)
    if pruned:
        kept = rng.randint(1, width)
        mask[:] = 0
        mask[sorted(rng.sample(range(width), kept))] = 1
    return mask


def add_entry(sd, prefix, width, pruned, rng, gen):
    """bn1 (full stream width) + select.indexes; returns the number of channels kept."""
    add_bn(sd, f"{prefix}bn1" if prefix.endswith(".") else f"{prefix}bn", width, gen)
    mask = keep_mask(width, pruned, rng)
    sd[f"{prefix}select.indexes"] = mask
    return int(mask.sum())


def paper_preresnet(n, pruned, rng, gen, num_classes=10):
    sd, cfg, inplanes = {"conv1.weight": conv_weight(16, 3, 3, gen)}, [], 16
    for s, planes in enumerate((16, 32, 64)):
        for k in range(n):
            p = f"layer{s + 1}.{k}."
            c0 = add_entry(sd, p, inplanes, pruned, rng, gen)
            c1, c2 = (rng.randint(1, planes), rng.randint(1, planes)) if pruned else (planes, planes)
            sd[p + "conv1.weight"] = conv_weight(c1, c0, 1, gen)
            add_bn(sd, p + "bn2", c1, gen)
            sd[p + "conv2.weight"] = conv_weight(c2, c1, 3, gen)
            add_bn(sd, p + "bn3", c2, gen)
            sd[p + "conv3.weight"] = conv_weight(planes * 4, c2, 1, gen) * 0.3
            if k == 0:
                sd[p + "downsample.0.weight"] = conv_weight(planes * 4, inplanes, 1, gen)
            cfg += [c0, c1, c2]
            inplanes = planes * 4
    kept = add_entry(sd, "", inplanes, pruned, rng, gen)
    sd["fc.weight"] = torch.randn(num_classes, kept, generator=gen) * 0.1
    sd["fc.bias"] = torch.randn(num_classes, generator=gen)
    return sd, cfg + [kept]


def paper_densenet(n, pruned, rng, gen, num_classes=10):
    sd, cfg, width = {"conv1.weight": conv_weight(24, 3, 3, gen)}, [], 24
    for b in range(1, 4):
        for i in range(n):
            kept = add_entry(sd, f"dense{b}.{i}.", width, pruned, rng, gen)
            sd[f"dense{b}.{i}.conv1.weight"] = conv_weight(12, kept, 3, gen)
            cfg.append(kept)
            width += 12
        if b < 3:
            kept = add_entry(sd, f"trans{b}.", width, pruned, rng, gen)
            sd[f"trans{b}.conv1.weight"] = conv_weight(width, kept, 1, gen)
            cfg.append(kept)
    kept = add_entry(sd, "", width, pruned, rng, gen)
    sd["fc.weight"] = torch.randn(num_classes, kept, generator=gen) * 0.1
    sd["fc.bias"] = torch.randn(num_classes, generator=gen)
    return sd, cfg + [kept]


def paper_vgg(cfg, gen, num_classes=10):
    sd, i, cin = {}, 0, 3
    for v in cfg:
        if v == "M":
            i += 1
            continue
        sd[f"feature.{i}.weight"] = conv_weight(v, cin, 3, gen)
        add_bn(sd, f"feature.{i + 1}", v, gen)
        i, cin = i + 3, v
    sd["classifier.weight"] = torch.randn(num_classes, cin, generator=gen) * 0.1
    sd["classifier.bias"] = torch.randn(num_classes, generator=gen)
    return sd


# --- the paper's forward pass, by hand ------------------------------------------------------

def bn(sd, p, x):
    return F.batch_norm(x, sd[p + ".running_mean"], sd[p + ".running_var"], sd[p + ".weight"],
                        sd[p + ".bias"], False, 0.0, 1e-5)


def entry(sd, bn_name, select, x):
    """bn over every channel, then keep where the float mask is nonzero, then relu."""
    return F.relu(bn(sd, bn_name, x)[:, sd[select + ".indexes"].nonzero().squeeze(1)])


def head(sd, x):
    x = entry(sd, "bn", "select", x)
    return F.linear(F.avg_pool2d(x, 8).flatten(1), sd["fc.weight"], sd["fc.bias"])


def forward_preresnet(sd, x):
    x = F.conv2d(x, sd["conv1.weight"], padding=1)
    n = len({k.split(".")[1] for k in sd if k.startswith("layer1.")})
    for s in (1, 2, 3):
        for k in range(n):
            p, stride = f"layer{s}.{k}", 2 if s > 1 and k == 0 else 1
            out = F.conv2d(entry(sd, p + ".bn1", p + ".select", x), sd[p + ".conv1.weight"])
            out = F.conv2d(F.relu(bn(sd, p + ".bn2", out)), sd[p + ".conv2.weight"], stride=stride, padding=1)
            out = F.conv2d(F.relu(bn(sd, p + ".bn3", out)), sd[p + ".conv3.weight"])
            if p + ".downsample.0.weight" in sd:
                x = F.conv2d(x, sd[p + ".downsample.0.weight"], stride=stride)
            x = out + x
    return head(sd, x)


def forward_densenet(sd, x):
    x = F.conv2d(x, sd["conv1.weight"], padding=1)
    n = len({k.split(".")[1] for k in sd if k.startswith("dense1.")})
    for b in (1, 2, 3):
        for i in range(n):
            p = f"dense{b}.{i}"
            x = torch.cat([x, F.conv2d(entry(sd, p + ".bn1", p + ".select", x), sd[p + ".conv1.weight"],
                                       padding=1)], 1)
        if b < 3:
            p = f"trans{b}"
            x = F.avg_pool2d(F.conv2d(entry(sd, p + ".bn1", p + ".select", x), sd[p + ".conv1.weight"]), 2)
    return head(sd, x)


def forward_vgg(sd, cfg, x):
    i = 0
    for v in cfg:
        if v == "M":
            x, i = F.max_pool2d(x, 2), i + 1
            continue
        x = F.relu(bn(sd, f"feature.{i + 1}", F.conv2d(x, sd[f"feature.{i}.weight"], padding=1)))
        i += 3
    return F.linear(F.avg_pool2d(x, 2).flatten(1), sd["classifier.weight"], sd["classifier.bias"])


# --- the files ------------------------------------------------------------------------------

VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512]
VGG11_PRUNED = [5, "M", 9, "M", 17, 3, "M", 30, 12, "M", 8, 20]


def make(arch, kind, seed):
    """(paper state_dict, the paper's forward on it, expected depth, expected cfg)."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    pruned = kind != "trained"
    if arch == "vgg":
        cfg = VGG11_PRUNED if pruned else VGG11
        sd = paper_vgg(cfg, gen, num_classes=100)
        return sd, lambda x: forward_vgg(sd, cfg, x), 11, (cfg if pruned else None)
    n = rng.choice([1, 2])
    if arch == "preresnet":
        sd, cfg = paper_preresnet(n, pruned, rng, gen, num_classes=100)
        return sd, lambda x: forward_preresnet(sd, x), 9 * n + 2, (cfg if pruned else None)
    sd, cfg = paper_densenet(n, pruned, rng, gen, num_classes=100)
    return sd, lambda x: forward_densenet(sd, x), 3 * n + 4, (cfg if pruned else None)


def write(path, sd, kind, cfg, prefix):
    """The paper's three kinds of file: main.py's after training, *prune.py's, and main.py's
    after fine-tuning a pruned model (no cfg there: it is read off the weights)."""
    if prefix:
        sd = {f"module.{k}": v for k, v in sd.items()}
    if kind == "pruned":
        obj = {"cfg": cfg, "state_dict": sd}
    else:
        obj = {"epoch": 160, "best_prec1": torch.tensor(0.9347), "state_dict": sd,
               "optimizer": {"state": {}, "param_groups": [{"lr": 0.001, "momentum": 0.9,
                                                             "params": list(range(len(sd)))}]}}
    torch.save(obj, path)


@pytest.mark.parametrize("arch", ["vgg", "preresnet", "densenet"])
@pytest.mark.parametrize("kind", ["trained", "pruned", "finetuned"])
@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.slow
def test_paper_files_load_and_match_the_paper_forward(arch, kind, prefix, tmp_path):
    seed = ["vgg", "preresnet", "densenet"].index(arch) * 10 + len(kind) + prefix
    sd, reference, depth, cfg = make(arch, kind, seed)
    path = tmp_path / "paper.pth.tar"
    write(path, sd, kind, cfg, prefix)

    with pytest.raises(CheckpointError, match="pass arch") as e:  # the parameter: the CLI says --arch
        load_checkpoint(path)
    assert "\n" not in str(e.value)

    ckpt = load_checkpoint(path, arch=arch)
    assert ckpt["arch"] == arch and ckpt["format"] == "slimming"
    assert ckpt["options"] == {"depth": depth, "num_classes": 100} and ckpt["cfg"] == cfg
    if kind == "pruned":
        assert "epoch" not in ckpt and "best_acc" not in ckpt
    else:
        assert ckpt["epoch"] == 160 and ckpt["best_acc"] == pytest.approx(93.47)
        assert "optimizer" not in ckpt  # the paper's optimizer state indexes its own parameter list

    model = load_model(path, arch=arch)
    assert not model.training
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert rel_diff(model(x), reference(x)) < 1e-5
        # and a converted file is an ordinary slimming checkpoint, safe to load
        save_checkpoint(checkpoint_dict(model, epoch=ckpt.get("epoch")), tmp_path / "ours.pth")
        assert torch.equal(load_model(tmp_path / "ours.pth")(x), model(x))
        # slimming works on it
        result = prune(model, percent=0.4, compensate=False)
        assert rel_diff(result.model(x), zeroed(model, result.cfg_mask)(x)) < 1e-4


def test_paper_names_depth_and_old_files(tmp_path):
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    sd, _ = paper_preresnet(2, True, rng, gen)
    old = {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")}  # PyTorch < 0.4.1
    torch.save({"state_dict": old}, tmp_path / "old.pth")
    ckpt = load_checkpoint(tmp_path / "old.pth", arch="resnet", depth=20)  # the paper's --arch name
    assert ckpt["arch"] == "preresnet" and ckpt["options"]["depth"] == 20
    assert all(v.dtype == torch.int64 for k, v in ckpt["state_dict"].items() if k.endswith(".index"))
    raw = torch.load(tmp_path / "old.pth", weights_only=True)["state_dict"]
    mask = raw["layer2.1.select.indexes"]
    assert torch.equal(ckpt["state_dict"]["layer2.1.select.index"], mask.nonzero().squeeze(1))
    assert torch.equal(ckpt["state_dict"]["layer2.1.bn1.weight"], raw["layer2.1.bn1.weight"][mask > 0])
    assert load_model(tmp_path / "old.pth", arch="preresnet").layer2[1].bn1.num_features == int(mask.sum())


def paper_file(tmp_path, arch="densenet", edit=None):
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    sd, cfg = paper_densenet(1, True, rng, gen) if arch == "densenet" else paper_preresnet(1, True, rng, gen)
    if edit:
        edit(sd, cfg)
    path = tmp_path / "paper.pth"
    torch.save({"cfg": cfg, "state_dict": sd}, path)
    return path


def drop(key):
    return lambda sd, cfg: sd.pop(key)


def shrink(key):
    return lambda sd, cfg: sd.__setitem__(key, sd[key][:-1])


@pytest.mark.parametrize("arch,edit,kwargs,match", [
    ("densenet", None, {"arch": "preresnet"}, "not a checkpoint of the paper's preresnet"),
    ("preresnet", None, {"arch": "densenet"}, "not a checkpoint of the paper's densenet"),
    ("densenet", None, {"arch": "vgg"}, "not a checkpoint of the paper's vgg"),
    ("densenet", None, {"arch": "alexnet"}, "unknown arch"),
    ("densenet", None, {"arch": "densenet", "depth": 40}, "depth 7, not 40"),
    ("preresnet", None, {"arch": "preresnet", "depth": 164}, "depth 11, not 164"),
    ("densenet", drop("fc.weight"), {"arch": "densenet"}, "fc.weight"),
    ("densenet", shrink("dense2.0.select.indexes"), {"arch": "densenet"}, "indexes has"),
    ("densenet", lambda sd, cfg: cfg.__setitem__(0, cfg[0] + 1), {"arch": "densenet"}, "does not match"),
    ("preresnet", shrink("layer3.0.conv3.weight"), {"arch": "preresnet"}, "do not fit"),
    ("preresnet", drop("layer1.0.bn2.running_var"), {"arch": "preresnet"}, "do not fit"),
])
def test_mismatches_are_one_line_errors(tmp_path, arch, edit, kwargs, match):
    path = paper_file(tmp_path, arch, edit)
    with pytest.raises(CheckpointError, match=match) as e:
        load_model(path, **kwargs)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_arch_and_depth_must_agree_with_a_slimming_file(tmp_path):
    path = tmp_path / "ours.pth"
    model = load_model(paper_file(tmp_path), arch="densenet")
    save_checkpoint(checkpoint_dict(model), path)
    assert load_checkpoint(path, arch="densenet", depth=7)["arch"] == "densenet"
    with pytest.raises(CheckpointError, match="holds arch 'densenet'"):
        load_checkpoint(path, arch="vgg")
    with pytest.raises(CheckpointError, match="depth-7"):
        load_checkpoint(path, depth=10)


def test_slimming_layout_without_arch_passes_through(tmp_path):
    """A bare state_dict of our own layout (select.index, narrow BN) also loads given --arch."""
    model = models.build("preresnet", depth=11).eval()
    randomize_bn(model, torch.Generator().manual_seed(2), zero_frac=0.5)
    pruned = prune(model, percent=0.5).model
    torch.save({"state_dict": pruned.state_dict(), "epoch": 3}, tmp_path / "bare.pth")
    loaded = load_model(tmp_path / "bare.pth", arch="preresnet")
    x = torch.randn(2, 3, 32, 32)
    assert loaded.cfg == pruned.cfg and torch.equal(loaded(x), pruned(x))


@pytest.mark.parametrize("cfg", [None, [5, 7, 3, 9, 4, 6, 2, 8]])
def test_nin_files_of_the_paper_load_and_match(tmp_path, cfg):
    """The paper's NIN files (``feature.N``: nine conv-BN-ReLU blocks, the last to the classes)
    read with --arch nin: widths and classes off the weights, outputs unchanged."""
    model = models.build("nin", cfg=cfg, num_classes=7).eval()
    randomize_bn(model, torch.Generator().manual_seed(3))
    path = tmp_path / "nin.pth.tar"
    saved = {"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}, "epoch": 4}
    if cfg is not None:
        saved["cfg"] = cfg
    torch.save(saved, path)
    loaded = load_model(path, arch="nin")
    assert loaded.cfg == (cfg or models.nin.DEFAULT_CFG) and loaded.options == {"num_classes": 7}
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    with pytest.raises(CheckpointError, match="NIN takes no depth"):
        load_model(path, arch="nin", depth=19)
