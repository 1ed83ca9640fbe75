"""Image packs (slimming.data.packed): one file holding an image folder's JPEG bytes, read by the fast
loader. A pack gives exactly the folder's pixels on the CPU, ImageFolder's classes and order, the
folder's mean and std; a hostile pack is one DataError line, refused before anything is allocated
beyond the file's size. Tiny JPEG folders made here; no ../shared."""

import io
import os
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from slimming.data import DataError, build_datasets, build_loaders, decode_imagefolder, load_images, packed
from slimming.data.packed import DIGEST, PREFIX, decode_pack, pack_folder, read_pack

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def own_cache_home(tmp_path, monkeypatch):
    """Caches written without a cache_dir go under tmp_path, not the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def jpeg(rng: np.random.Generator, width: int = 32, height: int = 32, gray: bool = False) -> bytes:
    """A random JPEG: smooth colour plus noise (JPEG's usual kind of content), quality 75."""
    shape = (height, width) if gray else (height, width, 3)
    base = rng.integers(0, 256, (1, 1) if gray else (1, 1, 3))
    pixels = np.clip(base + rng.normal(0, 40, shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=75)
    return out.getvalue()


def make_folder(root: Path, classes=("zebra", "ant", "mole"), counts=(3, 2), size=(32, 32),
                split: str = "test", seed: int = 0) -> Path:
    """root/{train,<split>}/<class>/*.jpg, classes made out of sorted order, one gray JPEG."""
    rng = np.random.default_rng(seed)
    for name, n in (("train", counts[0]), (split, counts[1])):
        for cls in classes:
            folder = root / name / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                (folder / f"{i:02d}.jpg").write_bytes(jpeg(rng, *size, gray=(i == 1)))
    return root


@pytest.fixture
def pack(tmp_path) -> Path:
    return Path(pack_folder(make_folder(tmp_path / "images"), tmp_path / "images.pack")["path"])


def one_line(e: pytest.ExceptionInfo, path: Path) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text and str(path) in text, text
    return text


# --------------------------------------------------------------------------- what a pack gives

@pytest.mark.parametrize("seed", range(4))
def test_a_pack_decodes_to_the_folders_pixels_and_imagefolders_order(tmp_path, seed):
    """Random class counts, image counts and sizes (not square), test/ or val/: the pack on the
    CPU equals the folder's own decode path exactly (the same decoder, PIL), labels included."""
    rng = random.Random(seed)
    classes = [f"c{rng.randint(0, 99)}-{i}" for i in range(rng.randint(1, 4))]
    size = (rng.randint(8, 40), rng.randint(8, 40))
    root = make_folder(tmp_path / "f", classes, (rng.randint(1, 4), rng.randint(1, 3)), size,
                       rng.choice(["test", "val"]), seed)
    done = pack_folder(root, tmp_path / "f.pack")
    got = decode_pack(done["path"])
    want = decode_imagefolder(root, cache_dir=tmp_path / "cache")
    assert got["classes"] == want["classes"] == sorted(classes)
    for key in ("train_images", "train_labels", "test_images", "test_labels"):
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
    assert got["train_images"].shape[1:] == (3, size[1], size[0])
    assert done["bytes"] == Path(done["path"]).stat().st_size
    assert read_pack(done["path"]).test_split == ("val" if (root / "val").is_dir() else "test")


def test_labels_and_classes_are_torchvision_imagefolders(tmp_path, pack):
    from torchvision.datasets import ImageFolder

    got = decode_pack(pack)
    for split in ("train", "test"):
        ref = ImageFolder(str(tmp_path / "images" / split))
        assert got["classes"] == ref.classes
        assert got[f"{split}_labels"].tolist() == ref.targets


def test_build_loaders_serves_a_pack_as_it_serves_the_folder(tmp_path, pack):
    common = dict(batch_size=4, seed=3, cache_dir=tmp_path / "cache")
    train_p, test_p, k_p = build_loaders("imagefolder", pack, **common)
    train_f, test_f, k_f = build_loaders("imagefolder", tmp_path / "images", **common)
    assert k_p == k_f == 3
    assert train_p.info == train_f.info and test_p.info.mean == test_f.info.mean
    for a, b in zip(list(train_p) + list(test_p), list(train_f) + list(test_f)):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    x, y, *_, k = load_images("imagefolder", pack)
    assert x.shape == (9, 3, 32, 32) and k == 3


def test_a_pack_is_for_the_fast_loader_only(tmp_path, pack):
    with pytest.raises(DataError) as e:
        build_loaders("imagefolder", pack, loader="torchvision")
    assert "fast loader only" in one_line(e, pack)
    with pytest.raises(DataError) as e:
        build_datasets("imagefolder", pack)
    one_line(e, pack)
    with pytest.raises(DataError) as e:  # resized as it is read: only the DataLoader path does that
        build_loaders("imagefolder", pack, image_size=48)
    assert "resized" in one_line(e, pack)


def test_pack_folder_refuses_what_a_pack_cannot_hold(tmp_path):
    root = make_folder(tmp_path / "png")
    Image.new("RGB", (32, 32)).save(root / "train" / "ant" / "00.jpg", "PNG")  # named .jpg
    with pytest.raises(DataError) as e:
        pack_folder(root, tmp_path / "p.pack")
    assert "not a JPEG" in one_line(e, root / "train" / "ant" / "00.jpg")
    root = make_folder(tmp_path / "mixed")
    (root / "test" / "mole" / "00.jpg").write_bytes(jpeg(np.random.default_rng(0), 16, 16))
    with pytest.raises(DataError) as e:
        pack_folder(root, tmp_path / "p.pack")
    assert "one size" in one_line(e, root / "test" / "mole" / "00.jpg")
    assert not (tmp_path / "p.pack").exists() and list(tmp_path.glob(".p.pack*")) == []


# --------------------------------------------------------------------------- hostile packs

def parts(path: Path) -> tuple[dict, np.ndarray, np.ndarray, list[bytes]]:
    """A pack's header, offsets, labels and images, to forge another from."""
    p = read_pack(path)
    data = path.read_bytes()[len(p.prefix):-DIGEST]
    blobs = [data[a:b] for a, b in zip(p.offsets[:-1], p.offsets[1:])]
    header = {"classes": p.classes, "test_split": p.test_split, "train": p.train, "test": p.test,
              "height": p.height, "width": p.width, "data_bytes": len(data)}
    return header, p.offsets.copy(), p.labels.numpy().copy(), blobs


def sof_claiming(blob: bytes, width: int, height: int) -> bytes:
    """``blob`` with its start-of-frame marker claiming ``width`` x ``height``."""
    i = blob.index(b"\xff\xc0")
    return blob[:i + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + blob[i + 9:]


def forged(kind: str, header, offsets, labels, blobs):
    """(header, offsets, labels, blobs, version) of a pack wrong in one way, its checksum right."""
    version, blobs = 1, list(blobs)
    if kind == "future version":
        version = 2
    elif kind == "version 0":
        version = 0
    elif kind == "10**12 images":
        header["train"] = 10**12
    elif kind == "huge data_bytes":
        header["data_bytes"] = 2**62
    elif kind == "offset out of range":
        offsets[3] = header["data_bytes"] + 10
    elif kind == "offsets wrap":  # int64 wrap-around: a negative step that overflows to a positive one
        offsets[2], offsets[3] = 2**62 + 1, -(2**62) - 2
    elif kind == "label out of range":
        labels[4] = len(header["classes"])
    elif kind == "negative label":
        labels[0] = -1
    elif kind == "mixed sizes":
        blobs[5] = jpeg(np.random.default_rng(1), 16, 16)
    elif kind == "bomb":  # a JPEG header claiming 60000x60000 pixels: refused before decoding
        blobs[2] = sof_claiming(blobs[2], 60000, 60000)
    elif kind == "not a jpeg":
        blobs[1] = b"GIF89a" + bytes(100)
    elif kind == "broken scan":
        blobs[0] = blobs[0][:len(blobs[0]) // 2]
    elif kind == "header fields":
        header["train"] = True
    elif kind == "unknown key":
        header["pickle"] = "no"
    elif kind == "too many pixels":
        header["height"] = header["width"] = 10**6
    elif kind == "duplicate classes":
        header["classes"] = ["a", "a", "b"]
    if kind in ("mixed sizes", "not a jpeg", "broken scan"):
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])])
        header["data_bytes"] = int(offsets[-1])
    return header, offsets, labels, blobs, version


HOSTILE = ["future version", "version 0", "10**12 images", "huge data_bytes", "offset out of range",
           "offsets wrap", "label out of range", "negative label", "mixed sizes", "bomb", "not a jpeg",
           "broken scan", "header fields", "unknown key", "too many pixels", "duplicate classes"]

SAYS = {"future version": "version 2, newer", "10**12 images": "implies", "huge data_bytes": "implies",
        "offset out of range": "offsets", "offsets wrap": "offsets", "label out of range": "labels",
        "negative label": "labels", "mixed sizes": "is 16x16 pixels", "not a jpeg": "not a JPEG",
        "bomb": "is 60000x60000 pixels", "broken scan": "cannot decode"}  # what the line says


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_pack_is_one_line_and_costs_no_memory(tmp_path, pack, kind):
    header, offsets, labels, blobs, version = forged(kind, *parts(pack))
    bad = tmp_path / "bad.pack"
    packed._write(bad, header, offsets, labels, blobs, version)
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as e:
            decode_pack(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert SAYS.get(kind, "") in one_line(e, bad)
    assert peak < 4 * bad.stat().st_size + 2**20, peak  # nothing sized by a claim
    if kind in ("future version", "10**12 images", "label out of range", "offset out of range"):
        with pytest.raises(DataError) as e:
            build_loaders("imagefolder", bad)
        one_line(e, bad)


@pytest.mark.parametrize("kind", ["empty", "magic", "short", "truncated", "checksum", "header json",
                                  "header size", "a folder"])
def test_damaged_files_are_one_line(tmp_path, pack, kind):
    data = bytearray(pack.read_bytes())
    header_end = PREFIX.size + PREFIX.unpack(data[:PREFIX.size])[2]
    bad = tmp_path / "bad.pack"
    changed = {"empty": b"", "magic": b"SLIMPACX" + data[8:], "short": data[:10],
               "truncated": data[:-1], "checksum": data[:-40] + bytes([data[-40] ^ 1]) + data[-39:],
               "header json": data[:PREFIX.size] + b"[" + data[PREFIX.size + 1:],
               "header size": data[:12] + (2**31).to_bytes(4, "little") + data[16:]}.get(kind)
    if changed is None:
        bad.mkdir()  # a directory is a folder: the folder's own message, one line
    else:
        bad.write_bytes(changed)
    with pytest.raises(DataError) as e:
        build_loaders("imagefolder", bad)
    one_line(e, bad)
    assert header_end % 8 == 0


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "pipe.pack"
    os.mkfifo(fifo)
    with pytest.raises(DataError) as e:
        decode_pack(fifo)
    assert "not a regular file" in one_line(e, fifo)
    with pytest.raises(DataError) as e:
        build_loaders("imagefolder", fifo)
    one_line(e, fifo)


def test_every_flipped_byte_or_cut_is_refused(tmp_path, pack):
    """Property: the checksum covers every byte, so any one flip or cut is a DataError line."""
    data = pack.read_bytes()
    bad = tmp_path / "bad.pack"
    rng = random.Random(0)
    for _ in range(40):
        i = rng.randrange(len(data))
        bad.write_bytes(data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
                        if rng.random() < 0.7 else data[:i])
        with pytest.raises(DataError) as e:
            decode_pack(bad)
        one_line(e, bad)


# --------------------------------------------------------------------------- the command line

def slimming(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slimming", *map(str, argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_train_on_a_pack_and_evaluate_from_its_checkpoint(tmp_path, pack):
    run = slimming("train", "--arch", "vgg", "--cfg", "8,M,8,M,8,M,8,M,8", "--dataset", "imagefolder",
                   "--data-root", pack, "--epochs", "1", "--cpu", "--save", tmp_path / "run")
    assert run.returncode == 0, run.stderr
    ckpt = torch.load(tmp_path / "run" / "best.pth", weights_only=True, map_location="cpu")
    assert ckpt["data"]["data_root"] == str(pack) and ckpt["data"]["image_size"] == 32
    header, offsets, labels, blobs, version = forged("label out of range", *parts(pack))
    packed._write(pack, header, offsets, labels, blobs, version)  # the checkpoint's data root, now bad
    run = slimming("eval", "--checkpoint", tmp_path / "run" / "best.pth", "--cpu")  # root defaulted
    assert run.returncode == 2 and "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(pack) in lines[0] and "labels" in lines[0], run.stderr
