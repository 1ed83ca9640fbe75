"""The README's Python example runs as it is (in a temporary folder) and does what it says."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_python_example_runs(tmp_path, monkeypatch, capsys):
    text = README.read_text()
    section = text[text.index("## Python"):text.index("## Checkpoints")]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "% of |gamma| under 1e-2" in out and "feature.1" in out
    assert (tmp_path / "pruned.pth").exists()
    assert namespace["net"].cfg == namespace["result"].cfg
