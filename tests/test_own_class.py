"""A network of the user's own class in the user's own loop: which modules ``ignore=`` keeps
whole (names, what is inside a name, types), and ``save_pruned``/``load_pruned``, which save a
pruned instance without its code and give the widths back to a fresh instance of the class."""

import pytest
import torch
from torch import nn

import slimming
from slimming import CheckpointError, SlimmingError, load_pruned, save_pruned

torch.manual_seed(0)


def cbr(cin, cout, k=3):
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=k // 2, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU())


class Head(nn.Module):
    def __init__(self, cin, outputs):
        super().__init__()
        self.cv = cbr(cin, 12)
        self.out = nn.Conv2d(12, outputs, 1)

    def forward(self, x):
        return self.out(self.cv(x))


class MyNet(nn.Module):
    """Stem, a residual pair, and a head, as a user writes one (not a registered family)."""

    def __init__(self, extra: bool = False):
        super().__init__()
        self.stem = cbr(3, 16)
        self.a, self.b = cbr(16, 24), cbr(24, 16)
        self.down = cbr(16, 32) if not extra else nn.Sequential(cbr(16, 32), cbr(32, 32))
        self.head = Head(32, 6)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.b(self.a(x))
        return self.head(self.down(x))


def sparse(model: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.data = torch.rand(m.num_features, generator=g) ** 3
            m.bias.data = 0.1 * torch.randn(m.num_features, generator=g)
            m.running_var.data = 0.5 + torch.rand(m.num_features, generator=g)
    return model.eval()


X = torch.randn(2, 3, 24, 24)


@pytest.mark.parametrize("ignore,kept", [
    ("head", ["head.cv.1"]),                   # a name keeps what is inside it
    (("head.cv.1",), ["head.cv.1"]),           # an exact name
    ((Head,), ["head.cv.1"]),                  # a type
    (("a.1", "a.2"), ["a.1"]),                 # several
])
def test_ignore_keeps_modules_whole_by_name_prefix_or_type(ignore, kept):
    model = sparse(MyNet(), 1)
    result = slimming.prune(model, percent=0.5, example_inputs=X[:1], ignore=ignore)
    for name in kept:
        assert result.masks[name].all(), name
    others = [n for n in result.masks if n not in kept]
    assert not others or any(not result.masks[n].all() for n in others)


@pytest.mark.parametrize("ignore", ["haed", ("head", "nope.1"), (3,)])
def test_ignore_refuses_what_names_no_module(ignore):
    with pytest.raises(SlimmingError) as e:
        slimming.prune(sparse(MyNet(), 2), percent=0.5, example_inputs=X[:1], ignore=ignore)
    assert e.value.params == ("ignore",) and "\n" not in str(e.value)


@pytest.mark.parametrize("seed", range(3))
def test_save_pruned_then_load_into_a_fresh_instance(tmp_path, seed):
    model = sparse(MyNet(), seed)
    result = slimming.prune(model, percent=0.4, example_inputs=X[:1], ignore="head")
    path = tmp_path / "pruned.pth"
    save_pruned(result.model, path, epoch=3)
    fresh = MyNet()
    back = load_pruned(path, fresh)
    assert back is fresh and not back.training
    assert back.a[0].out_channels == result.model.a[0].out_channels < 24
    with torch.no_grad():
        torch.testing.assert_close(back(X), result.model.eval()(X))
    assert torch.load(path, weights_only=True)["epoch"] == 3


def test_load_pruned_refuses_what_does_not_fit(tmp_path):
    result = slimming.prune(sparse(MyNet(), 4), percent=0.4, example_inputs=X[:1])
    path = tmp_path / "pruned.pth"
    save_pruned(result.model, path)
    with pytest.raises(CheckpointError, match="do not fit MyNet") as e:
        load_pruned(path, MyNet(extra=True))  # another architecture: a missing key
    assert "\n" not in str(e.value)
    other = tmp_path / "other.pth"
    slimming.save_checkpoint(slimming.checkpoint_dict(slimming.models.build("vgg")), other)
    with pytest.raises(CheckpointError, match="not a file written by slimming.save_pruned"):
        load_pruned(other, MyNet())
    torch.save({"format": "slimming-pruned", "version": 1, "state_dict": {"a": nn.ReLU()}},
               tmp_path / "code.pth")
    with pytest.raises(CheckpointError, match="refused"):
        load_pruned(tmp_path / "code.pth", MyNet())


class Width(nn.Module):
    """A width in an integer attribute the forward reads (a C2f block's ``c``)."""

    def __init__(self):
        super().__init__()
        self.c = 8
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 2)
        self.soft = nn.Softmax(dim=1)

    def forward(self, x):
        return self.soft(self.fc(self.bn(self.conv(x)).reshape(x.shape[0], self.c, -1).mean(-1)))


@pytest.mark.parametrize("forged", [{"c": 4}, {"c": 0}, {"c": 7}, {"soft.dim": 0}])
def test_a_forged_width_is_refused_without_an_example(tmp_path, forged):
    """A file whose widths were edited (its checksum made again) no longer fits its weights: the
    forward load_pruned runs at the shape the network was cut on, which the file keeps, refuses
    it in one line with no example given, and the fresh instance is left as it was; a file that
    changes an integer of torch's own modules that no cut sets (a softmax's dim) is refused too."""
    from slimming.utils.safeload import checksum

    model = Width().eval()
    with torch.no_grad():
        model.bn.weight.copy_(torch.tensor([1.0, 1e-4, 1.0, 1e-4, 1.0, 1e-4, 1.0, 1.0]))
    result = slimming.prune(model, percent=0.3, example_inputs=torch.zeros(1, 3, 8, 8), compensate=False)
    path = tmp_path / "pruned.pth"
    save_pruned(result.model, path)
    blob = torch.load(path, weights_only=True)
    assert blob["example_shape"] == [1, 3, 8, 8] and blob["widths"]["c"] == result.model.c == 6
    assert load_pruned(path, Width()).c == 6  # as written, it loads
    blob["widths"].update(forged)
    blob["checksum"] = checksum(blob)
    torch.save(blob, path)
    fresh = Width()
    with pytest.raises(CheckpointError) as e:
        load_pruned(path, fresh)
    assert "\n" not in str(e.value) and fresh.c == 8 and fresh.bn.num_features == 8


@pytest.mark.parametrize("name", ["format", "version", "widths", "state_dict", "checksum", "example_shape"])
def test_save_pruned_refuses_a_field_named_as_the_files_own(tmp_path, name):
    with pytest.raises(SlimmingError, match=f"'{name}' is the file's own field") as e:
        save_pruned(Small(), tmp_path / "p.pth", **{name: 1})
    assert "\n" not in str(e.value) and not (tmp_path / "p.pth").exists()


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean((2, 3)))


def _hostile(state: dict, case: str) -> dict:
    bn = ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var")
    if case == "zero-element-weight-2**31-wide":
        state["conv.weight"] = torch.empty(2 ** 31, 0, 3, 3)
        state["conv.bias"] = torch.empty(0)
    elif case == "batchnorm-wider-than-built":
        state.update({k: torch.ones(16) for k in bn})
    elif case == "zero-width-layer":
        state.update({"conv.weight": torch.empty(0, 3, 3, 3), "conv.bias": torch.empty(0),
                      "fc.weight": torch.empty(2, 0), **{k: torch.ones(0) for k in bn}})
    elif case == "linear-that-does-not-fit":
        state["fc.weight"] = torch.ones(2, 5)
    elif case == "int64-weights":
        state["conv.weight"] = state["conv.weight"].mul(100).long()
    elif case == "nan-weight":
        state["fc.weight"][0, 0] = float("nan")
    elif case == "infinite-weight":
        state["bn.weight"][3] = float("inf")
    elif case == "negative-variance":
        state["bn.running_var"][1] = -0.5
    return state


VALUES = ["int64-weights", "nan-weight", "infinite-weight", "negative-variance"]


@pytest.mark.parametrize("case", ["zero-element-weight-2**31-wide", "batchnorm-wider-than-built",
                                  "zero-width-layer", "linear-that-does-not-fit", "checksum-removed",
                                  *VALUES])
def test_a_hostile_pruned_file_is_refused_before_the_instance_changes(tmp_path, case):
    """A few-KB file cannot make load_pruned allocate gigabytes or hand back a network whose
    widths do not fit; the caller's instance is left exactly as it was."""
    from slimming.utils.safeload import save_checked

    state = _hostile(Small().state_dict(), case)
    blob = {"format": "slimming-pruned", "version": 1, "state_dict": state}
    save_checked(blob, tmp_path / "h.pth")
    if case == "checksum-removed":
        blob = torch.load(tmp_path / "h.pth", weights_only=True)
        del blob["checksum"]
        torch.save(blob, tmp_path / "h.pth")
    assert (tmp_path / "h.pth").stat().st_size < 64 * 1024
    fresh = Small()
    before = {k: v for k, v in fresh.state_dict(keep_vars=True).items()}
    with pytest.raises(CheckpointError) as e:
        load_pruned(tmp_path / "h.pth", fresh, torch.zeros(1, 3, 8, 8))
    assert "\n" not in str(e.value)
    after = fresh.state_dict(keep_vars=True)
    assert after.keys() == before.keys() and all(after[k] is v for k, v in before.items())


@pytest.mark.parametrize("case", VALUES)
def test_values_no_training_writes_are_refused_on_save_and_on_load(tmp_path, case):
    """int64 weights, a NaN, an infinite gamma, a negative variance: save_pruned refuses to write
    them (it never writes what load_pruned refuses) and a slimming checkpoint holding them is
    refused by load_model, in one line each (they loaded silently and computed garbage)."""
    model = Small()
    if case != "int64-weights":  # a model cannot hold an int64 convolution weight
        with torch.no_grad():
            for k, v in _hostile(Small().state_dict(), case).items():
                model.state_dict()[k].copy_(v)
        with pytest.raises(SlimmingError, match="bn|fc") as e:
            save_pruned(model, tmp_path / "x.pth")
        assert e.value.params == ("model",) and not (tmp_path / "x.pth").exists()
    ckpt = slimming.checkpoint_dict(slimming.models.build("vgg", cfg=[4, "M", 4, "M", 4, "M", 4, "M", 4]))
    key = next(k for k in ckpt["state_dict"] if k.endswith({"int64-weights": "0.weight", "nan-weight": "bias",
                                                              "infinite-weight": "1.weight",
                                                              "negative-variance": "running_var"}[case]))
    t = ckpt["state_dict"][key]
    ckpt["state_dict"][key] = t.long() if case == "int64-weights" else t.index_fill(
        0, torch.tensor([0]), {"nan-weight": float("nan"), "infinite-weight": float("inf"),
                               "negative-variance": -1.0}[case])
    slimming.save_checkpoint(ckpt, tmp_path / "c.pth")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")) as e:
        slimming.load_model(tmp_path / "c.pth")
    assert "\n" not in str(e.value)


def test_an_instance_built_on_the_meta_device_is_loaded_not_left_empty(tmp_path):
    model = Small()
    save_pruned(model, tmp_path / "m.pth")
    with torch.device("meta"):
        fresh = Small()
    loaded = load_pruned(tmp_path / "m.pth", fresh)
    assert not any(t.is_meta for t in loaded.state_dict().values())
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))


def test_save_pruned_never_writes_a_file_load_pruned_refuses(tmp_path):
    class Extra(Small):
        def get_extra_state(self):
            return {"note": "not a tensor"}

        def set_extra_state(self, state):
            pass

    with pytest.raises(SlimmingError) as e:
        save_pruned(Extra(), tmp_path / "x.pth")
    assert e.value.params == ("model",) and not (tmp_path / "x.pth").exists()


def test_a_load_refused_after_its_weights_were_copied_leaves_their_values_as_they_were(tmp_path):
    """The forward that vouches for the widths fails after load_state_dict copied the file's
    values into the instance's tensors: those values are put back too, not only the tensors."""
    torch.manual_seed(0)
    save_pruned(Small(), tmp_path / "a.pth")
    torch.manual_seed(1)
    fresh = Small()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(CheckpointError, match="the loaded widths do not fit"):
        load_pruned(tmp_path / "a.pth", fresh, torch.zeros(1, 5, 8, 8))  # an input it refuses
    assert [k for k, v in fresh.state_dict().items() if not torch.equal(v, before[k])] == []


@pytest.mark.parametrize("field", [lambda: 1, object(), {"a": [1, object()]}, torch.zeros(2, device="meta")])
def test_save_pruned_refuses_a_field_load_pruned_could_not_read(tmp_path, field):
    """A function (unpicklable: a raw AttributeError before) or an object (written, then refused
    by the weights_only load): one line naming the field, no file."""
    with pytest.raises(SlimmingError, match="the field note holds") as e:
        save_pruned(Small(), tmp_path / "x.pth", note=field)
    assert e.value.params == ("fields",) and not (tmp_path / "x.pth").exists()
    plain = {"epoch": 3, "acc": [0.5, None], 1: "one", "t": torch.ones(2)}
    save_pruned(Small(), tmp_path / "y.pth", note=plain)
    assert load_pruned(tmp_path / "y.pth", Small()) is not None


def test_save_pruned_of_a_model_on_the_meta_device_is_one_line(tmp_path):
    with torch.device("meta"):
        model = Small()
    with pytest.raises(SlimmingError, match="meta device") as e:
        save_pruned(model, tmp_path / "x.pth")
    assert e.value.params == ("model",) and not (tmp_path / "x.pth").exists()


class Grouped(nn.Module):
    """A GroupNorm (cut by whole groups) and a buffer outside the state_dict."""

    def __init__(self):
        super().__init__()
        self.conv, self.gn = nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16)
        self.register_buffer("shift", torch.zeros(1, 16, 1, 1), persistent=False)
        self.fc = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc((self.gn(self.conv(x)) + self.shift).mean((2, 3)))


@pytest.mark.parametrize("forge", ["num_groups-1", "num_groups-2", "nan-buffer"])
def test_a_forged_group_count_or_buffer_is_refused(tmp_path, forge):
    """Hostile round 6: a GroupNorm's num_groups forged (the same channels, other groups) loaded
    and computed 0.6-0.7 off, its forward running; a NaN in the file's buffers loaded. Both are
    refused in one line, the fresh instance as it was; the file as written loads."""
    from slimming.utils.safeload import checksum

    model = Grouped().eval()
    with torch.no_grad():
        model.gn.weight.copy_(torch.tensor([1.0] * 4 + [1e-4] * 4 + [1.0] * 8))
    result = slimming.prune(model, percent=0.25, example_inputs=torch.zeros(1, 3, 8, 8), compensate=False)
    path = tmp_path / "pruned.pth"
    save_pruned(result.model, path)
    assert load_pruned(path, Grouped()).gn.num_groups == result.model.gn.num_groups == 3
    blob = torch.load(path, weights_only=True)
    if forge.startswith("num_groups"):
        blob["widths"]["gn.num_groups"] = int(forge[-1])
    else:
        blob["buffers"]["shift"][0, 1] = float("nan")
    blob["checksum"] = checksum(blob)
    torch.save(blob, path)
    fresh = Grouped()
    with pytest.raises(CheckpointError) as e:
        load_pruned(path, fresh)
    assert "\n" not in str(e.value) and fresh.gn.num_groups == 4 and fresh.shift.shape == (1, 16, 1, 1)


def test_save_pruned_where_it_cannot_write_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    """A folder that cannot be written (here /proc, which even root cannot write) and a disk that
    fills under torch's writer (its RuntimeError) are one SlimmingError naming the path."""
    model = Small()
    with pytest.raises(SlimmingError) as e:
        save_pruned(model, "/proc/slimming-test/pruned.pth")
    assert e.value.params == ("path",) and "\n" not in str(e.value)

    def full(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing "
                           "file data/0: file write failed")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(SlimmingError, match="cannot write it .*file write failed") as e:
        save_pruned(model, tmp_path / "p.pth")
    assert e.value.params == ("path",) and list(tmp_path.iterdir()) == []
