"""``pml-eval demo``: the library's main job, end to end, on the UCI handwritten digits.

1. Split the 1,797 8x8 digit images that ship with scikit-learn into train, validation
   and test samples (60/20/20, stratified by digit, seeded).
2. Train a small embedding network (an MLP trunk and a linear embedder) with a supervised
   contrastive loss, using ``trainers.MetricLossOnly``; after every epoch the hooks of
   ``utils.logging_presets`` validate it with ``testers.GlobalEmbeddingSpaceTester``, record
   the results and keep the checkpoint with the best validation precision@1.
3. Reload the best checkpoint and score the test split with the tester.
4. Choose a verification threshold ("same digit or not?") on every pair of validation
   samples, and measure its decisions on every pair of test samples.
5. Write checkpoints, records, embeddings, scored pairs, ``results.json`` and plots.

Everything runs on the CPU, on one torch thread (the network is tiny), and needs no
network once installed: the core's ``demo`` extra (``pip install -e ".[demo]"`` in a clone)
brings scikit-learn (for the data) and matplotlib.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from .._atomic import atomic_write, atomic_write_text
from ..distances import CosineSimilarity
from ..errors import PMLError
from ..evaluation.retrieval.accuracy_calculator import AccuracyCalculator
from ..evaluation.search._install_hint import extra_install_hint
from ..testers import GlobalEmbeddingSpaceTester
from ..trainers import MetricLossOnly
from ..utils import logging_presets
from ._intervals import paper_recall
from ._output import format_table, write_json
from .parsers.demo import MARKER, check_output_folder

__all__ = [
    "DemoDependencyError",
    "DemoConfig",
    "DemoResult",
    "load_digit_splits",
    "supervised_contrastive_loss",
    "prepare_output",
    "run_demo",
    "run",
]

PRIMARY_METRIC = "precision_at_1"


class DemoDependencyError(PMLError, ModuleNotFoundError):
    """scikit-learn, which holds the demo's data set, is not installed."""


@dataclass
class DemoConfig:
    """What the demo does and where it writes.

    Attributes:
        output: The folder for every file the demo writes.
        epochs: Training epochs (the best one is kept).
        seed: Seeds the split, the initial weights and the batch order.
        batch_size: Training batch size.
        embedding_size: Dimensions of the embeddings.
        plots: Draw PNG plots (needs matplotlib).
        progress: Show progress bars on stderr.
        overwrite: Replace the files of an earlier run even if ``output`` was not
            written by the demo (by default, only a demo's own folder is reused).
        torch_threads: torch's intra-op threads while the demo runs (restored after);
            ``None`` keeps torch's setting. The network is tiny, so one thread is faster
            than a pool whose threads wait for each other, most of all on a busy machine
            (``benchmarks/demo.py``: 2.5 times less CPU time).
    """

    output: Path = Path("pml-demo")
    epochs: int = 20
    seed: int = 0
    batch_size: int = 128
    embedding_size: int = 32
    plots: bool = True
    progress: bool = True
    overwrite: bool = False
    torch_threads: int | None = 1


@dataclass
class DemoResult:
    """What the demo measured, and the files it wrote (name -> path)."""

    best_epoch: int
    epochs_run: int
    validation: dict[str, float]
    test: dict[str, float]
    threshold: dict[str, Any]
    seconds: float
    files: dict[str, Path] = field(default_factory=dict)
    recall: dict[str, dict[str, float]] = field(default_factory=dict)


def load_digit_splits(seed: int = 0) -> dict[str, TensorDataset]:
    """The UCI digits as ``{"train", "val", "test"}`` datasets of ``(pixels, digit)``.

    Pixels are scaled to [0, 1]. Each digit's samples are shuffled with ``seed`` and cut
    60/20/20, so every split holds every digit in the same proportions.

    Raises:
        DemoDependencyError: when scikit-learn is not installed.
    """
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError as error:
        raise DemoDependencyError(
            f"The demo reads the UCI digits that ship with scikit-learn, which is not "
            f"installed. Install it with: {extra_install_hint('demo')}",
            name="sklearn",
        ) from error
    digits = load_digits()
    pixels = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    labels = torch.tensor(digits.target, dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    parts: dict[str, list[torch.Tensor]] = {"train": [], "val": [], "test": []}
    for digit in labels.unique():
        rows = torch.nonzero(labels == digit).flatten()
        rows = rows[torch.randperm(len(rows), generator=generator)]
        cut_train, cut_val = round(0.6 * len(rows)), round(0.8 * len(rows))
        parts["train"].append(rows[:cut_train])
        parts["val"].append(rows[cut_train:cut_val])
        parts["test"].append(rows[cut_val:])
    splits = {}
    for name, chunks in parts.items():
        rows = torch.cat(chunks).sort().values
        splits[name] = TensorDataset(pixels[rows], labels[rows])
    return splits


def supervised_contrastive_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    indices_tuple: Any = None,
    temperature: float = 0.1,
) -> torch.Tensor:
    """Pull each sample towards the others of its class, away from the rest of the batch.

    For each anchor with at least one positive in the batch: the mean, over its positives,
    of ``-log softmax`` of the cosine similarities divided by ``temperature`` (the anchor
    itself left out). ``indices_tuple`` (a miner's output) is not used.

    Example:
        >>> labels = torch.tensor([0, 0, 1, 1])
        >>> close = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.1, 1.0]])
        >>> far = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0]])
        >>> bool(supervised_contrastive_loss(close, labels) < supervised_contrastive_loss(far, labels))
        True
    """
    unit = nn.functional.normalize(embeddings, dim=1)
    itself = torch.eye(len(unit), dtype=torch.bool, device=unit.device)
    logits = (unit @ unit.T / temperature).masked_fill(itself, float("-inf"))
    log_probability = logits - logits.logsumexp(dim=1, keepdim=True)
    positives = (labels[:, None] == labels[None, :]) & ~itself
    counts = positives.sum(dim=1)
    per_anchor = -log_probability.masked_fill(~positives, 0.0).sum(dim=1) / counts.clamp(min=1)
    return per_anchor[counts > 0].mean()


def _models(embedding_size: int) -> dict[str, nn.Module]:
    trunk = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
    return {"trunk": trunk, "embedder": nn.Linear(128, embedding_size)}


def _tester(hook: Any = None) -> GlobalEmbeddingSpaceTester:
    return GlobalEmbeddingSpaceTester(
        batch_size=512,
        dataloader_num_workers=0,
        data_device="cpu",
        accuracy_calculator=AccuracyCalculator(k="max_bin_count"),
        end_of_testing_hook=hook,
        progress_bar=False,
    )


def run_demo(config: DemoConfig) -> DemoResult:
    """Train, validate, test and choose a threshold; write every file under ``config.output``.

    Returns:
        The measurements and the paths of the written files.
    """
    check_output_folder(Path(config.output), config.overwrite)  # refuse before any work
    with _torch_threads(config.torch_threads):
        return _run_demo(config)


@contextmanager
def _torch_threads(count: int | None) -> Iterator[None]:
    previous = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _run_demo(config: DemoConfig) -> DemoResult:
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    splits = load_digit_splits(config.seed)
    output = Path(config.output)
    prepare_output(output, config.overwrite)
    files: dict[str, Path] = {}
    trainer, hooks, tester = _train(config, splits, output, files)
    best_epoch = hooks.load_best_saved_models(trainer, output / "models") or trainer.epoch
    models = trainer.models
    test_table = _only_metrics(
        _tester().test({"test": splits["test"]}, best_epoch, models["trunk"], models["embedder"])[
            "test"
        ]
    )
    validation = _accuracies_at(hooks, tester, best_epoch)
    embeddings = _embed_splits(splits, models, output, files)
    recall = {name: ci.as_dict() for name, ci in paper_recall(*embeddings["test"]).items()}
    threshold = _choose_threshold(embeddings, output, files)
    if config.plots:
        _draw(hooks, tester, best_epoch, threshold, embeddings, output, files)
    result = DemoResult(
        best_epoch=best_epoch,
        epochs_run=trainer.epoch,
        validation=validation,
        test=test_table,
        threshold=threshold,
        seconds=time.perf_counter() - started,
        files=files,
        recall=recall,
    )
    files["results"] = output / "results.json"
    write_json(files["results"], _as_record(result))
    return result


def prepare_output(folder: Path, overwrite: bool = False) -> None:
    """Make ``folder`` ready for a run: remove an earlier run's files, mark it as the demo's.

    A previous run's records and checkpoints must go, or the hooks would resume from them.
    They are removed only from a folder the demo marked as its own, or with ``overwrite``;
    anything else in the folder, and any file in its ``models``, ``logs`` and ``plots``
    folders that does not carry one of the demo's own names, is left alone.

    Raises:
        InvalidArgumentError: ``folder`` is a file, or holds files with the demo's names
            but is not a demo folder, and ``overwrite`` is false.
    """
    existing = check_output_folder(folder, overwrite)
    for path in existing:
        if path.is_dir() and not path.is_symlink():
            for own in _own_files_in(path):
                own.unlink()
        else:
            path.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        folder / MARKER, "Written by pml-eval demo; its files here are replaced on each run.\n"
    )


# The files the demo itself writes inside its folders; any other file there is the user's.
_OWN_FILES = {
    "models": re.compile(r"(?:trunk|embedder)[A-Za-z0-9_]*_(?:best)?[0-9]+\.pth"),
    "logs": re.compile(r"records\.db(?:-wal|-shm|-journal)?"),
    "plots": re.compile(r"(?:training_curves|threshold)\.png"),
}


def _own_files_in(folder: Path) -> list[Path]:
    """The files directly in one of the demo's folders that carry the demo's own names
    (its checkpoints, its records database, its plots): only these are replaced by a new
    run; a user's other files (and every subfolder) stay."""
    own = _OWN_FILES.get(folder.name)
    if own is None:
        return []
    return [
        path
        for path in folder.iterdir()
        if own.fullmatch(path.name) and path.is_file() and not path.is_symlink()
    ]


def _train(
    config: DemoConfig, splits: dict[str, TensorDataset], output: Path, files: dict[str, Path]
) -> tuple[MetricLossOnly, Any, GlobalEmbeddingSpaceTester]:
    files["models"], files["logs"] = output / "models", output / "logs"
    record_keeper, _, _ = logging_presets.get_record_keeper(files["logs"])
    hooks = logging_presets.get_hook_container(
        record_keeper, primary_metric=PRIMARY_METRIC, log_freq=1000
    )
    tester = _tester(hooks.end_of_testing_hook)
    validate = hooks.end_of_epoch_hook(tester, {"val": splits["val"]}, files["models"])
    models = _models(config.embedding_size)
    with _progress(config.epochs, config.progress) as bar:

        def end_of_epoch(trainer: MetricLossOnly) -> bool:
            keep_going = validate(trainer)
            value = _only_metrics(tester.all_accuracies["val"]).get(PRIMARY_METRIC, float("nan"))
            bar.set_postfix(loss=f"{trainer.losses['total_loss']:.3f}", val_p_at_1=f"{value:.3f}")
            bar.update(1)
            return keep_going

        trainer = MetricLossOnly(
            models=models,
            optimizers={
                f"{name}_optimizer": torch.optim.Adam(model.parameters(), lr=2e-3)
                for name, model in models.items()
            },
            batch_size=config.batch_size,
            loss_funcs={"metric_loss": supervised_contrastive_loss},
            mining_funcs={},
            dataset=splits["train"],
            dataloader_num_workers=0,
            data_device="cpu",
            end_of_iteration_hook=hooks.end_of_iteration_hook,
            end_of_epoch_hook=end_of_epoch,
        )
        trainer.train(num_epochs=config.epochs)
    return trainer, hooks, tester


@contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Any]:
    from tqdm import tqdm

    bar = tqdm(total=total, desc="training", unit="epoch", file=sys.stderr, disable=not enabled)
    try:
        yield bar
    finally:
        bar.close()


def _only_metrics(accuracies: dict[str, Any]) -> dict[str, float]:
    """``{"precision_at_1_level0": 0.9, "epoch": 3}`` -> ``{"precision_at_1": 0.9}``."""
    return {
        key.removesuffix("_level0"): float(value)
        for key, value in accuracies.items()
        if key != "epoch"
    }


def _accuracies_at(hooks: Any, tester: Any, epoch: int) -> dict[str, float]:
    history = hooks.get_accuracy_history(tester, "val", return_all_metrics=True)
    row = history["epoch"].index(epoch)
    return {
        key.removesuffix("_level0"): float(values[row])
        for key, values in history.items()
        if key != "epoch"
    }


def _embed_splits(
    splits: dict[str, TensorDataset],
    models: dict[str, Any],
    output: Path,
    files: dict[str, Path],
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Normalized embeddings of the validation and test splits, also saved as ``.npz``."""
    tester = _tester()
    embedded = {}
    for name in ("val", "test"):
        embeddings, labels = tester.get_all_embeddings(
            splits[name], models["trunk"], models["embedder"]
        )
        embedded[name] = (embeddings, labels[:, 0])
        files[f"{name}_embeddings"] = output / f"{name}_embeddings.npz"
        _save_npz(files[f"{name}_embeddings"], embeddings=embeddings, labels=labels[:, 0])
    return embedded


def _save_npz(path: Path, **tensors: torch.Tensor) -> None:
    arrays: dict[str, Any] = {name: tensor.numpy() for name, tensor in tensors.items()}
    atomic_write(path, lambda handle: np.savez(handle, **arrays))


def _all_pairs(
    embeddings: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every pair ``i < j``: both rows, their cosine similarity, and whether they match."""
    first, second = torch.triu_indices(len(labels), len(labels), offset=1)
    similarity = CosineSimilarity().pairwise(embeddings[first], embeddings[second])
    return embeddings[first], embeddings[second], similarity, labels[first] == labels[second]


def _choose_threshold(
    embedded: dict[str, tuple[torch.Tensor, torch.Tensor]],
    output: Path,
    files: dict[str, Path],
) -> dict[str, Any]:
    """F1-best threshold on validation pairs, then its decisions on test pairs."""
    from ..evaluation import MatchFinder, match_f1, select_threshold

    _, _, val_scores, val_same = _all_pairs(*embedded["val"])
    first, second, test_scores, test_same = _all_pairs(*embedded["test"])
    for name, scores, same in (("val", val_scores, val_same), ("test", test_scores, test_same)):
        files[f"{name}_pairs"] = output / f"{name}_pairs.npz"
        _save_npz(files[f"{name}_pairs"], scores=scores, labels=same)
    selection = select_threshold(val_scores, val_same, match_f1, is_inverted=True)
    finder = MatchFinder(CosineSimilarity(), threshold=selection.threshold)
    decided = finder.is_match(first, second)
    return {
        "metric": "f1",
        "threshold": selection.threshold,
        "validation_f1": selection.value,
        "validation_pairs": len(val_same),
        "test_pairs": len(test_same),
        "test": _decision_quality(decided, test_same),
    }


def _decision_quality(decided: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    tp = float((decided & truth).sum())
    fp = float((decided & ~truth).sum())
    fn = float((~decided & truth).sum())
    tn = float((~decided & ~truth).sum())
    true_match_rate, false_match_rate = tp / (tp + fn), fp / (fp + tn)
    return {
        "accuracy": (tp + tn) / (tp + fp + fn + tn),
        "balanced_accuracy": (true_match_rate + 1 - false_match_rate) / 2,
        "f1": 2 * tp / (2 * tp + fp + fn),
        "true_match_rate": true_match_rate,
        "false_match_rate": false_match_rate,
    }


def _draw(
    hooks: Any,
    tester: Any,
    best_epoch: int,
    threshold: dict[str, Any],
    embedded: dict[str, tuple[torch.Tensor, torch.Tensor]],
    output: Path,
    files: dict[str, Path],
) -> None:
    from .. import plots

    files["training_curves"] = plots.plot_training_curves(
        hooks.get_loss_history(["iteration", "total_loss"]),
        hooks.get_accuracy_history(tester, "val", return_all_metrics=True),
        output / "plots" / "training_curves.png",
        best_epoch=best_epoch,
        title="Training on the UCI digits",
    )
    _, _, scores, same = _all_pairs(*embedded["val"])
    files["threshold_plot"] = plots.plot_verification(
        scores,
        same,
        output / "plots" / "threshold.png",
        is_inverted=True,
        threshold=threshold["threshold"],
        title="Validation pairs (cosine similarity)",
    )


def _as_record(result: DemoResult) -> dict[str, Any]:
    return {
        "best_epoch": result.best_epoch,
        "epochs_run": result.epochs_run,
        "validation": result.validation,
        "test": result.test,
        "test_recall": result.recall,
        "threshold": result.threshold,
        "seconds": round(result.seconds, 2),
        "files": {name: str(path) for name, path in result.files.items()},
    }


# ---------------------------------------------------------------------------- command line


def run(args: argparse.Namespace) -> int:
    """Run the demo with the command line's settings, print its summary; return 0."""
    config = DemoConfig(
        output=Path(args.output),
        epochs=args.epochs or (2 if args.quick else DemoConfig.epochs),
        seed=args.seed,
        plots=not args.no_plots and _can_plot(),
        overwrite=args.overwrite,
        progress=sys.stderr.isatty(),
    )
    print(f"Training on the UCI digits for {config.epochs} epochs; writing to {config.output}/")
    started = getattr(args, "started", time.perf_counter())  # set by pml-eval's main
    result = run_demo(config)
    print(_summary(result, time.perf_counter() - started))
    return 0


def _can_plot() -> bool:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        hint = extra_install_hint("demo")
        print(f"pml-eval: note: matplotlib is not installed, so no plots ({hint}).")
        return False
    return True


def _summary(result: DemoResult, total: float) -> str:
    program = command_name()
    test = [[name, value] for name, value in sorted(result.test.items())]
    threshold, pairs = result.threshold, result.threshold["test"]
    lines = [
        "",
        f"Best validation {PRIMARY_METRIC}: {result.validation[PRIMARY_METRIC]:.4f} "
        f"at epoch {result.best_epoch} of {result.epochs_run}.",
        "",
        "Test split (each test digit searched among the other test digits):",
        format_table(["metric", "value"], test),
        "",
        "Recall@K as papers report it (95% bootstrap interval over the test queries):",
        format_table(["metric", "value", "95% interval"], _recall_rows(result.recall)),
        "",
        f"Verification threshold (cosine similarity, best F1 on {threshold['validation_pairs']} "
        f"validation pairs): {threshold['threshold']:.4f}",
        f"On {threshold['test_pairs']} test pairs: accuracy {pairs['accuracy']:.4f}, "
        f"F1 {pairs['f1']:.4f}, true match rate {pairs['true_match_rate']:.4f}, "
        f"false match rate {pairs['false_match_rate']:.4f}",
        "",
        f"Finished in {total:.1f} s since pml-eval started ({result.seconds:.1f} s of it "
        "loading the digits, training, scoring and plotting; the rest is start-up, mostly "
        "importing torch). Files:",
        *_file_lines(result.files),
        "",
        "Score the exported embeddings again from the command line:",
        f"  {program} evaluate {result.files['test_embeddings']} "
        f"--labels {result.files['test_embeddings']}",
        f"  {program} threshold {result.files['val_pairs']} --labels {result.files['val_pairs']} "
        "--similarity",
    ]
    return "\n".join(lines)


def command_name(argv0: str | None = None) -> str:
    """How to run ``pml-eval`` again as this run was started (``.venv/bin/pml-eval``, ...).

    A console script is named as it was typed, path included, so the advice works without
    activating the virtual environment; ``python -m`` runs get the interpreter's path.

    Example:
        >>> command_name(".venv/bin/pml-eval")
        '.venv/bin/pml-eval'
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    if Path(argv0).stem == "pml-eval":
        return shlex.quote(argv0)
    return f"{shlex.quote(sys.executable)} -m pytorch_metric_learning"


def _recall_rows(recall: dict[str, dict[str, float]]) -> list[list[Any]]:
    return [
        [name, ci["value"], f"[{ci['low']:.4f}, {ci['high']:.4f}]"] for name, ci in recall.items()
    ]


def _file_lines(files: dict[str, Path]) -> list[str]:
    described = {
        "results": "every number above, as JSON",
        "models": "checkpoints: the latest epoch and the best one",
        "logs": "records of losses and validation metrics (CSV files and records.db)",
        "val_embeddings": "validation embeddings and labels",
        "test_embeddings": "test embeddings and labels",
        "val_pairs": "validation pairs: cosine similarities and same-digit labels",
        "test_pairs": "test pairs",
        "training_curves": "plot: loss and validation metrics per epoch",
        "threshold_plot": "plot: F1 against the threshold, ROC and DET curves",
    }
    width = max(len(str(path)) for path in files.values())
    return [
        f"  {str(files[name]).ljust(width)}  {text}"
        for name, text in described.items()
        if name in files
    ]
