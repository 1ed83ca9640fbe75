import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff comes with the [dev] extra")
def test_ruff_clean():
    root = Path(__file__).resolve().parents[1]
    # --no-cache: a cached verdict outlives a move of packages (which imports are first-party)
    result = subprocess.run(["ruff", "check", "--no-cache", str(root)], capture_output=True, text=True,
                            cwd=root)
    assert result.returncode == 0, result.stdout
