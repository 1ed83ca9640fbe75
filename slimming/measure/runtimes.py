"""The runtimes a latency is measured in: the network as users deploy it.

``prepared(model, inputs, runtime)`` gives a function of no arguments that runs one forward of
``model`` on ``inputs`` in that runtime: ``"eager"`` (PyTorch as is, under inference mode),
``"export"`` (the program ``torch.export`` makes of it, run as a module) or ``"onnxruntime"``
(exported to ONNX in memory and run by an onnxruntime session on the CPU, with as many
threads as torch uses; the ``[onnx]`` extra). A budget asked for onnxruntime is met in
onnxruntime: its fused kernels leave a layer less fixed cost than eager does, so the same cut
can run at another fraction of the original there.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable

import torch
from torch import nn

from ..errors import SlimmingError, first_line

RUNTIMES = ("eager", "export", "onnxruntime")


def check_runtime(runtime: str, device: torch.device) -> None:
    """SlimmingError, in one line, for a runtime slimming cannot time here."""
    if runtime not in RUNTIMES:
        raise SlimmingError(f"unknown latency runtime {runtime!r}; choose one of: {', '.join(RUNTIMES)}",
                            param="runtime")
    if runtime == "onnxruntime":
        if device.type != "cpu":
            raise SlimmingError("the onnxruntime latency is timed on the CPU: put the model on the CPU "
                                "(--cpu) or time it in eager", param="runtime")
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise SlimmingError("timing in onnxruntime needs the onnx extra: pip install \"slimming[onnx]\" "
                                "(onnx, onnxscript, onnxruntime)", param="runtime") from None


def version(runtime: str) -> str:
    """The runtime's version, as a latency table's context records it."""
    if runtime == "onnxruntime":
        import onnxruntime

        return f"onnxruntime {onnxruntime.__version__}"
    return runtime


def prepared(model: nn.Module, inputs: tuple, runtime: str = "eager") -> Callable[[], object]:
    """One forward of ``model`` (in eval mode, the caller's to keep) on ``inputs`` in
    ``runtime``, as a function of no arguments. SlimmingError where the model does not export."""
    if runtime == "eager":
        def run():
            with torch.inference_mode():
                return model(*inputs)
        return run
    try:
        if runtime == "export":
            program = torch.export.export(model, tuple(inputs)).module()

            def run():
                with torch.inference_mode():
                    return program(*inputs)
            return run
        return _onnx_session(model, inputs)
    except SlimmingError:
        raise
    except Exception as e:  # noqa: BLE001 (the exporters raise many kinds; all mean "does not export")
        raise SlimmingError(f"the network cannot be timed in {runtime}: it does not export "
                            f"({first_line(e, 160)}); time it in eager", param="runtime") from None


def _onnx_session(model: nn.Module, inputs: tuple) -> Callable[[], object]:
    import onnxruntime as ort

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporters' deprecation and tracer notes
        buf = io.BytesIO()
        try:  # the TorchScript-based exporter: 10 ms a layer, where dynamo's takes seconds
            torch.onnx.export(model, tuple(inputs), buf, dynamo=False)
            data = buf.getvalue()
        except Exception:  # noqa: BLE001 (a network only the dynamo exporter takes)
            data = torch.onnx.export(model, tuple(inputs), dynamo=True, verbose=False).model_proto
            data = data.SerializeToString()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = torch.get_num_threads(), 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feed = {n: t.detach().cpu().numpy() for n, t in zip(names, inputs)}
    return lambda: session.run(None, feed)
