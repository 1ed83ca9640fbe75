import re
from pathlib import Path

from setuptools import find_packages, setup

PLOT = ["matplotlib>=3.5"]
ONNX = ["onnx>=1.15", "onnxscript>=0.1", "onnxruntime>=1.17"]
TIMM = ["timm>=1.0.8"]  # 1.0.8: the first with the test_* models the tests build
SMP = ["segmentation-models-pytorch>=0.3.3"]  # decoders others wrote, for the trace's tests (MIT)
# diffusion UNets and 3-D medical networks others wrote, for the trace's tests (Apache-2.0)
NETS = ["diffusers>=0.30", "monai>=1.3", "einops>=0.6"]  # einops: MONAI's SwinUNETR (MIT)
# the trainers slimming.integrations hooks into, for its tests (Apache-2.0); never Ultralytics (AGPL)
TRAINERS = ["transformers>=4.46", "accelerate>=1.1", "lightning>=2.0"]

setup(
    name="slimming",
    version=re.search(r'__version__ = "(.+)"', Path("slimming/version.py").read_text()).group(1),
    description="Network slimming for PyTorch: L1-sparse BatchNorm training, channel pruning, "
                "fine-tuning (Liu et al., ICCV 2017)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # the network families live in the top-level models/ folder and install as slimming.models:
    # never a top-level "models" package, which would clash with the models/ folder of the
    # paper's repository and of YOLOv5 checkouts
    packages=[*find_packages(include=["slimming", "slimming.*"]), "slimming.models"],
    package_dir={"slimming.models": "models"},
    python_requires=">=3.10",
    install_requires=[
        # >= 2.10: older releases have code-execution holes in the weights_only loader
        # (CVE-2025-32434 below 2.6, CVE-2026-24747 below 2.10); safe loading is a promise here.
        "torch>=2.10,<3",
        "torchvision>=0.25",
        "numpy>=1.24",
        "tqdm>=4.60",
        "pyyaml>=6.0.1",  # the first release with wheels for Python 3.11
    ],
    extras_require={
        "plot": PLOT,
        "onnx": ONNX,
        "timm": TIMM,  # timm models: --arch timm:NAME
        # the tests execute the notebook and check every export format
        "dev": ["pytest>=7", "pytest-xdist>=3.0.2", "ruff>=0.4", "nbclient>=0.7", "nbformat>=5",
                "ipykernel>=6", *PLOT, *ONNX, *TIMM, *SMP, *NETS, *TRAINERS],
    },
    entry_points={"console_scripts": ["slimming=slimming.cli:main"]},
)
