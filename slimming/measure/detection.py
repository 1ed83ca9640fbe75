"""How well a detector finds objects: average precision at an IoU threshold (mAP@0.5 by
default), for judging a detector before and after slimming.

Inputs follow torchvision's detection convention: one dict per image, predictions
``{"boxes": (K, 4), "scores": (K,), "labels": (K,)}`` and targets ``{"boxes": (M, 4),
"labels": (M,)}``, boxes as (x1, y1, x2, y2) in pixels (an image with no box may give an empty
tensor of shape (0,) as well). Per class, detections of all images are ranked by score; each is a
true positive when it overlaps an unmatched ground-truth box of its class by at least the
threshold (the best such box is taken, as COCO does), else a false positive (a second detection
of a found object counts against). The class's AP comes from its precision-recall curve with
precision made non-increasing (each point takes the best precision at that recall or higher):
by default (``interpolation="all"``) it is the area under that curve at every recall step, the
all-point interpolation of Pascal VOC since 2010; ``interpolation="coco"`` averages it instead
at the 101 recall points 0, 0.01, ..., 1 (0 at a point no detection's recall reaches), as
COCO's evaluation does, so that figures compare with COCO-style tools at the same IoU threshold
(the two differ by at most 0.01). mAP is the mean over the classes that have ground truth.
Bad input (a missing key, boxes not (N, 4), lengths that disagree, NaN or inf, a threshold
outside (0, 1]) raises ``SlimmingError`` naming the parameter.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import SlimmingError, clip, number

INTERPOLATIONS = ("all", "coco")


def _real_tensor(value, where: str, param: str) -> torch.Tensor:
    """``value`` if it is a tensor of real numbers (not bool, not complex) with no NaN or inf."""
    if not isinstance(value, torch.Tensor):
        raise SlimmingError(f"{where} must be a torch.Tensor, got {type(value).__name__}", param=param)
    if value.dtype == torch.bool or value.is_complex():
        raise SlimmingError(f"{where} must hold real numbers, got dtype {value.dtype}", param=param)
    if value.is_meta:
        raise SlimmingError(f"{where} is on the meta device: it holds no values", param=param)
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise SlimmingError(f"{where} holds NaN or inf", param=param)
    return value


def _boxes(value, where: str, param: str, *, empty_1d: bool = False) -> torch.Tensor:
    """``value`` as (N, 4) boxes; with ``empty_1d`` an empty tensor of shape (0,) is no box."""
    value = _real_tensor(value, where, param)
    if empty_1d and value.shape == (0,):
        return value.reshape(0, 4)
    if value.dim() != 2 or value.shape[1] != 4:
        raise SlimmingError(f"{where} must have shape (N, 4) as (x1, y1, x2, y2), "
                            f"got {tuple(value.shape)}", param=param)
    return value


def _images(value, param: str, keys: tuple[str, ...]) -> list[dict]:
    """The list of per-image dicts ``value`` checked: each has ``keys``, boxes (N, 4), scores and
    labels of length N; returned with boxes as (N, 4) and every tensor detached on the CPU."""
    if not isinstance(value, (list, tuple)):
        raise SlimmingError(f"{param} must be a list of dicts (one per image), got {type(value).__name__}",
                            param=param)
    out = []
    for i, image in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(image, Mapping):
            raise SlimmingError(f"{where} must be a dict with keys {', '.join(map(repr, keys))}, "
                                f"got {type(image).__name__}", param=param)
        for key in keys:
            if key not in image:
                raise SlimmingError(f"{where} has no {key!r} (needs {', '.join(map(repr, keys))})",
                                    param=param)
        boxes = _boxes(image["boxes"], f"{where}['boxes']", param, empty_1d=True)
        checked = {"boxes": boxes.detach().cpu()}
        for key in keys[1:]:
            t = _real_tensor(image[key], f"{where}[{key!r}]", param)
            if t.dim() != 1 or len(t) != len(boxes):
                raise SlimmingError(f"{where}[{key!r}] must have shape ({len(boxes)},), one per box, "
                                    f"got {tuple(t.shape)}", param=param)
            if key == "labels":
                if t.is_floating_point() and not bool((t == t.round()).all()):
                    raise SlimmingError(f"{where}['labels'] must be whole numbers (class indices)",
                                        param=param)
                if bool((t < 0).any()):  # an int8 -1 once counted as class 255
                    raise SlimmingError(f"{where}['labels'] holds a negative class index", param=param)
                t = t.to(torch.int64)
            checked[key] = t.detach().cpu()
        out.append(checked)
    return out


def _iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """In float64: boxes at 1e30 square to 1e60, past float32's range (identical boxes scored 0)."""
    a, b = a.double(), b.double()
    area_a = (a[:, 2] - a[:, 0]).clamp_min(0) * (a[:, 3] - a[:, 1]).clamp_min(0)
    area_b = (b[:, 2] - b[:, 0]).clamp_min(0) * (b[:, 3] - b[:, 1]).clamp_min(0)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp_min(0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp_min(1e-12)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(K, M) IoU of boxes ``a`` (K, 4) and ``b`` (M, 4), (x1, y1, x2, y2)."""
    a, b = _boxes(a, "a", "a"), _boxes(b, "b", "b")
    dtype = torch.promote_types(a.dtype, b.dtype) if a.is_floating_point() or b.is_floating_point() \
        else torch.float32
    return _iou(a, b).to(dtype)


def _check(preds, targets, iou_threshold, interpolation) -> tuple[list[dict], list[dict]]:
    number(iou_threshold, "iou_threshold", low=0, low_ok=False, high=1, high_ok=True)
    if not isinstance(interpolation, str) or interpolation not in INTERPOLATIONS:
        raise SlimmingError(f"interpolation must be 'all' (Pascal VOC 2010+, every recall step) or 'coco' "
                            f"(101 recall points), got {clip(repr(interpolation))}", param="interpolation")
    preds = _images(preds, "preds", ("boxes", "scores", "labels"))
    targets = _images(targets, "targets", ("boxes", "labels"))
    if len(preds) != len(targets):
        raise SlimmingError(f"preds has {len(preds)} images but targets has {len(targets)}: "
                            "give one dict per image in both, in the same order", param="preds")
    return preds, targets


def average_precisions(preds: list[dict], targets: list[dict], iou_threshold: float = 0.5,
                       interpolation: str = "all") -> dict[int, float]:
    """{class: AP} for every class with at least one ground-truth box; ``interpolation`` "all"
    (every recall step, Pascal VOC 2010+) or "coco" (101 recall points), see the module's text."""
    preds, targets = _check(preds, targets, iou_threshold, interpolation)
    gt = _by_class(targets, ("boxes",))
    found = _by_class(preds, ("boxes", "scores"))
    out = {}
    for c in sorted(gt):
        boxes, images = gt[c]["boxes"], gt[c]["image"]
        gts = {int(i): boxes[images == i] for i in images.unique()}  # this class's boxes per image
        total = len(boxes)
        hits = []
        if c in found:  # by score, highest first; stable: ties keep image order
            order = torch.sort(found[c]["scores"].double(), descending=True, stable=True).indices
            matched = {i: torch.zeros(len(g), dtype=torch.bool) for i, g in gts.items()}
            for box, i in zip(found[c]["boxes"][order], found[c]["image"][order].tolist()):
                hit = False
                if i in gts:
                    iou = _iou(box[None], gts[i])[0]
                    iou[matched[i]] = -1
                    best = int(iou.argmax())
                    if iou[best] >= iou_threshold:
                        matched[i][best] = hit = True
                hits.append(hit)
        if not hits:
            out[c] = 0.0
            continue
        tp = torch.tensor(hits, dtype=torch.float64).cumsum(0)
        recall = tp / total
        precision = tp / torch.arange(1, len(hits) + 1, dtype=torch.float64)
        # precision made non-increasing: each point takes the best precision at its recall or higher
        envelope = precision.flip(0).cummax(0).values.flip(0)
        if interpolation == "all":  # summed over the recall steps
            steps = torch.diff(recall, prepend=torch.zeros(1, dtype=torch.float64))
            out[c] = float((envelope * steps).sum())
        else:  # at recall r = k / 100: the first point reaching r (the best there), 0 if none does
            points = torch.arange(101, dtype=torch.float64) / 100
            first = torch.searchsorted(recall, points)  # recall is non-decreasing; len(recall): none
            padded = torch.cat([envelope, torch.zeros(1, dtype=torch.float64)])
            out[c] = float(padded[first].sum() / 101)
    return out


def _by_class(images: list[dict], keys: tuple[str, ...]) -> dict[int, dict[str, torch.Tensor]]:
    """{class: {key: its rows of every image, in image order, "image": which image}}: one sort,
    not a pass over every image per class (20,000 classes took minutes)."""
    labels = torch.cat([d["labels"] for d in images]) if images else torch.zeros(0, dtype=torch.int64)
    if not len(labels):
        return {}
    image = torch.cat([torch.full((len(d["labels"]),), i, dtype=torch.int64) for i, d in enumerate(images)])
    rows = {k: torch.cat([d[k] for d in images]) for k in keys}
    order = torch.sort(labels, stable=True).indices  # stable: image order within a class
    classes, counts = torch.unique_consecutive(labels[order], return_counts=True)
    out, start = {}, 0
    for c, n in zip(classes.tolist(), counts.tolist()):
        take = order[start:start + n]
        out[c] = {"image": image[take], **{k: v[take] for k, v in rows.items()}}
        start += n
    return out


def mean_average_precision(preds: list[dict], targets: list[dict], iou_threshold: float = 0.5,
                           interpolation: str = "all") -> float:
    """mAP@``iou_threshold``: the mean of ``average_precisions`` (0 when no image has a box);
    ``interpolation`` "all" (Pascal VOC 2010+, the default) or "coco" (COCO's 101 points)."""
    aps = average_precisions(preds, targets, iou_threshold, interpolation)
    return sum(aps.values()) / len(aps) if aps else 0.0
