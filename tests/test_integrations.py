"""Sparsity training inside other trainers (issue 48): ``slimming.integrations``. Each trainer
takes one optimizer step over two accumulated batches, once plain and once with slimming's
hook; the two runs start alike and see the same batches, so the L1 step is the whole
difference: the scaling factors moved by exactly ``lr * strength * sign(gamma)`` more (once per
optimizer step, not per batch; on unscaled gradients), every other parameter the same.

Ultralytics (AGPL) is never imported: its trainer is written here the way Ultralytics 8 writes
``BaseTrainer`` (a GradScaler, ``accumulate``, ``optimizer_step`` unscaling, clipping, stepping
and updating the EMA; ``get_model`` building from a config and loading the weights that fit).
Hugging Face's and Lightning's own trainers run where installed."""

import copy
import math
import warnings

import pytest
import torch
from torch import nn

import slimming
from slimming.errors import SlimmingError
from slimming.integrations.ultralytics import sparse_trainer

LR, STRENGTH = 0.1, 0.01


class Detect(nn.Module):
    """A detection head of its own type, as Ultralytics' ``Detect``: ignored by type."""

    def __init__(self, c: int):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, 6, 1, bias=False), nn.BatchNorm2d(6)

    def forward(self, x):
        return self.bn(self.conv(x))


class TinyDetector(nn.Module):
    """Built from a config (``{"width": w}``), as Ultralytics builds a model from its yaml."""

    def __init__(self, cfg: dict):
        super().__init__()
        w = cfg["width"]
        self.model = nn.Sequential(nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.SiLU(),
                                   nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.SiLU(),
                                   Detect(w))

    def forward(self, x):
        return self.model(x)


class ModelEMA:
    def __init__(self, model: nn.Module, decay: float = 0.9):
        self.ema, self.decay = copy.deepcopy(model).eval(), decay

    @torch.no_grad()
    def update(self, model: nn.Module):
        for e, p in zip(self.ema.state_dict().values(), model.state_dict().values()):
            if e.dtype.is_floating_point:
                e.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)


class BaseTrainer:
    """Ultralytics 8's ``BaseTrainer`` in small: the same step, the same places."""

    def __init__(self, overrides: dict):
        self.args = dict(overrides)
        self.model, self.ema, self.last_opt_step, self.steps = None, None, -1, 0

    def get_model(self, cfg=None, weights=None, verbose=True):
        model = TinyDetector(cfg)
        if weights is not None:  # Ultralytics' intersect_dicts: what fits is loaded, the rest dropped
            own = model.state_dict()
            model.load_state_dict({k: v for k, v in weights.state_dict().items()
                                   if k in own and own[k].shape == v.shape}, strict=False)
        return model

    def _setup_train(self):
        torch.manual_seed(0)
        self.model = self.get_model(self.args["model"], self.args.get("weights"))
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)  # gradients scaled, as under AMP
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)
        self.ema, self.accumulate = ModelEMA(self.model), self.args.get("accumulate", 2)

    def train(self):
        self._setup_train()
        g = torch.Generator().manual_seed(1)
        for ni in range(self.args.get("batches", 2)):
            x = torch.randn(4, 3, 8, 8, generator=g)
            loss = (self.model(x) - 0.5).square().mean()
            self.scaler.scale(loss).backward()
            if ni - self.last_opt_step >= self.accumulate:
                self.optimizer_step()
                self.last_opt_step = ni
        return self

    def optimizer_step(self):
        self.scaler.unscale_(self.optimizer)  # unscale gradients
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=1e6)  # clip gradients
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        self.steps += 1
        if self.ema:
            self.ema.update(self.model)


def moved_by_l1(plain: nn.Module, sparse: nn.Module, start: nn.Module, steps: int, ignored=()) -> None:
    """Every BatchNorm gamma of ``sparse`` (but ``ignored`` ones) is ``plain``'s less ``steps``
    L1 steps of ``LR * STRENGTH * sign``; everything else is the same."""
    names = {f"{n}.weight" for n, m in sparse.named_modules() if isinstance(m, nn.BatchNorm2d)
             and not n.startswith(ignored)}
    assert names
    p, s, w0 = plain.state_dict(), sparse.state_dict(), start.state_dict()
    for key in p:
        want = p[key] - steps * LR * STRENGTH * torch.sign(w0[key]) if key in names else p[key]
        assert torch.allclose(s[key], want, atol=1e-6), key


def test_an_ultralytics_style_trainer_makes_the_factors_sparse_once_a_step_after_unscaling():
    cfg = {"model": {"width": 8}, "accumulate": 2, "batches": 2}
    plain = BaseTrainer(cfg).train()
    sparse = sparse_trainer(BaseTrainer, STRENGTH, ignore=Detect)(cfg).train()
    assert type(sparse).__name__ == "SparseBaseTrainer" and plain.steps == sparse.steps == 1
    torch.manual_seed(0)
    start = TinyDetector(cfg["model"])
    moved_by_l1(plain.model, sparse.model, start, 1, ignored=("model.6",))  # the head, ignored by type
    assert sparse.sparsity.params and "unscale_" not in vars(sparse.scaler)  # the scaler as it was
    ema_plain, ema_sparse = plain.ema.ema.state_dict(), sparse.ema.ema.state_dict()
    assert not torch.equal(ema_plain["model.1.weight"], ema_sparse["model.1.weight"])  # the EMA follows


def test_four_batches_accumulated_by_two_take_two_l1_steps():
    cfg = {"model": {"width": 8}, "accumulate": 2, "batches": 4}
    trainer = sparse_trainer(BaseTrainer, 0.0)(cfg).train()
    assert trainer.steps == 2 and len(trainer.sparsity.params) == 3  # the head's norm too: nothing ignored


def test_the_pruned_model_fine_tunes_in_the_trainer_with_its_own_widths(tmp_path):
    """docs/python.md's recipe: ``get_model`` overridden to load the pruned file onto the model
    the config builds; the trainer's own ``get_model`` would drop every weight that no longer fits."""
    torch.manual_seed(0)
    net = TinyDetector({"width": 8}).eval()
    with torch.no_grad():
        net.model[1].weight[:5] = 0
    result = slimming.prune(net, threshold=1e-3, example_inputs=torch.zeros(1, 3, 8, 8), ignore=Detect)
    slimming.save_pruned(result.model, tmp_path / "slim.pth")

    class FineTune(BaseTrainer):
        def get_model(self, cfg=None, weights=None, verbose=True):
            return slimming.load_pruned(tmp_path / "slim.pth", TinyDetector(cfg))

    trainer = sparse_trainer(FineTune, STRENGTH)({"model": {"width": 8}}).train()
    assert trainer.model.model[0].out_channels == 3 and trainer.steps == 1
    dropped = BaseTrainer({"model": {"width": 8}, "weights": result.model})
    dropped._setup_train()
    assert dropped.model.model[0].out_channels == 8  # what fine-tuning without the recipe trains


def test_a_trainer_that_does_not_unscale_and_a_non_trainer_are_refused():
    class NoScaler(BaseTrainer):
        def optimizer_step(self):
            self.optimizer.step()

    with pytest.raises(SlimmingError, match="never called self.scaler.unscale_"):
        sparse_trainer(NoScaler, STRENGTH)({"model": {"width": 8}}).train()
    with pytest.raises(SlimmingError, match="trainer class"):
        sparse_trainer(TinyDetector({"width": 4}), STRENGTH)
    with pytest.raises(SlimmingError, match="strength"):
        sparse_trainer(BaseTrainer, math.nan)


class LossModel(nn.Module):
    """A Hugging Face-style model: keyword inputs, a dict with its loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))

    def forward(self, pixel_values, labels=None):
        logits = self.net(pixel_values)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Pictures(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 2, (8,), generator=g)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def test_a_hugging_face_trainer_with_the_callback(tmp_path):
    transformers = pytest.importorskip("transformers")
    from slimming.integrations.huggingface import SparsityCallback

    def run(callbacks):
        model = LossModel()
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
            max_steps=1, learning_rate=LR, lr_scheduler_type="constant", optim="sgd", weight_decay=0.0,
            max_grad_norm=0.0, report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
            dataloader_num_workers=0, disable_tqdm=True, seed=0)
        transformers.Trainer(model, args, train_dataset=Pictures(), callbacks=callbacks).train()
        return model

    callback = SparsityCallback(STRENGTH)
    moved_by_l1(run([]), run([callback]), LossModel(), 1)
    assert len(callback.sparsity.params) == 1
    with pytest.raises(SlimmingError, match="add_gates"):
        run([SparsityCallback(STRENGTH, ignore="net")])


def test_a_lightning_trainer_with_the_callback():
    lightning = pytest.importorskip("lightning")
    from slimming.integrations.lightning import SparsityCallback

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = LossModel()

        def training_step(self, batch, i):
            return self.model(**batch)["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    def run(callbacks):
        module = Module()
        trainer = lightning.Trainer(max_steps=1, accumulate_grad_batches=2, accelerator="cpu", devices=1,
                                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                    enable_model_summary=False, callbacks=callbacks)
        trainer.fit(module, torch.utils.data.DataLoader(Pictures(), batch_size=4))
        return module.model

    callback = SparsityCallback(STRENGTH)
    moved_by_l1(run([]), run([callback]), LossModel(), 1)
    assert len(callback.sparsity.params) == 1


def vit_with_gates(transformers, heads: bool):
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2,
                                    num_attention_heads=3, intermediate_size=96, num_labels=10)
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(config).eval()
    slimming.add_gates(model, torch.zeros(1, 3, 32, 32), heads=heads)
    return model


def gate_cut(model: nn.Module, per_layer: list[int], head: bool = False) -> None:
    """The MLP gate of layer i cut at its first ``per_layer[i]`` channels; with ``head``, the
    first head of layer 0 too."""
    from slimming.layers.rules import ChannelGate
    mlp = [m for n, m in model.named_modules() if isinstance(m, ChannelGate) and "fc2" in n]
    heads = [m for n, m in model.named_modules() if isinstance(m, ChannelGate) and "fc2" not in n]
    with torch.no_grad():
        for gate, n in zip(mlp, per_layer):
            gate.weight.view(-1)[:n] = 1e-4
        if head:
            heads[0].weight.view(-1)[0] = 1e-4


@pytest.mark.parametrize("case", ["uniform", "per layer", "a head"])
def test_a_hugging_face_model_saves_as_hugging_face_where_its_config_can_say_the_cut(case, tmp_path):
    """Issue 48, item 3: an MLP cut alike in every layer sets ``config.intermediate_size`` on the
    pruned model (the original's config unchanged), so ``save_pretrained`` and ``from_pretrained``
    round-trip it; widths the config cannot say (per layer; a head cut where ViT derives the
    head size from ``hidden_size``) leave it as it was, with one warning naming save_pruned."""
    transformers = pytest.importorskip("transformers")
    model = vit_with_gates(transformers, heads=case == "a head")
    gate_cut(model, [40, 40] if case != "per layer" else [40, 20], head=case == "a head")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = slimming.prune(model, threshold=1e-3, example_inputs=torch.zeros(1, 3, 32, 32),
                                output_transform=lambda out: out.logits)
    notes = [str(w.message) for w in said if "model.config" in str(w.message)]
    assert model.config.intermediate_size == 96 and model.config.num_attention_heads == 3
    if case != "uniform":
        assert len(notes) == 1 and "slimming.save_pruned" in notes[0]
        assert result.model.config.intermediate_size == 96
        assert ("[56, 76]" in notes[0]) == (case == "per layer")
        return
    assert notes == [] and result.model.config.intermediate_size == 56
    assert all(m.config is result.model.config for m in result.model.modules() if hasattr(m, "config"))
    result.model.save_pretrained(tmp_path)
    again = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(again(x).logits, result.model(x).logits)
