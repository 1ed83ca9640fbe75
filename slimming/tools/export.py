"""Export a (pruned) network: TorchScript, ONNX, or a ``torch.export`` program (the path
PyTorch now recommends over TorchScript). Every export is loaded back and checked against the
PyTorch model on a random batch; the file is kept only when they agree."""

from __future__ import annotations

import copy
import io
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import ExportError, first_line
from ..layers.gates import fold, gated_layers
from ..measure.stats import DEFAULT_INPUT_SIZE
from ..utils.devices import full_precision
from ..utils.files import atomic_path

FORMATS = ("export", "torchscript", "onnx")


def _written(save, path: Path) -> None:
    """``save(buffer)`` into memory, then the bytes to ``path`` by Python: torch's archive writer
    aborts the process (C++ ``terminate``, exit 134) when the disk fills under it, where Python's
    write raises an OSError that names the file."""
    buf = io.BytesIO()
    save(buf)
    path.write_bytes(buf.getbuffer())


def _run_torchscript(model, x, path):
    with warnings.catch_warnings():  # TorchScript is deprecated in favour of torch.export
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(model)
        _written(lambda f: torch.jit.save(scripted, f), path)
        return torch.jit.load(path)(x)


def _run_export(model, x, path):
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    _written(lambda f: torch.export.save(program, f), path)
    return torch.export.load(path).module()(x)


def _run_onnx(model, x, path):
    try:
        import onnxruntime
    except ImportError:
        raise ExportError("ONNX export needs the onnx extra: pip install -e \".[onnx]\" "
                          "(onnx, onnxscript, onnxruntime)") from None
    torch.onnx.export(model, (x,), path, input_names=["input"], output_names=["logits"],
                      dynamic_shapes=({0: torch.export.Dim("batch", min=1)},), dynamo=True,
                      external_data=False,  # one self-contained file (fine below 2 GB)
                      verbose=False)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {"input": x.cpu().numpy()})[0])


RUNNERS = {"torchscript": _run_torchscript, "export": _run_export, "onnx": _run_onnx}


@torch.no_grad()
def export_model(model: nn.Module, out: str | os.PathLike, fmt: str = "export",
                 input_size: tuple[int, ...] = DEFAULT_INPUT_SIZE, batch_size: int = 4,
                 atol: float = 1e-4) -> float:
    """Write ``model`` (eval mode, on its own device) to ``out`` in format ``fmt`` and return
    the largest absolute difference between the exported model's and PyTorch's outputs on a
    random batch (N, *input_size). Raises ExportError, leaving no file, when it is not within
    ``atol``. (ONNX is checked with onnxruntime's CPU provider.)"""
    if fmt not in RUNNERS:
        raise ExportError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    model = model.eval()
    out = Path(out)
    if fmt == "export" and out.suffix != ".pt2":
        raise ExportError(f"{out}: a torch.export program is a .pt2 file; name it e.g. model.pt2")
    if gated_layers(model) or gated_layers(model, heads=True):  # an unpruned gated network: its
        model = copy.deepcopy(model)  # gates folded into the layers they feed (the same outputs;
        fold(model)  # TorchScript cannot script the hooks that apply them)
    x = torch.randn(batch_size, *input_size, device=next(model.parameters()).device)
    with atomic_path(out) as tmp, full_precision():  # TF32 on CUDA would miss onnxruntime's CPU by 1e-3
        expected = model(x)
        try:
            got = RUNNERS[fmt](model, x, tmp)
        except (ExportError, OSError):  # an OSError: the disk, named by atomic_path
            raise
        except Exception as e:  # the exporters raise many kinds; all mean "could not export"
            raise ExportError(f"{fmt} export failed: {first_line(e)}") from None
        diff = (got.float().to(expected.device) - expected).abs().max().item()
        if not diff <= atol:
            raise ExportError(f"{fmt} export does not reproduce the model: largest difference "
                              f"{diff:.3g} > tolerance {atol:g}")
    return diff
