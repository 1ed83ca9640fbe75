"""mAP@0.5 (slimming.measure.detection): hand-checked cases and properties; and the worked
YOLO-style detector of benchmarks/detector.py, pruned exactly with its head kept whole."""

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import torch
from conftest import rel_diff, sparsity_shaped, zeroed

import slimming
from slimming.measure.detection import average_precisions, box_iou, mean_average_precision

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def target(boxes, labels):
    return {"boxes": torch.tensor(boxes, dtype=torch.float), "labels": torch.tensor(labels)}


def pred(boxes, scores, labels):
    return {"boxes": torch.tensor(boxes, dtype=torch.float).reshape(-1, 4),
            "scores": torch.tensor(scores, dtype=torch.float),
            "labels": torch.tensor(labels, dtype=torch.long)}


def test_box_iou_by_hand():
    a = torch.tensor([[0.0, 0, 10, 10]])
    b = torch.tensor([[0.0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]])
    assert torch.allclose(box_iou(a, b), torch.tensor([[1.0, 50 / 150, 0.0]]))


def test_cases_by_hand():
    t = [target([[0, 0, 10, 10]], [0])]
    assert mean_average_precision([pred([[0, 0, 10, 10]], [0.9], [0])], t) == 1.0
    assert mean_average_precision([pred([], [], [])], t) == 0.0
    assert mean_average_precision([pred([[0, 0, 10, 10]], [0.9], [1])], t) == 0.0  # wrong class
    # a false positive ranked above the hit: precision 1/2 at recall 1
    two = pred([[50, 50, 60, 60], [0, 0, 10, 10]], [0.9, 0.8], [0, 0])
    assert mean_average_precision([two], t) == pytest.approx(0.5)
    # a second detection of a found object is a false positive, after the hit: AP stays 1
    dup = pred([[0, 0, 10, 10], [0, 0, 10, 9]], [0.9, 0.8], [0, 0])
    assert mean_average_precision([dup], t) == 1.0
    # IoU 0.45 misses at 0.5 and hits at 0.4
    near = [pred([[0, 0, 10, 22.2]], [0.9], [0])]
    iou = box_iou(near[0]["boxes"], t[0]["boxes"]).item()
    assert 0.4 < iou < 0.5
    assert mean_average_precision(near, t) == 0.0 and mean_average_precision(near, t, 0.4) == 1.0
    # two classes: the mean of their APs; a class with no ground truth does not count
    t2 = [target([[0, 0, 10, 10], [20, 20, 30, 30]], [0, 1])]
    p2 = pred([[0, 0, 10, 10], [50, 50, 60, 60], [20, 20, 30, 30], [0, 0, 5, 5]],
              [0.9, 0.95, 0.8, 0.7], [0, 1, 1, 2])
    assert average_precisions([p2], t2) == {0: 1.0, 1: 0.5}
    assert mean_average_precision([p2], t2) == pytest.approx(0.75)


def random_case(rng: random.Random, images: int = 6):
    preds, targets = [], []
    for _ in range(images):
        gts = [[x, y, x + w, y + h] for x, y, w, h in
               [(rng.uniform(0, 50), rng.uniform(0, 50), rng.uniform(5, 20), rng.uniform(5, 20))
                for _ in range(rng.randint(0, 4))]]
        labels = [rng.randint(0, 2) for _ in gts]
        det = [[c + rng.gauss(0, 2) for c in b] for b in gts if rng.random() < 0.8]
        det += [[x, y, x + 10, y + 10] for x, y in [(rng.uniform(0, 60), rng.uniform(0, 60))
                                                     for _ in range(rng.randint(0, 3))]]
        targets.append(target(gts if gts else torch.zeros(0, 4).tolist(), labels))
        preds.append(pred(det, [rng.random() for _ in det], [rng.randint(0, 2) for _ in det]))
    return preds, targets


@pytest.mark.parametrize("seed", range(5))
def test_properties_on_random_cases(seed):
    rng = random.Random(seed)
    preds, targets = random_case(rng)
    value = mean_average_precision(preds, targets)
    assert 0.0 <= value <= 1.0
    order = list(range(len(preds)))
    rng.shuffle(order)  # the order of the images does not matter
    shuffled = mean_average_precision([preds[i] for i in order], [targets[i] for i in order])
    assert shuffled == pytest.approx(value)
    scaled = [dict(p, scores=p["scores"] ** 3) for p in preds]  # only the ranking of scores matters
    assert mean_average_precision(scaled, targets) == pytest.approx(value)
    perfect = [pred(t["boxes"].tolist(), [1.0] * len(t["labels"]), t["labels"].tolist()) for t in targets]
    boxes = any(len(t["labels"]) for t in targets)
    assert mean_average_precision(perfect, targets) == (1.0 if boxes else 0.0)
    # adding a detection with a score under all others can only raise or keep every AP
    low = [dict(p) for p in preds]
    extra = targets[0]["boxes"][:1] if len(targets[0]["labels"]) else torch.zeros(0, 4)
    if len(extra):
        low[0] = pred(preds[0]["boxes"].tolist() + extra.tolist(), preds[0]["scores"].tolist() + [-1.0],
                      preds[0]["labels"].tolist() + targets[0]["labels"][:1].tolist())
        before, after = average_precisions(preds, targets), average_precisions(low, targets)
        assert all(after[c] >= before[c] - 1e-12 for c in before)


def load_detector():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("detector_example", BENCH / "detector.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_the_worked_detector_is_pruned_exactly_with_its_head_whole(tmp_path):
    det = load_detector()
    torch.manual_seed(0)
    model = det.TinyYOLO().eval()
    sparsity_shaped(model, 0)
    images, targets = det.make_shapes(4, seed=0)
    assert images.shape == (4, 3, det.SIZE, det.SIZE) and all(len(t["boxes"]) >= 1 for t in targets)
    result = slimming.prune(model, target_flops=0.6, ignore="head", compensate=False)
    assert result.budget["achieved"] <= 0.6 * result.budget["full"]
    with torch.no_grad():
        a, b = result.model(images), zeroed(model, result.masks)(images)
    assert a.shape == b.shape == (4, 4 + len(det.CLASSES), 8 * 8 + 4 * 4)
    assert rel_diff(a, b) < 1e-4
    neck_cut = False
    for name, m in model.head.named_modules():  # the head keeps what it makes; what it reads is cut
        if isinstance(m, torch.nn.Conv2d):
            new = result.model.head.get_submodule(name)
            assert new.out_channels == m.out_channels
            neck_cut |= new.in_channels < m.in_channels
        elif isinstance(m, torch.nn.BatchNorm2d):
            assert result.masks[f"head.{name}"].all()
    assert neck_cut  # the neck's outputs, read by the head, are slimmed too
    # the C2f pieces stay equal, so chunk(2) of the pruned tensor is still right
    half = result.masks["backbone.c2f2.cv1.1"].view(2, -1).sum(1)
    assert half[0] == half[1]
    # the loss trains: one step lowers it on a fixed batch
    small = result.model.train()
    opt = torch.optim.SGD(small.parameters(), lr=0.01)
    first = det.detection_loss(small(images), targets)
    first.backward()
    opt.step()
    assert det.detection_loss(small(images), targets).item() < first.item()
