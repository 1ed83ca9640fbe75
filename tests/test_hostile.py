"""The table of hostile and mistaken inputs, across every command.

Every case must give exit code 2, exactly one line on stderr that names the problem, no
traceback, no file changed (the input folder byte-identical, no output created), in under 30 s
and within 1.5 GiB of data memory. The cases run in one child process (one torch import for
all) under ``RLIMIT_DATA`` = 1.5 GiB, each with a 30 s alarm; a case that allocates past the
limit or hangs fails with the reason. The inputs are classes, not single cases: every hostile
checkpoint goes through ``prune``, and the commands share the loader.
"""

import functools
import json
import os
import pickle
import random
import resource
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib

import pytest
import torch
from conftest import randomize_bn

from slimming import checkpoint_dict, models, save_checkpoint
from slimming.utils.safeload import checksum

TINY = [8, "M", 16, "M", 16, "M", 16, "M", 16]
SYN = ["--dataset", "synthetic", "--cpu"]
MEMORY = int(1.5 * 2**30)


class Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def forged(d, name: str, edit, arch: str = "vgg", **options) -> None:
    """A checkpoint of a small network with ``edit`` applied and its checksum made to match:
    what a careful attacker (or a hand-edit plus a recomputed checksum) produces."""
    model = models.build(arch, cfg=TINY if arch == "vgg" else None, **options)
    ckpt = checkpoint_dict(model, acc=10.0, epoch=1)
    edit(ckpt)
    ckpt["checksum"] = checksum(ckpt)
    torch.save(ckpt, d / name)


def raw(d, name: str, obj) -> None:
    torch.save(obj, d / name)


def zip_bomb(d) -> None:
    """A real checkpoint re-zipped with deflate: 64 MiB of zeros in a few hundred KiB."""
    torch.save({"arch": "vgg", "state_dict": {"w": torch.zeros(16 * 2**20)}}, d / "big.tmp")
    with zipfile.ZipFile(d / "big.tmp") as z, zipfile.ZipFile(d / "zipbomb.pth", "w",
                                                             zipfile.ZIP_DEFLATED) as out:
        for info in z.infolist():
            out.writestr(info.filename, z.read(info.filename))
    (d / "big.tmp").unlink()


def png_header_bomb() -> bytes:
    """A PNG whose header claims 60000x60000 RGB pixels (10 GB decoded) in ~100 bytes."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 100)) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Every hostile or mistaken input, built once; the cases only read it."""
    d = tmp_path_factory.mktemp("zoo")
    model = models.build("vgg", cfg=TINY)
    randomize_bn(model, torch.Generator().manual_seed(0))
    save_checkpoint(checkpoint_dict(model, acc=10.0, epoch=1, optimizer={}), d / "good.pth")
    from slimming import prune

    pruned = prune(model, percent=0.5)
    save_checkpoint(checkpoint_dict(pruned.model, cfg_mask=pruned.cfg_mask), d / "pruned.pth")
    data = (d / "good.pth").read_bytes()
    (d / "empty.pth").write_bytes(b"")
    (d / "truncated.pth").write_bytes(data[: len(data) // 3])
    (d / "random.pth").write_bytes(random.Random(0).randbytes(4096))
    raw(d, "evil.pth", {"arch": "vgg", "state_dict": {}, "x": Evil(d / "pwned")})
    raw(d, "noarch.pth", {"state_dict": model.state_dict()})
    raw(d, "notdict.pth", [1, 2, 3])
    zip_bomb(d)
    os.symlink("/dev/zero", d / "devzero.pth")
    os.mkfifo(d / "fifo.pth")
    flipped = torch.load(d / "good.pth", weights_only=True)
    flipped["state_dict"]["feature.0.weight"][0, 0, 0, 0] += 1.0
    raw(d, "flipped.pth", flipped)

    def put(key, value):
        return lambda c: c.__setitem__(key, value)

    def weight(value):
        return lambda c: c["state_dict"].__setitem__("feature.0.weight", value)

    def nested(depth):
        return functools.reduce(lambda a, _: [a], range(depth), 0)

    def laughs():
        tree = [0]
        for _ in range(6):
            tree = [tree] * 1000  # 10^18 nodes by reference, 70 KB pickled
        return tree

    raw(d, "expanded.pth", {"arch": "vgg", "state_dict": {"w": torch.zeros(1).expand(10**9)}})
    raw(d, "laughs.pth", {"arch": "vgg", "state_dict": {}, "x": laughs()})
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # pickling is recursive; torch's weights_only unpickling is not
    try:
        raw(d, "deep.pth", {"arch": "vgg", "state_dict": {}, "x": nested(5000)})
    finally:
        sys.setrecursionlimit(limit)
    raw(d, "bigint.pth", {"arch": "vgg", "state_dict": {}, "x": 2**4000})
    raw(d, "sparse.pth", {"arch": "vgg", "state_dict": {"w": torch.sparse_coo_tensor(
        torch.zeros(4, 0, dtype=torch.long), torch.zeros(0), (8, 3, 3, 3), check_invariants=True)}})
    forged(d, "complex.pth", weight(torch.zeros(8, 3, 3, 3, dtype=torch.complex64)))
    forged(d, "intweight.pth", weight(torch.zeros(8, 3, 3, 3, dtype=torch.int64)))
    forged(d, "shape.pth", weight(torch.zeros(8, 5, 3, 3)))
    forged(d, "nontensor.pth", weight([1.0, 2.0]))
    forged(d, "nangamma.pth", lambda c: c["state_dict"]["feature.1.weight"].fill_(float("nan")))
    forged(d, "optslist.pth", put("options", [19, 10]))
    forged(d, "classes0.pth", lambda c: c["options"].__setitem__("num_classes", 0))
    forged(d, "classesbig.pth", lambda c: c["options"].__setitem__("num_classes", 10**9))
    forged(d, "optbool.pth", lambda c: c["options"].__setitem__("depth", True))
    forged(d, "optunknown.pth", lambda c: c["options"].__setitem__("width", 4))
    forged(d, "format.pth", put("format", "keras"))
    forged(d, "otherarch.pth", put("arch", "nin"))
    forged(d, "version.pth", put("version", 99))
    forged(d, "cfgint.pth", put("cfg", 7))
    forged(d, "cfghuge.pth", put("cfg", [10**6, "M", 16, "M", 16, "M", 16, "M", 16]))
    forged(d, "cfgmasks.pth", put("cfg_mask", [1, 2, 3]))
    forged(d, "archint.pth", put("arch", 3))
    forged(d, "archunknown.pth", put("arch", "alexnet"))
    forged(d, "epochneg.pth", put("epoch", -1))
    forged(d, "accstr.pth", put("acc", "high"))
    forged(d, "resdepth.pth", lambda c: c["options"].__setitem__("depth", 9 * 10**6 + 2),
           arch="preresnet", depth=11)
    forged(d, "selectoob.pth", lambda c: c["state_dict"]["layer1.0.select.index"].add_(1000),
           arch="preresnet", depth=11)
    forged(d, "selectdup.pth", lambda c: c["state_dict"]["layer2.0.select.index"].zero_(),
           arch="preresnet", depth=11)
    external = models.build("torchvision:mobilenet_v2", num_classes=10, kwargs={"width_mult": 0.25})
    for name, edit in [("extusercode", put("arch", "os:system")),
                       ("extunknown", put("arch", "torchvision:no_such_net")),
                       ("extweights", lambda c: c["options"]["kwargs"].__setitem__("weights", "DEFAULT")),
                       ("exthugeint", lambda c: c["options"]["kwargs"].__setitem__("width_mult", 10**6)),
                       ("extcfg", put("cfg", {"features.0.1": 999}))]:
        ckpt = checkpoint_dict(external)  # options are copied, not shared with the model
        edit(ckpt)
        ckpt["checksum"] = checksum(ckpt)
        torch.save(ckpt, d / f"{name}.pth")
    forged(d, "archescape.pth", put("arch", "vgg\n\x1b[2J" + "x" * 2**20))
    forged(d, "imagesize.pth", put("data", {"dataset": "synthetic", "data_root": None, "image_size": 4000}))
    forged(d, "imagesizehuge.pth", put("data", {"dataset": "synthetic", "data_root": None,
                                                "image_size": 10**9}))
    external32 = models.build("torchvision:mobilenet_v2", num_classes=10, kwargs={"width_mult": 0.25},
                              input_size=[3, 32, 32])

    def narrow(*names, keep=4):
        def edit(c):
            for key in list(c["state_dict"]):
                if key.rsplit(".", 1)[0] in names and c["state_dict"][key].dim() >= 1:
                    c["state_dict"][key] = c["state_dict"][key][:keep].clone()
        return edit

    def narrow_last(c):  # the last conv and its BN narrowed together, the classifier left as it was
        narrow("features.18.0", "features.18.1", keep=640)(c)
        c["cfg"] = {"features.18.1": 640}

    for name, edit in [("extimagesize", put("data", {"dataset": "synthetic", "data_root": None,
                                                     "image_size": 640})),
                       ("extnarrowbn", narrow("features.0.1")),
                       ("extclassifier", narrow_last),
                       ("extsegmenter", put("arch", "torchvision:deeplabv3_mobilenet_v3_large"))]:
        ckpt = checkpoint_dict(external32)
        edit(ckpt)
        ckpt["checksum"] = checksum(ckpt)
        torch.save(ckpt, d / f"{name}.pth")
    for name, data in [("extmobile", None),
                       ("extimagesizehuge", {"dataset": "synthetic", "image_size": 5000})]:
        ckpt = checkpoint_dict(external, data=data)  # no input_size: the data record decides
        ckpt["checksum"] = checksum(ckpt)
        torch.save(ckpt, d / f"{name}.pth")
    with open(d / "plainpickle.pth", "wb") as f:
        pickle.dump({"arch": "vgg", "state_dict": {}}, f, protocol=4)
    raw(d, "blockedglobal.pth", {"arch": "vgg", "state_dict": {}, "x": os.system})
    paper = {"state_dict": model.state_dict(), "cfg": 5, "epoch": None}
    raw(d, "papercfg.pth", paper)
    (d / "afile").write_text("I am a file")
    (d / "nolayout").mkdir()
    for split in ("train", "test"):
        (d / "emptyclass" / split / "cat").mkdir(parents=True)
        (d / "bomb" / split / "cat").mkdir(parents=True)
        (d / "bomb" / split / "cat" / "x.png").write_bytes(png_header_bomb())
    (d / "notutf8.yaml").write_bytes(b"epochs: \xff\xfe\n")
    (d / "deep.yaml").write_text("cfg: " + "[" * 2000 + "]" * 2000 + "\n")
    (d / "alias.yaml").write_text("a: &a [1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\n"
                                  "c: &c [*b,*b,*b,*b,*b,*b,*b,*b]\ncfg: [*c,*c,*c,*c,*c,*c,*c,*c]\n")
    (d / "unknown.yaml").write_text("epochs: 1\nlearnig_rate: 0.1\n")
    (d / "big.yaml").write_text("# padding\n" * 10000)
    (d / "list.yaml").write_text("- epochs\n- 1\n")
    (d / "dictvalue.yaml").write_text("lr: {a: 1}\n")
    run = d / "run"
    (run / "pruned").mkdir(parents=True)
    (run / "pruned" / "pruned.pth").write_bytes(b"not a checkpoint")
    (run / "pruned" / "eval.json").write_text("{")
    return d


# (id, argv; {f} = the zoo, {o} = an output path that must not come to exist, needle in the line)
CHECKPOINTS = [
    ("missing", "no such file"), ("empty", "corrupt"), ("truncated", "corrupt"),
    ("random", "corrupt"), ("evil", "refused"), ("noarch", "--arch"), ("notdict", "state_dict"),
    ("zipbomb", "compressed"), ("devzero", "not a regular file"), ("fifo", "not a regular file"),
    ("flipped", "checksum"), ("expanded", "expanded"), ("laughs", "exponential"),
    ("deep", "nested deeper"), ("bigint", "Unsupported operand"), ("sparse", "sparse"),
    ("complex", "complex"), ("intweight", "int64"), ("shape", "do not fit"),
    ("nontensor", "other than named tensors"), ("nangamma", "feature.1.weight holds NaN"),
    ("optslist", "options"), ("classes0", "positive integer"), ("classesbig", "declares 1000000000"),
    ("optbool", "positive integer"), ("optunknown", "width"), ("format", "not a slimming"),
    ("version", "newer slimming"), ("cfgint", "'cfg'"), ("cfghuge", "declares cfg"),
    ("cfgmasks", "cfg_mask"), ("archint", "'arch'"), ("archunknown", "'arch'"),
    ("epochneg", "'epoch'"), ("accstr", "'acc'"), ("resdepth", "depth"),
    ("selectoob", "select.index"), ("selectdup", "select.index"),
    ("extusercode", "your own code"), ("extunknown", "no_such_net"), ("extweights", "nothing downloads"),
    ("exthugeint", "numbers above"), ("extcfg", "its cfg says"),
    # text from a file is escaped and cut; a plain pickle and a blocked global say they are refused
    ("archescape", "'arch'"), ("plainpickle", "plain Python pickle"), ("blockedglobal", "posix.system"),
    # weights inconsistent with themselves; a network that is not a classifier (and no download)
    ("extnarrowbn", "do not fit together"), ("extclassifier", "do not fit together"),
    ("extsegmenter", "has shape"),
]
CASES = [(f"prune-{name}", ["prune", "--checkpoint", f"{{f}}/{name}.pth", "--percent", "0.5",
                            "--save", "{o}", "--cpu"], needle) for name, needle in CHECKPOINTS]
CASES += [
    ("prune-papercfg", ["prune", "--checkpoint", "{f}/papercfg.pth", "--arch", "vgg", "--percent",
                        "0.5", "--save", "{o}"], "'cfg'"),
    ("prune-arch-mismatch", ["prune", "--checkpoint", "{f}/good.pth", "--arch", "nin", "--percent",
                             "0.5", "--save", "{o}"], "not 'nin'"),
    ("prune-otherarch", ["prune", "--checkpoint", "{f}/otherarch.pth", "--percent", "0.5", "--save",
                         "{o}"], "do not fit"),
    ("prune-both-ways", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--threshold",
                         "0.1", "--save", "{o}"], "not allowed with"),
    ("prune-directory", ["prune", "--checkpoint", "{f}", "--percent", "0.5", "--save", "{o}"], "directory"),
    ("prune-percent-1", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "1", "--save", "{o}"],
     "[0, 1)"),
    ("prune-percent-nan", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "nan", "--save", "{o}"],
     "[0, 1)"),
    ("prune-threshold-inf", ["prune", "--checkpoint", "{f}/good.pth", "--threshold", "inf", "--save",
                             "{o}"], ">= 0"),
    ("prune-threshold-all", ["prune", "--checkpoint", "{f}/good.pth", "--threshold", "50", "--save",
                             "{o}", "--cpu"], "every"),
    ("prune-threshold-none", ["prune", "--checkpoint", "{f}/good.pth", "--threshold", "0", "--save",
                              "{o}", "--cpu"], "prunes no channel"),
    ("prune-min-channels-0", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5",
                              "--min-channels", "0", "--save", "{o}"], "positive integer"),
    ("prune-exists", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--save", "{f}"],
     None),  # {f}/pruned.pth is there: filled in below
    ("prune-save-is-file", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--save",
                            "{f}/afile/x"], "is a file"),
    ("prune-save-proc", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--save",
                         "/proc/x"], "cannot write in /proc"),
    ("prune-device-bogus", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--save",
                            "{o}", "--device", "bogus"], "not a device"),
    ("prune-cpu-and-cuda", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--save",
                            "{o}", "--cpu", "--device", "cuda"], "contradict"),
    ("prune-device-mps", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--save",
                          "{o}", "--device", "mps"], "cpu or cuda"),
    ("prune-target-flops-0", ["prune", "--checkpoint", "{f}/good.pth", "--target-flops", "0", "--save",
                              "{o}", "--cpu"], "not positive"),
    ("prune-target-flops-unreachable", ["prune", "--checkpoint", "{f}/good.pth", "--target-flops", "2",
                                        "--save", "{o}", "--cpu"], "cannot be met"),
    ("prune-target-flops-above", ["prune", "--checkpoint", "{f}/good.pth", "--target-flops", "1e12",
                                  "--save", "{o}", "--cpu"], "nothing to cut"),
    ("prune-target-params-nan", ["prune", "--checkpoint", "{f}/good.pth", "--target-params", "nan",
                                 "--save", "{o}", "--cpu"], "not positive"),
    ("prune-percent-and-budget", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5",
                                  "--target-flops", "0.5", "--save", "{o}", "--cpu"], "not allowed"),
    ("prune-round-to-0", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--round-to", "0",
                          "--save", "{o}", "--cpu"], "positive integer"),
    ("prune-max-layer-prune-0", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5",
                                 "--max-layer-prune", "0", "--save", "{o}", "--cpu"], "(0, 1]"),
    ("prune-max-layer-prune-big", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5",
                                   "--max-layer-prune", "1.5", "--save", "{o}", "--cpu"], "(0, 1]"),
    ("prune-recalibrate-neg", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5",
                               "--recalibrate-bn", "-1", "--save", "{o}", "--cpu"], ">= 0"),
    ("prune-round-to-blocks", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.3", "--round-to",
                               "64", "--save", "{o}", "--cpu"], "--round-to 64 put channels back"),
    ("prune-max-layer-prune-blocks", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.3",
                                      "--max-layer-prune", "0.01", "--save", "{o}", "--cpu"],
     "--max-layer-prune 0.01 put channels back"),
    # sizes a checkpoint records are bounded and checked against the network's own
    ("eval-imagesize", ["eval", "--checkpoint", "{f}/imagesize.pth", "--cpu"], "takes 32x32"),
    ("eval-imagesize-huge", ["eval", "--checkpoint", "{f}/imagesizehuge.pth", "--cpu"], "1000000000 pixels"),
    ("eval-extimagesize-huge", ["eval", "--checkpoint", "{f}/extimagesizehuge.pth", "--cpu"],
     "from 1 to 1024"),
    ("eval-extimagesize", ["eval", "--checkpoint", "{f}/extimagesize.pth", "--cpu"], "takes 32x32"),
    ("finetune-imagesize", ["finetune", "--checkpoint", "{f}/imagesize.pth", "--save", "{o}", "--cpu"],
     "takes 32x32"),
    ("sweep-imagesize", ["sweep", "--checkpoint", "{f}/imagesize.pth", "--save", "{o}", "--cpu"],
     "takes 32x32"),
    # one shape check for every command
    ("eval-extnarrowbn", ["eval", "--checkpoint", "{f}/extnarrowbn.pth", *SYN], "do not fit together"),
    ("stats-extclassifier", ["stats", "--checkpoint", "{f}/extclassifier.pth", "--cpu"],
     "do not fit together"),
    ("export-extnarrowbn", ["export", "--checkpoint", "{f}/extnarrowbn.pth", "--out", "{o}.pt2", "--cpu"],
     "do not fit together"),
    # an allocation that fails is one line
    ("stats-out-of-memory", ["stats", "--checkpoint", "{f}/extmobile.pth", "--input-size", "3,4096,4096",
                             "--cpu"], "out of memory"),
    ("eval-device-cuda", ["eval", "--checkpoint", "{f}/good.pth", "--device", "cuda:0",
                          "--dataset", "synthetic"], "no CUDA device"),
    ("eval-evil", ["eval", "--checkpoint", "{f}/evil.pth", *SYN], "refused"),
    ("eval-zipbomb", ["eval", "--checkpoint", "{f}/zipbomb.pth", *SYN], "compressed"),
    ("eval-imagefolder-no-root", ["eval", "--checkpoint", "{f}/good.pth", "--dataset", "imagefolder",
                                  "--cpu"], "--data-root"),
    ("stats-expanded", ["stats", "--checkpoint", "{f}/expanded.pth", "--cpu"], "expanded"),
    ("stats-compare-laughs", ["stats", "--checkpoint", "{f}/good.pth", "--compare", "{f}/laughs.pth",
                              "--cpu"], "exponential"),
    ("stats-input-small", ["stats", "--checkpoint", "{f}/good.pth", "--input-size", "3,8,8", "--cpu"],
     "does not fit"),
    ("stats-input-wide", ["stats", "--checkpoint", "{f}/good.pth", "--input-size", "3,4096,4096",
                          "--cpu"], "does not fit"),
    ("stats-input-huge", ["stats", "--checkpoint", "{f}/good.pth", "--input-size", "3,100000,5",
                          "--cpu"], "C,H,W"),
    ("stats-input-2d", ["stats", "--checkpoint", "{f}/good.pth", "--input-size", "3,32", "--cpu"], "C,H,W"),
    ("stats-repeats-neg", ["stats", "--checkpoint", "{f}/good.pth", "--repeats", "-1"], "[0, 10000]"),
    ("export-input-small", ["export", "--checkpoint", "{f}/good.pth", "--input-size", "3,16,16",
                            "--out", "{o}.pt2", "--cpu"], "does not fit"),
    ("export-not-pt2", ["export", "--checkpoint", "{f}/good.pth", "--out", "{o}.bin", "--cpu"], ".pt2"),
    ("export-exists", ["export", "--checkpoint", "{f}/good.pth", "--out", "{f}/good.pth", "--format",
                       "torchscript", "--cpu"], "already exists"),
    ("export-atol-nan", ["export", "--checkpoint", "{f}/good.pth", "--out", "{o}.pt2", "--atol", "nan"],
     "positive"),
    ("export-cfghuge", ["export", "--checkpoint", "{f}/cfghuge.pth", "--out", "{o}.pt2", "--cpu"],
     "declares cfg"),
    ("finetune-version", ["finetune", "--checkpoint", "{f}/version.pth", "--save", "{o}", *SYN],
     "newer slimming"),
    ("finetune-config-list", ["finetune", "--checkpoint", "{f}/good.pth", "--save", "{o}", "--dataset",
                          "synthetic", "--cpu", "--config", "{f}/list.yaml"], "mapping"),
    ("train-resume-pruned", ["train", "--resume", "{f}/pruned.pth", "--save", "{o}", *SYN],
     "finetune --checkpoint"),
    ("train-resume-missing", ["train", "--resume", "{f}/missing.pth", "--save", "{o}", *SYN], "no such file"),
    ("train-lr-nan", ["train", "--lr", "nan", "--save", "{o}", *SYN], "positive"),
    ("train-lr-inf", ["train", "--lr", "inf", "--save", "{o}", *SYN], "positive"),
    ("train-momentum-nan", ["train", "--momentum", "nan", "--save", "{o}", *SYN], ">= 0"),
    ("train-label-smoothing-1", ["train", "--label-smoothing", "1", "--save", "{o}", *SYN], "[0, 1)"),
    ("train-label-smoothing-neg", ["train", "--label-smoothing", "-0.1", "--save", "{o}", *SYN], "[0, 1)"),
    ("train-seed-huge", ["train", "--seed", str(2**70), "--save", "{o}", *SYN], "2**63"),
    ("train-seed-neg", ["train", "--seed", "-1", "--save", "{o}", *SYN], "2**63"),
    ("train-epochs-0", ["train", "--epochs", "0", "--save", "{o}", *SYN], "positive integer"),
    ("train-batch-0", ["train", "--batch-size", "0", "--save", "{o}", *SYN], "positive integer"),
    ("train-workers-neg", ["train", "--workers", "-2", "--save", "{o}", *SYN], ">= 0"),
    ("train-warmup-neg", ["train", "--warmup-epochs", "-1", "--save", "{o}", *SYN], ">= 0"),
    ("train-cfg-three-pools", ["train", "--cfg", "8,M,8,M,8,M,8", "--save", "{o}", *SYN], "four 'M'"),
    ("train-cfg-five-pools", ["train", "--cfg", "8,M,8,M,8,M,8,M,8,M,8", "--save", "{o}", *SYN],
     "four 'M'"),
    ("train-cfg-junk", ["train", "--cfg", "8,X", "--save", "{o}", *SYN], "bad cfg entry"),
    ("train-cfg-huge-width", ["train", "--cfg", "8,M,8,M,8,M,8,M,99999999", "--save", "{o}", *SYN],
     "bad cfg entry"),
    ("train-cfg-nin", ["train", "--arch", "nin", "--cfg", "8,8,8", "--save", "{o}", *SYN], "eight"),
    ("train-depth-vgg", ["train", "--depth", "12", "--save", "{o}", *SYN], "depth"),
    ("train-depth-resnet-huge", ["train", "--arch", "resnet", "--depth", str(9 * 10**8 + 2), "--save",
                                 "{o}", *SYN], "depth"),
    ("train-arch", ["train", "--arch", "alexnet", "--save", "{o}", *SYN], "unknown arch"),
    ("train-arch-torchvision", ["train", "--arch", "torchvision:no_such_net", "--save", "{o}", *SYN],
     "no model"),
    ("train-arch-module", ["train", "--arch", "no_such_package:net", "--save", "{o}", *SYN], "cannot import"),
    ("train-external-cfg", ["train", "--arch", "torchvision:resnet18", "--cfg", "8,M,8", "--save", "{o}",
                            *SYN], "--model-kwargs"),
    ("train-model-kwargs-list", ["train", "--arch", "torchvision:resnet18", "--model-kwargs", "[1]",
                                 "--save", "{o}", *SYN], "JSON object"),
    ("train-model-kwargs-weights", ["train", "--arch", "torchvision:resnet18", "--model-kwargs",
                                    '{{"weights": "DEFAULT"}}', "--save", "{o}", *SYN], "nothing downloads"),
    # builders: nothing downloads, options are checked by building on the meta device first
    ("train-arch-detector", ["train", "--arch", "torchvision:fasterrcnn_mobilenet_v3_large_320_fpn",
                             "--save", "{o}", *SYN], "not class scores"),
    ("train-weights-backbone", ["train", "--arch", "torchvision:deeplabv3_mobilenet_v3_large",
                                "--model-kwargs", '{{"weights_backbone": "DEFAULT"}}', "--save", "{o}", *SYN],
     "nothing downloads"),
    ("train-model-kwargs-exponent", ["train", "--arch", "torchvision:mobilenet_v2", "--model-kwargs",
                                     '{{"width_mult": 1e20}}', "--save", "{o}", *SYN], "numbers above"),
    ("train-model-kwargs-infinity", ["train", "--arch", "torchvision:mobilenet_v2", "--model-kwargs",
                                     '{{"width_mult": Infinity}}', "--save", "{o}", *SYN], "numbers above"),
    ("train-model-kwargs-zero-division", ["train", "--arch", "torchvision:mobilenet_v2", "--model-kwargs",
                                          '{{"round_nearest": 0}}', "--save", "{o}", *SYN], "by zero"),
    ("train-model-kwargs-wide", ["train", "--arch", "torchvision:mobilenet_v2", "--model-kwargs",
                                 '{{"width_mult": 4096}}', "--save", "{o}", *SYN], "parameters; more than"),
    ("train-timm-features-only", ["train", "--arch", "timm:resnet18", "--model-kwargs",
                                  '{{"features_only": true}}', "--save", "{o}", *SYN], "not class scores"),
    ("train-timm-global-pool", ["train", "--arch", "timm:resnet18", "--model-kwargs",
                                '{{"global_pool": ""}}', "--save", "{o}", *SYN],
     "timm:resnet18"),  # refused by the builder (older timm) or by the meta forward (newer)
    ("train-timm-in-chans", ["train", "--arch", "timm:resnet18", "--model-kwargs", '{{"in_chans": 1}}',
                             "--save", "{o}", *SYN], "cannot take a batch"),
    ("train-arch-long-name", ["train", "--arch", "torchvision:" + "x\x1b" * 50_000, "--save", "{o}", *SYN],
     "no model"),
    ("train-no-num-classes", ["train", "--arch", "torchvision:raft_small", "--save", "{o}", *SYN],
     "num_classes"),
    ("train-data-root-fifo", ["train", "--dataset", "imagefolder", "--data-root", "{f}/fifo.pth", "--save",
                              "{o}", "--cpu"], "a FIFO, not a folder"),
    ("train-data-root-device", ["train", "--dataset", "imagefolder", "--data-root", "/dev/null", "--save",
                                "{o}", "--cpu"], "a character device, not a folder"),
    ("train-model-kwargs-family", ["train", "--model-kwargs", '{{"a": 1}}', "--save", "{o}", *SYN],
     "shipped families"),
    ("train-init-missing", ["train", "--init", "{f}/missing.pth", "--save", "{o}", *SYN], "no such file"),
    ("train-init-evil", ["train", "--init", "{f}/evil.pth", "--save", "{o}", *SYN], "refused"),
    ("train-init-mismatch", ["train", "--init", "{f}/good.pth", "--save", "{o}", *SYN], "do not fit"),
    ("train-num-classes", ["train", "--num-classes", "7", "--cfg", "8,M,8,M,8,M,8,M,8", "--save", "{o}",
                           *SYN], "--num-classes 7"),
    ("train-amp-dtype", ["train", "--amp-dtype", "bfloat16", "--save", "{o}", *SYN], "--amp"),
    ("train-sparsity-target-alone", ["train", "--sparsity-target", "0.5", "--save", "{o}", *SYN],
     "slimming train: error: --sparsity-target"),
    ("train-sparsity-target-1", ["train", "--sparsity", "1e-4", "--sparsity-target", "1", "--save", "{o}",
                                 *SYN], "(0, 1)"),
    ("train-deterministic", ["train", "--deterministic", "--save", "{o}", *SYN], "--seed"),
    ("train-save-is-file", ["train", "--save", "{f}/afile", *SYN], "is a file"),
    ("train-dataset", ["train", "--dataset", "imagenet", "--save", "{o}"], "invalid choice"),
    ("train-no-layout", ["train", "--dataset", "imagefolder", "--data-root", "{f}/nolayout", "--save",
                         "{o}", "--cpu"], "train"),
    ("train-empty-class", ["train", "--dataset", "imagefolder", "--data-root", "{f}/emptyclass",
                           "--save", "{o}", "--cpu"], "cat"),
    ("train-png-header-bomb", ["train", "--dataset", "imagefolder", "--data-root", "{f}/bomb",
                               "--save", "{o}", "--cpu"], "decompression bomb"),
    ("train-png-header-bomb-torchvision", ["train", "--dataset", "imagefolder", "--data-root",
                                           "{f}/bomb", "--loader", "torchvision", "--save", "{o}",
                                           "--cpu"], "decompression bomb"),
    ("train-config-not-utf8", ["train", "--config", "{f}/notutf8.yaml", "--save", "{o}", *SYN], "UTF-8"),
    ("train-config-deep", ["train", "--config", "{f}/deep.yaml", "--save", "{o}", *SYN], "nested"),
    ("train-config-alias", ["train", "--config", "{f}/alias.yaml", "--save", "{o}", *SYN], "aliases"),
    ("train-config-unknown", ["train", "--config", "{f}/unknown.yaml", "--save", "{o}", *SYN],
     "unknown key"),
    ("train-config-big", ["train", "--config", "{f}/big.yaml", "--save", "{o}", *SYN], "KiB"),
    ("train-config-dict-value", ["train", "--config", "{f}/dictvalue.yaml", "--save", "{o}", *SYN],
     "flat list"),
    ("train-config-missing", ["train", "--config", "{f}/missing.yaml", "--save", "{o}", *SYN],
     "cannot read"),
    ("sweep-percents-junk", ["sweep", "--checkpoint", "{f}/good.pth", "--percents", "a:b:c", "--save",
                             "{o}", *SYN], "--percents"),
    ("sweep-percents-many", ["sweep", "--checkpoint", "{f}/good.pth", "--percents", "0:0.99:1e-9",
                             "--save", "{o}", *SYN], "--percents"),
    ("sweep-percents-nan", ["sweep", "--checkpoint", "{f}/good.pth", "--percents", "nan,0.5", "--save",
                            "{o}", *SYN], "--percents"),
    ("sweep-target-flops-0", ["sweep", "--checkpoint", "{f}/good.pth", "--target-flops", "0,0.5", "--save",
                              "{o}", *SYN], "budget of 0"),
    ("sweep-target-params-big", ["sweep", "--checkpoint", "{f}/good.pth", "--target-params", "1.5",
                                 "--save", "{o}", *SYN], "fraction in (0, 1)"),
    ("sweep-percents-and-budget", ["sweep", "--checkpoint", "{f}/good.pth", "--target-flops", "0.5",
                                   "--percents", "0.5", "--save", "{o}", *SYN], "not allowed"),
    ("sweep-format", ["sweep", "--checkpoint", "{f}/format.pth", "--save", "{o}", *SYN],
     "not a slimming"),
    ("report-missing", ["report", "--run", "{f}/missing"], "no such run folder"),
    ("report-hand-edited", ["report", "--run", "{f}/run", "--cpu"], "pruned.pth"),
    ("pipeline-no-percent", ["pipeline", "--save", "{o}", *SYN], "--percent"),
    ("pipeline-cfg", ["pipeline", "--cfg", "8,M,8", "--percent", "0.5", "--save", "{o}", *SYN],
     "four 'M'"),
    ("pipeline-save-is-file", ["pipeline", "--percent", "0.5", "--save", "{f}/afile", *SYN], "is a file"),
    ("pipeline-iterations-0", ["pipeline", "--percent", "0.5", "--iterations", "0", "--save", "{o}", *SYN],
     "positive integer"),
    ("pipeline-target-flops-0", ["pipeline", "--target-flops", "0", "--save", "{o}", *SYN], "not positive"),
    ("pipeline-latency-ms-iterations", ["pipeline", "--target-latency", "5ms", "--iterations", "2",
                                        "--epochs", "1", "--save", "{o}", *SYN], "as a fraction"),
    ("prune-target-latency-word", ["prune", "--checkpoint", "{f}/good.pth", "--target-latency", "fast",
                                   "--save", "{o}"], "a time such as 12ms"),
    ("prune-target-latency-nan", ["prune", "--checkpoint", "{f}/good.pth", "--target-latency", "nanms",
                                  "--save", "{o}"], "a time such as 12ms"),
    ("prune-target-latency-huge", ["prune", "--checkpoint", "{f}/good.pth", "--target-latency", "1e9ms",
                                   "--save", "{o}", "--cpu"], "at or above the unpruned"),
    ("prune-round-to-word", ["prune", "--checkpoint", "{f}/good.pth", "--percent", "0.5", "--round-to",
                             "often", "--save", "{o}"], "not a number"),
    ("sweep-target-latency-big", ["sweep", "--checkpoint", "{f}/good.pth", "--target-latency", "1.5",
                                  "--save", "{o}", *SYN], "fraction in (0, 1)"),
    ("cache-typo", ["cache", "--clearr"], "--clear"),
]
CASES = [(i, a, "already exists" if i == "prune-exists" else n) for i, a, n in CASES]

RUNNER = textwrap.dedent("""
    import contextlib, hashlib, io, json, os, resource, signal, sys, time
    from pathlib import Path
    from slimming.cli import main

    zoo, out_root, cases_file, results_file = map(Path, sys.argv[1:5])

    def snapshot():
        found = {}
        for dirpath, dirnames, filenames in os.walk(zoo):  # does not follow links
            for name in dirnames + filenames:
                p = Path(dirpath, name)
                if p.is_symlink():
                    found[str(p)] = "link:" + os.readlink(p)
                elif p.is_file():
                    found[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
                else:
                    found[str(p)] = "dir" if p.is_dir() else "other"
        return found

    def alarm(*_):
        raise TimeoutError("over 30 s")

    signal.signal(signal.SIGALRM, alarm)
    for case in json.loads(cases_file.read_text()):
        before = snapshot()
        err = io.StringIO()
        start = time.process_time()  # its CPU time: what a busy machine does not stretch
        signal.alarm(300)  # a hang, on however busy a machine
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    code = main(case["argv"])
                except SystemExit as e:
                    code = e.code
        except BaseException as e:  # reported, not hidden: the test fails on it
            code, _ = "escaped", err.write(f"ESCAPED {type(e).__name__}: {e}")
        finally:
            signal.alarm(0)
        row = {"id": case["id"], "code": code, "stderr": err.getvalue(),
               "seconds": time.process_time() - start, "changed": snapshot() != before,
               "created": any(p.exists() for p in Path(out_root).glob(case["id"] + "*"))}
        with open(results_file, "a") as f:
            f.write(json.dumps(row) + "\\n")
""")


@pytest.fixture(scope="module")
def results(zoo, tmp_path_factory):
    """Run every case in one child process, limited to 1.5 GiB of data memory."""
    work = tmp_path_factory.mktemp("hostile")
    out = work / "out"
    out.mkdir()
    cases = [{"id": i, "argv": [a.format(f=zoo, o=out / i) for a in argv]} for i, argv, _ in CASES]
    (work / "cases.json").write_text(json.dumps(cases))
    (work / "runner.py").write_text(RUNNER)

    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY, MEMORY))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "TORCH_HOME": str(work / "torch-home")}  # a download would make its cache folder here
    proc = subprocess.run([sys.executable, str(work / "runner.py"), str(zoo), str(out),
                           str(work / "cases.json"), str(work / "results.jsonl")],
                          preexec_fn=limit, env=env, capture_output=True, text=True, timeout=1200)
    rows = {}
    if (work / "results.jsonl").exists():
        rows = {r["id"]: r for r in map(json.loads, (work / "results.jsonl").read_text().splitlines())}
    rows["_process"] = {"code": proc.returncode, "stderr": proc.stderr[-2000:],
                        "downloaded": (work / "torch-home").exists()}
    return rows


@pytest.mark.parametrize("case_id,needle", [(i, n) for i, _, n in CASES], ids=[c[0] for c in CASES])
@pytest.mark.slow
def test_hostile_input_is_one_line_exit_2_and_changes_nothing(results, zoo, case_id, needle):
    row = results.get(case_id)
    assert row is not None, f"the runner died before this case: {results['_process']}"
    lines = row["stderr"].strip().splitlines()
    assert row["code"] == 2, row["stderr"][-1500:]
    assert len(lines) == 1 and "Traceback" not in row["stderr"], row["stderr"][-1500:]
    assert needle in lines[0], lines[0]
    assert len(lines[0]) <= 1000 and "\x1b" not in lines[0], lines[0][:1000]  # readable, and inert
    assert not row["changed"] and not row["created"], "a file was written or changed"
    assert row["seconds"] < 30
    assert not (zoo / "pwned").exists()


@pytest.mark.slow
def test_the_runner_itself_ended_cleanly(results):
    assert results["_process"]["code"] == 0, results["_process"]["stderr"]
    assert not results["_process"]["downloaded"], "a case tried to download (TORCH_HOME was made)"


def test_the_table_covers_every_command():
    """A command added later must bring its hostile inputs into the table."""
    from slimming.cli.parser import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert {argv[0] for _, argv, _ in CASES} == commands


@pytest.mark.slow
def test_code_in_the_working_folder_is_never_imported(zoo, tmp_path):
    """The paper's repository and every YOLOv5 checkout hold packages named models/, utils/ and
    data/: ``python -m slimming`` run there must not import them (slimming's networks install
    as ``slimming.models``), neither for a good run nor for a mistake."""
    work = tmp_path / "yolov5"
    for name in ("models", "utils", "data"):
        (work / name).mkdir(parents=True)
        (work / name / "__init__.py").write_text(
            f"open({str(work / ('imported-' + name))!r}, 'w').close()\n"
            "raise ImportError('the working folder\\'s own package')\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    ok = subprocess.run([sys.executable, "-m", "slimming", "prune", "--checkpoint", str(zoo / "good.pth"),
                         "--percent", "0.5", "--save", str(tmp_path / "out"), "--cpu"],
                        cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-1500:]
    assert (tmp_path / "out" / "pruned.pth").is_file()
    bad = subprocess.run([sys.executable, "-m", "slimming", "eval", "--checkpoint", str(zoo / "evil.pth"),
                          "--dataset", "synthetic", "--cpu"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=300)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and "refused" in lines[0], bad.stderr[-1500:]
    assert not list(work.glob("imported-*")), "slimming imported the working folder's own code"
    assert not (zoo / "pwned").exists()
