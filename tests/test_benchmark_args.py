"""The scripts in benchmarks/ keep the commands' promise for bad arguments: one line on stderr,
exit code 2, no traceback, nothing written (an output that is a file where a folder belongs, a
pack path that is a folder, a count of 0, a checkpoint that is not there)."""

import os
import subprocess
import sys
from pathlib import Path

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
        "detector.py": ["--out", str(f)],
        "network_table.py": ["--repeats", "0"],
        "gpu/run.py": ["--out", str(f), "--no-install"],
    }


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    f, d = tmp_path / "a-file", tmp_path / "a-folder"
    f.write_text("keep me")
    d.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    procs = {name: subprocess.Popen([sys.executable, str(BENCH / name), *argv], cwd=tmp_path, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, argv in cases(f, d).items()}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        lines = err.strip().splitlines()
        assert proc.returncode == 2, (name, err[-1500:])
        assert len(lines) == 1 and "Traceback" not in err, (name, err[-1500:])
    assert f.read_text() == "keep me" and not list(d.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "a-folder"]
