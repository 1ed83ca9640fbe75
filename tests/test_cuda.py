"""The CUDA paths: mixed precision (float16 with GradScaler, bfloat16), channels-last,
torch.compile, the fast loader on the GPU, pruning's rebuild on CUDA, export on CUDA, and
deterministic runs. A test that needs CUDA is marked ``cuda`` (run them with ``pytest -m cuda``
on a GPU machine; ``benchmarks/gpu/run.py`` does) and is skipped without one. Where the same
check can run on the CPU, it is parametrized over devices: the CPU case runs in the ordinary
suite, in well under a second, and shows that the test itself is right.

Comparisons on CUDA turn TF32 off (``exact_fp32``) where they hold a GPU result against the CPU's
or another layout's: PyTorch runs float32 convolutions in TF32 by default (10 bits of mantissa),
which would blur every tolerance below by about 1e-3 relative.
"""

import json
import subprocess
import sys

import pytest
import torch
from conftest import TINY_VGG, sparsity_shaped

import slimming
from slimming import BNSparsity, models
from slimming.training.engine import Trainer, make_scheduler
from slimming.utils.devices import full_precision

HAS_CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.usefixtures("one_thread")  # the CPU cases: tiny convolutions, busy cores
CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")])


def cuda_only(test):
    return pytest.mark.cuda(pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")(test))


@pytest.fixture
def exact_fp32():
    """float32 convolutions and matmuls in full float32 on CUDA (no TF32) for this test, restored
    by assignment after it. Not ``monkeypatch.setattr``: ``torch.backends.cuda.matmul`` serves
    ``allow_tf32`` through ``__getattr__``, and pytest >= 9.2 deletes such an attribute at
    teardown instead of restoring it, which raises."""
    with full_precision():
        yield


def batches(n: int, size: int = 16, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 3, 32, 32, generator=g), torch.randint(10, (size,), generator=g))
            for _ in range(n)]


def train_steps(device: str, amp_dtype=None, strength: float = 2e-2, steps: int = 5, channels_last=False,
                compile=False, init_scale: float = 2.0**10):
    """``steps`` plain-SGD steps (lr 0.1, no momentum: each update is lr x the gradient) of the
    tiny VGG through ``Trainer.step``; returns the prunable gammas (CPU) and the losses."""
    torch.manual_seed(0)
    model = models.build("vgg", cfg=TINY_VGG).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    net = torch.compile(model) if compile else model
    trainer = Trainer(net, opt, make_scheduler(opt, 1), torch.device(device), amp_dtype=amp_dtype,
                      sparsity=BNSparsity(model, strength) if strength else None, channels_last=channels_last)
    if trainer.scaler.is_enabled():  # a scale that cannot overflow this tiny net: no step skipped
        trainer.scaler = torch.amp.GradScaler(device, init_scale=init_scale)
    losses = []
    for x, y in batches(steps):
        x = x.to(device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        loss, _, applied = trainer.step(x, y.to(device))
        assert bool(applied), "the scaler skipped a step"
        losses.append(loss.item())
    if channels_last:
        assert model.feature[0].weight.is_contiguous(memory_format=torch.channels_last)
    gammas = torch.cat([bn.weight.detach().float().cpu() for bn in model.prunable_bns()])
    return gammas, losses


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("amp_dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_amp_steps_are_finite_and_apply_the_l1_term_unscaled(device, amp_dtype, exact_fp32):
    """Five steps under autocast land where five float32 steps land.

    The L1 term moves every gamma by lr * S = 2e-3 a step, 1e-2 over the five: if it were added
    to scaled gradients it would be divided by the loss scale (1024) and all but vanish; added
    twice, or to gradients the scaler then unscales, it would be off by as much again or more.
    What autocast itself changes is the rounding of the loss gradient: bfloat16 keeps 8 bits
    (relative error ~4e-3), float16 11; on gamma gradients of order 1e-2 to 1e-1 that is at
    most 5 * 0.1 * 0.1 * 4e-3 = 2e-4 over the five steps (measured on the CPU: 2.3e-4 and
    1.3e-4). So the gammas must agree within 2.5e-3, a quarter of the L1 term's effect, which
    the first check shows is really there."""
    fp32, _ = train_steps(device)
    amp, losses = train_steps(device, amp_dtype)
    no_l1, _ = train_steps(device, strength=0.0)
    assert all(torch.isfinite(torch.tensor(losses)))
    effect = (no_l1 - fp32).abs()
    assert effect.min() > 0.8e-2 and effect.max() < 1.2e-2  # the term is there, ~5 * 0.1 * 2e-2
    assert (amp - fp32).abs().max() < 2.5e-3


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_channels_last_steps_match_the_default_layout(device, exact_fp32):
    plain, plain_losses = train_steps(device, steps=3)
    cl, cl_losses = train_steps(device, steps=3, channels_last=True)
    assert plain_losses == pytest.approx(cl_losses, rel=1e-4)
    torch.testing.assert_close(cl, plain, rtol=0, atol=1e-4)


@cuda_only
def test_compiled_steps_match_eager_and_the_model_still_prunes(exact_fp32):
    torch._dynamo.reset()
    eager, eager_losses = train_steps("cuda", steps=3)
    compiled, compiled_losses = train_steps("cuda", steps=3, compile=True)
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-3)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-4)
    model = models.build("vgg", cfg=TINY_VGG).cuda()
    sparsity_shaped(model)
    compiled_cut = slimming.prune(torch.compile(model), percent=0.5)  # unwrapped: the same network
    assert compiled_cut.model.cfg == slimming.prune(model, percent=0.5).model.cfg


@cuda_only
def test_fast_loader_on_cuda_gives_the_cpu_loaders_batches():
    from slimming.data import build_loaders

    on = {d: build_loaders("synthetic", batch_size=100, seed=3, loader="fast", device=d)
          for d in ("cpu", "cuda")}
    for train in (True, False):
        loaders = {d: on[d][0 if train else 1] for d in on}
        for epoch in (0, 1):
            for loader in loaders.values():
                loader.set_epoch(epoch)
            for (xc, yc), (xg, yg) in zip(loaders["cpu"], loaders["cuda"], strict=True):
                assert xg.is_cuda and yg.is_cuda
                assert torch.equal(yg.cpu(), yc)
                torch.testing.assert_close(xg.cpu(), xc, rtol=0, atol=1e-6)  # the same float ops


def _pruned(device: str, compensate: bool):
    torch.manual_seed(0)
    model = models.build("vgg", cfg=TINY_VGG)
    sparsity_shaped(model, seed=0, small=0.5)
    result = slimming.prune(model.to(device), percent=0.5, compensate=compensate)
    assert next(result.model.parameters()).device.type == device  # rebuilt where the model is
    return result, {k: v.cpu() for k, v in result.model.state_dict().items()}


@cuda_only
@pytest.mark.parametrize("compensate", [False, True])
def test_prune_rebuilt_on_cuda_equals_the_cpu_one(compensate, exact_fp32):
    """Without compensation the cut is pure copying: bit-identical. Compensation computes folds
    with convolutions, whose float32 sums CUDA adds in another order: within 1e-5."""
    (cpu, a), (gpu, b) = _pruned("cpu", compensate), _pruned("cuda", compensate)
    assert gpu.cfg == cpu.cfg and all(torch.equal(m.cpu(), n) for m, n in zip(gpu.cfg_mask, cpu.cfg_mask))
    assert gpu.compensation.get("applied") == cpu.compensation.get("applied")
    assert a.keys() == b.keys()
    for k in a:
        if compensate:
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
        else:
            assert torch.equal(b[k], a[k]), k


@cuda_only
def test_prune_on_cuda_with_tf32_stays_close_to_the_cpu_one():
    """As ``slimming prune`` runs on a GPU (TF32 on, PyTorch's default for convolutions):
    compensation turns TF32 off while it computes the folds (``devices.full_precision``), so
    the file agrees with the CPU's as closely as with TF32 off, and TF32 is on again after."""
    assert torch.backends.cudnn.allow_tf32
    (cpu, a), (gpu, b) = _pruned("cpu", True), _pruned("cuda", True)
    assert gpu.cfg == cpu.cfg and torch.backends.cudnn.allow_tf32
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)


@cuda_only
@pytest.mark.parametrize("fmt,name", [("export", "m.pt2"), ("torchscript", "m.ts"), ("onnx", "m.onnx")])
def test_export_on_cuda_reproduces_the_model(fmt, name, tmp_path):
    """``slimming export`` on a GPU machine: the model stays on CUDA, the file is checked
    against it with the default tolerance (ONNX through onnxruntime on the CPU)."""
    from slimming.tools.export import export_model

    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    model = _pruned("cuda", True)[0].model.eval()
    assert export_model(model, tmp_path / name, fmt) <= 1e-4
    x = torch.randn(3, 3, 32, 32, device="cuda")
    if fmt == "export":
        got = torch.export.load(str(tmp_path / name)).module()(x)
    elif fmt == "torchscript":
        got = torch.jit.load(str(tmp_path / name))(x)
    else:
        return
    assert got.is_cuda
    torch.testing.assert_close(got, model(x), rtol=0, atol=1e-4)


def _train(tmp_path, name: str, *flags: str, epochs: int = 1) -> dict:
    save = tmp_path / name
    cmd = [sys.executable, "-m", "slimming", "train", "--arch", "vgg", "--cfg", ",".join(map(str, TINY_VGG)),
           "--dataset", "synthetic", "--epochs", str(epochs), "--batch-size", "64", "--sparsity", "1e-3",
           "--device", "cuda", "--save", str(save), *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads((save / "metrics.jsonl").read_text().splitlines()[-1])
    return {"row": row, "ckpt": slimming.load_checkpoint(save / "last.pth")}


@cuda_only
def test_deterministic_runs_on_cuda_give_identical_weights(tmp_path):
    """``--deterministic --seed 0`` twice, each in a fresh process: bit-identical weights (and no
    operation without a deterministic CUDA kernel on the way, which would be an error)."""
    a, b = (_train(tmp_path, name, "--deterministic", "--seed", "0") for name in ("a", "b"))
    assert a["ckpt"]["state_dict"].keys() == b["ckpt"]["state_dict"].keys()
    for k, v in a["ckpt"]["state_dict"].items():
        assert torch.equal(v, b["ckpt"]["state_dict"][k]), k
    assert a["row"]["test_acc"] == b["row"]["test_acc"]


@cuda_only
def test_float16_amp_from_the_command_line_on_cuda(tmp_path):
    """``--amp`` on CUDA means float16 with a GradScaler: its state is saved, skipped steps are
    counted (a few early on, while the scale falls from 2**16; none once it has settled), and
    the run learns as on the CPU (float32 there: 46% after these three epochs)."""
    run = _train(tmp_path, "amp", "--amp", "--seed", "0", "--channels-last", epochs=3)
    assert run["ckpt"]["args"]["amp"] and run["ckpt"]["scaler"]["scale"] > 0
    assert isinstance(run["row"]["amp_skipped"], int) and run["row"]["amp_skipped"] < 5  # the last epoch
    assert torch.isfinite(torch.tensor(run["row"]["train_loss"])) and run["row"]["test_acc"] > 25
