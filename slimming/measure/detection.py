"""How well a detector finds objects: average precision at an IoU threshold (mAP@0.5 by
default), for judging a detector before and after slimming.

Inputs follow torchvision's detection convention: one dict per image, predictions
``{"boxes": (K, 4), "scores": (K,), "labels": (K,)}`` and targets ``{"boxes": (M, 4),
"labels": (M,)}``, boxes as (x1, y1, x2, y2) in pixels. Per class, detections of all images
are ranked by score; each is a true positive when it overlaps an unmatched ground-truth box of
its class by at least the threshold (the best such box is taken, as COCO does), else a false
positive (a second detection of a found object counts against). The class's AP is the area
under its precision-recall curve with precision made non-increasing (all points, as VOC since
2010 and COCO do); mAP is the mean over the classes that have ground truth.
"""

from __future__ import annotations

import torch


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(K, M) IoU of boxes ``a`` (K, 4) and ``b`` (M, 4), (x1, y1, x2, y2)."""
    area_a = (a[:, 2] - a[:, 0]).clamp_min(0) * (a[:, 3] - a[:, 1]).clamp_min(0)
    area_b = (b[:, 2] - b[:, 0]).clamp_min(0) * (b[:, 3] - b[:, 1]).clamp_min(0)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp_min(0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp_min(1e-12)


def average_precisions(preds: list[dict], targets: list[dict],
                       iou_threshold: float = 0.5) -> dict[int, float]:
    """{class: AP} for every class with at least one ground-truth box."""
    if len(preds) != len(targets):
        raise ValueError(f"{len(preds)} predictions for {len(targets)} images")
    classes = sorted({int(c) for t in targets for c in t["labels"].tolist()})
    out = {}
    for c in classes:
        gts = [t["boxes"][t["labels"] == c].float() for t in targets]
        total = sum(len(g) for g in gts)
        found = []  # (score, image, box)
        for i, p in enumerate(preds):
            keep = p["labels"] == c
            found += [(float(s), i, b) for s, b in zip(p["scores"][keep], p["boxes"][keep].float())]
        found.sort(key=lambda f: -f[0])  # stable: ties keep image order
        matched = [torch.zeros(len(g), dtype=torch.bool) for g in gts]
        hits = []
        for _, i, box in found:
            hit = False
            if len(gts[i]):
                iou = box_iou(box[None], gts[i])[0]
                iou[matched[i]] = -1
                best = int(iou.argmax())
                if iou[best] >= iou_threshold:
                    matched[i][best] = hit = True
            hits.append(hit)
        tp = torch.tensor(hits, dtype=torch.float64).cumsum(0)
        recall = tp / total
        precision = tp / torch.arange(1, len(hits) + 1, dtype=torch.float64)
        # precision made non-increasing, then summed over the recall steps
        envelope = precision.flip(0).cummax(0).values.flip(0)
        steps = torch.diff(recall, prepend=torch.zeros(1, dtype=torch.float64))
        out[c] = float((envelope * steps).sum()) if hits else 0.0
    return out


def mean_average_precision(preds: list[dict], targets: list[dict], iou_threshold: float = 0.5) -> float:
    """mAP@``iou_threshold``: the mean of ``average_precisions`` (0 when no image has a box)."""
    aps = average_precisions(preds, targets, iou_threshold)
    return sum(aps.values()) / len(aps) if aps else 0.0
