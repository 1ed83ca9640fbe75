"""Progress bars on the long steps (``slimming.utils.progress``): shown on a terminal only, off
under ``--quiet``, ``progress.quiet()`` and ``TQDM_DISABLE``; the prune's bar names its steps."""

import contextlib
import io
import sys
from unittest import mock

import pytest
import torch
from conftest import TINY_VGG, randomize_bn

import slimming
from slimming import models
from slimming.cli import main
from slimming.io.checkpoint import checkpoint_dict, save_checkpoint
from slimming.utils import progress


class Terminal(io.StringIO):
    """stderr as a terminal: tqdm draws its bars here."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """stderr a terminal in the test's body (pytest puts its own stderr back after a fixture's
    setup, so the test's call sets it: ``with terminal:``)."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    return On()


class On(Terminal):
    def __enter__(self):
        self.patch = mock.patch.object(sys, "stderr", self)
        self.patch.start()
        return self

    def __exit__(self, *exc):
        self.patch.stop()


def _model(seed: int = 0):
    torch.manual_seed(seed)
    model = models.build("vgg", cfg=TINY_VGG)
    randomize_bn(model, torch.Generator().manual_seed(seed), zero_frac=0.3)
    return model.eval()


@pytest.mark.parametrize("amount", [{"percent": 0.5}, {"target_flops": 0.6}])
def test_a_prune_on_a_terminal_names_its_steps(terminal, amount):
    with terminal:
        slimming.prune(_model(), surgery="graph", **amount)
    shown = terminal.getvalue()
    assert "prune:" in shown
    for step in ("trace", "cut", "check"):
        assert step in shown
    assert ("flops budget: trying" in shown) == ("target_flops" in amount)


@pytest.mark.parametrize("how", ["quiet", "env", "not a terminal"])
def test_no_bar_where_it_is_off(terminal, monkeypatch, how):
    model = _model(1)
    if how == "env":
        monkeypatch.setenv("TQDM_DISABLE", "1")
    elsewhere = mock.patch.object(sys, "stderr", io.StringIO()) if how == "not a terminal" \
        else contextlib.nullcontext()
    with terminal, elsewhere, progress.quiet(how == "quiet"):
        result = slimming.prune(model, percent=0.5, surgery="graph")
    assert terminal.getvalue() == ""
    bare = slimming.prune(_model(1), percent=0.5, surgery="graph")  # the bars change nothing else
    assert result.cfg == bare.cfg and result.threshold == bare.threshold


def test_steps_count_only_inside_them(terminal):
    with terminal:
        progress.at("nowhere")  # outside any steps(): nothing
    assert terminal.getvalue() == ""
    with terminal, progress.steps("outer") as outer:
        progress.at("a")
        with progress.steps("inner") as inner:
            progress.at("b")
            progress.at("c")
        progress.at("d")
    assert (outer.n, inner.n) == (2, 2)


def test_quiet_holds_inside_and_ends_with_its_block():
    with progress.quiet():
        with progress.quiet(False):  # an inner "not quiet" does not turn the outer off
            assert progress.is_quiet()
    assert not progress.is_quiet()


@pytest.mark.parametrize("quiet", [False, True])
def test_the_command_line_quiet_flag(terminal, tmp_path, quiet):
    path = tmp_path / "sparse.pth"
    save_checkpoint(checkpoint_dict(_model(2)), path)
    argv = ["prune", "--checkpoint", str(path), "--percent", "0.5", "--save", str(tmp_path / "out"),
            "--cpu", *(["--quiet"] if quiet else [])]
    with terminal:
        assert main(argv) == 0
    assert (tmp_path / "out" / "pruned.pth").exists()
    assert ("prune:" in terminal.getvalue()) != quiet


def test_quiet_also_stops_the_progress_lines_of_a_log(monkeypatch, capsys):
    from slimming.training import engine

    monkeypatch.setattr(engine, "PROGRESS_S", 0.0)  # a line every batch, where lines are on
    model = models.build("vgg", cfg=[4, "M", 4, "M", 4, "M", 4, "M", 8])
    opt = engine.make_optimizer(model, lr=0.01)
    trainer = engine.Trainer(model, opt, engine.make_scheduler(opt, 1), torch.device("cpu"))
    batches = [(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))) for _ in range(2)]
    trainer.train_one_epoch(batches)
    assert capsys.readouterr().out.count("train: batch") == 2
    with progress.quiet():
        trainer.train_one_epoch(batches)
    assert "train: batch" not in capsys.readouterr().out
