"""Image folders and decode caches made by a careless or hostile user: images whose header lies
about their size, 16-bit images, symlink loops, damaged or forged caches, files that are not
images. Every case is one DataError line (or a rebuilt cache), never a traceback or a hang.
Tiny data made here in tmp_path; runs in seconds on a CPU."""

import os
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import png
from PIL import Image

from slimming.data import DataError, build_datasets, build_loaders, decode_imagefolder, images
from slimming.data.images import check_image, list_images, read_image
from slimming.utils.safeload import checksum


@pytest.fixture(autouse=True)
def own_cache_home(tmp_path, monkeypatch):
    """Caches written without a cache_dir go under tmp_path, not the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def save(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def make_folder(root: Path, n: int = 2, seed: int = 0) -> Path:
    """root/{train,test}/{ant,bee}/{0..n-1}.png, random RGB."""
    rng = np.random.default_rng(seed)
    for split in ("train", "test"):
        for cls in ("ant", "bee"):
            for i in range(n):
                save(root / split / cls / f"{i}.png", rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    return root


def png16(pixels: np.ndarray) -> bytes:
    """uint16 (H, W, 1 or 3) -> a 16-bit gray or RGB PNG (PIL cannot write 16-bit RGB)."""
    h, w, c = pixels.shape
    rows = b"".join(b"\0" + pixels[y].astype(">u2").tobytes() for y in range(h))
    return png(w, h, 16, {1: 0, 3: 2}[c], rows)


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text and "Caught" not in text, text
    text.encode("ascii", "backslashreplace").decode()  # printable as it is
    str(text).encode("utf-8")  # no lone surrogates: stderr can print it
    return text


def build(root: Path, kind: str, cache: Path | None, **kw):
    return build_loaders("imagefolder", root, batch_size=4, seed=0, loader=kind, cache_dir=cache, **kw)


def load_all(root: Path, kind: str, cache: Path | None) -> int:
    """Build both loaders and read every batch once (the torchvision loader checks headers when
    it is built, and decodes when it is read); returns the number of training samples."""
    train, test, _ = build(root, kind, cache)
    for ld in (train, test):
        for _ in ld:
            pass
    return train.dataset_size


def test_extensions_are_imagefolders():
    from torchvision.datasets.folder import IMG_EXTENSIONS

    assert images.EXTENSIONS == IMG_EXTENSIONS


# --------------------------------------------------------------------------- sizes from headers

@pytest.mark.parametrize("kind", ["fast", "torchvision"])
@pytest.mark.parametrize("size, claim", [((60000, 60000), "3,600,000,000 pixels"),  # PIL: error
                                         ((10000, 10000), "100,000,000 pixels"),  # PIL: warning
                                         ((9000, 8000), "9000x8000 = 72,000,000 pixels")])  # ours
def test_a_header_claiming_too_many_pixels_is_refused_before_decoding(tmp_path, kind, size, claim,
                                                                      monkeypatch):
    root = make_folder(tmp_path / "images")
    bad = root / "test" / "bee" / "zz.png"  # the last file: every image is checked, not the first
    bad.write_bytes(png(*size, 8, 2, b"\0" * 100))  # a 200-byte file

    real = images.rgb8

    def decode(im):
        assert im.size == (32, 32), "decoded an image whose size is wrong"
        return real(im)

    monkeypatch.setattr(images, "rgb8", decode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.process_time()
        with pytest.raises(DataError) as e:
            build(root, kind, tmp_path / "cache")
    assert time.process_time() - start < 10
    assert not [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]
    text = one_line(e)
    assert text.startswith(f"{bad}: its header claims {claim}") and "decompression bomb" in text
    assert f"over the limit of {images.MAX_PIXELS:,}" in text and "resize" in text


def test_size_is_checked_from_the_header_before_any_decoding(tmp_path, monkeypatch):
    path = tmp_path / "wide.png"
    path.write_bytes(png(64001, 1000, 8, 2, b"\0" * 100))  # 64,001,000 pixels: one too many rows
    monkeypatch.setattr(images, "rgb8", lambda im: pytest.fail("decoded"))
    for read in (read_image, check_image):
        with pytest.raises(DataError, match="64001x1000 = 64,001,000 pixels, over the limit"):
            read(path)
    path.write_bytes(png(64000, 1000, 8, 2, b"\0" * 100))  # at the limit: the header passes
    assert check_image(path) == (64000, 1000)


@pytest.mark.parametrize("kind", ["fast", "torchvision"])
def test_files_that_are_not_images(tmp_path, kind):
    root = make_folder(tmp_path / "images")
    cases = {
        "notes.png": lambda p: p.write_text("these are not pixels\n"),
        "truncated.png": lambda p: p.write_bytes((root / "train" / "ant" / "0.png").read_bytes()[:200]),
        "gif.jpg": lambda p: Image.new("RGB", (32, 32)).save(p, format="GIF"),  # not a format read
        "fifo.png": lambda p: os.mkfifo(p),  # opening it for reading would wait forever
        "zero.png": lambda p: p.symlink_to("/dev/zero"),
        "broken.png": lambda p: p.symlink_to(tmp_path / "nowhere.png"),
        "dir.png": lambda p: (p / "x.txt").parent.mkdir(),  # a folder: walked into, holds no image
        "float.tif": lambda p: Image.fromarray(np.zeros((32, 32), np.float32)).save(p),
        "int32.tif": lambda p: Image.fromarray(np.full((32, 32), 70000, np.int32)).save(p),
    }
    expected = {"notes.png": "not an image", "truncated.png": "cannot decode", "gif.jpg": "not an image",
                "fifo.png": "not a regular file", "zero.png": "not a regular file",
                "broken.png": "cannot read it", "float.tif": "floating-point",
                "int32.tif": "outside 0..65535"}
    for name, make in cases.items():
        folder = tmp_path / name.replace(".", "_")
        make_folder(folder)
        path = folder / "train" / "bee" / name
        make(path)
        if name == "dir.png":
            load_all(folder, kind, tmp_path / "cache")  # an empty folder named x.png is no image
            continue
        start = time.process_time()
        with pytest.raises(DataError) as e:
            load_all(folder, kind, tmp_path / "cache")
        assert time.process_time() - start < 10, name
        text = one_line(e)
        assert text.startswith(str(path)) and expected[name] in text, text


def test_a_file_that_cannot_be_opened(tmp_path, monkeypatch):
    root = make_folder(tmp_path / "images")
    locked = root / "train" / "ant" / "1.png"
    real_open = os.open

    def deny(path, *a, **k):  # what chmod 000 does for a user who is not root
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(images.os, "open", deny)
    for kind in ("fast", "torchvision"):
        with pytest.raises(DataError) as e:
            build(root, kind, tmp_path / "cache")
        assert one_line(e) == f"{locked}: cannot read it (Permission denied); fix or remove it"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file anyway")
def test_a_chmod_000_file(tmp_path):
    root = make_folder(tmp_path / "images")
    locked = root / "test" / "ant" / "0.png"
    locked.chmod(0)
    with pytest.raises(DataError, match="Permission denied"):
        build(root, "fast", tmp_path / "cache")


def test_a_bad_image_in_a_dataloader_worker_is_one_line(tmp_path):
    root = make_folder(tmp_path / "images")
    train, test, _ = build(root, "torchvision", None, workers=1)  # headers checked: all fine
    bad = root / "test" / "bee" / "1.png"
    bad.write_bytes(bad.read_bytes()[:150])  # damaged after the check, read in the worker
    assert list(train)
    with pytest.raises(DataError) as e:
        list(test)
    assert one_line(e).startswith(f"{bad}: cannot decode this image")


def test_odd_file_names_stay_on_one_line(tmp_path):
    root = make_folder(tmp_path / "images")
    raw = os.fsencode(root / "train" / "ant")
    with open(os.path.join(raw, b"caf\xe9.png"), "wb") as f:  # Latin-1 bytes: no UTF-8 name
        Image.fromarray(np.full((32, 32, 3), 9, np.uint8)).save(f, format="PNG")
    blob = decode_imagefolder(root, tmp_path / "cache")  # the cache key hashes bytes
    assert len(blob["train_images"]) == 5 and (blob["train_images"] == 9).all(dim=(1, 2, 3)).any()
    (root / "test" / "ant" / "line\nbreak.png").write_text("not an image")
    with pytest.raises(DataError) as e:
        decode_imagefolder(root, tmp_path / "cache")
    assert "line\\nbreak.png" in one_line(e)
    os.remove(root / "test" / "ant" / "line\nbreak.png")
    with open(os.path.join(os.fsencode(root / "test" / "bee"), b"\xff.png"), "wb") as f:
        f.write(b"junk")
    with pytest.raises(DataError) as e:
        build(root, "torchvision", None)
    assert "\\udcff.png" in one_line(e)


# --------------------------------------------------------------------------- 16-bit images

VALUES = np.array([0, 1, 255, 256, 257, 383, 1000, 32767, 32896, 65279, 65280, 65534, 65535],
                  dtype=np.uint16)


def pixels16(seed: int) -> np.ndarray:
    """uint16 (32, 32): every value of VALUES, then random ones."""
    rng = np.random.default_rng(seed)
    flat = rng.integers(0, 65536, 32 * 32).astype(np.uint16)
    flat[:len(VALUES)] = VALUES
    return flat.reshape(32, 32)


def both_loaders(root: Path, cache: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The test images as uint8 (N, 3, 32, 32) from the fast loader's decode and from the
    torchvision loader's dataset (untransformed)."""
    fast = decode_imagefolder(root, cache)["test_images"]
    _, test, _ = build_datasets("imagefolder", root)
    test.transform = None
    return fast, torch.stack([test[i][0] for i in range(len(test))])


def test_16_bit_images_are_scaled_to_8_bits_never_wrapped_or_clipped(tmp_path):
    root = make_folder(tmp_path / "images", n=1)
    gray, red, green, blue = (pixels16(s) for s in range(4))
    Image.fromarray(gray).save(root / "test" / "ant" / "a_gray16.png")  # PIL writes mode I;16
    assert Image.open(root / "test" / "ant" / "a_gray16.png").mode == "I;16"
    rgb = np.stack([red, green, blue], axis=-1)
    (root / "test" / "ant" / "b_rgb16.png").write_bytes(png16(rgb))
    (root / "test" / "ant" / "c_gray16.pgm").write_bytes(b"P5\n32 32\n65535\n" + gray.astype(">u2").tobytes())
    assert Image.open(root / "test" / "ant" / "c_gray16.pgm").mode == "I"
    (root / "test" / "ant" / "d_gray16as_rgb.png").write_bytes(png16(np.stack([gray] * 3, axis=-1)))
    fast, slow = both_loaders(root, tmp_path / "cache")
    assert torch.equal(fast, slow)  # the same pixels from both loaders
    want_gray = torch.from_numpy((gray >> 8).astype(np.uint8)).expand(3, 32, 32)
    want_rgb = torch.from_numpy((rgb >> 8).astype(np.uint8)).permute(2, 0, 1)
    # test/ant: 0.png, a_gray16.png, b_rgb16.png, c_gray16.pgm, d_gray16as_rgb.png
    assert torch.equal(fast[1], want_gray) and torch.equal(fast[3], want_gray)
    assert torch.equal(fast[2], want_rgb)
    assert torch.equal(fast[4], fast[1])  # gray decodes as the same image saved as 16-bit RGB
    first = fast[1, 0].flatten()[:len(VALUES)].tolist()
    assert first == [0, 0, 0, 1, 1, 1, 3, 127, 128, 254, 255, 255, 255]
    assert first != [v % 256 for v in VALUES] and first != [min(v, 255) for v in VALUES]


def test_8_bit_modes_agree_between_loaders(tmp_path):
    root = make_folder(tmp_path / "images", n=1)
    rng = np.random.default_rng(5)
    folder = root / "test" / "bee"
    save(folder / "gray.png", rng.integers(0, 256, (32, 32), dtype=np.uint8))
    save(folder / "rgba.png", rng.integers(0, 256, (32, 32, 4), dtype=np.uint8))
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).quantize(16).save(folder / "p.png")
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / "q.jpg", quality=90)
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / "r.bmp")
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / "s.webp")
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).convert("CMYK").save(folder / "t.tif")
    fast, slow = both_loaders(root, tmp_path / "cache")
    assert fast.shape == (9, 3, 32, 32) and torch.equal(fast, slow)
    gray = np.array(Image.open(folder / "gray.png"))
    assert torch.equal(fast[2], torch.from_numpy(gray).expand(3, 32, 32))


# --------------------------------------------------------------------------- listing

def imagefolder_listing(folder: Path):
    from torchvision.datasets import ImageFolder

    ds = ImageFolder(str(folder), loader=lambda p: p)
    return ds.classes, ds.samples


def test_listing_is_imagefolders_for_an_ordinary_folder(tmp_path):
    folder = tmp_path / "train"
    names = ["b/0.png", "b/x/1.PNG", "b/x-y/2.jpg", "b/x/z/3.jpeg", "b/x.y/4.bmp", "b/notes.txt",
             "b/X/5.webp", "a/9.tif", "a/10.TIFF", "a/deep/er/est/6.ppm", "a/7.pgm", "a/8.gif",
             "c d/é.png", "C/1.png", "a/.hidden.png"]
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")
    (folder / "stray.png").write_bytes(b"")  # a file beside the class folders: ignored
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "sub" / "e.png").write_bytes(b"")
    (folder / "b" / "link").symlink_to(elsewhere)  # a link out of the folder is followed
    (folder / "linked").symlink_to(elsewhere)  # so is a linked class folder
    assert list_images(folder) == imagefolder_listing(folder)
    classes, samples = list_images(folder)
    assert classes == ["C", "a", "b", "c d", "linked"]
    assert (str(folder / "linked" / "sub" / "e.png"), 4) in samples


def test_symlink_loops_list_each_image_once_and_finish(tmp_path):
    root = make_folder(tmp_path / "images")
    ant = root / "train" / "ant"
    (ant / "self").symlink_to(".")  # the folder itself
    (ant / "up").symlink_to("..")  # the split folder: every class again
    (ant / "sub").mkdir()
    save(ant / "sub" / "s.png", np.zeros((32, 32, 3), dtype=np.uint8))
    (ant / "sub" / "back").symlink_to("..")  # the class folder, from below
    (ant / "sub" / "again").symlink_to("../sub")  # the folder holding the link
    (ant / "root").symlink_to("/")  # everything above
    (ant / "z_alias").symlink_to("sub")  # a second name for a folder: listed once, as sub
    start = time.process_time()
    classes, samples = list_images(root / "train")
    assert time.process_time() - start < 2
    paths = [p for p, _ in samples]
    assert classes == ["ant", "bee"] and len(paths) == len(set(paths)) == 5
    assert paths[:3] == [str(ant / "0.png"), str(ant / "1.png"), str(ant / "sub" / "s.png")]
    assert load_all(root, "fast", tmp_path / "cache") == load_all(root, "torchvision", None) == 5


def test_a_double_loop_is_not_exponential(tmp_path):
    root = make_folder(tmp_path / "images")
    bee = root / "train" / "bee"
    for name in ("l1", "l2", "l3"):
        (bee / name).symlink_to(".")
    start = time.process_time()
    _, samples = list_images(root / "train")
    assert time.process_time() - start < 2 and len(samples) == 4


def test_a_class_folder_linked_from_elsewhere_is_read(tmp_path):
    root = make_folder(tmp_path / "images")
    elsewhere = tmp_path / "store" / "cat"
    for split in ("train", "test"):
        save(elsewhere / split / "c.png", np.full((32, 32, 3), 77, dtype=np.uint8))
        (root / split / "cat").symlink_to(elsewhere / split)
    blob = decode_imagefolder(root, tmp_path / "cache")
    assert blob["classes"] == ["ant", "bee", "cat"]
    assert blob["train_labels"].tolist() == [0, 0, 1, 1, 2]
    assert (blob["train_images"][4] == 77).all()
    _, test, n = build(root, "torchvision", None)
    assert n == 3 and test.dataset_size == 5


def test_a_class_folder_linking_to_its_own_split_is_refused(tmp_path):
    root = make_folder(tmp_path / "images")
    (root / "train" / "zzz").symlink_to(".")
    with pytest.raises(DataError) as e:
        list_images(root / "train")
    assert "remove the link" in one_line(e)


@pytest.mark.parametrize("kind", ["fast", "torchvision"])
def test_folders_without_images(tmp_path, kind):
    root = make_folder(tmp_path / "images")
    for cls in ("ant", "bee"):
        for p in (root / "train" / cls).iterdir():
            p.unlink()
    (root / "train" / "ant" / "readme.txt").write_text("no images here")
    with pytest.raises(DataError) as e:
        build(root, kind, tmp_path / "cache")
    assert one_line(e).startswith(f"{root / 'train' / 'ant'}: no image files")
    shutil.rmtree(root / "train")
    (root / "train").mkdir()
    with pytest.raises(DataError) as e:
        build(root, kind, tmp_path / "cache")
    assert one_line(e).startswith(f"{root / 'train'}: no class folders")
    with pytest.raises(DataError) as e:
        build(tmp_path / "missing", kind, tmp_path / "cache")
    assert "no such folder" in one_line(e)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(DataError):
        build(tmp_path / "a_file", kind, tmp_path / "cache")


# --------------------------------------------------------------------------- the decode cache

@pytest.fixture
def cached(tmp_path):
    """(root, cache folder, cache file, the reference decode)."""
    root = make_folder(tmp_path / "images", n=3)
    ref = decode_imagefolder(root, tmp_path / "cache")
    (path,) = (tmp_path / "cache").glob("*.pt")
    return root, tmp_path / "cache", path, ref


def reread(cached, capsys, decoded: bool = True) -> str:
    """Decode with the cache in whatever state a test left it; check the data is right and the
    cache valid again. Returns what went to stderr."""
    root, cache, path, ref = cached
    capsys.readouterr()
    blob = decode_imagefolder(root, cache)
    err = capsys.readouterr().err
    assert ("decoded" in err) == decoded, err
    for k in ("train_images", "train_labels", "test_images", "test_labels", "classes"):
        assert (blob[k] == ref[k]) if k == "classes" else torch.equal(blob[k], ref[k])
    return err


def forge(path: Path, change) -> None:
    """Change the cache's contents and recompute its checksum, as a forger would."""
    blob = torch.load(path, weights_only=True)
    change(blob)
    blob["checksum"] = checksum(blob)
    path.unlink()
    torch.save(blob, path)


def test_a_valid_cache_is_used(cached, capsys):
    assert reread(cached, capsys, decoded=False) == ""


def test_a_truncated_cache_is_rebuilt(cached, capsys):
    path = cached[2]
    path.write_bytes(path.read_bytes()[:1000])
    err = reread(cached, capsys)
    assert err.startswith(f"slimming: the decoded-image cache is invalid and is being rebuilt: {path}:")
    assert reread(cached, capsys, decoded=False) == ""


def test_a_cache_with_a_flipped_byte_is_rebuilt(cached, capsys):
    path, ref = cached[2], cached[3]
    raw = bytearray(path.read_bytes())
    at = bytes(raw).find(ref["train_images"][1].numpy().tobytes())  # inside the pixel data
    assert at > 0
    raw[at + 100] ^= 0x10
    path.write_bytes(bytes(raw))
    err = reread(cached, capsys)
    assert "invalid" in err and "checksum" in err and len(err.splitlines()) == 2


@pytest.mark.parametrize("change, reason", [
    (lambda b: b["train_labels"].__setitem__(0, 2), "train_labels fall outside [0, 2)"),
    (lambda b: b["test_labels"].__setitem__(0, -1), "test_labels fall outside"),
    (lambda b: b["train_labels"].copy_(b["train_labels"].flip(0)), "train_labels are not the folder's"),
    (lambda b: b.update(train_labels=b["train_labels"][:-1]), "train_labels are not int64 (6,)"),
    (lambda b: b.update(test_images=b["test_images"].float()), "test_images are not uint8"),
    (lambda b: b.update(test_images=b["test_images"][:, :, :31]), "test_images are not uint8"),
    (lambda b: b.update(classes=["ant", "wasp"]), "classes"),
    (lambda b: b.update(classes=torch.zeros(2)), "classes"),
    (lambda b: b.update(format=torch.zeros(3)), "not a slimming decoded-image cache"),
    (lambda b: b.pop("checksum"), "no checksum"),  # put back by forge(): a forged checksum
])
def test_a_forged_cache_is_rebuilt(cached, capsys, change, reason):
    if reason == "no checksum":
        blob = torch.load(cached[2], weights_only=True)
        blob.pop("checksum")
        torch.save(blob, cached[2])
    else:
        forge(cached[2], change)
    err = reread(cached, capsys)
    assert "invalid and is being rebuilt" in err and reason in err, err


def test_a_stale_cache_is_rebuilt_quietly(cached, capsys):
    forge(cached[2], lambda b: b.update(key="another listing", version=1))
    assert "invalid" not in reread(cached, capsys)


def test_a_cache_that_is_a_link_to_a_device_is_replaced(cached, capsys):
    path = cached[2]
    path.unlink()
    path.symlink_to("/dev/zero")
    assert "symbolic link" in reread(cached, capsys)
    assert not path.is_symlink() and path.is_file()
    assert os.path.exists("/dev/zero")  # replaced the link, not written through it
    reread(cached, capsys, decoded=False)


def test_a_cache_that_is_a_directory_is_decoded_around(cached, capsys):
    path = cached[2]
    path.unlink()
    (path / "inside").mkdir(parents=True)
    err = reread(cached, capsys)
    assert "is a directory" in err and "cannot write the decoded-image cache" in err
    assert (path / "inside").is_dir()  # nothing of the user's removed
    reread(cached, capsys)  # and again next time, without a traceback


def test_a_cache_folder_that_is_a_file_is_decoded_around(tmp_path, capsys):
    root = make_folder(tmp_path / "images")
    (tmp_path / "cache").write_text("")
    blob = decode_imagefolder(root, tmp_path / "cache")
    assert len(blob["train_images"]) == 4 and "cannot write" in capsys.readouterr().err


# --------------------------------------------------------------------------- flags

@pytest.mark.parametrize("kind", ["fast", "torchvision"])
def test_an_absurd_batch_size_is_one_batch_of_everything(kind):
    train, test, _ = build_loaders("synthetic", batch_size=10**30, seed=0, loader=kind)
    assert len(train) == len(test) == 1
    assert next(iter(test))[0].shape == (512, 3, 32, 32)


@pytest.mark.parametrize("bad", [dict(batch_size=0), dict(batch_size=-3), dict(batch_size=2.5),
                                 dict(batch_size=True), dict(workers=-1), dict(workers="2")])
def test_bad_counts(bad):
    with pytest.raises(DataError) as e:
        build_loaders("synthetic", loader="torchvision", **bad)
    assert "must be an integer" in one_line(e)


def test_the_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    from slimming.cli import main

    root = make_folder(tmp_path / "images")
    bad = root / "train" / "ant" / "huge.png"
    bad.write_bytes(png(60000, 60000, 8, 2, b"\0"))
    for kind in ("fast", "torchvision"):
        code = main(["train", "--arch", "vgg", "--cfg", "8,M,8,M,8,M,8,M,8", "--dataset", "imagefolder",
                     "--data-root", str(root), "--loader", kind, "--epochs", "1", "--cpu",
                     "--save", str(tmp_path / f"run-{kind}")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and err[-1].startswith(f"slimming train: error: {bad}: its header claims")
        assert not any("Traceback" in line for line in err)
