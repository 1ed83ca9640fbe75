"""The user's model left exactly as given (issue 46, high): every forward slimming runs that the
user did not ask for (the trace's, the check's at a second size, compensation's, a latency
probe's) puts back every attribute the forward changed, not only parameters and buffers; and a
small pruned file cannot make ``load_pruned`` run a forward that costs gigabytes."""

import warnings

import pytest
import timm
import torch
import torchvision
from conftest import sparsity_shaped
from torch import nn

import slimming
from slimming import load_pruned, save_pruned
from slimming.errors import CheckpointError
from slimming.utils.modules import modes_kept


class WindowAttention(nn.Module):
    """As Hugging Face's Swin does: a forward that sets its window from the input's size (4 -> 3
    at a smaller one), caches a mask per size in a dict, and counts its calls in a plain int."""

    def __init__(self, c: int):
        super().__init__()
        self.window_size, self.masks, self.calls, self.seen = 4, {}, 0, []
        self.proj = nn.Conv2d(c, c, 1)

    def forward(self, x):
        if min(x.shape[-2:]) < self.window_size * 2:
            self.window_size = min(x.shape[-2:]) // 2
        self.calls += 1
        self.seen.append(x.shape[-1])
        key = (x.shape[-1], self.window_size)
        if key not in self.masks:
            self.masks[key] = torch.ones(1, 1, *x.shape[-2:])
        self.last = x.shape[-1]  # an attribute added by the forward
        pooled = nn.functional.avg_pool2d(x, self.window_size, 1, padding=0)
        pooled = nn.functional.interpolate(pooled, size=x.shape[-2:])
        return self.proj(pooled * self.masks[key]) + x


class Windowed(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.attn = WindowAttention(16)
        self.body = nn.Sequential(nn.Conv2d(16, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU())
        self.fc = nn.Linear(24, 5)

    def forward(self, x):
        return self.fc(self.body(self.attn(self.stem(x))).mean((2, 3)))


def attributes(model: nn.Module) -> dict:
    """Every module's plain attributes, by value where they are numbers, strings or tuples and
    by identity otherwise; its containers' contents by identity."""
    out = {}
    for name, m in model.named_modules():
        for k, v in vars(m).items():
            if isinstance(v, (dict, list, set)) and not k.startswith("_"):
                out[name, k] = (type(v), len(v), [id(x) for x in (v.values() if isinstance(v, dict) else v)])
            elif isinstance(v, (int, float, str, tuple, bool, type(None))):
                out[name, k] = v
            elif not k.startswith("_"):
                out[name, k] = id(v)
    return out


def test_modes_kept_puts_back_what_a_forward_set_added_or_filled():
    model = Windowed().eval()
    before = attributes(model)
    with modes_kept(model):
        model(torch.zeros(1, 3, 6, 6))
    assert attributes(model) == before and not hasattr(model.attn, "last")
    assert model.attn.window_size == 4 and model.attn.masks == {} and model.attn.calls == 0


class LoggingConv(nn.Conv2d):
    """torch's forward, and a helper of its own that fills a list it holds."""

    def __init__(self, *args):
        super().__init__(*args)
        self.log = ["built"]

    def _conv_forward(self, x, weight, bias):
        self.log.append(x.shape)
        return super()._conv_forward(x, weight, bias)


class Filling(nn.Module):
    """A forward that changes containers which held something: a dict's value replaced, a key
    added, a list grown, a set emptied; a buffer registered on a torch layer it holds; a list
    a torch layer's subclass fills in a helper of its own."""

    def __init__(self):
        super().__init__()
        self.conv, self.logged = nn.Conv2d(3, 3, 1), LoggingConv(3, 3, 1)
        self.table, self.seen, self.tags = {"a": 1, "b": [2]}, [object()], {"x"}

    def forward(self, x):
        self.table["a"], self.table["c"] = object(), 3
        self.seen.append(x)
        self.tags.clear()
        self.conv.register_buffer("cache", x.detach(), persistent=False)
        return self.logged(self.conv(x))


def test_modes_kept_puts_back_containers_that_held_something_as_they_were():
    model = Filling()
    table, b, first = model.table, model.table["b"], model.seen[0]
    with modes_kept(model):
        model(torch.zeros(1, 3, 2, 2))
    assert model.table is table and list(model.table.items()) == [("a", 1), ("b", b)]
    assert model.seen == [first] and model.seen[0] is first and model.tags == {"x"}
    assert "cache" not in model.conv._buffers and not model.conv._non_persistent_buffers_set
    assert model.logged.log == ["built"]  # a subclass's own helper: watched as the user's code is


@pytest.mark.parametrize("how", [dict(percent=0.4), dict(target_flops=0.6),
                                 dict(percent=0.4, compensate=True), dict(percent=0.4, verify=False)])
def test_prune_leaves_a_model_whose_forward_sets_its_own_attributes_as_given(how):
    """The check also runs at a smaller size: there the forward lowers ``window_size``; the model
    the user holds afterwards runs at its own size as before, bit for bit."""
    torch.manual_seed(0)
    model = Windowed().eval()
    sparsity_shaped(model, 0)
    x = torch.randn(2, 3, 16, 16)
    before = attributes(model)
    with torch.no_grad():
        out = model(x)
    after_one = attributes(model)  # what the user's own call changed: the counter, the cache
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slimming.prune(model, example_inputs=torch.zeros(1, 3, 16, 16), **how)
    assert attributes(model) == after_one and model.attn.window_size == 4
    with torch.no_grad():
        assert torch.equal(model(x), out)
    assert before[("attn", "window_size")] == 4


NETWORKS = [
    ("resnet18", lambda: torchvision.models.resnet18(num_classes=10), 64),
    ("mobilenet_v3_small", lambda: torchvision.models.mobilenet_v3_small(num_classes=10), 64),
    ("swin_t", lambda: torchvision.models.swin_t(num_classes=10), 64),
    ("convnext_tiny", lambda: torchvision.models.convnext_tiny(num_classes=10), 64),
    ("timm vit", lambda: timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=64), 64),
    ("timm efficientnet", lambda: timm.create_model("efficientnet_b0", num_classes=10), 64),
]


@pytest.mark.parametrize("name,build,size", NETWORKS, ids=[n for n, _, _ in NETWORKS])
@pytest.mark.slow
def test_the_users_network_gives_the_same_outputs_bit_for_bit_after_each_call(name, build, size):
    """Over networks others wrote: prune (checked, unchecked, to a FLOPs budget, compensated)
    and add_gates' trace leave the user's model computing what it computed, bit for bit, with
    every attribute as it was."""
    torch.manual_seed(0)
    model = build().eval()
    sparsity_shaped(model, 1)
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        out = model(x)
    before = attributes(model)
    for how in (dict(percent=0.3), dict(percent=0.3, verify=False), dict(target_flops=0.7),
                dict(percent=0.3, compensate=True)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                slimming.prune(model, example_inputs=torch.zeros(1, 3, size, size), **how)
            except slimming.SlimmingError:
                pass  # a refusal leaves it as given too
        assert attributes(model) == before, how
        with torch.no_grad():
            assert torch.equal(model(x), out), how


class Plain(nn.Module):
    """No ``input_size``: load_pruned's check runs at the shape the file says it was cut on."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64)
        self.conv2 = nn.Conv2d(64, 64, 1)
        self.fc = nn.Linear(64, 2)

    def forward(self, x):
        return self.fc(self.conv2(torch.relu(self.bn(self.conv(x)))).mean((2, 3)))


def _forged(tmp_path, shape, widths=None):
    from slimming.utils.safeload import checksum

    model = Plain().eval()
    sparsity_shaped(model, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = slimming.prune(model, percent=0.4, example_inputs=torch.zeros(1, 3, 8, 8))
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "pruned.pth"
    save_pruned(result.model, path)
    blob = torch.load(path, weights_only=True)
    blob["example_shape"] = shape
    if widths:
        blob["state_dict"]["fc.weight"] = torch.zeros(2, widths)
    blob["checksum"] = checksum(blob)
    torch.save(blob, path)
    return path


def _real_inputs(model, monkeypatch) -> list:
    """The shapes of the real (not fake) tensors the model's forward is called on."""
    from torch._subclasses.fake_tensor import FakeTensor

    seen, forward = [], Plain.forward

    def spy(self, x):
        if not isinstance(x, FakeTensor):
            seen.append(tuple(x.shape))
        return forward(self, x)

    monkeypatch.setattr(Plain, "forward", spy)
    return seen


def test_a_small_file_saying_a_huge_example_shape_is_checked_on_shapes_alone(tmp_path, monkeypatch):
    """8 KB saying (1, 3, 4096, 4096): the forward at that size would allocate gigabytes (each
    64-channel map 4 GiB); load_pruned checks the widths on fake tensors (shapes, no memory)
    and never runs the network at that size for real, and still loads a file that fits."""
    path = _forged(tmp_path / "huge", [1, 3, 4096, 4096])
    small = _forged(tmp_path / "small", [1, 3, 32, 32])
    assert path.stat().st_size < 64 * 1024
    seen = _real_inputs(Plain, monkeypatch)
    loaded = load_pruned(path, Plain())
    assert seen == [] and loaded.conv.out_channels < 64
    load_pruned(small, Plain())
    assert seen == [(1, 3, 32, 32)]  # a cheap one runs for real, as before


@pytest.mark.parametrize("shape", [[1, 3, 4096, 4096], [1, 3, 32, 32]])
def test_widths_that_do_not_fit_are_refused_at_any_example_shape(tmp_path, monkeypatch, shape):
    path = _forged(tmp_path, shape, widths=5)
    seen = _real_inputs(Plain, monkeypatch)
    fresh = Plain()
    with pytest.raises(CheckpointError) as e:
        load_pruned(path, fresh)
    assert "\n" not in str(e.value) and fresh.conv.out_channels == 64
    assert all(s == (1, 3, 32, 32) for s in seen)  # never the huge one for real
