"""The input pipeline: batch-wise crop/flip, normalisation, seeding, DDP shards, the decoded
ImageFolder cache, and the one-line errors. Tiny data made here; runs in seconds on a CPU."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from slimming.data import (
    STATS,
    DataError,
    TensorLoader,
    build_loaders,
    decode_imagefolder,
    imagefolder,
    synthetic_images,
)
from slimming.data import datasets as data
from slimming.data.loaders import crop_flip
from slimming.data.recipes import transforms

MEAN, STD = STATS["cifar10"]


@pytest.fixture(autouse=True)
def own_cache_home(tmp_path, monkeypatch):
    """Caches written without a cache_dir go under tmp_path, not the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def distinct_images(n: int, seed: int = 0) -> torch.Tensor:
    """n random uint8 images (n, 3, 32, 32) with no zero pixel, so padding is recognisable."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)


def loader(n: int = 64, batch_size: int = 16, train: bool = True, seed: int = 0, **kw) -> TensorLoader:
    """A TensorLoader whose label is the sample's index, so every output names its source."""
    return TensorLoader(distinct_images(n), torch.arange(n), batch_size, train=train, mean=MEAN,
                        std=STD, seed=seed, **kw)


def unnormalize(x: torch.Tensor, info=None) -> torch.Tensor:
    """uint8 pixels of normalised images: with CIFAR-10's mean and std, or ``info``'s."""
    mean, std = (MEAN, STD) if info is None else (info.mean, info.std)
    mean, std = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    return ((x * std + mean) * 255).round().to(torch.uint8)


def locate(window: torch.Tensor, image: torch.Tensor) -> tuple[int, int, bool] | None:
    """(top, left, flipped) of ``window`` (3, 32, 32) inside the 4-pixel zero-padded ``image``."""
    padded = torch.nn.functional.pad(image, (4, 4, 4, 4))
    for top in range(9):
        for left in range(9):
            crop = padded[:, top:top + 32, left:left + 32]
            for flipped in (False, True):
                if torch.equal(window, crop.flip(2) if flipped else crop):
                    return top, left, flipped
    return None


def epoch(ld) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*ld)
    return torch.cat(xs), torch.cat(ys)


# --------------------------------------------------------------------------- augmentation

def test_crop_flip_matches_per_sample_slicing():
    images = distinct_images(32)
    g = torch.Generator().manual_seed(1)
    top, left = torch.randint(9, (32,), generator=g), torch.randint(9, (32,), generator=g)
    flip = torch.rand(32, generator=g) < 0.5
    out = crop_flip(images, top, left, flip)
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    for i in range(32):
        want = padded[i, :, top[i]:top[i] + 32, left[i]:left[i] + 32]
        assert torch.equal(out[i], want.flip(2) if flip[i] else want)


def test_train_batches_are_padded_crops_and_flips_of_their_own_image():
    ld = loader(64)
    images = distinct_images(64)
    x, y = epoch(ld)
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.shape == (64, 3, 32, 32)
    assert sorted(y.tolist()) == list(range(64))  # each sample once per epoch, shuffled
    assert y.tolist() != list(range(64))
    found = [locate(w, images[i]) for w, i in zip(unnormalize(x), y.tolist())]
    assert all(f is not None for f in found)
    assert {f[2] for f in found} == {False, True}  # both flipped and unflipped samples
    assert len({f[:2] for f in found}) > 20  # each sample has its own offsets
    assert any(f[:2] != (4, 4) for f in found)


def test_test_path_normalisation_equals_torchvision():
    images, labels = synthetic_images(50, split_seed=3)
    x, y = epoch(TensorLoader(images, labels, 16, train=False, mean=MEAN, std=STD))
    want = torch.stack([transforms("synthetic", False, False)(im) for im in images])
    assert torch.equal(y, labels)
    assert torch.allclose(x, want, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------- seeding

def test_same_seed_and_epoch_give_the_same_batches():
    a, b = loader(seed=7), loader(seed=7)
    a.set_epoch(3)
    b.set_epoch(3)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    a.set_epoch(3)
    b.set_epoch(4)
    assert not torch.equal(epoch(a)[1], epoch(b)[1])
    assert not torch.equal(epoch(loader(seed=8))[1], epoch(loader(seed=7))[1])


def test_a_resumed_loader_sees_the_epoch_it_resumes_at():
    ld = loader(seed=3)
    passes = [epoch(ld) for _ in range(3)]  # without set_epoch: epochs 0, 1, 2
    assert not torch.equal(passes[0][1], passes[1][1])
    resumed = loader(seed=3)
    resumed.set_epoch(2)
    x, y = epoch(resumed)
    assert torch.equal(x, passes[2][0]) and torch.equal(y, passes[2][1])


# --------------------------------------------------------------------------- sharding

def test_train_shards_are_equal_and_cover_every_sample():
    shards = [loader(10, batch_size=3, rank=r, world_size=3) for r in range(3)]
    for ld in shards:
        ld.set_epoch(5)
    seen = [epoch(ld)[1].tolist() for ld in shards]
    assert [ld.num_samples for ld in shards] == [4, 4, 4]
    assert [len(ld) for ld in shards] == [2, 2, 2] and all(len(s) == 4 for s in seen)
    assert all(ld.dataset_size == 10 for ld in shards)
    every = sum(seen, [])
    assert set(every) == set(range(10)) and len(every) == 12  # two repeated to pad 10 to 12


def test_test_shards_partition_the_samples():
    shards = [loader(10, batch_size=3, train=False, rank=r, world_size=3) for r in range(3)]
    seen = [epoch(ld)[1].tolist() for ld in shards]
    assert seen == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [ld.num_samples for ld in shards] == [4, 3, 3]


def test_torchvision_loader_shards():
    built = [build_loaders("synthetic", loader="torchvision", seed=1, rank=r, world_size=3)
             for r in range(3)]
    trains, tests = [b[0] for b in built], [b[1] for b in built]
    assert len({ld.num_samples for ld in trains}) == 1 and len({len(ld) for ld in trains}) == 1
    for ld in trains:
        ld.set_epoch(2)
    assert set(sum((list(ld.sampler) for ld in trains), [])) == set(range(2560))
    test_indices = sorted(sum((list(ld.dataset.indices) for ld in tests), []))
    assert test_indices == list(range(512)) and sum(ld.num_samples for ld in tests) == 512
    single = build_loaders("synthetic", loader="torchvision", seed=1)[0]
    assert single.num_samples == 2560

    def order(epoch):  # the shuffle order is a function of (seed, epoch), as a resume needs
        single.set_epoch(epoch)
        return list(iter(single.sampler))

    assert order(3) == order(3) and order(3) != order(4)


# --------------------------------------------------------------------------- image folders

def save(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def make_folder(root: Path, n_train: int = 3, n_test: int = 2, seed: int = 0) -> Path:
    """root/{train,test}/<class>/*.png, classes created out of sorted order; 9 train and 9 test
    images, of which three test ones are grayscale, RGBA and palette PNGs."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("test", n_test)):
        for cls in ("zebra", "ant", "mole"):
            for i in range(n):
                save(root / split / cls / f"{i}.png", rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    save(root / "test" / "mole" / "gray.png", rng.integers(0, 256, (32, 32), dtype=np.uint8))
    save(root / "test" / "mole" / "rgba.png", rng.integers(0, 256, (32, 32, 4), dtype=np.uint8))
    palette = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).quantize(16)
    palette.save(root / "test" / "mole" / "palette.png")
    return root


@pytest.fixture
def counted_decode(monkeypatch):
    calls = []
    real = imagefolder._decode

    def decode(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(imagefolder, "_decode", decode)
    return calls


def build_fast(root, cache):
    return build_loaders("imagefolder", root, batch_size=4, seed=0, cache_dir=cache)


def test_imagefolder_is_decoded_once_and_cached(tmp_path, counted_decode, monkeypatch):
    root, cache = make_folder(tmp_path / "images"), tmp_path / "cache"
    train, test, num_classes = build_fast(root, cache)
    assert num_classes == 3 and train.dataset_size == 9 and test.dataset_size == 9
    assert len(counted_decode) == 18 and len(list(cache.glob("*.pt"))) == 1
    first = epoch(test)

    def broken(path):
        raise AssertionError("decoded again although the cache is valid")

    monkeypatch.setattr(imagefolder, "_decode", broken)
    again = epoch(build_fast(root, cache)[1])
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


def test_a_changed_folder_rebuilds_the_cache(tmp_path, counted_decode):
    root, cache = make_folder(tmp_path / "images"), tmp_path / "cache"
    build_fast(root, cache)
    counted_decode.clear()
    changed = root / "test" / "ant" / "0.png"
    save(changed, np.full((32, 32, 3), 7, dtype=np.uint8))
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    test = build_fast(root, cache)[1]
    x, y = epoch(test)
    assert len(counted_decode) == 18
    assert torch.equal(unnormalize(x[:1], test.info), torch.full((1, 3, 32, 32), 7, dtype=torch.uint8))
    counted_decode.clear()
    touched = root / "train" / "ant" / "1.png"  # same bytes, new mtime
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    build_fast(root, cache)
    assert len(counted_decode) == 18
    counted_decode.clear()
    save(root / "train" / "zebra" / "new.png", np.zeros((32, 32, 3), dtype=np.uint8))
    train, _, _ = build_fast(root, cache)
    assert len(counted_decode) == 19 and train.dataset_size == 10
    assert len(list(cache.glob("*.pt"))) == 1  # rewritten in place, not piled up
    assert len(list(cache.glob("*.info"))) == 1


def test_two_images_swapped_with_their_mtimes_kept_rebuild_the_cache(tmp_path, counted_decode):
    """Same names, sizes and mtimes, other bytes (``cp -p``, an unpacked archive): the decode
    cache is keyed on the files' contents, so the images answer for their real labels."""
    root, cache = make_folder(tmp_path / "images"), tmp_path / "cache"
    a, b = root / "test" / "ant" / "0.png", root / "test" / "zebra" / "0.png"
    assert a.stat().st_size == b.stat().st_size  # random 32x32 PNGs: equal sizes, else the test is moot
    before = epoch(build_fast(root, cache)[1])
    stamps = {p: (p.stat().st_atime_ns, p.stat().st_mtime_ns) for p in (a, b)}
    bytes_a, bytes_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(bytes_b)
    b.write_bytes(bytes_a)
    for p, ns in stamps.items():
        os.utime(p, ns=ns)
    counted_decode.clear()
    after = epoch(build_fast(root, cache)[1])
    assert len(counted_decode) == 18  # decoded again
    assert torch.equal(after[1], before[1]) and not torch.equal(after[0], before[0])


def test_a_corrupt_cache_is_rebuilt(tmp_path, counted_decode):
    root, cache = make_folder(tmp_path / "images"), tmp_path / "cache"
    first = epoch(build_fast(root, cache)[1])
    (cache_file,) = cache.glob("*.pt")
    cache_file.write_bytes(cache_file.read_bytes()[:1000])
    counted_decode.clear()
    again = epoch(build_fast(root, cache)[1])
    assert len(counted_decode) == 18 and torch.equal(again[0], first[0])
    assert torch.load(cache_file, weights_only=True)["format"] == imagefolder.CACHE_FORMAT


def test_default_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    decode_imagefolder(make_folder(tmp_path / "images"))
    assert len(list((tmp_path / "xdg" / "slimming" / "decoded").glob("*.pt"))) == 1


def test_fast_and_torchvision_loaders_agree_on_an_imagefolder(tmp_path):
    from torchvision.datasets import ImageFolder

    root = make_folder(tmp_path / "images")
    fast = build_loaders("imagefolder", root, batch_size=4, seed=0, cache_dir=tmp_path / "cache")
    slow = build_loaders("imagefolder", root, batch_size=4, seed=0, loader="torchvision")
    assert fast[2] == slow[2] == 3
    xf, yf = epoch(fast[1])
    xs, ys = epoch(slow[1])
    assert torch.equal(yf, ys) and torch.allclose(xf, xs, rtol=0, atol=1e-6)
    assert ImageFolder(str(root / "test")).classes == ["ant", "mole", "zebra"]
    assert fast[0].num_samples == slow[0].num_samples == 9
    assert fast[1].num_samples == slow[1].num_samples == 9
    assert sorted(epoch(fast[0])[1].tolist()) == sorted(epoch(slow[0])[1].tolist())


@pytest.mark.parametrize("loader", ["fast", "torchvision"])
def test_limit_takes_the_first_images_of_each_class(tmp_path, loader):
    """``limit=N``: the first N images of each class in each split, in the folder's sorted order
    (the test images are the whole set's first of each class, bit for bit, at a fixed
    normalisation: "dataset" measures the part's own training images); a limit above a class's
    count keeps it whole; another source is refused in one line naming ``limit``."""
    root = make_folder(tmp_path / "images", n_train=4, n_test=3)
    cache = tmp_path / "cache"
    whole = build_loaders("imagefolder", root, batch_size=4, seed=0, cache_dir=cache, loader=loader,
                          norm="imagenet")
    xw, yw = epoch(whole[1])
    for limit in (1, 2, 5):
        part = build_loaders("imagefolder", root, batch_size=4, seed=0, cache_dir=cache, loader=loader,
                             norm="imagenet", limit=limit)
        counts = {"train": min(limit, 4) * 3, "test": min(limit, 3) * 2 + min(limit, 6)}
        assert part[0].num_samples == counts["train"] and part[1].num_samples == counts["test"]
        first = torch.cat([torch.nonzero(yw == c).flatten()[:limit] for c in range(3)])
        xp, yp = epoch(part[1])
        assert torch.equal(yp, yw[first]) and torch.equal(xp, xw[first])
        assert sorted(epoch(part[0])[1].tolist()) == [c for c in range(3) for _ in range(min(limit, 4))]
    for name, where in (("synthetic", None), ("imagefolder", root)):
        with pytest.raises(DataError) as e:
            build_loaders(name, where, limit=0 if name == "imagefolder" else 3)
        assert e.value.params == ("limit",) and "\n" not in str(e.value)


def test_limit_from_the_command_line(tmp_path, capsys):
    """--limit N reaches train (its config), eval and the other commands' loaders."""
    from conftest import TINY_VGG

    from slimming.cli import main
    from slimming.cli.parser import read_args
    from slimming.training.config import TrainConfig

    root = make_folder(tmp_path / "images", n_train=2, n_test=3)
    assert TrainConfig.from_args(read_args(["train", "--limit", "1", "--save", "x"])).limit == 1
    common = ["--dataset", "imagefolder", "--data-root", str(root), "--cpu", "--workers", "0"]
    cfg = ",".join(map(str, TINY_VGG))
    assert main(["train", "--arch", "vgg", "--cfg", cfg, "--epochs", "1", "--limit", "1", "--save",
                 str(tmp_path / "run"), *common]) == 0
    for limit, images in (("1", 3), ("2", 6), ("9", 12)):
        capsys.readouterr()
        checkpoint = str(tmp_path / "run" / "last.pth")
        assert main(["eval", "--checkpoint", checkpoint, "--limit", limit, *common]) == 0
        assert f"({images} test images of imagefolder" in capsys.readouterr().out


def test_cifar_arrays_become_nchw(tmp_path, monkeypatch):
    import torchvision.datasets

    rng = np.random.default_rng(0)
    arrays = {True: rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8),  # NHWC, as torchvision
              False: rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)}

    class FakeCIFAR100:
        def __init__(self, root, train, download, transform=None):
            self.data, self.targets = arrays[train], list(range(len(arrays[train])))
            self.classes = [str(i) for i in range(100)]

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", FakeCIFAR100)
    (tmp_path / "cifar-100-python").mkdir()  # where torchvision's copy lies (looked for first)
    train_x, _, test_x, test_y, num_classes = data.load_images("cifar100", tmp_path)
    assert num_classes == 100 and train_x.shape == (6, 3, 32, 32) and test_y.tolist() == [0, 1, 2, 3]
    assert torch.equal(test_x[2, 1], torch.from_numpy(arrays[False][2, :, :, 1]))  # channel 1 = G
    _, test, _ = build_loaders("cifar100", tmp_path, batch_size=2)
    x, _ = epoch(test)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in STATS["cifar100"])
    assert torch.allclose(x, (test_x.float() / 255 - mean) / std, atol=1e-5)


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("kind", ["fast", "torchvision"])
def test_imagefolder_errors(tmp_path, kind):
    def build(root):
        return build_loaders("imagefolder", root, loader=kind, cache_dir=tmp_path / "cache")

    (tmp_path / "none").mkdir()
    with pytest.raises(DataError, match="no train/ folder"):
        build(tmp_path / "none")
    empty = make_folder(tmp_path / "empty")
    (empty / "train" / "void").mkdir()
    with pytest.raises(DataError, match="void"):
        build(empty)
    no_test = tmp_path / "no_test"
    save(no_test / "train" / "a" / "0.png", np.zeros((40, 40, 3), dtype=np.uint8))
    with pytest.raises(DataError, match="no test/ or val/ folder"):
        build(no_test)
    with pytest.raises(DataError, match="needs root"):  # the parameter: the CLI says --data-root
        build_loaders("imagefolder", None, loader=kind)


def test_one_image_of_another_size_leaves_the_fast_loader(tmp_path, capsys):
    """Every header is read: a single 40x32 image among 32x32 ones makes the default size 224
    and sends the folder to the DataLoader path, saying so in one line."""
    root = make_folder(tmp_path / "images")
    save(root / "train" / "zebra" / "9.png", np.zeros((32, 40, 3), dtype=np.uint8))
    capsys.readouterr()
    train, test, _ = build_fast(root, tmp_path / "cache")
    notice = [line for line in capsys.readouterr().err.splitlines() if "DataLoader path" in line]
    assert len(notice) == 1 and "2 sizes (from 32x32 to 40x32)" in notice[0], notice
    assert not isinstance(train, TensorLoader) and train.info.loader == "torchvision"
    assert train.info.image_size == 224 and next(iter(test))[0].shape == (9, 3, 224, 224)
    with pytest.raises(DataError, match="9.png: 40x32 pixels, but"):
        decode_imagefolder(root, tmp_path / "cache")  # the fast loader's decode needs one size


def test_unknown_loader_or_dataset():
    with pytest.raises(DataError, match="unknown loader"):
        build_loaders("synthetic", loader="dali")
    with pytest.raises(DataError, match="unknown dataset"):
        build_loaders("mnist")
