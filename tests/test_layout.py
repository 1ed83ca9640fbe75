"""The layout's rules, read off every module's imports (AST): no import circle, no arrow
against the parts' direction, no private name taken from another module, no project import
inside a function (but the one in ``LATE``). Which part may import which is written once, as the table in
``docs/layout.md``; ``BELOW`` is that table, and a test holds the two equal."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BELOW = {  # part -> the parts it may import (besides itself): docs/layout.md's table
    "errors": set(),
    "version": set(),
    "utils": {"errors"},
    "data": {"utils", "errors"},
    "models": {"utils", "errors"},
    "layers": {"utils", "errors"},
    "measure": {"utils", "errors"},
    "io": {"measure", "layers", "models", "utils", "errors"},
    "pruning": {"layers", "models", "measure", "utils", "errors"},
    "training": {"data", "io", "pruning", "measure", "layers", "models", "utils", "errors"},
    "integrations": {"training", "pruning", "layers", "models", "measure", "utils", "errors"},
    "tools": {"training", "data", "io", "pruning", "measure", "layers", "models", "utils", "errors"},
    "cli": {"tools", "training", "data", "io", "pruning", "measure", "layers", "models", "utils",
            "errors", "version"},
}


def documented_rule() -> dict[str, set[str]]:
    """docs/layout.md's table ``| part | may import |``: part -> the parts its row names."""
    lines = (REPO / "docs" / "layout.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines)
                 if [c.strip() for c in line.strip().strip("|").split("|")] == ["part", "may import"])
    rule = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        part, names = (c.strip() for c in line.strip().strip("|").split("|"))
        part = part.strip("`")
        assert part not in rule, f"{part} has two rows"
        rule[part] = set() if names == "nothing" else {n.strip().strip("`") for n in names.split(",")}
    return rule


def test_the_documented_rule_is_the_enforced_one():
    assert documented_rule() == BELOW


def test_each_part_names_its_modules_and_leaves_the_rule_to_the_table():
    """A part's docstring names each of its modules (``runs``, ``trace``, ``ops``) and points to
    docs/layout.md for what it may import, instead of writing the rule again."""
    wrong = []
    for init in [*sorted(REPO.glob("slimming/*/__init__.py")), REPO / "models" / "__init__.py"]:
        name, doc = init.parent.name, ast.get_docstring(ast.parse(init.read_text())) or ""
        if name != "models":  # models names its families as a kind, not one by one
            wrong += [f"{name} does not name {m.stem}" for m in sorted(init.parent.glob("*.py"))
                      if m.stem != "__init__" and f"``{m.stem}``" not in doc]
        if ("Imports:" in doc or "docs/layout.md" not in doc):
            wrong.append(f"{name} states its own rule instead of pointing to docs/layout.md")
    assert wrong == []


def modules() -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package); the top-level models/ folder is slimming.models
    (setup.py's package_dir)."""
    found = {}
    for path in [*REPO.glob("slimming/**/*.py"), *REPO.glob("models/**/*.py")]:
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[0] == "models":
            parts.insert(0, "slimming")
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULES = modules()


def part(module: str) -> str:
    return module.split(".")[1] if "." in module else "slimming"


def imports(module: str):
    """(imported project module, name taken from it or None, line, inside a function) for every
    import of a slimming module in ``module``."""
    path, package = MODULES[module]
    tree = ast.parse(path.read_text())
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function |= {id(n) for n in ast.walk(node) if n is not node}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "slimming":
                    yield alias.name, None, node.lineno, id(node) in in_function
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if package else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1] + ([node.module] if node.module else [])
                base = ".".join(base)
            else:
                base = node.module or ""
            if base.split(".")[0] != "slimming":
                continue
            for alias in node.names:
                child = f"{base}.{alias.name}"
                if child in MODULES:
                    yield child, None, node.lineno, id(node) in in_function
                else:
                    yield base, alias.name, node.lineno, id(node) in in_function


GRAPH = {m: {t for t, _, _, _ in imports(m) if t in MODULES} for m in MODULES}


def test_every_module_is_in_a_known_part():
    assert {part(m) for m in MODULES} - {"slimming"} <= set(BELOW) | {"__main__"}


def test_no_import_circle():
    """Tarjan's strongly connected components over the module graph: none larger than one."""
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    assert circles == []


def test_arrows_run_one_way():
    wrong = [f"{m} -> {t}" for m in sorted(MODULES) for t in sorted(GRAPH[m])
             if part(m) in BELOW and part(t) != part(m) and part(t) not in BELOW[part(m)]]
    assert wrong == []


def test_no_private_name_across_modules():
    taken = [f"{m}:{line} takes {name} from {t}" for m in sorted(MODULES)
             for t, name, line, _ in imports(m)
             if name and name.startswith("_") and not name.startswith("__") and t != m]
    assert taken == []


# the one import made late, and why: the command line reads its arguments before it imports torch
LATE = {("slimming.cli", "slimming.cli.run")}


def test_no_project_import_inside_a_function():
    late = [f"{m}:{line} imports {t}" for m in sorted(MODULES)
            for t, _, line, inside in imports(m) if inside and (m, t) not in LATE]
    assert late == []


@pytest.mark.slow
def test_help_and_a_typo_answer_without_torch():
    """``slimming --help``, a command's ``--help`` and a mistyped flag import no torch (the
    5-9 s a busy machine takes for it), nor does ``import slimming`` until its API is used. So
    the parser writes down the names its flags offer: in a fresh process (nothing registered
    by a test), they are the library's registries."""
    code = ("import sys, slimming, slimming.cli\n"
            "assert 'torch' not in sys.modules\n"
            "for argv in (['--help'], ['prune', '--help'], ['prune', '--precent', '0.5'], ['--version']):\n"
            "    try:\n"
            "        slimming.cli.main(argv)\n"
            "    except SystemExit as e:\n"
            "        assert e.code in (0, 2), (argv, e.code)\n"
            "    else:\n"
            "        raise AssertionError(argv)\n"
            "assert 'torch' not in sys.modules, [m for m in sys.modules if m.startswith('slimming')]\n"
            "slimming.prune\n"
            "assert 'torch' in sys.modules\n"
            "from slimming import models, data, pruning\n"
            "from slimming.cli.parser import SHIPPED, SHIPPED_ALIASES\n"
            "import slimming.data.datasets, slimming.pruning.importance, slimming.measure.runtimes\n"
            "for (module, name), names in SHIPPED.items():\n"
            "    assert sorted(names) == sorted(getattr(sys.modules[module], name)), (module, name)\n"
            "assert SHIPPED_ALIASES == models.ALIASES\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "did you mean --percent?" in out.stderr


def test_top_level_holds_only_the_package_face():
    assert sorted(p.name for p in (REPO / "slimming").glob("*.py")) == [
        "__init__.py", "__main__.py", "errors.py", "version.py"]
    for name, (path, package) in MODULES.items():
        if package and name.count(".") == 1:
            assert ast.get_docstring(ast.parse(path.read_text())), f"{name} says nothing of itself"


@pytest.mark.slow
def test_the_families_are_the_top_level_models_folder_installed_as_slimming_models(tmp_path):
    """The brief's top level (setup.py, README.md, slimming, models, tests, notebooks): models/
    holds the network families and only them, installed as slimming.models; from anywhere but
    the repository there is no top-level ``models`` to import (it would clash with the paper's
    repository's and YOLOv5's)."""
    assert {"setup.py", "README.md", "slimming", "models", "tests", "notebooks"} <= {
        p.name for p in REPO.iterdir()}
    assert not (REPO / "slimming" / "models").exists()
    assert sorted(p.stem for p in (REPO / "models").glob("*.py")) == [
        "__init__", "common", "densenet", "external", "nin", "preresnet", "registry", "vgg"]
    code = ("import importlib.util, pathlib, slimming.models as m\n"
            "print(pathlib.Path(m.__file__).parent.name, importlib.util.find_spec('models'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["models", "None"]


def test_a_checkout_left_with_the_old_models_folder_says_what_to_delete(tmp_path):
    """A checkout from before the move keeps slimming/models/__pycache__, which Python would
    import as an empty namespace slimming.models: import slimming names the folder instead."""
    package = tmp_path / "slimming"
    (package / "models" / "__pycache__").mkdir(parents=True)
    for name in ("__init__.py", "errors.py", "version.py"):
        (package / name).write_text((REPO / "slimming" / name).read_text())
    out = subprocess.run([sys.executable, "-c", "import slimming"], cwd=tmp_path, capture_output=True,
                         text=True)
    assert out.returncode == 1
    assert f"{package / 'models'} is left over from an older checkout" in out.stderr
    (package / "models" / "__init__.py").write_text("")  # an installed package: its folder is whole
    assert subprocess.run([sys.executable, "-c", "import slimming"], cwd=tmp_path).returncode == 0


def code_lines(node: ast.AST, lines: list[str]) -> int:
    """Lines of code in a function's or class's body: no docstring, comment or blank line."""
    documented = isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    body = node.body[1:] if documented else node.body
    if not body:
        return 0
    return sum(1 for line in lines[body[0].lineno - 1:node.end_lineno]
               if line.strip() and not line.strip().startswith("#"))


def test_the_pruning_core_stays_in_parts_a_reader_can_hold():
    """prune.py at most 400 lines; in slimming/pruning/ no class over 300 lines of code and no
    function over 60 (issue 44: the core grew by adding fields and steps to a few large ones)."""
    assert len((REPO / "slimming" / "pruning" / "prune.py").read_text().splitlines()) <= 400
    big = []
    for path in sorted((REPO / "slimming" / "pruning").glob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                most = 300 if isinstance(node, ast.ClassDef) else 60
                if code_lines(node, lines) > most:
                    big.append(f"{path.name}:{node.lineno} {node.name}: {code_lines(node, lines)} lines")
    assert big == []


def test_the_channel_graph_keeps_the_channel_algebra_and_the_trace_its_records_beside_it():
    """ChannelGraph at most 12 fields (issue 44: 24, 15 of them a mailbox of what the trace found
    for other parts); what the trace found beside the channels is in the records of ``Traced``,
    each read by the part named for it."""
    import torch
    from torch import nn

    from slimming.pruning.graph import ChannelGraph
    from slimming.pruning.trace import trace
    from slimming.pruning.traced import Baked, Coverage, Traced, Widths

    assert len(vars(ChannelGraph(nn.Identity()))) <= 12
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))
    found = trace(model, torch.zeros(1, 3, 8, 8))
    assert isinstance(found, Traced) and isinstance(found.graph, ChannelGraph)
    assert (type(found.widths), type(found.baked), type(found.coverage)) == (Widths, Baked, Coverage)
    again = found.copy()  # what a second forward builds on leaves the first as it was
    again.coverage.unseen.append("x")
    again.widths.borders.setdefault("0", []).append(None)
    assert found.coverage.unseen == [] and None not in found.widths.borders.get("0", [])


def test_old_paths_are_the_new_modules():
    import importlib

    import slimming

    for old, new in slimming.OLD_PATHS.items():
        assert importlib.import_module(f"slimming.{old}") is importlib.import_module(f"slimming.{new}")
        assert importlib.import_module(f"slimming.{new}").__name__ == f"slimming.{new}"
    assert callable(slimming.prune) and slimming.prune.__module__ == "slimming.pruning.prune"


@pytest.mark.parametrize("folder", ["models", "utils", "data"])
@pytest.mark.slow
def test_import_from_a_folder_with_its_own_package(tmp_path, folder):
    """The paper's repository and YOLOv5 checkouts hold a ``models`` package of their own."""
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "__init__.py").write_text("raise ImportError('the wrong package')\n")
    code = "import slimming, slimming.cli, slimming.tools.report; print(slimming.models.build('vgg').arch)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "vgg"


@pytest.mark.parametrize("name", ["vgg-pruned.pth", "timm-resnet-pruned.pth", "timm-vit-gated-pruned.pt"])
def test_files_written_before_the_families_moved_load_and_compute_the_same(name):
    """tests/data/v0.2: files written by slimming 0.2.0 (commit c03b04a, the families and the
    layer rules still in slimming/models/; tests/data/make_v02_checkpoints.py): a family's cut,
    a timm network cut along its graph (rebuilt by resize_like), a gated timm vision
    transformer cut by heads (save_pruned)."""
    import torch

    from slimming import load_model, load_pruned, models

    if name.startswith("timm"):
        timm = pytest.importorskip("timm")
        arch = "test_resnet" if "resnet" in name else "test_vit"
        try:  # the oldest timm setup.py allows (1.0.8) has no test_resnet, nor a test_vit built on meta
            models.build(f"timm:{arch}", num_classes=10, input_size=[3, 64, 64], empty=True)
        except ValueError:
            pytest.skip(f"timm {timm.__version__} cannot build {arch} as 0.2.0 did")
    folder = REPO / "tests" / "data" / "v0.2"
    expected = torch.load(folder / "expected.pt", weights_only=True)
    x = expected["input32" if name.startswith("vgg") else "input64"]
    if name.endswith(".pt"):
        fresh = models.build("timm:test_vit", num_classes=10, input_size=[3, 64, 64])
        model = load_pruned(folder / name, fresh)
    else:
        model = load_model(folder / name)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), expected[name.rsplit(".", 1)[0]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["vgg", "vgg-pruned", "nin", "nin-pruned", "preresnet-pruned",
                                  "densenet-pruned"])
def test_checkpoints_written_before_the_layout_load_and_compute_the_same(name):
    """tests/data/v0.1: files written by slimming 0.1.0 (tests/data/make_v01_checkpoints.py)."""
    import torch

    from slimming import load_checkpoint, load_model

    folder = REPO / "tests" / "data" / "v0.1"
    expected = torch.load(folder / "expected.pt", weights_only=True)
    model = load_model(folder / f"{name}.pth")
    with torch.no_grad():
        torch.testing.assert_close(model(expected["input"]), expected[name], rtol=1e-5, atol=1e-5)
    ckpt = load_checkpoint(folder / f"{name}.pth")
    assert ("cfg_mask" in ckpt) == name.endswith("-pruned")
