"""The layout's rules, read off every module's imports (AST): no import circle, no arrow
against the parts' direction, no private name taken from another module, no project import
inside a function. The direction is the one ``slimming/__init__.py`` states:
cli -> tools -> training -> pruning, io -> measure, models -> utils -> errors; data -> utils,
errors."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BELOW = {  # part -> the parts it may import (besides itself)
    "errors": set(),
    "version": set(),
    "utils": {"errors"},
    "data": {"utils", "errors"},
    "models": {"utils", "errors"},
    "measure": {"utils", "errors"},
    "io": {"measure", "models", "utils", "errors"},
    "pruning": {"models", "measure", "utils", "errors"},
    "training": {"data", "io", "pruning", "measure", "models", "utils", "errors"},
    "tools": {"training", "data", "io", "pruning", "measure", "models", "utils", "errors"},
    "cli": {"tools", "training", "data", "io", "pruning", "measure", "models", "utils", "errors",
            "version"},
}


def modules() -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package); ``models/`` installs as ``slimming.models``."""
    found = {}
    for path in [*REPO.glob("slimming/**/*.py"), *REPO.glob("models/**/*.py")]:
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[0] == "models":
            parts = ["slimming", *parts]
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


def test_no_project_import_inside_a_function():
    late = [f"{m}:{line} imports {t}" for m in sorted(MODULES)
            for t, _, line, inside in imports(m) if inside]
    assert late == []


def test_top_level_holds_only_the_package_face():
    assert sorted(p.name for p in (REPO / "slimming").glob("*.py")) == [
        "__init__.py", "__main__.py", "errors.py", "version.py"]
    for name, (path, package) in MODULES.items():
        if package and name.count(".") == 1 and name != "slimming.models":
            assert ast.get_docstring(ast.parse(path.read_text())), f"{name} says nothing of itself"


def test_old_paths_are_the_new_modules():
    import importlib

    import slimming

    for old, new in slimming.OLD_PATHS.items():
        assert importlib.import_module(f"slimming.{old}") is importlib.import_module(f"slimming.{new}")
        assert importlib.import_module(f"slimming.{new}").__name__ == f"slimming.{new}"
    assert callable(slimming.prune) and slimming.prune.__module__ == "slimming.pruning.prune"


@pytest.mark.parametrize("folder", ["models", "utils", "data"])
def test_import_from_a_folder_with_its_own_package(tmp_path, folder):
    """The paper's repository and YOLOv5 checkouts hold a ``models`` package of their own."""
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "__init__.py").write_text("raise ImportError('the wrong package')\n")
    code = "import slimming, slimming.cli, slimming.tools.report; print(slimming.models.build('vgg').arch)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "vgg"


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
