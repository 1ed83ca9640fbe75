"""What the layout promises a contributor: a new network family is one new file, a new
importance criterion one class, and library errors name Python parameters while the command
line names its flags."""

import importlib
import sys
import textwrap

import pytest
import torch
from conftest import zeroed

import slimming
from slimming import SlimmingError, checkpoint_dict, load_model, models, save_checkpoint
from slimming.cli import main
from slimming.pruning import importance

TINY = '''
"""A tiny chain family, as a contributor would write it: this file is all there is."""
from torch import nn

from slimming.models.registry import register


@register
class Net(nn.Module):
    arch = "tinychain"
    input_size = (3, 16, 16)
    surgery = "chain"

    def __init__(self, cfg=None, num_classes=5):
        super().__init__()
        self.cfg = list(cfg or [6, 8])
        self.options = {"num_classes": num_classes}
        layers, c = [], 3
        for w in self.cfg:
            layers += [nn.Conv2d(c, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            c = w
        self.feature = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x):
        return self.classifier(self.feature(x).mean((2, 3)))

    def prunable_bns(self):
        return [m for m in self.feature if isinstance(m, nn.BatchNorm2d)]

    def pruned_cfg(self, kept):
        return list(kept)
'''


@pytest.fixture
def tiny_family(tmp_path, monkeypatch):
    (tmp_path / "tiny_family_mod.py").write_text(textwrap.dedent(TINY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(models.registry, "FAMILIES", dict(models.FAMILIES))
    monkeypatch.setattr(models, "FAMILIES", models.registry.FAMILIES)
    importlib.import_module("tiny_family_mod")
    yield "tinychain"
    sys.modules.pop("tiny_family_mod", None)


@pytest.mark.parametrize("seed", range(3))
def test_a_new_family_is_one_file(tiny_family, tmp_path, seed):
    """Registered by its own decorator, the family builds, prunes by its declared surgery (the
    pruned network equals the original with the cut channels' BatchNorms zeroed), saves and
    reloads, and the CLI's --arch takes it, without a line elsewhere."""
    g = torch.Generator().manual_seed(seed)
    model = models.build(tiny_family, num_classes=5).eval()
    for bn in model.prunable_bns():
        bn.weight.data = torch.rand(bn.num_features, generator=g)
        bn.bias.data = torch.randn(bn.num_features, generator=g) * 0.1
        bn.running_mean.data = torch.randn(bn.num_features, generator=g) * 0.1
    result = slimming.prune(model, percent=0.4, compensate=False)  # traced at its own 3x16x16
    assert result.model.cfg == [int(m.sum()) for m in result.cfg_mask] and sum(result.model.cfg) < 14
    names = {id(m): n for n, m in model.named_modules()}
    reference = zeroed(model, {names[id(b)]: keep for b, keep in zip(model.prunable_bns(), result.cfg_mask)})
    x = torch.randn(4, 3, 16, 16, generator=g)
    torch.testing.assert_close(result.model.eval()(x), reference(x), rtol=1e-5, atol=1e-5)
    path = tmp_path / "tiny.pth"
    save_checkpoint(checkpoint_dict(result.model), path)
    back = load_model(path)
    assert back.arch == tiny_family and back.cfg == result.model.cfg
    torch.testing.assert_close(back(x), result.model(x))
    from slimming.cli.parser import arch_name

    assert arch_name(tiny_family) == tiny_family


def test_a_family_defined_again_replaces_itself_and_a_taken_name_is_refused(tiny_family):
    """Reloading the family's module (autoreload, a notebook cell run twice) is no error;
    another class under a taken name (or a shipped family's alias) is."""
    module = importlib.reload(sys.modules["tiny_family_mod"])
    assert models.family(tiny_family) is module.Net
    for name in (tiny_family, "resnet"):
        with pytest.raises(ValueError, match="is taken"):
            models.register(type("Other", (module.Net,), {"arch": name}))


def test_a_new_criterion_is_one_class(monkeypatch):
    """A subclass of Importance registers under its names; prune and --importance use it."""
    monkeypatch.setattr(importance, "CRITERIA", dict(importance.CRITERIA))

    class LastChannelsFirst(importance.Importance):
        names = {"test-position": {}}

        def __call__(self, model, group):
            return torch.arange(group.size, dtype=torch.float32)  # the first channels go first

    model = models.build("vgg", cfg=[8, "M", 16, "M", 16, "M", 16, "M", 16], num_classes=10)
    result = slimming.prune(model, percent=0.5, importance=importance.get_importance("test-position"))
    for mask in result.cfg_mask:
        kept = mask.nonzero().squeeze(1)
        assert kept.tolist() == list(range(mask.numel() - len(kept), mask.numel()))
    from slimming.cli.parser import build_parser

    args = build_parser().parse_args(["prune", "--checkpoint", "x.pth", "--percent", "0.5", "--save", "out",
                                      "--importance", "test-position"])
    assert args.importance == "test-position"
    with pytest.raises(SlimmingError, match="importance nope is not a criterion") as e:
        importance.get_importance("nope")
    assert e.value.params == ("importance",)


def test_library_errors_name_parameters_and_the_cli_names_flags(tmp_path, capsys):
    model = models.build("vgg", cfg=[8, "M", 16, "M", 16, "M", 16, "M", 16], num_classes=10)
    for kwargs, param in [({"target_flops": 0}, "target_flops"), ({"target_params": -1.0}, "target_params"),
                          ({"percent": 0.5, "round_to": 0}, "round_to"),
                          ({"percent": 0.5, "max_layer_prune": 2}, "max_layer_prune")]:
        with pytest.raises(SlimmingError) as e:
            slimming.prune(model, **kwargs)
        assert param in str(e.value) and "--" not in str(e.value) and param in e.value.params
    path = tmp_path / "vgg.pth"
    save_checkpoint(checkpoint_dict(model), path)
    code = main(["prune", "--checkpoint", str(path), "--target-flops", "1e30", "--save",
                 str(tmp_path / "out"), "--cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "--target-flops 1e+30 is at or above" in err and "target_flops" not in err
    assert not (tmp_path / "out").exists()


def test_a_new_data_source_is_one_record(monkeypatch):
    """A Source record with its tensors and datasets: both loaders serve it, and --dataset
    takes its name."""
    from slimming.data import datasets

    monkeypatch.setitem(datasets.SOURCES, "tiny16", None)  # gone again after the test
    del datasets.SOURCES["tiny16"]
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (60, 3, 16, 16), dtype=torch.uint8, generator=g)
    labels = torch.arange(60) % 3

    def tensors(root, download):
        return images[:48], labels[:48], images[48:], labels[48:], 3

    def sets(root, download, pipeline):
        return (datasets.TensorImages(images[:48], labels[:48], pipeline(True)),
                datasets.TensorImages(images[48:], labels[48:], pipeline(False)), 3)

    datasets.add_source(datasets.Source("tiny16", tensors, sets, count=60, size=16,
                                        stats=((0.5,) * 3, (0.25,) * 3)))
    for loader in ("fast", "torchvision"):
        train, test, classes = datasets.build_loaders("tiny16", batch_size=8, loader=loader, seed=0)
        x, y = next(iter(train))
        assert classes == 3 and x.shape == (8, 3, 16, 16) and x.dtype == torch.float32
        assert train.info.image_size == 16 and train.info.mean == (0.5,) * 3
        assert sum(len(y) for _, y in test) == 12
    from slimming.cli.parser import build_parser

    args = build_parser().parse_args(["train", "--dataset", "tiny16", "--save", "x"])
    assert args.dataset == "tiny16"
    with pytest.raises(SlimmingError, match="unknown dataset nope"):
        datasets.build_loaders("nope")


def test_train_takes_a_typed_config_and_returns_its_result(tmp_path):
    """``train(TrainConfig(...), model)``: no Namespace; an injected loss and the result."""
    from slimming.training import TrainConfig, train

    calls = []

    def loss_fn(logits, y):
        calls.append(logits.shape)
        return torch.nn.functional.cross_entropy(logits, y)

    model = models.build("vgg", cfg=[8, "M", 8, "M", 8, "M", 8, "M", 8], num_classes=10)
    config = TrainConfig(save=tmp_path / "run", epochs=1, dataset="synthetic", batch_size=256,
                         cpu=True, sparsity=1e-4, seed=0)
    result = train(config, model, loss_fn=loss_fn)
    assert calls and calls[0][1] == 10 and 0 <= result.best_acc <= 100
    assert result.last["epoch"] == 1 and result.folder == tmp_path / "run"
    assert {p.name for p in result.folder.iterdir()} >= {"last.pth", "best.pth", "metrics.jsonl"}
    back = load_model(result.folder / "last.pth")
    assert back.cfg == model.cfg
    with pytest.raises(SlimmingError, match="already exists: pass overwrite") as e:
        train(config, model)
    assert "overwrite" in e.value.params
    with pytest.raises(SlimmingError, match="deterministic needs seed"):
        train(TrainConfig(save=tmp_path / "d", epochs=1, dataset="synthetic", cpu=True,
                          deterministic=True), model)


def test_a_config_file_sets_the_parsers_defaults(tmp_path, capsys):
    """YAML keys become set_defaults of the subcommand: typed and checked by each flag's own
    type, switches as booleans, the command line wins."""
    from slimming.cli.parser import apply_config, build_parser

    config = tmp_path / "c.yaml"
    config.write_text("epochs: 7\nlr: 0.05\namp: true\ncfg: [4, M, 4, M, 4, M, 4, M, 4]\n")
    argv = ["train", "--config", str(config), "--save", "x", "--lr", "0.2"]
    parser = build_parser()
    apply_config(parser, argv)
    args = parser.parse_args(argv)
    assert (args.epochs, args.lr, args.amp) == (7, 0.2, True)
    assert args.cfg == [4, "M", 4, "M", 4, "M", 4, "M", 4]
    for text, message in [("epochs: zero\n", "--epochs"), ("amp: 3\n", "switch"),
                          ("epochs: true\n", "takes a value")]:
        config.write_text(text)
        parser = build_parser()
        with pytest.raises(SystemExit):
            apply_config(parser, ["train", "--config", str(config), "--save", "x"])
            parser.parse_args(["train", "--config", str(config), "--save", "x"])
        assert message in capsys.readouterr().err


class _Layer(torch.nn.Module):
    """A layer of one's own for the registration tests below."""


@pytest.mark.parametrize("call,param", [
    (lambda: slimming.register_layer(_Layer, slimming.LayerRule(makes={"weight": 0}), name=""), "name"),
    (lambda: slimming.register_layer(_Layer, slimming.LayerRule(makes={"weight": 0}), name=5), "name"),
    (lambda: slimming.register_layer(_Layer, slimming.LayerRule(reads={"weight": 7}, makes={"weight": 0})),
     "rule"),
    (lambda: slimming.register_layer(_Layer, slimming.LayerRule(reads={"weight": "1"}, makes={"weight": 0})),
     "rule"),
    (lambda: slimming.add_gates(torch.nn.Linear(4, 4), torch.zeros(1, 4), at=5), "at"),
    (lambda: slimming.prune(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                                torch.nn.Conv2d(8, 4, 3)),
                            percent=0.3, example_inputs=torch.zeros(1, 3, 8, 8),
                            importance=importance.Importance()), "importance"),
], ids=["name-empty", "name-int", "dim-7", "dim-str", "gates-at-int", "base-importance"])
def test_extension_points_refuse_what_they_cannot_use_in_one_line(call, param):
    """Hostile round 5: each a SlimmingError naming its parameter, nothing registered."""
    before = dict(slimming.layers.rules.RULES)
    with pytest.raises(SlimmingError) as e:
        call()
    assert e.value.params == (param,) and "\n" not in str(e.value)
    assert dict(slimming.layers.rules.RULES) == before


@pytest.mark.parametrize("seed", range(6))
def test_registrations_of_one_key_come_off_in_any_order_and_leave_nothing_behind(seed):
    """Hostile round 6: the same op name and the same layer type registered three times, the
    handles removed in a random order. While any is held, the newest one still held is what the
    trace follows; once all are removed, the tables are as they were (a registration stayed
    behind where the oldest was removed first)."""
    import random

    from slimming.layers.rules import MODULE_RULES, RULES
    from slimming.pruning.register import OP_ALIASES, register_layer, register_op

    rng = random.Random(seed)
    tables = (dict(OP_ALIASES), dict(RULES), dict(MODULE_RULES))
    likes = ["silu", "add", "cat"]
    rules = [slimming.LayerRule(makes={"weight": 0}, reads={"weight": 1}),
             slimming.LayerRule(carries={"weight": 0}),
             slimming.LayerRule(makes={"weight": 0, "bias": 0}, reads={"weight": 1})]
    held = [(register_op("myop", like), register_layer(_Layer, rule), like, rule)
            for like, rule in zip(likes, rules)]
    assert slimming.register_op is register_op and slimming.register_layer is register_layer
    for i in rng.sample(range(3), 3):
        op, layer, _, _ = held[i]
        op.remove()
        layer.remove()
        held[i] = None
        left = [h for h in held if h is not None]
        if left:
            assert OP_ALIASES["myop"] == left[-1][2] and RULES[left[-1][1]] is left[-1][3]
    assert (dict(OP_ALIASES), dict(RULES), dict(MODULE_RULES)) == tables
