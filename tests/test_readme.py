"""The README's and the docs' Python examples (```python blocks) run as they are (in a temporary
folder) and do what they say; their links lead somewhere, and every page of docs/ is linked from
the README. A ```py block is a recipe for code slimming never imports (Ultralytics: AGPL)."""

import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import slimming
from slimming.layers import rules as layers
from slimming.pruning import speed

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


# (id, page, code): README-block0, python.md-block1, ...
EXAMPLES = [(f"{'README' if page == README else page.name}-block{i}", page, code)
            for page in PAGES for i, code in enumerate(python_blocks(page))]
BLOCKS = [code for _, _, code in EXAMPLES]


def test_there_are_python_examples():
    assert len(python_blocks(README)) >= 2 and len(DOCS) >= 2
    assert len(BLOCKS) > len(python_blocks(README))


@pytest.mark.parametrize(("page", "code"), [(page, code) for _, page, code in EXAMPLES],
                         ids=[name for name, _, _ in EXAMPLES])
@pytest.mark.slow
def test_a_python_example_runs(page, code, tmp_path, monkeypatch, capsys, request):
    monkeypatch.chdir(tmp_path)
    if "target_latency" in code:  # timed by a deterministic clock: a busy machine refuses a budget
        request.getfixturevalue("steady_clock")
    namespace: dict = {}
    rules, module_rules = dict(layers.RULES), dict(layers.MODULE_RULES)
    held = {key: list(entries) for key, entries in layers._HELD.items()}  # the registrations held
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            exec(compile(code, str(page.relative_to(ROOT)), "exec"), namespace)
    finally:  # a layer kind registered by an example stays in that example
        layers.RULES.clear()
        layers.RULES.update(rules)
        layers.MODULE_RULES.clear()
        layers.MODULE_RULES.update(module_rules)
        layers._HELD.clear()  # its handle, never removed, held no more either
        layers._HELD.update(held)
    # an example warns only where it says so ("it warns: the model shows little sparsity"), and
    # then it does: a fresh model's gammas, all ones, cut by half without a word of it gave "40
    # layers keep under 5%" twice to the first reader who copied the README's example
    here = str(page.relative_to(ROOT))
    said = [str(w.message) for w in said if "slimming" in w.filename or w.filename == here]
    expected = re.findall(r"# .*warns: ([^(\n]+?)\s*(?:\(|$)", code, re.M)
    assert all(any(e in w for e in expected) for w in said), (said, expected)
    assert all(any(e in w for w in said) for e in expected), (said, expected)
    if "register_layer" in code:  # a layer kind of your own: DeformConv2d cut as a convolution
        small = namespace["small"]
        assert small.dc.weight.shape == (small.dc.out_channels, small.stem[0].out_channels, 3, 3)
        return
    if "class Detector" in code:  # your own detector in your own loop, its head kept whole
        small, again = namespace["small"], namespace["again"]
        result = namespace["result"]
        assert result.budget.achieved <= 0.6 * result.budget.full
        # the head keeps its own widths; the neck that feeds it is slimmed like the rest
        assert small.head[1].out_channels == 7 and small.head[0][0].out_channels == 32
        assert small.head[0][0].in_channels == small.backbone[3].cv2[0].out_channels < 32
        assert (tmp_path / "detector.pth").exists()
        x = torch.randn(2, 3, 64, 64)
        with torch.no_grad():
            assert torch.equal(again.eval()(x), small.eval()(x))
        return
    if "target_latency" in code:  # a latency budget: measured, recorded, the original untouched
        b, model = namespace["result"].budget, namespace["model"]
        assert b.what == "latency" and b.asked == 0.5 and b.runtime == "eager"
        assert 1 <= len(b.rounds) <= speed.ROUNDS  # how many a noisy machine needs varies
        assert b.table["entries"] > 0 and b.original_ms > 0 and 0 < b.ratio < 1
        assert b.ms == pytest.approx(b.ratio * b.original_ms) and b.spread == b.ratio_spread
        assert namespace["result"].model.fc.out_features == 10
        assert namespace["result"].verified is not None
        return
    if "HeadGate" in code or "slimming_gate.weight[1] = 0" in code:  # a ViT's head cut whole
        result, vit = namespace["result"], namespace["vit"]
        attn = result.model.blocks[0].attn
        assert attn.num_heads == 2 and attn.qkv.out_features == 3 * attn.proj.in_features == 3 * 128
        assert [b.attn.num_heads for b in result.model.blocks[1:]] == [3] * 11  # their gates are ones
        assert vit.blocks[0].attn.num_heads == 3 and result.verified < 1e-4
        assert not any(isinstance(m, layers.ChannelGate) for m in result.model.modules())
        return
    if "SparsityCallback" in code:  # a Hugging Face ViT: gated, trained by its Trainer, cut, saved
        result, model, again, sparse = (namespace[k] for k in ("result", "model", "again", "sparse"))
        gates = {id(m.weight) for m in model.modules() if isinstance(m, layers.ChannelGate)}
        assert gates and gates <= {id(p) for p in sparse.sparsity.params}  # the gates made sparse
        assert slimming.count_params(result.model) < slimming.count_params(model)
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            assert torch.equal(again.eval()(x).logits, result.model(x).logits)
        return
    if "add_gates" in code:  # ConvNeXt through its LayerNorms and gates, folded away at the cut
        result, model = namespace["result"], namespace["model"]
        assert result.budget.achieved <= 0.5 * result.budget.full
        mlp = result.model.features[1][0].block
        assert mlp[3].in_features < 96 and mlp[3].out_features == mlp[5].in_features < 384
        assert not any(isinstance(m, layers.ChannelGate) for m in result.model.modules())
        assert sum(isinstance(m, layers.ChannelGate) for m in model.modules()) == 18
        return
    if "result.removed" in code:  # a branch cut whole, removed: what the comment says it prints
        said = code.split("print(result.removed)")[1].split("#", 1)[1].strip()
        assert capsys.readouterr().out.strip() == said
        model, result = namespace["model"], namespace["result"]
        x = torch.randn(2, 3, 48, 48)
        with torch.no_grad():
            assert slimming.count_flops(result.model, inputs=(x,)) < slimming.count_flops(model, inputs=(x,))
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


def prose(page: Path) -> str:
    """The page without its fenced blocks."""
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)


def anchors(page: Path) -> Iterator[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ +(.+?) *$", prose(page), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


def links(page: Path) -> list[str]:
    """The targets of the page's markdown links, outside code."""
    text = re.sub(r"`[^`]*`", "", prose(page))  # inline code, which may hold brackets
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_leads_to_a_file_and_heading(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in set(anchors(file)):
            broken.append(f"{target} (no such heading)")
    assert broken == []


def test_every_doc_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(README)}
    assert [doc.name for doc in DOCS if doc.resolve() not in linked] == []


PATH = re.compile(r"(?<![\w./~-])((?:slimming|models|tests|benchmarks|notebooks|docs|\.ci)/[\w./-]*\w)")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_path_a_page_names_exists(page):
    """``slimming/utils/files.py``, ``benchmarks/detector.py``: files that move take their
    mentions with them."""
    named = {m for code in re.findall(r"`([^`]*)`", prose(page)) for m in PATH.findall(code)}
    assert sorted(p for p in named if not (ROOT / p).exists()) == []
