import pickle
import random

import pytest
import torch

from slimming import CheckpointError, checkpoint_dict, load_checkpoint, load_model, models, save_checkpoint


class Evil:
    """Unpickling this would create a marker file: the loader must never do it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def ckpt_path(tmp_path, tiny_vgg):
    path = tmp_path / "model.pth"
    save_checkpoint(checkpoint_dict(tiny_vgg, epoch=3, acc=50.0), path)
    return path


def test_round_trip_rebuilds_same_network(ckpt_path, tiny_vgg):
    raw = torch.load(ckpt_path, weights_only=True)
    assert raw["arch"] == "vgg" and raw["format"] == "slimming" and raw["version"] == 1
    assert raw["cfg"] == tiny_vgg.cfg and raw["options"]["num_classes"] == 10
    model = load_model(ckpt_path)
    assert not model.training
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(model(x), tiny_vgg.eval()(x))


def test_default_cfg_is_stored_as_none(tmp_path):
    path = tmp_path / "a.pth"
    save_checkpoint(checkpoint_dict(models.build("vgg", depth=11)), path)
    assert torch.load(path, weights_only=True)["cfg"] is None
    assert load_model(path).cfg == models.vgg.DEFAULT_CFGS[11]


def test_module_prefix_is_stripped(tmp_path, tiny_vgg):
    ckpt = checkpoint_dict(tiny_vgg)
    ckpt["state_dict"] = {f"module.{k}": v for k, v in ckpt["state_dict"].items()}
    save_checkpoint(ckpt, tmp_path / "ddp.pth")
    assert torch.equal(load_model(tmp_path / "ddp.pth").feature[0].weight, tiny_vgg.feature[0].weight)


def test_hostile_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"arch": "vgg", "state_dict": {}, "payload": Evil(marker)}, path)
    with pytest.raises(CheckpointError, match="refused"):
        load_checkpoint(path)
    assert not marker.exists()
    with open(tmp_path / "plain.pkl", "wb") as f:  # a bare pickle, not even a zip
        pickle.dump(Evil(marker), f, protocol=2)
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "plain.pkl")
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"\x00" * 10, random.Random(0).randbytes(4096)],
                         ids=["empty", "zeros", "random"])
def test_garbage_files_get_one_clear_error(tmp_path, content):
    path = tmp_path / "bad.pth"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="bad.pth") as e:
        load_checkpoint(path)
    assert "\n" not in str(e.value)


def test_truncated_checkpoint(ckpt_path):
    data = ckpt_path.read_bytes()
    ckpt_path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(ckpt_path)


def test_missing_file_directory_and_non_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        load_checkpoint(tmp_path / "nope.pth")
    with pytest.raises(CheckpointError, match="directory"):
        load_checkpoint(tmp_path)
    torch.save({"weights": torch.ones(1)}, tmp_path / "x.pth")
    with pytest.raises(CheckpointError, match="state_dict"):
        load_checkpoint(tmp_path / "x.pth")
    torch.save({"state_dict": {}}, tmp_path / "y.pth")
    with pytest.raises(CheckpointError, match="architecture"):
        load_checkpoint(tmp_path / "y.pth")


def test_weights_that_do_not_fit_the_cfg(ckpt_path):
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt["cfg"] = [8, "M", 16, "M", 16, 12, "M", 24, "M", 24]
    save_checkpoint(ckpt, ckpt_path)
    with pytest.raises(CheckpointError, match="do not fit"):
        load_model(ckpt_path)
    ckpt["arch"] = "nin"
    ckpt["cfg"] = None
    save_checkpoint(ckpt, ckpt_path)
    with pytest.raises(CheckpointError):
        load_model(ckpt_path)


def test_failed_save_keeps_old_file_and_leaves_no_temp(ckpt_path, monkeypatch):
    before = ckpt_path.read_bytes()

    def boom(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError):
        save_checkpoint({"arch": "vgg", "state_dict": {}}, ckpt_path)
    assert ckpt_path.read_bytes() == before
    assert [p.name for p in ckpt_path.parent.iterdir()] == [ckpt_path.name]
