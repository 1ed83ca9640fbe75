"""The README's Python examples run as they are (in a temporary folder) and do what they say."""

import re
from pathlib import Path

import pytest
import torch
from slimming.models import layers

import slimming

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_there_are_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_a_python_example_runs(code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    rules, module_rules = dict(layers.RULES), dict(layers.MODULE_RULES)
    try:
        exec(compile(code, "README.md", "exec"), namespace)
    finally:  # a layer kind registered by an example stays in that example
        layers.RULES.clear()
        layers.RULES.update(rules)
        layers.MODULE_RULES.clear()
        layers.MODULE_RULES.update(module_rules)
    if "register_layer" in code:  # a layer kind of your own: DeformConv2d cut as a convolution
        small = namespace["small"]
        assert small.dc.weight.shape == (small.dc.out_channels, small.stem[0].out_channels, 3, 3)
        return
    if "class Detector" in code:  # your own detector in your own loop, its head kept whole
        small, again = namespace["small"], namespace["again"]
        result = namespace["result"]
        assert result.budget["achieved"] <= 0.6 * result.budget["full"]
        # the head keeps its own widths; the neck that feeds it is slimmed like the rest
        assert small.head[1].out_channels == 7 and small.head[0][0].out_channels == 32
        assert small.head[0][0].in_channels == small.backbone[3].cv2[0].out_channels < 32
        assert (tmp_path / "detector.pth").exists()
        x = torch.randn(2, 3, 64, 64)
        with torch.no_grad():
            assert torch.equal(again.eval()(x), small.eval()(x))
        return
    if "sparsity.apply()" in code:  # the training loop, prune, save and reload
        out = capsys.readouterr().out
        assert "% of |gamma| under 1e-2" in out and "feature.1" in out
        assert (tmp_path / "pruned.pth").exists()
        assert namespace["net"].cfg == namespace["result"].cfg
    if "TrainConfig" in code:  # a run from Python, then its checkpoint pruned
        assert namespace["run"].last["epoch"] == 1
        assert (tmp_path / "runs" / "py-sparse" / "best.pth").exists()
        small = slimming.load_model(tmp_path / "runs" / "py-pruned.pth")
        assert sum(v for v in small.cfg if v != "M") < 16 + 32 + 32 + 64 + 64
    if "save_pruned" in code:  # the user's own class, without its code
        assert (tmp_path / "small.pth").exists()
        assert namespace["again"].layer1[0].conv1.out_channels < 64
        again = namespace["again"]  # ignore="fc": its outputs kept, the features it reads cut
        assert again.fc.out_features == 10 and again.fc.in_features == again.layer4[1].bn2.num_features < 512
    elif "example_inputs" in code:  # any module, pruned through its graph
        result = namespace["result"]
        classifier = result.model.classifier[1]  # ignored: keeps its outputs, reads the cut features
        assert classifier.out_features == 10
        assert classifier.in_features == result.model.features[18][1].num_features
        assert not result.masks["features.2.conv.0.1"].all()
