"""mAP@0.5 (slimming.measure.detection): hand-checked cases and properties; and the worked
YOLO-style detector of benchmarks/detector.py, pruned exactly with its head kept whole."""

import importlib.util
import random
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import rel_diff, sparsity_shaped, zeroed

import slimming
from slimming.errors import SlimmingError
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


def good():
    """One image, a valid (preds, targets) pair for the table of bad inputs to spoil."""
    return [pred([[0, 0, 10, 10], [20, 20, 30, 30]], [0.9, 0.8], [0, 1])], [target([[0, 0, 10, 10]], [0])]


def spoil(side, key, value):
    preds, targets = good()
    (preds if side == "preds" else targets)[0][key] = value
    return preds, targets


def drop(side, key):
    preds, targets = good()
    del (preds if side == "preds" else targets)[0][key]
    return preds, targets


NAN, INF = float("nan"), float("inf")
BAD = {  # name: (preds, targets, keyword arguments, the parameter the error names)
    "preds not a list": (good()[0][0], good()[1], {}, "preds"),
    "targets a tensor": (good()[0], torch.zeros(1, 4), {}, "targets"),
    "preds of strings": (["boxes"], good()[1], {}, "preds"),
    "targets of lists": (good()[0], [[0, 0, 10, 10]], {}, "targets"),
    "more preds than targets": (good()[0] * 2, good()[1], {}, "preds"),
    "fewer preds than targets": ([], good()[1], {}, "preds"),
    "preds without boxes": (*drop("preds", "boxes"), {}, "preds"),
    "preds without scores": (*drop("preds", "scores"), {}, "preds"),
    "preds without labels": (*drop("preds", "labels"), {}, "preds"),
    "targets without boxes": (*drop("targets", "boxes"), {}, "targets"),
    "targets without labels": (*drop("targets", "labels"), {}, "targets"),
    "pred boxes of 3 columns": (*spoil("preds", "boxes", torch.zeros(2, 3)), {}, "preds"),
    "pred boxes of 5 columns": (*spoil("preds", "boxes", torch.zeros(2, 5)), {}, "preds"),
    "target boxes of 3 columns": (*spoil("targets", "boxes", torch.zeros(1, 3)), {}, "targets"),
    "target boxes of 5 columns": (*spoil("targets", "boxes", torch.zeros(1, 5)), {}, "targets"),
    "pred boxes 1-D": (*spoil("preds", "boxes", torch.zeros(8)), {}, "preds"),
    "target boxes 3-D": (*spoil("targets", "boxes", torch.zeros(1, 1, 4)), {}, "targets"),
    "pred boxes a list": (*spoil("preds", "boxes", [[0, 0, 10, 10], [20, 20, 30, 30]]), {}, "preds"),
    "pred boxes of bools": (*spoil("preds", "boxes", torch.ones(2, 4, dtype=torch.bool)), {}, "preds"),
    "3 scores for 2 boxes": (*spoil("preds", "scores", torch.ones(3)), {}, "preds"),
    "1 label for 2 boxes": (*spoil("preds", "labels", torch.zeros(1, dtype=torch.long)), {}, "preds"),
    "2 target labels for 1 box": (*spoil("targets", "labels", torch.zeros(2, dtype=torch.long)), {},
                                  "targets"),
    "scores (2, 1)": (*spoil("preds", "scores", torch.ones(2, 1)), {}, "preds"),
    "NaN in pred boxes": (*spoil("preds", "boxes", torch.tensor([[0, 0, NAN, 10], [20, 20, 30, 30]])), {},
                          "preds"),
    "inf in target boxes": (*spoil("targets", "boxes", torch.tensor([[0, 0, 10, INF]])), {}, "targets"),
    "NaN in scores": (*spoil("preds", "scores", torch.tensor([NAN, 0.8])), {}, "preds"),
    "inf in scores": (*spoil("preds", "scores", torch.tensor([0.9, -INF])), {}, "preds"),
    "scores of strings": (*spoil("preds", "scores", ["0.9", "0.8"]), {}, "preds"),
    "fractional labels": (*spoil("targets", "labels", torch.tensor([0.5])), {}, "targets"),
    "an int8 label of -1": (*spoil("preds", "labels", torch.tensor([0, -1], dtype=torch.int8)), {}, "preds"),
    "a negative target label": (*spoil("targets", "labels", torch.tensor([-3])), {}, "targets"),
    "pred boxes on the meta device": (*spoil("preds", "boxes", torch.zeros(2, 4, device="meta")), {},
                                      "preds"),
    "iou_threshold -1": (*good(), {"iou_threshold": -1}, "iou_threshold"),
    "iou_threshold 0": (*good(), {"iou_threshold": 0}, "iou_threshold"),
    "iou_threshold 1.5": (*good(), {"iou_threshold": 1.5}, "iou_threshold"),
    "iou_threshold NaN": (*good(), {"iou_threshold": NAN}, "iou_threshold"),
    "iou_threshold inf": (*good(), {"iou_threshold": INF}, "iou_threshold"),
    "iou_threshold True": (*good(), {"iou_threshold": True}, "iou_threshold"),
    "iou_threshold a string": (*good(), {"iou_threshold": "0.5"}, "iou_threshold"),
    "iou_threshold None": (*good(), {"iou_threshold": None}, "iou_threshold"),
    "interpolation voc": (*good(), {"interpolation": "voc"}, "interpolation"),
    "interpolation COCO": (*good(), {"interpolation": "COCO"}, "interpolation"),
    "interpolation 101": (*good(), {"interpolation": 101}, "interpolation"),
}


@pytest.mark.parametrize("function", [mean_average_precision, average_precisions])
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_refused_naming_the_parameter(function, case):
    preds, targets, kwargs, param = BAD[case]
    with pytest.raises(SlimmingError) as e:
        function(preds, targets, **kwargs)
    assert e.value.params == (param,)
    message = str(e.value)
    assert param in message and "\n" not in message and len(message) < 200


@pytest.mark.parametrize(("a", "b", "param"), [
    (torch.zeros(2, 3), torch.zeros(1, 4), "a"),
    (torch.zeros(2, 4), torch.zeros(1, 5), "b"),
    (torch.zeros(4), torch.zeros(1, 4), "a"),
    ([[0, 0, 1, 1]], torch.zeros(1, 4), "a"),
    (torch.zeros(1, 4), torch.tensor([[0.0, 0, NAN, 1]]), "b"),
    (torch.tensor([[0.0, 0, INF, 1]]), torch.zeros(1, 4), "a"),
    (torch.ones(1, 4, dtype=torch.bool), torch.zeros(1, 4), "a"),
])
def test_box_iou_refuses_bad_boxes(a, b, param):
    with pytest.raises(SlimmingError) as e:
        box_iou(a, b)
    assert e.value.params == (param,) and "\n" not in str(e.value)


def test_empty_images_are_valid():
    t = [target([[0, 0, 10, 10]], [0]),
         {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)},
         {"boxes": torch.zeros(0), "labels": torch.zeros(0)}]
    p = [pred([[0, 0, 10, 10]], [0.9], [0]), pred([], [], []),
         {"boxes": torch.zeros(0), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}]
    for interpolation in ("all", "coco"):
        assert mean_average_precision(p, t, interpolation=interpolation) == 1.0
    assert mean_average_precision([pred([], [], [])], [target(torch.zeros(0, 4).tolist(), [])]) == 0.0
    assert mean_average_precision([], []) == 0.0
    assert box_iou(torch.zeros(0, 4), torch.zeros(3, 4)).shape == (0, 3)
    # integer boxes are read as numbers
    assert torch.allclose(box_iou(torch.tensor([[0, 0, 10, 10]]), torch.tensor([[5, 0, 15, 10]])),
                          torch.tensor([[50 / 150]]))


def test_coco_interpolation_by_hand():
    # two objects of class 0; ranked: a hit, a false positive, a hit. Precision 1, 1/2, 2/3 at
    # recall 1/2, 1/2, 1, made non-increasing: 1 up to recall 1/2, then 2/3 up to recall 1
    t = [target([[0, 0, 10, 10], [20, 20, 30, 30]], [0])]
    t[0]["labels"] = torch.tensor([0, 0])
    p = [pred([[0, 0, 10, 10], [50, 50, 60, 60], [20, 20, 30, 30]], [0.9, 0.8, 0.7], [0, 0, 0])]
    # all points: recall steps of 1/2 at precision 1 and 2/3
    assert mean_average_precision(p, t) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3, abs=1e-9)
    # COCO: recall 0, 0.01, ..., 0.50 (51 points) at 1, recall 0.51, ..., 1.00 (50 points) at 2/3
    coco = (51 * 1 + 50 * (2 / 3)) / 101
    assert abs(mean_average_precision(p, t, interpolation="coco") - coco) < 1e-9
    assert abs(average_precisions(p, t, interpolation="coco")[0] - coco) < 1e-9
    # the last object never found: recall stops at 1/2, so the 50 points past it count 0
    missed = [pred([[0, 0, 10, 10], [50, 50, 60, 60]], [0.9, 0.8], [0, 0])]
    assert abs(mean_average_precision(missed, t, interpolation="coco") - 51 / 101) < 1e-9
    assert mean_average_precision(missed, t) == pytest.approx(0.5, abs=1e-9)
    # precision 1 up to recall 1/2, then 1/2 up to recall 1 (hit, two misses, hit)
    late = [pred([[0, 0, 10, 10], [50, 50, 60, 60], [70, 70, 80, 80], [20, 20, 30, 30]],
                 [0.9, 0.8, 0.7, 0.6], [0, 0, 0, 0])]
    assert abs(mean_average_precision(late, t, interpolation="coco") - (51 * 1 + 50 * 0.5) / 101) < 1e-9
    assert mean_average_precision(late, t) == pytest.approx(0.75, abs=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_coco_and_all_points_agree_on_random_cases(seed):
    rng = random.Random(100 + seed)
    preds, targets = random_case(rng, images=rng.randint(1, 8))
    every, coco = average_precisions(preds, targets), average_precisions(preds, targets, interpolation="coco")
    assert every.keys() == coco.keys()
    for c in every:
        assert 0.0 <= every[c] <= 1.0 and 0.0 <= coco[c] <= 1.0
        # both read one non-increasing precision curve p on [0, 1] with values in [0, 1]: with S the
        # sum of its 101 samples, the area lies in [(S - p(0)) / 100, (S - p(1)) / 100], so that
        # S / 101 - area lies in [p(1) / 100 - S / 10100, p(0) / 100 - S / 10100], within +-0.01
        assert abs(every[c] - coco[c]) <= 0.01 + 1e-12
    a = mean_average_precision(preds, targets)
    b = mean_average_precision(preds, targets, interpolation="coco")
    assert abs(a - b) <= 0.02
    boxes = any(len(t["labels"]) for t in targets)
    perfect = [pred(t["boxes"].tolist(), [1.0] * len(t["labels"]), t["labels"].tolist()) for t in targets]
    far = [dict(p, boxes=p["boxes"] + 1000) for p in preds]  # no detection overlaps any target
    for interpolation in ("all", "coco"):
        expected = 1.0 if boxes else 0.0
        assert mean_average_precision(perfect, targets, interpolation=interpolation) == expected
        assert mean_average_precision(far, targets, interpolation=interpolation) == 0.0


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
    assert result.budget.achieved <= 0.6 * result.budget.full
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


def test_identical_huge_boxes_still_overlap_whole():
    """Boxes at 1e30 pixels: their areas (1e60) overflow float32, and identical boxes scored 0."""
    box = torch.tensor([[0.0, 0.0, 1e30, 1e30]])
    assert box_iou(box, box).item() == 1.0
    preds = [{"boxes": box, "scores": torch.tensor([0.9]), "labels": torch.tensor([2])}]
    assert mean_average_precision(preds, [{"boxes": box, "labels": torch.tensor([2])}]) == 1.0


@pytest.mark.slow
def test_many_classes_cost_a_pass_over_the_detections_not_classes_times_images():
    """20,000 classes over 200 images: grouped by one sort (a Python loop over classes x images
    took minutes); the answer is the same as class by class, each alone."""
    g = torch.Generator().manual_seed(0)
    preds, targets = [], []
    for _ in range(200):
        xy = torch.rand(100, 2, generator=g) * 100
        boxes = torch.cat([xy, xy + 5 + torch.rand(100, 2, generator=g) * 20], 1)
        labels = torch.randint(0, 20_000, (100,), generator=g)
        jitter = boxes + torch.randn(100, 4, generator=g)
        preds.append({"boxes": jitter, "scores": torch.rand(100, generator=g), "labels": labels})
        targets.append({"boxes": boxes, "labels": labels})
    start = time.process_time()
    aps = average_precisions(preds, targets)
    assert time.process_time() - start < 20  # CPU time: 48 s before, about 2 now
    assert len(aps) > 10_000
    for c in list(aps)[:20]:  # a class alone gives its AP
        alone = [{k: v[d["labels"] == c] for k, v in d.items()} for d in preds]
        truth = [{k: v[d["labels"] == c] for k, v in d.items()} for d in targets]
        assert average_precisions(alone, truth) == {c: aps[c]}
