"""Data: datasets (CIFAR-10/100, an image folder of any sizes, image packs, a synthetic task),
the training and evaluation recipes, and the two loaders that serve them. A data source is one
record in ``datasets.SOURCES``.

Modules, each importing only those before it: ``recipes`` (constants, per-image pipelines,
``DataInfo``) <- ``images`` (reading one file safely) <- ``loaders`` (``TensorLoader``,
``EpochDataLoader``) and ``imagefolder`` (listing a folder, its caches, measuring) <- ``packed``
(image packs) <- ``datasets`` (the sources, choosing the image size and loader, the entry
points re-exported here).

Which parts it may import: ``docs/layout.md``. torchvision is imported only when called.
"""

from ..errors import DataError
from .datasets import (
    DATASETS,
    LOADERS,
    NORMS,
    TensorImages,
    build_datasets,
    build_loaders,
    decode_imagefolder,
    fast_loader_limit,
    load_images,
    synthetic_images,
)
from .loaders import TensorLoader
from .recipes import IMAGENET_STATS, STATS, DataInfo

__all__ = ["DATASETS", "IMAGENET_STATS", "LOADERS", "NORMS", "STATS", "DataError", "DataInfo",
           "TensorImages", "TensorLoader", "build_datasets", "build_loaders", "decode_imagefolder",
           "fast_loader_limit", "load_images", "synthetic_images"]
