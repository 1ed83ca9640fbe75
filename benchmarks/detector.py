"""A YOLO-style detector slimmed in a plain training loop: the worked example of slimming a
network that is not a classifier, on a detection task this script generates (coloured squares,
discs and triangles on textured backgrounds, with their boxes).

The detector is written the way YOLOv8 is (C2f blocks that chunk into a Python list, SPPF,
an upsampling and concatenating neck, decoupled box and class heads at two scales that decode
their own outputs in eval mode), small enough for two CPU cores. The loop is yours: sparsity
training with ``slimming.BNSparsity`` (the heads left out), ``slimming.prune`` to a FLOPs
budget with the heads ignored, fine-tuning, and mAP@0.5 (``slimming.measure.detection``),
parameters, FLOPs and CPU latency before and after (the two networks timed in turn, with the
spread: latency at this size moves with the machine's load). The pruned model is saved without its code
(``slimming.save_pruned``) and loaded into a fresh instance (``slimming.load_pruned``).

    python benchmarks/detector.py [--epochs 20] [--finetune-epochs 6] [--target-flops 0.65]
        [--out runs/detector]
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import guarded, out_folder, parser, positive_int
from torch import nn
from torchvision.ops import batched_nms, generalized_box_iou_loss

import slimming
from slimming.measure.detection import mean_average_precision
from slimming.measure.stats import count_flops, count_params

CLASSES = ("square", "disc", "triangle")
SIZE = 64  # pixels; the heads see 8x8 (stride 8) and 4x4 (stride 16) grids
STRIDES = (8, 16)
SMALL = 16  # objects up to this many pixels on their longer side go to the stride-8 head

# ------------------------------------------------------------------------------------- data


def make_shapes(count: int, seed: int, size: int = SIZE) -> tuple[torch.Tensor, list[dict]]:
    """``count`` images (count, 3, size, size) in [0, 1] of 1 to 4 shapes each on a textured
    background, and their targets ({"boxes": (M, 4) x1 y1 x2 y2, "labels": (M,)})."""
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5, indexing="ij")
    images, targets = [], []
    for _ in range(count):
        # background: a colour gradient plus blurred noise
        base = torch.rand(3, 1, 1, generator=g) * 0.6 + 0.2
        tilt = (torch.rand(3, 1, 1, generator=g) - 0.5) * 0.4
        noise = F.avg_pool2d(torch.rand(1, 3, size, size, generator=g), 5, 1, 2)[0]
        img = (base + tilt * (xs / size - 0.5) + (noise - 0.5) * 0.5).clamp(0, 1)
        boxes, labels = [], []
        for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
            side = float(torch.randint(8, 29, (1,), generator=g))
            x1 = float(torch.rand(1, generator=g)) * (size - side)
            y1 = float(torch.rand(1, generator=g)) * (size - side)
            cls = int(torch.randint(0, len(CLASSES), (1,), generator=g))
            cx, cy, r = x1 + side / 2, y1 + side / 2, side / 2
            if cls == 0:
                mask = (xs >= x1) & (xs <= x1 + side) & (ys >= y1) & (ys <= y1 + side)
            elif cls == 1:
                mask = (xs - cx) ** 2 + (ys - cy) ** 2 <= r * r
            else:  # apex up: inside the two edges and above the base
                mask = (ys <= y1 + side) & (ys - y1 >= 2 * (xs - cx).abs())
            colour = torch.rand(3, 1, 1, generator=g)
            img = torch.where(mask, colour, img)
            boxes.append([x1, y1, x1 + side, y1 + side])
            labels.append(cls)
        images.append(img)
        targets.append({"boxes": torch.tensor(boxes), "labels": torch.tensor(labels)})
    return torch.stack(images), targets


# ------------------------------------------------------------------------------------- network


class Conv(nn.Sequential):
    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 1):
        super().__init__(nn.Conv2d(c1, c2, k, s, k // 2, bias=False), nn.BatchNorm2d(c2), nn.SiLU())


class Bottleneck(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.cv1, self.cv2 = Conv(c, c), Conv(c, c)

    def forward(self, x):
        return x + self.cv2(self.cv1(x))


class C2f(nn.Module):
    """YOLOv8's block: one conv, chunked in two; bottlenecks on the last piece, each output
    appended to the list; everything concatenated into a last conv."""

    def __init__(self, c1: int, c2: int, n: int = 1):
        super().__init__()
        self.c = c2 // 2
        self.cv1, self.cv2 = Conv(c1, 2 * self.c, 1), Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 5):
        super().__init__()
        self.cv1, self.cv2 = Conv(c1, c1 // 2, 1), Conv(c1 // 2 * 4, c2, 1)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class Attention(nn.Module):
    """Multi-head self-attention over the positions of a feature map, as YOLOv10/11 write it:
    one conv+BN makes queries, keys and values for every head; a depthwise conv on the values
    adds position; a conv+BN projects back."""

    def __init__(self, c: int, heads: int = 2):
        super().__init__()
        self.heads, self.head_dim = heads, c // heads
        self.key_dim = self.head_dim // 2
        self.scale = self.key_dim ** -0.5
        self.qkv = nn.Sequential(nn.Conv2d(c, c + 2 * self.key_dim * heads, 1, bias=False),
                                 nn.BatchNorm2d(c + 2 * self.key_dim * heads))
        self.proj = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))
        self.pe = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        n, c, h, w = x.shape
        q, k, v = self.qkv(x).view(n, self.heads, 2 * self.key_dim + self.head_dim, h * w).split(
            [self.key_dim, self.key_dim, self.head_dim], dim=2)
        attn = ((q.transpose(-2, -1) @ k) * self.scale).softmax(dim=-1)
        y = (v @ attn.transpose(-2, -1)).view(n, c, h, w) + self.pe(v.reshape(n, c, h, w))
        return self.proj(y)


class C2PSA(nn.Module):
    """YOLO11's C2PSA: half the channels through attention and a feed-forward, each residual."""

    def __init__(self, c: int):
        super().__init__()
        self.c = c // 2
        self.cv1, self.cv2 = Conv(c, 2 * self.c, 1), Conv(2 * self.c, c, 1)
        self.attn, self.ffn = Attention(self.c), nn.Sequential(Conv(self.c, 2 * self.c, 1),
                                                               Conv(2 * self.c, self.c, 1))

    def forward(self, x):
        a, b = self.cv1(x).split((self.c, self.c), dim=1)
        b = b + self.attn(b)
        b = b + self.ffn(b)
        return self.cv2(torch.cat([a, b], 1))


class Detect(nn.Module):
    """Decoupled heads per scale: 4 box distances (left, top, right, bottom, in strides) and
    the class logits. Training: the raw maps; eval: (N, 4 + classes, anchors) with boxes in
    pixels and class probabilities, as YOLOv8's head gives."""

    def __init__(self, chs: tuple[int, ...], nc: int, width: int = 32):
        super().__init__()
        self.nc = nc
        self.box = nn.ModuleList(nn.Sequential(Conv(c, width), Conv(width, width), nn.Conv2d(width, 4, 1))
                                 for c in chs)
        self.cls = nn.ModuleList(nn.Sequential(Conv(c, width), Conv(width, width), nn.Conv2d(width, nc, 1))
                                 for c in chs)

    def forward(self, xs: list[torch.Tensor]):
        maps = [torch.cat([b(x), c(x)], 1) for b, c, x in zip(self.box, self.cls, xs)]
        if self.training:
            return maps
        out = []
        for m, stride in zip(maps, STRIDES):
            n, _, h, w = m.shape
            ys, xs_ = torch.meshgrid(torch.arange(h, device=m.device), torch.arange(w, device=m.device),
                                     indexing="ij")
            centre = torch.stack([xs_, ys]).flatten(1).to(m.dtype).add(0.5).mul(stride)  # (2, h*w)
            ltrb = F.softplus(m[:, :4].flatten(2)) * stride
            boxes = torch.cat([centre - ltrb[:, :2], centre + ltrb[:, 2:]], 1)
            out.append(torch.cat([boxes, m[:, 4:].flatten(2).sigmoid()], 1))
        return torch.cat(out, 2)


class TinyYOLO(nn.Module):
    """Backbone (C2f stages, SPPF, with ``attention`` YOLO11's C2PSA), a PAN neck (upsample +
    concatenate, downsample + concatenate), heads at strides 8 and 16."""

    def __init__(self, nc: int = len(CLASSES), attention: bool = False):
        super().__init__()
        self.backbone = nn.ModuleDict({
            "stem": Conv(3, 16, 3, 2), "down1": Conv(16, 32, 3, 2), "c2f1": C2f(32, 32),
            "down2": Conv(32, 64, 3, 2), "c2f2": C2f(64, 64, 2), "down3": Conv(64, 128, 3, 2),
            "c2f3": C2f(128, 128), "sppf": SPPF(128, 128)})
        if attention:  # YOLO11's: C2PSA after SPPF
            self.backbone["psa"] = C2PSA(128)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.neck3, self.down, self.neck4 = C2f(192, 64), Conv(64, 64, 3, 2), C2f(192, 128)
        self.head = Detect((64, 128), nc)
        self.input_size = (3, SIZE, SIZE)

    def forward(self, x):
        b = self.backbone
        p3 = b["c2f2"](b["down2"](b["c2f1"](b["down1"](b["stem"](x)))))
        p4 = b["sppf"](b["c2f3"](b["down3"](p3)))
        if "psa" in b:
            p4 = b["psa"](p4)
        n3 = self.neck3(torch.cat([self.up(p4), p3], 1))
        n4 = self.neck4(torch.cat([self.down(n3), p4], 1))
        return self.head([n3, n4])


# ------------------------------------------------------------------------------------- loss


def assign(targets: list[dict], shapes: list[tuple[int, int]]):
    """Per scale: class targets (N, nc, h, w), and the positive cells with their boxes. An
    object goes to the scale its size suits, on the cells around its centre that lie in it."""
    n = len(targets)
    cls = [torch.zeros(n, len(CLASSES), h, w) for h, w in shapes]
    pos = [([], [], [], []) for _ in shapes]  # image, row, col, box
    for i, t in enumerate(targets):
        order = (t["boxes"][:, 2:] - t["boxes"][:, :2]).prod(1).argsort(descending=True)
        for j in order.tolist():  # large first: a smaller object takes a shared cell
            box, label = t["boxes"][j], int(t["labels"][j])
            level = 0 if float((box[2:] - box[:2]).max()) <= SMALL else 1
            stride, (h, w) = STRIDES[level], shapes[level]
            cx, cy = float(box[0] + box[2]) / 2 / stride, float(box[1] + box[3]) / 2 / stride
            for r in range(max(0, int(cy) - 1), min(h, int(cy) + 2)):
                for c in range(max(0, int(cx) - 1), min(w, int(cx) + 2)):
                    x, y = (c + 0.5) * stride, (r + 0.5) * stride
                    inside = box[0] < x < box[2] and box[1] < y < box[3]
                    if inside or (r, c) == (int(cy), int(cx)):
                        cls[level][i, :, r, c] = 0
                        cls[level][i, label, r, c] = 1
                        for lst, v in zip(pos[level], (i, r, c, box)):
                            lst.append(v)
    return cls, pos


def detection_loss(maps: list[torch.Tensor], targets: list[dict]) -> torch.Tensor:
    """Class BCE over every cell (per positive), plus GIoU and L1 of the positive cells' boxes."""
    cls_t, pos = assign(targets, [tuple(m.shape[2:]) for m in maps])
    count = max(1, sum(len(p[0]) for p in pos))
    loss_cls = sum(F.binary_cross_entropy_with_logits(m[:, 4:], t.to(m), reduction="sum")
                   for m, t in zip(maps, cls_t)) / count
    loss_box = maps[0].new_zeros(())
    for m, (img, row, col, boxes), stride in zip(maps, pos, STRIDES):
        if not img:
            continue
        raw = m[torch.tensor(img), :4, torch.tensor(row), torch.tensor(col)]
        centre = torch.stack([torch.tensor(col), torch.tensor(row)], 1).to(m).add(0.5).mul(stride)
        ltrb = F.softplus(raw) * stride
        pred = torch.cat([centre - ltrb[:, :2], centre + ltrb[:, 2:]], 1)
        true = torch.stack(boxes).to(m)
        loss_box = loss_box + generalized_box_iou_loss(pred, true, reduction="sum") \
            + F.l1_loss(pred / stride, true / stride, reduction="sum") * 0.1
    return loss_cls + 2 * loss_box / count


def decode(out: torch.Tensor, conf: float = 0.05, iou: float = 0.6, top: int = 100) -> list[dict]:
    """Eval outputs (N, 4 + nc, anchors) to per-image detections after class-wise NMS."""
    found = []
    for o in out:
        boxes, probs = o[:4].T, o[4:].T
        scores, labels = probs.max(1)
        keep = scores > conf
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        keep = batched_nms(boxes, scores, labels, iou)[:top]
        found.append({"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]})
    return found


# ------------------------------------------------------------------------------------- the loop


def fit(model: nn.Module, images, targets, epochs: int, lr: float, sparsity=None, batch: int = 32,
        seed: int = 0, label: str = "train") -> None:
    """Your training loop: AdamW with a cosine schedule; ``sparsity.apply()`` between the
    backward pass and the step (after ``scaler.unscale_`` when you use AMP). One line per epoch."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=5e-4)
    steps = epochs * math.ceil(len(images) / batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    model.train()
    start = time.perf_counter()
    for epoch in range(epochs):
        order = torch.randperm(len(images), generator=g)
        total, count = 0.0, 0
        for k in range(0, len(images), batch):
            idx = order[k:k + batch]
            flip = torch.rand(1, generator=g) < 0.5  # horizontal flip, boxes too
            x, t = images[idx], [targets[i] for i in idx.tolist()]
            if flip:
                x = x.flip(3)
                t = [{"boxes": torch.stack([SIZE - b[:, 2], b[:, 1], SIZE - b[:, 0], b[:, 3]], 1),
                      "labels": tt["labels"]} for tt in t for b in [tt["boxes"]]]
            loss = detection_loss(model(x), t)
            optimizer.zero_grad()
            loss.backward()
            if sparsity is not None:
                sparsity.apply()
            optimizer.step()
            schedule.step()
            total, count = total + loss.item() * len(idx), count + len(idx)
        print(f"  {label} epoch {epoch + 1}/{epochs}: loss {total / count:.3f}"
              + (f", |gamma|<1e-2 {sparsity.fraction_below(1e-2):.0%}" if sparsity is not None else "")
              + f"  {time.perf_counter() - start:.0f} s", flush=True)


@torch.no_grad()
def evaluate(model: nn.Module, images, targets) -> float:
    model.eval()
    found = [d for k in range(0, len(images), 100) for d in decode(model(images[k:k + 100]))]
    return mean_average_precision(found, targets, 0.5)


def costs(model: nn.Module) -> dict:
    """Parameters and FLOPs of one image."""
    return {"params": count_params(model), "flops": count_flops(model, (3, SIZE, SIZE))}


@torch.inference_mode()
def interleaved_ms(models: dict[str, nn.Module], batch: int, repeats: int = 40) -> dict:
    """CPU milliseconds of each model at ``batch``, measured in turn (one run of each, then the
    next round), so that a busy moment of the machine costs them alike: median, 10th and 90th
    percentiles."""
    x = torch.randn(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {name: [] for name in models}
    for m in models.values():
        m.eval()
        for _ in range(3):
            m(x)
    for _ in range(repeats):
        for name, m in models.items():
            t = time.perf_counter()
            m(x)
            times[name].append(1000 * (time.perf_counter() - t))
    return {name: {"median": statistics.median(t), "p10": statistics.quantiles(t, n=10)[0],
                   "p90": statistics.quantiles(t, n=10)[-1]} for name, t in times.items()}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--epochs", type=positive_int, default=20)
    ap.add_argument("--finetune-epochs", type=positive_int, default=6)
    ap.add_argument("--target-flops", type=float, default=0.65)
    ap.add_argument("--sparsity", type=float, default=5e-3)
    ap.add_argument("--train-images", type=positive_int, default=2000)
    ap.add_argument("--out", type=out_folder, default=Path("runs/detector"))
    args = ap.parse_args()
    if not 0 < args.target_flops < 1:
        ap.error("--target-flops must be a fraction in (0, 1)")
    torch.manual_seed(0)
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(2)  # the figures in RESULTS.md: 2 threads; OMP_NUM_THREADS wins
    t0 = time.perf_counter()
    train_x, train_t = make_shapes(args.train_images, seed=1)
    test_x, test_t = make_shapes(500, seed=2)
    model = TinyYOLO()
    sparsity = slimming.BNSparsity(model, strength=args.sparsity, ignore="head")
    fit(model, train_x, train_t, args.epochs, 3e-3, sparsity, label="sparsity training")
    trained = {"map50": evaluate(model, test_x, test_t), **costs(model),
               "gamma_below_1e-2": sparsity.fraction_below(1e-2)}
    print(f"sparsity-trained: mAP@0.5 {trained['map50']:.3f}, {trained['params'] / 1e6:.3f}M params, "
          f"{trained['flops'] / 1e6:.1f}M FLOPs", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    slimming.save_pruned(model, args.out / "trained.pth")  # any instance saves: unpruned too
    start = time.perf_counter()
    result = slimming.prune(model, target_flops=args.target_flops, ignore="head")
    prune_s = time.perf_counter() - start
    small = result.model
    pruned = {"map50": evaluate(small, test_x, test_t), **costs(small), "prune_s": prune_s,
              "channels_cut": result.budget.percent, "compensation": result.compensation}
    print(f"pruned to {args.target_flops:.0%} of the FLOPs in {prune_s:.2f} s: mAP@0.5 "
          f"{pruned['map50']:.3f}, {pruned['params'] / 1e6:.3f}M params, {pruned['flops'] / 1e6:.1f}M FLOPs",
          flush=True)
    fit(small, train_x, train_t, args.finetune_epochs, 1e-3, seed=1, label="fine-tuning")
    finetuned = {"map50": evaluate(small, test_x, test_t), **costs(small)}
    print(f"fine-tuned: mAP@0.5 {finetuned['map50']:.3f}", flush=True)
    latency = {batch: interleaved_ms({"unpruned": model, "pruned": small}, batch) for batch in (1, 32)}
    for batch, got in latency.items():
        a, b = got["unpruned"], got["pruned"]
        print(f"CPU ms at batch {batch}, interleaved, median [10th-90th percentile] of 40: unpruned "
              f"{a['median']:.2f} [{a['p10']:.2f}-{a['p90']:.2f}], pruned {b['median']:.2f} "
              f"[{b['p10']:.2f}-{b['p90']:.2f}]", flush=True)
    slimming.save_pruned(small, args.out / "pruned.pth")
    again = slimming.load_pruned(args.out / "pruned.pth", TinyYOLO())
    assert abs(evaluate(again, test_x, test_t) - finetuned["map50"]) < 1e-9
    report = {"trained": trained, "pruned": pruned, "finetuned": finetuned, "latency_ms": latency,
              "args": {k: str(v) for k, v in vars(args).items()}, "seconds": time.perf_counter() - t0}
    (args.out / "detector.json").write_text(json.dumps(report, indent=2))
    print(f"total {report['seconds']:.0f} s; {args.out / 'detector.json'}")


if __name__ == "__main__":
    raise SystemExit(guarded(main))
