"""Images of any size: the image size chosen, the two recipes (pad-and-crop for NxN images,
resized crops otherwise), val/ as the test split, modes and bit depths, the measured mean and std
and their cache, the ImageNet constants, the fast loader's memory limit, decompression bombs, and
32x32 folders served exactly as before. Tiny images made here in tmp_path; runs in seconds."""

import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import png
from PIL import Image
from torchvision.transforms.v2 import functional as F

from slimming.data import (
    IMAGENET_STATS,
    STATS,
    DataError,
    DataInfo,
    TensorLoader,
    build_datasets,
    build_loaders,
    decode_imagefolder,
    imagefolder,
    images,
)
from slimming.data import datasets as data
from slimming.data.images import read_image
from slimming.data.loaders import EpochDataLoader

MEAN, STD = STATS["cifar10"]
SIZES = [(40, 50), (64, 64), (17, 33)]  # (width, height) of the mixed folder's images
CLASSES = ("ant", "bee")


@pytest.fixture(autouse=True)
def own_cache_home(tmp_path, monkeypatch):
    """Caches written without a cache_dir go under tmp_path, not the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def save(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def mixed_folder(root: Path, test: str = "test", seed: int = 0) -> Path:
    """root/{train,<test>}/{ant,bee}/{0,1,2}.png, one image of each of SIZES per class: 6 + 6."""
    rng = np.random.default_rng(seed)
    for split in ("train", test):
        for cls in CLASSES:
            for i, (w, h) in enumerate(SIZES):
                save(root / split / cls / f"{i}.png", rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    return root


def square_folder(root: Path, size: int = 32, seed: int = 0) -> Path:
    """root/{train,test}/{ant,bee,cat}/*.png, all size x size: 9 train and 6 test images."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", 3), ("test", 2)):
        for cls in ("ant", "bee", "cat"):
            for i in range(n):
                save(root / split / cls / f"{i}.png",
                     rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
    return root


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def build(root, cache, image_size=None, **kw):
    kw = {"batch_size": 4, "seed": 0, **kw}
    return build_loaders("imagefolder", root, cache_dir=cache, image_size=image_size, **kw)


def epoch(ld) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*ld)
    return torch.cat(xs), torch.cat(ys)


def normalized(x: torch.Tensor, info: DataInfo) -> torch.Tensor:
    """uint8 (..., 3, H, W) -> what the loaders make of it: x / 255, less mean, over std."""
    mean, std = torch.tensor(info.mean).view(3, 1, 1), torch.tensor(info.std).view(3, 1, 1)
    return (x.float() / 255 - mean) / std


def notices(err: str) -> list[str]:
    return [line for line in err.splitlines() if "using the DataLoader path" in line]


# --------------------------------------------------------------------------- sizes and recipes

@pytest.mark.parametrize("n", [32, 48])
@pytest.mark.parametrize("kind", ["fast", "torchvision"])
def test_a_mixed_folder_gives_n_by_n_batches(tmp_path, n, kind, capsys):
    root = mixed_folder(tmp_path / "images")
    train, test, num_classes = build(root, tmp_path / "cache", n, loader=kind)
    assert num_classes == 2 and isinstance(train, EpochDataLoader)
    info = train.info
    assert info is test.info and info.image_size == n and info.resize == round(n * 8 / 7)
    assert info.loader == "torchvision" and info.norm == "dataset" and info.test_split == "test"
    for ld in (train, test):
        x, y = epoch(ld)
        assert x.shape == (6, 3, n, n) and x.dtype == torch.float32
        assert sorted(y.tolist()) == [0, 0, 0, 1, 1, 1]
    found = notices(capsys.readouterr().err)
    if kind == "fast":  # asked for, it cannot serve these: it says why in one line, not an error
        assert found == [f"slimming: the images are of 3 sizes (from 17x33 to 64x64), resized to "
                         f"{n}x{n} as they are read, which only the DataLoader path does; using the "
                         "DataLoader path with --workers 0"]
    else:
        assert found == []


def test_the_default_size_is_32_only_when_every_image_is_32x32(tmp_path):
    mixed = mixed_folder(tmp_path / "mixed")
    assert build(mixed, tmp_path / "cache")[0].info.image_size == 224
    square = square_folder(tmp_path / "square", size=48)
    info = build(square, tmp_path / "cache")[0].info
    assert (info.image_size, info.resize) == (224, 256)  # 48x48 images are not 32x32
    one_off = square_folder(tmp_path / "one_off")
    save(one_off / "test" / "cat" / "9.png", np.zeros((33, 32, 3), dtype=np.uint8))  # test counts too
    assert build(one_off, tmp_path / "cache")[0].info.image_size == 224
    train, _, _ = build(square_folder(tmp_path / "small"), tmp_path / "cache")
    assert isinstance(train, TensorLoader) and train.info.image_size == 32


def test_training_takes_random_resized_crops_and_flips(tmp_path):
    from torchvision.transforms import v2

    root = mixed_folder(tmp_path / "images")
    train = build(root, tmp_path / "cache", 32)[0]
    ops = [type(t) for t in train.dataset.transform.transforms]
    assert ops == [v2.RandomResizedCrop, v2.RandomHorizontalFlip, v2.ToDtype, v2.Normalize]

    def one_epoch(ld, e, global_seed):
        ld.set_epoch(e)
        torch.manual_seed(global_seed)  # the transforms draw from it (workers=0)
        return epoch(ld)

    again = build(root, tmp_path / "cache", 32)[0]  # the same seed
    x0, y0 = one_epoch(train, 0, 1)
    x1, y1 = one_epoch(again, 0, 1)
    assert torch.equal(y0, y1) and torch.equal(x0, x1)  # the same seed and draws: the same batches
    x2, y2 = one_epoch(again, 0, 2)
    assert torch.equal(y2, y0) and not torch.equal(x2, x0)  # only the augmentation differs
    assert x2.shape == x0.shape == (6, 3, 32, 32)
    _, y3 = one_epoch(again, 1, 1)
    assert not torch.equal(y3, y0)  # another epoch: another order


def test_evaluation_resizes_the_shorter_side_and_crops_the_centre(tmp_path):
    root = mixed_folder(tmp_path / "images")
    _, test, _ = build(root, tmp_path / "cache", 32)
    x, y = epoch(test)
    assert torch.equal(x, epoch(test)[0])  # deterministic
    info = test.info
    assert info.resize == 37  # round(32 * 8 / 7) = round(36.57)
    # test/ant/0.png is 40 wide, 50 high: shorter side 40 -> 37, so 50 -> int(37 * 50 / 40) = 46;
    # the centre 32x32 of 46x37 starts at row round(14 / 2) = 7, column round(5 / 2) = 2
    image = read_image(root / "test" / "ant" / "0.png")
    assert image.shape == (3, 50, 40)
    want = F.resize(image, [46, 37], antialias=True)[:, 7:39, 2:34]
    assert torch.allclose(x[0], normalized(want, info), rtol=0, atol=1e-6)
    # test/ant/1.png is 64x64: 37x37, centre from (2, 2)
    want = F.resize(read_image(root / "test" / "ant" / "1.png"), [37, 37], antialias=True)[:, 2:34, 2:34]
    assert torch.allclose(x[1], normalized(want, info), rtol=0, atol=1e-6)


def test_square_images_of_the_chosen_size_are_padded_and_cropped_in_memory(tmp_path):
    root = square_folder(tmp_path / "images", size=48)
    train, test, _ = build(root, tmp_path / "cache", 48)
    assert isinstance(train, TensorLoader) and train.info.resize is None
    assert train.padding == train.info.padding == 6  # 48 // 8
    x, _ = epoch(train)
    assert x.shape == (9, 3, 48, 48)
    slow = build(root, tmp_path / "cache", 48, loader="torchvision")
    assert slow[0].dataset.transform.transforms[0].padding == [6, 6, 6, 6]
    assert torch.allclose(epoch(test)[0], epoch(slow[1])[0], rtol=0, atol=1e-6)


def test_the_builtin_datasets_take_an_image_size_too(capsys):
    train, test, _ = build_loaders("synthetic", seed=0)
    assert isinstance(train, TensorLoader)
    assert train.info == DataInfo(32, None, MEAN, STD, "dataset", "fast", "test")
    train, test, _ = build_loaders("synthetic", seed=0, image_size=48)
    assert isinstance(train, EpochDataLoader) and (train.info.image_size, train.info.resize) == (48, 55)
    assert next(iter(train))[0].shape == (64, 3, 48, 48) and next(iter(test))[0].shape == (256, 3, 48, 48)
    assert notices(capsys.readouterr().err) == [
        "slimming: the images are 32x32, resized to 48x48 as they are read, which only the "
        "DataLoader path does; using the DataLoader path with --workers 0"]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "32", 10**6])
def test_bad_image_sizes(bad):
    with pytest.raises(DataError) as e:
        build_loaders("synthetic", image_size=bad)
    assert "image_size" in one_line(e) and e.value.params == ("image_size",)  # the CLI: --image-size


# --------------------------------------------------------------------------- layout and modes

def test_val_is_the_test_split_when_there_is_no_test(tmp_path):
    root = mixed_folder(tmp_path / "images", test="val")
    for kind in ("fast", "torchvision"):
        train, test, n = build(root, tmp_path / "cache", 32, loader=kind)
        assert n == 2 and test.info.test_split == "val" and test.dataset_size == 6
    root = square_folder(tmp_path / "both")
    save(root / "val" / "ant" / "0.png", np.zeros((32, 32, 3), dtype=np.uint8))
    _, test, _ = build(root, tmp_path / "cache")
    assert test.info.test_split == "test" and test.dataset_size == 6  # test/ wins
    square = square_folder(tmp_path / "square_val")
    blob = decode_imagefolder(square, tmp_path / "cache")
    os.rename(square / "test", square / "val")
    assert torch.equal(decode_imagefolder(square, tmp_path / "cache")["test_images"], blob["test_images"])
    (tmp_path / "neither" / "train" / "ant").mkdir(parents=True)
    for kind in ("fast", "torchvision"):
        with pytest.raises(DataError) as e:
            build(tmp_path / "neither", tmp_path / "cache", loader=kind)
        assert one_line(e) == (f"{tmp_path / 'neither'}: expected the layout test/<class>/<image> or "
                               "val/<class>/<image> for the test split (no test/ or val/ folder)")
    os.rename(root / "train", root / "training")
    with pytest.raises(DataError, match="no train/ folder"):
        build(root, tmp_path / "cache")


def test_modes_and_bit_depths_of_odd_sizes_decode_to_rgb(tmp_path):
    rng = np.random.default_rng(3)
    folder = tmp_path / "images" / "train" / "ant"
    gray = rng.integers(0, 256, (33, 17), dtype=np.uint8)
    rgba = rng.integers(0, 256, (19, 23, 4), dtype=np.uint8)
    palette = Image.fromarray(rng.integers(0, 256, (45, 31, 3), dtype=np.uint8)).quantize(16)
    gray16 = rng.integers(0, 65536, (21, 29)).astype(np.uint16)
    rgb16 = rng.integers(0, 65536, (27, 13, 3)).astype(np.uint16)
    save(folder / "gray.png", gray)
    save(folder / "rgba.png", rgba)
    folder.mkdir(parents=True, exist_ok=True)
    palette.save(folder / "palette.png")
    Image.fromarray(gray16).save(folder / "gray16.png")
    assert Image.open(folder / "gray16.png").mode == "I;16"
    rows = b"".join(b"\0" + rgb16[y].astype(">u2").tobytes() for y in range(27))
    (folder / "rgb16.png").write_bytes(png(13, 27, 16, 2, rows))
    want = {"gray.png": np.repeat(gray[..., None], 3, axis=2), "rgba.png": rgba[..., :3],
            "palette.png": np.array(palette.convert("RGB")),
            "gray16.png": np.repeat((gray16 >> 8).astype(np.uint8)[..., None], 3, axis=2),
            "rgb16.png": (rgb16 >> 8).astype(np.uint8)}
    for name, pixels in want.items():
        x = read_image(folder / name)
        assert x.dtype == torch.uint8 and torch.equal(x, torch.from_numpy(pixels).permute(2, 0, 1)), name
    for name in want:  # a test split of the same files, and the loaders make 32x32 RGB of them
        save(tmp_path / "images" / "test" / "ant" / name, np.zeros((8, 8, 3), dtype=np.uint8))
    train, test, _ = build(tmp_path / "images", tmp_path / "cache", 32)
    assert epoch(train)[0].shape == epoch(test)[0].shape == (5, 3, 32, 32)


def test_a_header_claiming_100000_by_100000_pixels_is_refused_before_decoding(tmp_path, monkeypatch):
    root = mixed_folder(tmp_path / "images")
    bad = root / "train" / "bee" / "zz.png"
    bad.write_bytes(png(100_000, 100_000, 8, 2, b"\0" * 100))  # 10 gigapixels in 130 bytes
    real = images.rgb8

    def decode(im):
        assert im.size[0] * im.size[1] <= images.MAX_PIXELS, "decoded a decompression bomb"
        return real(im)

    monkeypatch.setattr(images, "rgb8", decode)
    for kind in ("fast", "torchvision"):
        with pytest.raises(DataError) as e:
            build(root, tmp_path / "cache", loader=kind)
        assert one_line(e) == (f"{bad}: its header claims 10,000,000,000 pixels, over the limit of "
                               f"64,000,000 (a decompression bomb?); resize it (to 224x224, or 32x32 "
                               "for the CIFAR networks) or remove it")


def test_headers_are_read_once_for_an_unchanged_folder(tmp_path, monkeypatch):
    root, cache = mixed_folder(tmp_path / "images"), tmp_path / "cache"
    build(root, cache, 32, loader="torchvision")
    monkeypatch.setattr(imagefolder, "check_image", lambda p: pytest.fail("read a header again"))
    build(root, cache, 32, loader="torchvision")
    build_datasets("imagefolder", root, image_size=32, cache_dir=cache)
    save(root / "train" / "ant" / "new.png", np.zeros((9, 9, 3), dtype=np.uint8))
    read = []
    monkeypatch.setattr(imagefolder, "check_image", lambda p: read.append(p) or images.check_image(p))
    build(root, cache, 32, loader="torchvision")
    assert len(read) == 13  # the folder changed: every header again


# --------------------------------------------------------------------------- mean and std

@pytest.fixture
def measured(monkeypatch):
    """The number of images of each measurement of a mean and std."""
    counts = []
    real = imagefolder._measure

    def measure(batches):
        mean, std, n = real(batches)
        counts.append(n)
        return mean, std, n

    monkeypatch.setattr(imagefolder, "_measure", measure)
    return counts


def hand_stats(pixels: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.stack(pixels).double() / 255  # (N, 3, H, W)
    return x.mean(dim=(0, 2, 3)), x.permute(1, 0, 2, 3).reshape(3, -1).std(dim=1, unbiased=False)


def test_the_mean_and_std_are_measured_once_and_cached(tmp_path, measured, capsys):
    root, cache = mixed_folder(tmp_path / "images"), tmp_path / "cache"
    info = build(root, cache, 32)[0].info
    assert measured == [6] and "measured the mean" in capsys.readouterr().err
    eval32 = [F.center_crop(F.resize(read_image(p), [37], antialias=True), 32)
              for p in sorted((root / "train").glob("*/*.png"))]  # as evaluation resizes them
    mean, std = hand_stats(eval32)
    assert torch.allclose(torch.tensor(info.mean, dtype=torch.float64), mean, atol=1e-9)
    assert torch.allclose(torch.tensor(info.std, dtype=torch.float64), std, atol=1e-9)
    assert build(root, cache, 32, loader="fast")[1].info == info and measured == [6]  # reused
    assert "measured" not in capsys.readouterr().err
    build(root, cache, 48)
    build(root, cache, 32)
    build(root, cache, 48)
    assert measured == [6, 6]  # one measurement per image size, both kept
    save(root / "train" / "bee" / "3.png", np.zeros((20, 20, 3), dtype=np.uint8))
    changed = build(root, cache, 32)[0].info
    assert measured == [6, 6, 7] and changed.mean != info.mean  # a changed folder: measured again


@pytest.mark.parametrize("damage", ["truncate", "flip", "link"])
def test_a_damaged_statistics_cache_is_rebuilt(tmp_path, measured, capsys, damage):
    root, cache = mixed_folder(tmp_path / "images"), tmp_path / "cache"
    info = build(root, cache, 32)[0].info
    (path,) = cache.glob("*.info")
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[:200])
    elif damage == "flip":
        at = raw.find(struct.pack(">d", info.mean[0]))  # inside the stored mean
        assert at > 0
        path.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    else:
        path.unlink()
        path.symlink_to("/dev/zero")
    capsys.readouterr()
    assert build(root, cache, 32)[0].info == info
    err = capsys.readouterr().err
    assert measured == [6, 6]
    assert err.startswith(f"slimming: the image-information cache is invalid and is being rebuilt: {path}")
    assert not path.is_symlink() and build(root, cache, 32)[0].info == info and measured == [6, 6]


def test_a_forged_statistics_cache_is_rebuilt(tmp_path, measured, capsys):
    from slimming.utils.safeload import checksum

    root, cache = mixed_folder(tmp_path / "images"), tmp_path / "cache"
    info = build(root, cache, 32)[0].info
    (path,) = cache.glob("*.info")
    for forge, reason in [(lambda b: b["stats"][0].update(std=[0.0, 0.1, 0.1]), "stats"),
                          (lambda b: b["stats"][0].update(mean=[float("nan")] * 3), "stats"),
                          (lambda b: b.update(sizes=b["sizes"][:1]), "sizes"),
                          (lambda b: b["sizes"].__setitem__((0, 0), 2**62), "sizes")]:
        blob = torch.load(path, weights_only=True)
        forge(blob)
        blob["checksum"] = checksum(blob)
        torch.save(blob, path)
        capsys.readouterr()
        assert build(root, cache, 32)[0].info == info
        err = capsys.readouterr().err
        assert "invalid and is being rebuilt" in err and f"its {reason}" in err, err


def test_a_large_folder_is_measured_on_a_fixed_sample(tmp_path, measured, monkeypatch):
    monkeypatch.setattr(imagefolder, "STATS_IMAGES", 4)
    root = square_folder(tmp_path / "images")
    train = build(root, tmp_path / "a", loader="torchvision")[0]
    fast = build(root, tmp_path / "b")[0]
    assert measured == [4, 4] and fast.info.mean == train.info.mean  # the same 4 images
    files = sorted((root / "train").glob("*/*.png"))
    mean, std = hand_stats([read_image(files[i]) for i in imagefolder._stats_sample(9).tolist()])
    assert torch.allclose(torch.tensor(fast.info.std, dtype=torch.float64), std, atol=1e-9)
    assert len(set(imagefolder._stats_sample(9).tolist())) == 4


def test_fast_and_dataloader_paths_agree_on_a_32x32_folder(tmp_path):
    root = square_folder(tmp_path / "images")
    fast = build(root, tmp_path / "a")
    slow = build(root, tmp_path / "b", loader="torchvision")
    assert fast[1].info.mean == slow[1].info.mean and fast[1].info.std == slow[1].info.std
    assert torch.allclose(epoch(fast[1])[0], epoch(slow[1])[0], rtol=0, atol=1e-6)


def test_imagenet_and_given_normalisation(tmp_path, measured):
    root = mixed_folder(tmp_path / "images")
    _, test, _ = build(root, tmp_path / "cache", 32, norm="imagenet")
    assert (test.info.mean, test.info.std) == IMAGENET_STATS == ((0.485, 0.456, 0.406),
                                                                  (0.229, 0.224, 0.225))
    assert test.info.norm == "imagenet" and measured == []  # nothing measured
    want = F.resize(read_image(root / "test" / "ant" / "0.png"), [46, 37], antialias=True)[:, 7:39, 2:34]
    assert torch.allclose(epoch(test)[0][0], normalized(want, test.info), rtol=0, atol=1e-6)
    fast = build(square_folder(tmp_path / "square"), tmp_path / "cache", norm="imagenet")[1]
    assert isinstance(fast, TensorLoader) and fast.info.mean == IMAGENET_STATS[0]
    given = build(root, tmp_path / "cache", 32, norm=([0.5] * 3, (0.25, 0.25, 0.25)))[1]
    assert (given.info.mean, given.info.std, given.info.norm) == ((0.5,) * 3, (0.25,) * 3, "given")
    assert build_loaders("synthetic", norm="imagenet")[0].info.std == IMAGENET_STATS[1]
    for bad in ["cifar", None, (MEAN,), ([0.5] * 3, [0.0, 1, 1]), ([0.5] * 2, [1] * 2), ("abc", "def")]:
        with pytest.raises(DataError) as e:
            build_loaders("synthetic", norm=bad)
        assert "norm" in one_line(e)


def test_info_as_dict_is_plain(tmp_path):
    info = build(mixed_folder(tmp_path / "images"), tmp_path / "cache", 48)[0].info
    d = info.as_dict()
    assert d == {"image_size": 48, "resize": 55, "mean": list(info.mean), "std": list(info.std),
                 "norm": "dataset"}
    x = read_image(tmp_path / "images" / "test" / "ant" / "0.png")
    assert info.transform()(x).shape == (3, 48, 48)


# --------------------------------------------------------------------------- the fast loader

def test_the_fast_loader_falls_back_over_its_memory_limit(tmp_path, monkeypatch, capsys):
    root = square_folder(tmp_path / "images")
    fast = build(root, tmp_path / "cache")
    assert isinstance(fast[0], TensorLoader)
    monkeypatch.setattr(data, "fast_loader_limit", lambda: 40_000)
    capsys.readouterr()
    slow = build(root, tmp_path / "cache", workers=0)
    assert isinstance(slow[0], EpochDataLoader) and slow[0].info.loader == "torchvision"
    assert notices(capsys.readouterr().err) == [
        "slimming: 15 images of 32x32 would take 45.0 KiB decoded, over the fast loader's limit of "
        "39.1 KiB here; using the DataLoader path with --workers 0"]
    assert torch.allclose(epoch(slow[1])[0], epoch(fast[1])[0], rtol=0, atol=1e-6)
    build(root, tmp_path / "cache", loader="torchvision")  # not asked for: nothing said
    assert notices(capsys.readouterr().err) == []
    build(root, tmp_path / "cache", rank=1, world_size=2)  # said by rank 0 only
    assert notices(capsys.readouterr().err) == []


def test_the_memory_limit_is_a_quarter_of_ram_at_most_4_gib(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    limit = data.fast_loader_limit()
    assert 0 < limit <= 4 * 2**30 and limit <= data._memory() // 4
    monkeypatch.setattr(data, "_memory", lambda: 8 * 2**30)
    assert data.fast_loader_limit() == 2 * 2**30
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: four copies on this machine
    assert data.fast_loader_limit() == 2**29


def test_a_32x32_folder_is_served_exactly_as_before(tmp_path):
    """image_size None on a 32x32 folder: the fast loader, the same pad-and-crop draws, the same
    order: with CIFAR-10's constants (what an image folder was normalised with before) the very
    batches of before; with the folder's own mean and std the same pixels."""
    root, cache = square_folder(tmp_path / "images"), tmp_path / "cache"
    train, test, n = build(root, cache)
    assert n == 3 and isinstance(train, TensorLoader) and isinstance(test, TensorLoader)
    assert (train.info.image_size, train.info.resize, train.padding) == (32, None, 4)
    blob = decode_imagefolder(root, cache)

    def before(**kw):  # what build_loaders("imagefolder", root, batch_size=4, seed=0) made before
        return TensorLoader(blob["train_images"], blob["train_labels"], 4, train=True, mean=MEAN,
                            std=STD, seed=0, **kw)

    old, given = before(), build(root, cache, norm=(MEAN, STD))[0]
    for _ in range(2):  # epochs 0 and 1
        for (xa, ya), (xb, yb) in zip(old, given, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    own = build(root, cache)[0]
    for (xa, ya), (xb, yb) in zip(before(), own, strict=True):
        assert torch.equal(ya, yb)
        pixels_a = (xa * torch.tensor(STD).view(1, 3, 1, 1) + torch.tensor(MEAN).view(1, 3, 1, 1)) * 255
        pixels_b = (xb * torch.tensor(own.info.std).view(1, 3, 1, 1)
                    + torch.tensor(own.info.mean).view(1, 3, 1, 1)) * 255
        assert torch.allclose(pixels_a, pixels_b, atol=1e-3)
