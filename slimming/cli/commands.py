"""What each subcommand does. ``parser.py`` parses the command line and turns mistakes into
one line; the functions here take the parsed arguments, call the library and print:
``slimming.training`` (``train(TrainConfig)``; ``runs``: device, outputs, the data a checkpoint
was trained on), ``slimming.tools`` (``prune_checkpoint``, sweep, export, report);
``pipeline.py`` is ``slimming pipeline``."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch
from torch import nn

from .. import models
from ..errors import DataError, SlimmingError, clip, first_line, listed
from ..io.checkpoint import save_checkpoint
from ..layers.removed import removed_layers
from ..measure.latency import CACHE_ENV, MeasuredLatency, cache_info, clear_cache, layer_latencies
from ..measure.stats import (
    channels_last_note,
    compare_stats,
    count_params,
    format_stats,
    input_size_of,
    latency_ms,
)
from ..pruning.gates import add_gates
from ..pruning.importance import get_importance
from ..pruning.repair import recalibrate_bn
from ..tools import plots
from ..tools.export import export_model
from ..tools.prune_checkpoint import prune_checkpoint
from ..tools.report import below_cut, build_report, write_report
from ..tools.sweep import parse_percents, sweep, write_sweep
from ..training.config import TrainConfig, finetune_lr
from ..training.engine import evaluate
from ..training.runs import (
    DEVICE_FLAGS,
    announce_device,
    check_classes,
    check_output,
    data_of,
    default_data,
    device_for,
    loaders,
    native_size,
    plain_args,
    read_checkpoint,
    trained_on,
)
from ..training.train import MakeModel, load_init, train
from ..utils.files import human_bytes, write_text

# --------------------------------------------------------------------------- train, finetune

def new_model(args) -> MakeModel:
    """How ``train`` makes the network the flags describe (``--arch``, ``--cfg``/``--depth`` or
    ``--model-kwargs``, ``--init``), once the data says its number of classes."""
    def make_model(num_classes: int, device: torch.device, data: dict):
        if args.num_classes is not None and args.num_classes != num_classes:
            raise SlimmingError(f"--num-classes {args.num_classes}, but the dataset has "
                                f"{num_classes} classes")
        if models.external.is_external(args.arch):
            size = data.get("image_size") or 32
            try:  # size on the meta device, then one forward (slimming.models.external): before any folder
                model = models.build(args.arch, num_classes=num_classes, kwargs=args.model_kwargs,
                                     input_size=[3, size, size])
            except ValueError as e:
                raise SlimmingError(f"--arch {clip(args.arch)}: {first_line(e, 400)}") from None
        else:
            options = {"num_classes": num_classes}
            if args.depth is not None and args.cfg is None:
                options["depth"] = args.depth
            model = models.build(args.arch, cfg=args.cfg, **options)
        if args.init is not None:
            load_init(model, args.init)
        if getattr(args, "gates", False) or getattr(args, "gates_everywhere", False):
            gated = add_gates(model, everywhere=getattr(args, "gates_everywhere", False))
            if int(os.environ.get("RANK", 0)) == 0:  # once under torchrun
                print(f"gates before {len(gated)} layers" + (f": {listed(gated)}" if gated else
                                                            " (every width has a scaling factor)"))
        return model, {}

    return make_model


def checkpoint_model(ckpt: dict, path, model: nn.Module) -> MakeModel:
    """How ``finetune`` starts: the network of checkpoint ``ckpt`` (read from ``path``), which
    the data must fit, carrying its masks and where it came from."""
    def make_model(num_classes: int, device: torch.device, data: dict):
        check_classes(ckpt, path, num_classes)
        source = {"path": str(path), "acc": ckpt.get("acc"), "source_acc": ckpt.get("source_acc")}
        return model, {"cfg_mask": ckpt.get("cfg_mask"), "source": source}

    return make_model


def cmd_train(args) -> None:
    train(TrainConfig.from_args(args), new_model(args), native=native_size(args.arch),
          record=plain_args(args))


def cmd_finetune(args) -> None:
    ckpt, model = read_checkpoint(args, args.checkpoint)  # on the CPU; the run moves it
    default_data(args, ckpt)
    if args.lr is None:  # by the fine-tune's length (parser.FINETUNE_LR)
        args.lr = finetune_lr(args.epochs)
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"learning rate {args.lr:g}, the default for a fine-tune of {args.epochs} epoch(s) "
                  "(--lr sets it)")
    run = train(TrainConfig.from_args(args), checkpoint_model(ckpt, args.checkpoint, model),
                native=native_size(ckpt["arch"]), record=plain_args(args))
    say_below_cut(args.checkpoint, run, args.lr, args.epochs)


def say_below_cut(pruned, run, lr: float, epochs: int, flag: str = "--lr") -> None:
    """One line on stderr (once under torchrun) where the fine-tune's best test accuracy is
    under the pruned network's right after the cut (``eval.json``, which ``slimming prune``
    writes beside ``pruned.pth``): it lost what the cut kept."""
    path = Path(pruned).parent / "eval.json"
    try:
        cut = json.loads(path.read_text())["acc"] if path.is_file() and path.stat().st_size < 4096 else None
    except (OSError, ValueError, KeyError, TypeError):
        return
    if int(os.environ.get("RANK", 0)) or not isinstance(cut, (int, float)) or not run.best_acc < cut:
        return
    print(f"note: fine-tuning ended below the accuracy right after the cut: its best {run.best_acc:.2f}% "
          f"against {cut:.2f}% ({path}); {flag} {lr:g} is likely too high for {epochs} epoch(s): try "
          f"{flag} {lr / 10:g}", file=sys.stderr)


# --------------------------------------------------------------------------- the other commands

def checkpoint_and_data(args, device: torch.device):
    """``--checkpoint`` rebuilt on ``device`` and the data it was trained on (the data flags
    override): (checkpoint, model, train loader, test loader)."""
    ckpt, model = read_checkpoint(args, args.checkpoint, device)
    default_data(args, ckpt)
    train_loader, test_loader, num_classes = loaders(args, device, image_size=native_size(ckpt["arch"]))
    check_classes(ckpt, args.checkpoint, num_classes)
    announce_device(args, device)
    return ckpt, model, train_loader, test_loader


def cmd_eval(args) -> dict:
    device = device_for(args)
    _, model, _, test_loader = checkpoint_and_data(args, device)
    m = evaluate(model.to(device), test_loader, device)
    print(f"{args.checkpoint}: top-1 accuracy {m['acc']:.2f}%  loss {m['loss']:.4f}  "
          f"({m['count']} test images of {args.dataset}, {count_params(model):,} parameters)")
    return m


def prune_warnings(model: nn.Module, result, min_channels: int, ask: str = "--percent") -> list[str]:
    """What to say before a fine-tune is spent on a pruning that cannot work well: layers the
    guard refilled (a model without sparsity, the library says itself). ``ask``: the flag that
    asked for the cut (``--percent``, ``--threshold``, ``--target-flops``, ``--target-params``)."""
    notes = []
    if result.guarded:
        names = ", ".join(result.guarded[:6]) + (", ..." if len(result.guarded) > 6 else "")
        smaller = {"--threshold": "a smaller --threshold", "--target-flops": "a larger budget",
                   "--target-params": "a larger budget"}.get(ask, "a smaller --percent")
        notes.append(f"{len(result.guarded)} layer(s) fell to the --min-channels guard and keep "
                     f"only their {min_channels} largest-|gamma| channel(s): {names}; that can "
                     f"cost much accuracy: try {smaller}")
    return notes  # the library itself warns of a model without sparsity (notes.little_sparsity)


def unaligned(model: nn.Module, pruned: nn.Module, multiple: int = 8) -> tuple[int, int]:
    """(layers the cut left at a width that is not a multiple of ``multiple``, layers it cut):
    convolutions and linear layers, by name, either side."""
    before = {n: m for n, m in model.named_modules() if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear))}
    odd = cut = 0
    for name, m in pruned.named_modules():
        if name in before and isinstance(m, (nn.modules.conv._ConvNd, nn.Linear)):
            old, new = (before[name].weight.shape[:2], m.weight.shape[:2])
            changed = [w for w, v in zip(new, old) if w != v]
            cut += bool(changed)
            odd += any(w % multiple for w in changed)
    return odd, cut


def shape_options(args) -> dict:
    """What every cut respects (``slimming.prune``'s keywords), from the flags."""
    return {"min_channels": args.min_channels, "round_to": args.round_to,
            "max_layer_prune": args.max_layer_prune, "compensate": args.compensate,
            "verify": getattr(args, "verify", True), "cut_heads": getattr(args, "cut_heads", True),
            "remove_branches": getattr(args, "remove_branches", True),
            "importance": get_importance(getattr(args, "importance", "bn-max"))}


def latency_options(args, device: torch.device) -> dict:
    """The timer of ``--target-latency`` and ``--round-to auto`` (``latency_model``), in the
    runtime and with the patience the flags give; none where nothing is timed."""
    if getattr(args, "target_latency", None) is None and args.round_to != "auto":
        return {}
    return {"latency_model": MeasuredLatency(device, runtime=args.latency_runtime,
                                             max_seconds=args.latency_seconds)}


def recalibrate(args, model: nn.Module, data, device: torch.device) -> None:
    """``--recalibrate-bn N``: the pruned network's BatchNorm statistics, re-estimated on N
    batches of ``data`` (the loaders of the checkpoint's data, or of the data flags given)."""
    seen = recalibrate_bn(model, data[0], args.recalibrate_bn, device)
    print(f"BatchNorm statistics re-estimated on {seen:,} training images ({args.dataset})" if seen
          else "no BatchNorm statistics to re-estimate (the network has no BatchNorm)")


def prune_data(args, ckpt: dict, device: torch.device):
    """The loaders ``prune`` reads after the cut: --recalibrate-bn needs them (an error if they
    do not read); the accuracy right after the cut takes them when at hand: the data flags
    given (an error too), or the checkpoint's own dataset where it already is (nothing is
    downloaded for it). None, and a line that says why, where they are not."""
    given = args.dataset is not None or args.data_root is not None or args.download
    named = trained_on(ckpt).get("dataset")
    default_data(args, ckpt)
    try:
        return loaders(args, device, image_size=native_size(ckpt["arch"]))
    except DataError:
        if given or args.recalibrate_bn:
            raise
        why = f"its data, {args.dataset}, is not under {args.data_root or 'the default folder'}" if named \
            else "the checkpoint does not say what it was trained on"
        print(f"accuracy right after the cut: not measured ({why}); to measure it, give --dataset and "
              "--data-root (--no-eval stops this line)")
        return None


def accuracy_after_cut(args, ckpt: dict, model: nn.Module, data, device: torch.device) -> dict:
    """The pruned network's test accuracy right after the cut, before any fine-tune, on the
    test split of ``data``, beside the checkpoint's own."""
    m = evaluate(model, data[1], device)
    was = ckpt.get("acc")
    before = f" (the checkpoint's: {was:.2f}%)" if isinstance(was, (int, float)) else ""
    print(f"accuracy right after the cut: {m['acc']:.2f}%{before}, on {m['count']:,} test images of "
          f"{args.dataset}; `slimming finetune` on the pruned model recovers what the cut cost")
    return m


def write_eval(folder, m: dict) -> None:
    """``folder``/eval.json: the accuracy right after the cut, which slimming report reads."""
    write_text(folder / "eval.json", json.dumps({k: m[k] for k in ("acc", "loss", "count")}))


def latency_lines(b) -> str:
    """What a latency budget (a ``LatencyBudget``) asked, achieved and cost, in a few lines."""
    t = b.table or {}
    where = f"{b.runtime} on {t['device']}, {t['threads']} thread(s), " if t else f"{b.runtime}, "
    of = f"{b.ratio:.3f} +- {b.ratio_spread:.3f} of the original"
    mss = f"{b.ms:.3g} +- {b.ms_spread:.2g} ms against its {b.original_ms:.3g} +- {b.original_spread:.2g} ms"
    if b.unit == "fraction":
        asked, got = f"{b.asked:g} of the original's ({b.target_ms:.3g} ms)", f"{of} ({mss}"
    else:
        asked = f"{b.target_ms:.3g} ms"
        got = f"{b.ms:.3g} +- {b.ms_spread:.2g} ms ({of}, {b.original_ms:.3g} ms"
    lines = [f"latency budget {asked}, at batch {b.batch} ({where}the fastest tenth of "
             f"{b.best.samples} interleaved samples each): achieved {got} in the same rounds), in "
             f"{len(b.rounds)} measured round(s)"]
    if not b.met:
        lines.append("the measured latency missed the budget by more than its spread (or 5%) after "
                     "correcting: the cut's steps are coarser than the budget's precision here")
    if t:
        kept = f", {t['size']} in {t['path']} (slimming cache --clear empties it)" if t.get("path") else ""
        noisy = f"; {t['noisy']} too noisy to keep" if t.get("noisy") else ""
        lines.append(f"latency table: {t['entries']} layer timings ({t['measured']} new, "
                     f"{t['seconds']:.1f} s{noisy}){kept}")
    return "\n".join(lines)


def retried(result) -> str:
    """One line: how many cuts the check (or the unchecked run) refused, and what each next
    cut kept (``result.retries``; the warnings say why)."""
    kept = "; ".join(f"{', '.join(r.modules[:3])}{' ...' if len(r.modules) > 3 else ''} "
                     f"({'heads and sizes kept' if r.kept == 'sizes' else 'every one kept whole'})"
                     for r in result.retries)
    n, by = len(result.retries), "the check" if result.retries[0].failed == "match" else "the run"
    return f"cut {n + 1} times: {n} refused ({by}), then {kept}"


def cmd_prune(args) -> None:
    out = args.save / "pruned.pth"
    check_output(out, args.overwrite)
    device = device_for(args)
    paper = {"arch": args.arch, "depth": args.depth} if getattr(args, "arch", None) else {}
    pruned = prune_checkpoint(args.checkpoint, device=device, **paper, percent=args.percent,
                              threshold=args.threshold, target_flops=args.target_flops,
                              target_params=args.target_params, target_latency=args.target_latency,
                              batch_size=args.latency_batch, **shape_options(args),
                              **latency_options(args, device))
    ckpt, model, result = pruned.source, pruned.original, pruned.result
    table = result.layer_table()
    announce_device(args, device)
    width = max(len(n) for n, _, _ in table)
    print(f"{'layer':<{width}}  before  after")
    for name, before, after in table:
        print(f"{name:<{width}}  {before:>6}  {after:>5}")
    before = sum(b for _, b, _ in table)
    after = sum(a for _, _, a in table)
    p0, p1 = count_params(model), count_params(result.model)
    thr = "none" if result.threshold is None else f"{result.threshold:.4g}"
    print(f"channels {before} -> {after} ({100 * (before - after) / before:.1f}% removed; "
          f"|gamma| threshold {thr}; scored by {getattr(args, 'importance', 'bn-max')})")
    if result.ranked is not None:  # what --percent counts, which the line above does not
        ranked, cut = result.ranked
        asked = f"; --percent {args.percent:g} asked {math.floor(args.percent * ranked + 1e-9)}" \
            if args.percent is not None else ""
        print(f"ranked {ranked} channels (one per channel that layers share; kept ones not ranked): "
              f"{cut} cut ({100 * cut / max(ranked, 1):.1f}%{asked})")
    print(f"parameters {p0:,} -> {p1:,} ({100 * p1 / p0:.1f}% kept)")
    b = result.budget
    if b is not None and b.what == "latency":
        print(latency_lines(b))
    elif b is not None:
        what = "FLOPs" if b.what == "flops" else "parameter"
        print(f"{what} budget {b.target:.4g} ({100 * b.target / b.full:.1f}% of "
              f"{b.full:.4g}): {b.achieved:.4g} achieved ({100 * b.achieved / b.full:.2f}%)")
    if isinstance(result.cfg, dict):  # a traced network: its widths per factor layer, in the file
        changed = sum(1 for _, b, a in table if a != b)
        gone = len(table) - len(result.cfg)  # gates fold into the layer after them at the cut
        held = f"; the file's cfg holds the widths of the {len(result.cfg)} left (the {gone} gates " \
            "fold into the layers they feed)" if gone > 0 else " (the file's cfg)"
        print(f"widths of {changed} of {len(table)} layers with a scaling factor changed{held}")
    else:
        print(f"cfg {result.cfg}")
    if result.retries:
        print(retried(result))
    if result.verified is not None:
        print(f"checked: equals the original with the cut channels zeroed (largest relative "
              f"difference {result.verified:.2g} on a random input), before compensation")
    if result.compensation.get("applied"):
        c = result.compensation
        print(f"compensation: the constant outputs of {c['folded']} cut channel inputs folded into "
              f"{c['layers']} layers" + (f"; {c['unfolded']} left as the paper leaves them (no bias "
                                          "and no BatchNorm right after the layer reading them)"
                                          if c["unfolded"] else ""))
    elif result.compensation.get("layers"):
        print("compensation: not applied: folding did not bring the pruned network closer to the "
              "original (its cut gammas at zero) on random images; the paper's cut is kept")
    evaluating = getattr(args, "eval", False)  # pipeline evaluates the saved file itself
    data = prune_data(args, ckpt, device) if args.recalibrate_bn or evaluating else None
    if args.recalibrate_bn:
        recalibrate(args, result.model, data, device)
    measured = accuracy_after_cut(args, ckpt, result.model, data, device) if evaluating and data else None
    ask = next((f"--{k.replace('_', '-')}" for k in ("percent", "threshold", "target_flops", "target_params",
                                                      "target_latency")
                if getattr(args, k) is not None), "--percent")
    for note in prune_warnings(model, result, args.min_channels, ask):
        print(f"slimming prune: warning: {note}", file=sys.stderr)
    odd, cut = unaligned(model, result.model)
    if odd and args.round_to is None:
        print(f"note: {odd} of the {cut} layers cut have widths that are not multiples of 8; onnxruntime "
              "(and some CPU kernels) run such widths slowly, at times slower than the unpruned network "
              "(docs/commands.md, Three limits): --round-to 8 keeps them aligned")
    save_checkpoint(pruned.checkpoint(data=data_of(ckpt), args=plain_args(args, leave_out=DEVICE_FLAGS)), out)
    if measured is not None:
        write_eval(args.save, measured)
    elif (args.save / "eval.json").is_file() and not (args.save / "eval.json").is_symlink():
        (args.save / "eval.json").unlink()  # it was another cut's
    print(f"saved {out}")


def cmd_stats(args) -> None:
    device = device_for(args)
    paths = [args.checkpoint] + ([args.compare] if args.compare else [])
    loaded = [read_checkpoint(args, path, device)[1] for path in paths]
    size = args.input_size or input_size_of(loaded[0])
    for model in loaded:
        models.check_input_size(model, size)
    announce_device(args, device)
    results = compare_stats([model.to(device).eval() for model in loaded], size, repeats=args.repeats)
    if args.layers:
        x = torch.zeros(1, *size, device=device)
        for model, r in zip(loaded, results):
            r["layers"] = [{"name": n, "in": i, "out": o, "ms": ms}
                           for n, i, o, ms in layer_latencies(model, (x,))]
            r["layers"] += [{"name": n, "in": 0, "out": 0, "ms": 0.0, "removed": what}  # a branch cut whole
                            for n, what in removed_layers(model, layers_only=True).items()]
    if args.json:
        print(json.dumps({str(p): r for p, r in zip(paths, results)}, indent=1))
        return
    print(f"checkpoint: {args.checkpoint}" + (f"\ncompare:    {args.compare}" if args.compare else ""))
    together = ", the two timed in turn (the ratio: the median of the rounds')" if args.compare else ""
    print(f"on {device}; FLOPs count a multiply-add as two (torch.utils.flop_counter); latency: the "
          f"fastest tenth of {args.repeats} runs under torch.inference_mode{together}, +- a 95% spread")
    print(format_stats(results[0], results[1] if args.compare else None, ("checkpoint", "compare")))
    if args.layers:
        print(layer_table(results))
    for path, r in zip(paths, results):
        note = channels_last_note(r)
        if note:
            print(f"{path}: {note}")


def layer_table(results: list[dict]) -> str:
    """Each layer's widths and latency alone (batch 1); with a second network, its beside it
    (matched by name) and the ratio."""
    other = {row["name"]: row for row in results[1]["layers"]} if len(results) > 1 else None
    width = max([len(row["name"]) for row in results[0]["layers"]] + [5])
    head = f"{'layer':<{width}}  {'widths':>11}  {'ms':>8}"
    lines = [head + (f"  {'compare':>11}  {'ms':>8}  ratio" if other is not None else "")]
    for row in results[0]["layers"]:
        line = f"{row['name']:<{width}}  {_widths(row)}  {row['ms']:>8.3f}"
        if other is not None and row["name"] in other:
            b = other[row["name"]]
            line += f"  {_widths(b)}  {b['ms']:>8.3f}  {b['ms'] / max(row['ms'], 1e-9):.2f}x"
        lines.append(line)
    total = [sum(row["ms"] for row in r["layers"]) for r in results]
    lines.append(f"{'sum':<{width}}  {'':>11}  {total[0]:>8.3f}" + (
        f"  {'':>11}  {total[1]:>8.3f}  {total[1] / max(total[0], 1e-9):.2f}x" if other is not None else ""))
    lines.append("(each layer timed alone on the input it sees, median of 5; the sum leaves out "
                 "what runs between layers" + ("; removed: a layer of a residual branch cut whole, which "
                                               "computes nothing or its bias)" if any(
                                                   "removed" in row for r in results for row in r["layers"])
                                               else ")"))
    return "\n".join(lines)


def _widths(row: dict) -> str:
    """A layer's widths in the table, in>out; "removed" for one a branch cut whole replaced."""
    return f"{'removed':>11}" if "removed" in row else f"{row['in']:>5}>{row['out']:<5}"


def cmd_sweep(args) -> None:
    axis, text = next(((a, v) for a, v in (("flops", args.target_flops), ("params", args.target_params),
                                           ("latency", args.target_latency)) if v is not None),
                      ("percent", args.percents or "0.1:0.9:0.1"))
    flag = {"percent": "--percents", "flops": "--target-flops", "params": "--target-params",
            "latency": "--target-latency"}[axis]
    points = parse_percents(text, flag)
    if axis != "percent" and 0 in points:
        raise SlimmingError(f"{flag}: a budget of 0 leaves nothing; give fractions in (0, 1)")
    check_output(args.save / "sweep.csv", False)
    device = device_for(args)
    _, model, train_loader, test_loader = checkpoint_and_data(args, device)
    options = {k: v for k, v in shape_options(args).items() if k != "min_channels"}
    options.update(latency_options(args, device) if axis == "latency" or args.round_to == "auto" else {})
    if axis == "latency":  # timed at --latency-batch images of the model's size, on its device
        options["example_inputs"] = torch.zeros(args.latency_batch, *input_size_of(model), device=device)
    repair = None
    if args.recalibrate_bn:
        def repair(m):
            recalibrate_bn(m, train_loader, args.recalibrate_bn, device)
    rows = sweep(model.to(device).eval(), test_loader, device, points, args.min_channels,
                 input_size_of(model), axis=axis, options=options, repair=repair)
    for r in rows:
        if r.get("acc") is None:  # a budget no cut reached
            print(f"{axis} {r['target']:<5g} missed: {r['missed']}")
            continue
        what = "unpruned     " if r.get("reference") else (
            f"percent {r['percent']:<5g}" if axis == "percent" else f"{axis} {r['target']:<5g}")
        latency = f"  latency {r['latency_ms']:.3g} +- {r['latency_ms_spread']:.2g} ms" \
            if "latency_ms" in r else ""
        if r.get("met") is False and axis == "latency":
            latency += (f" (missed: {r['latency_kept']:.3f} +- {r['latency_kept_spread']:.3f} of the "
                        "original's)")
        missed = "  (missed)" if r.get("met") is False and axis != "latency" else ""
        print(f"{what} params kept {100 * r['params_kept']:5.1f}%  FLOPs kept "
              f"{100 * r['flops_kept']:5.1f}%{missed}{latency}  top-1 {r['acc']:.2f}%")
    written = write_sweep(rows, args.save)
    print("wrote " + ", ".join(str(p) for p in written))
    if not plots.available():
        print(f"no sweep.png: {plots.MISSING}")


def cmd_export(args) -> None:
    check_output(args.out, args.overwrite, param="out")
    device = device_for(args)
    _, model = read_checkpoint(args, args.checkpoint, device)
    size = args.input_size or input_size_of(model)
    models.check_input_size(model, size)
    diff = export_model(model, args.out, args.format, size, atol=args.atol)
    announce_device(args, device)
    print(f"exported {args.out} ({args.format}, on {device}); largest difference from PyTorch on "
          f"a random batch: {diff:.3g} (tolerance {args.atol:g})")
    quick = {"latency_ms": {64: latency_ms(model, 64, size, repeats=5)},
             "latency_ms_channels_last": {64: latency_ms(model, 64, size, repeats=5, channels_last=True)}}
    note = channels_last_note(quick)
    if note:
        print(f"note: {note}")


def cmd_cache(args) -> None:
    folder, tables, size = cache_info()
    if args.clear:
        freed = clear_cache()
        print(f"removed {tables} latency table(s), {human_bytes(freed)}, from {folder}")
    else:
        print(f"{tables} latency table(s), {human_bytes(size)}, in {folder} (one per device, torch "
              f"version and thread count; set {CACHE_ENV} to keep them elsewhere; --clear empties it)")


def cmd_report(args) -> None:
    device = device_for(args)
    report = build_report(args.run, args.repeats, device, getattr(args, "arch", None))
    announce_device(args, device)
    written = write_report(report, args.run)
    print("wrote " + ", ".join(str(p) for p in written))
    if note := below_cut(report):
        print(f"note: {note}", file=sys.stderr)
    if not plots.available():
        print(f"text only: {plots.MISSING}")
