"""Pack an image folder of JPEGs into one file that travels (``slimming.data.packed``):

    python benchmarks/pack_images.py ../shared/data/cifar10-jpeg gpu-data/cifar10.pack

then ``--dataset imagefolder --data-root gpu-data/cifar10.pack`` anywhere a folder is taken
(the fast loader decodes it once, with nvJPEG on CUDA). Prints the number of images, the
pack's bytes and the seconds it took. A bad file is one line and exit code 2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slimming.cli.parser import Parser  # noqa: E402
from slimming.data.packed import pack_folder  # noqa: E402
from slimming.errors import SlimmingError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="train/<class>/*.jpg and test/<class>/*.jpg (or val/)")
    p.add_argument("out", type=Path, help="the pack to write (atomically)")
    args = p.parse_args(argv)
    if args.out.is_dir():
        p.error(f"{args.out} is a folder: give the path of the pack file to write")
    start = time.perf_counter()
    try:
        done = pack_folder(args.folder, args.out)
    except SlimmingError as e:
        print(f"pack_images: {e}", file=sys.stderr)
        return 2
    print(f"{done['images']:,} images ({done['train']:,} train, {done['test']:,} test, "
          f"{len(done['classes'])} classes, {done['width']}x{done['height']}) in {done['path']}: "
          f"{done['bytes']:,} bytes, {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
