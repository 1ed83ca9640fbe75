"""The scripts in benchmarks/ keep the commands' promise for bad arguments: one line on stderr,
exit code 2, no traceback, nothing written (an output that is a file where a folder belongs, a
pack path that is a folder, a count of 0, a checkpoint that is not there). Each runs as
``__main__`` in this process: an argument error comes before any work, so the promise is the
same as a fresh interpreter's."""

import runpy
import signal
import sys
import warnings
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def cases(f: Path, d: Path) -> dict[str, list[str]]:
    """{script: argv}; ``f`` is a file, ``d`` a folder, both must stay as they are."""
    return {
        "budget_repair.py": ["--out", str(f)],
        "controller_starts.py": ["--data-root", str(d), "--out", str(f / "x")],
        "own_network.py": ["--out", str(f)],
        "paper_vgg_cpu.py": ["--epochs", "0"],
        "vs_torch_pruning.py": ["--checkpoint", str(d / "missing.pth"), "--repeats", "0"],
        "loader_speed.py": ["--cache-dir", str(f)],
        "pack_images.py": [str(d), str(d)],
        "compare_trees.py": [str(d), str(d)],
        "same_cuts.py": ["--compare", str(d), str(f)],
        "detector.py": ["--out", str(f)],
        "network_table.py": ["--repeats", "0"],
        "heads.py": ["--percent", "2"],
        "gpu/run.py": ["--out", str(f), "--no-install"],
    }


def run_script(path: Path, argv: list[str], capsys) -> tuple[int, str]:
    """``python path *argv``, in this process (the suite pays for one torch import, not eleven):
    its exit code and stderr; the interpreter's state it may touch is put back."""
    saved = (sys.argv, list(sys.path), torch.get_num_threads(), warnings.filters[:],
             {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)},
             set(sys.modules))
    sys.argv, sys.path[:0] = [str(path), *argv], [str(path.parent), str(BENCH)]
    code = 0
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        torch.set_num_threads(saved[2])
        warnings.filters[:] = saved[3]
        for s, handler in saved[4].items():
            signal.signal(s, handler)
        for name in set(sys.modules) - saved[5]:  # the scripts' own helpers (common, ...)
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(BENCH)):
                del sys.modules[name]
    return code, capsys.readouterr().err


def test_bad_arguments_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    f, d = tmp_path / "a-file", tmp_path / "a-folder"
    f.write_text("keep me")
    d.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for name, argv in cases(f, d).items():
        code, err = run_script(BENCH / name, argv, capsys)
        lines = err.strip().splitlines()
        assert code == 2, (name, err[-1500:])
        assert len(lines) == 1 and "Traceback" not in err, (name, err[-1500:])
    assert f.read_text() == "keep me" and not list(d.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "a-folder"]


def test_every_script_refuses_an_option_it_does_not_have(tmp_path, monkeypatch, capsys):
    """``--bogus`` is one line and exit code 2 before any work, for every script (prune_time.py
    once ran its whole benchmark and exited 0)."""
    monkeypatch.chdir(tmp_path)
    scripts = sorted(p for p in [*BENCH.glob("*.py"), *BENCH.glob("gpu/*.py")] if p.name != "common.py")
    assert len(scripts) >= 18
    for path in scripts:
        if "__main__" not in path.read_text():
            continue  # a helper module, not a script
        code, err = run_script(path, ["--bogus"], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, (path.name, err[-800:])
        assert "--bogus" in err or "required" in err, (path.name, err)
    assert list(tmp_path.iterdir()) == []
