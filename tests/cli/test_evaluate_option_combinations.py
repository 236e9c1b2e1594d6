"""Every incompatible option combination of ``pml-eval evaluate`` fails before the search,
with exit 2 and a message naming both options.

The class is enumerated two ways: a list of every known incompatible pair (each must name
both of its options), and every pair and triple of a table of options (each combination
either runs, or fails with exit 2 before any metric is computed, naming two options)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from pytorch_metric_learning.cli import evaluate

from .conftest import error_line
from .test_loaders import write


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    arrays = {
        "q": rng.normal(size=(12, 3)).astype(np.float32),
        "ql": rng.integers(0, 3, 12),
        "r": rng.normal(size=(20, 3)).astype(np.float32),
        "rl": rng.integers(0, 3, 20),
        "qg": rng.integers(0, 2, 12),
        "rg": rng.integers(0, 2, 20),
        "qc": rng.integers(0, 2, 12),
    }
    paths = {name: write(tmp_path / f"{name}.npy", array) for name, array in arrays.items()}
    (tmp_path / "images.txt").write_text("".join(f"{i}.png\n" for i in range(12)))
    paths["images"] = tmp_path / "images.txt"
    paths["plot"] = tmp_path / "worst.png"
    return paths


@pytest.fixture
def no_search(monkeypatch):
    """Record each search that runs (refusals must come before any)."""
    calls: list[int] = []
    real = evaluate.compute_metrics

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "compute_metrics", spy)
    return calls


def _argv(files, options, reference=True):
    base = ["evaluate", files["q"], "--labels", files["ql"]]
    if reference:
        base += ["--reference", files["r"], "--reference-labels", files["rl"]]
    return [*base, *[files.get(item, item) for item in options]]


# (options, the two options the message must name); files by their fixture key.
INCOMPATIBLE = [
    (["--single-gallery-shot", "--ci", "95", "--ci-method", "clopper_pearson",
      "--metrics", "recall_at_1"], ("--ci-method", "--single-gallery-shot")),
    (["--ci", "95", "--ci-method", "clopper_pearson", "--ci-by-class",
      "--metrics", "recall_at_1"], ("--ci-method", "--ci-by-class")),
    (["--ci", "95", "--ci-method", "clopper_pearson", "--metrics", "r_precision"],
     ("--ci-method", "--metrics")),
    (["--ci-method", "percentile"], ("--ci-method", "--ci")),
    (["--ci-by-class"], ("--ci-by-class", "--ci")),
    (["--ci", "95", "--per-class"], ("--ci", "--per-class")),
    (["--ci", "95", "--avg-of-avgs"], ("--ci", "--avg-of-avgs")),
    (["--per-class", "--avg-of-avgs"], ("--per-class", "--avg-of-avgs")),
    (["--query-categories", "qc", "--per-class"], ("--query-categories", "--per-class")),
    (["--images", "images"], ("--images", "--show-worst")),
    (["--plot", "plot"], ("--plot", "--show-worst")),
    (["--reference-images", "images"], ("--reference-images", "--show-worst")),
    (["--show-worst", "2", "--images", "images"], ("--images", "--plot")),
    (["--show-worst", "2", "--plot", "plot"], ("--images", "--plot")),
    (["--query-groups", "qg"], ("--query-groups", "--reference-groups")),
    (["--reference-groups", "rg"], ("--query-groups", "--reference-groups")),
    (["--worst-metric", "recall_at_1"], ("--worst-metric", "--show-worst")),
    (["--worst-k", "3"], ("--worst-k", "--show-worst")),
    (["--single-gallery-shot", "--knn", "torch_distributed"],
     ("--single-gallery-shot", "--knn")),
    (["--single-gallery-shot", "--metrics", "NMI,r_precision"],
     ("--single-gallery-shot", "--metrics")),
]  # fmt: skip
ONE_SET = [
    (["--reference-groups", "rg"], ("--reference-groups", "--reference")),
    (["--ref-includes-query"], ("--ref-includes-query", "--reference")),
]


@pytest.mark.parametrize(("options", "named"), INCOMPATIBLE + ONE_SET)
def test_each_incompatible_pair_fails_before_the_search_naming_both(
    cli, files, no_search, options, named
) -> None:
    reference = (options, named) not in ONE_SET
    result = cli(*_argv(files, options, reference))
    assert result.code == 2, result.err
    line = error_line(result.err)
    for option in named:
        assert option in line, (option, line)
    assert not no_search


# Options whose pairs and triples are tried (each a list of argv items).
TABLE = {
    "groups": ["--query-groups", "qg", "--reference-groups", "rg"],
    "single_shot": ["--single-gallery-shot"],
    "ci": ["--ci", "95", "--resamples", "20"],
    # with what each needs, so that the pairs reach the combinations that matter
    "clopper": ["--ci", "95", "--ci-method", "clopper_pearson", "--metrics", "recall_at_1"],
    "percentile": ["--ci", "95", "--ci-method", "percentile"],
    "ci_by_class": ["--ci-by-class"],
    "per_class": ["--per-class"],
    "avg": ["--avg-of-avgs"],
    "categories": ["--query-categories", "qc"],
    "worst": ["--show-worst", "2"],
    "worst_k": ["--worst-k", "2"],
    "k": ["--k", "3"],
    "zero_one": ["--metrics", "recall_at_1,precision_at_1"],
}
COMBINATIONS = [
    combo
    for size in (2, 3)
    for combo in itertools.combinations(TABLE, size)
    if not {"clopper", "percentile"} <= set(combo)
]


@pytest.mark.slow
def test_every_combination_runs_or_fails_before_the_search(cli, files, no_search) -> None:
    failures = []
    for combo in COMBINATIONS:
        no_search.clear()
        result = cli(*_argv(files, [item for name in combo for item in TABLE[name]]))
        if result.code == 0:
            continue
        line = result.err.strip().splitlines()[-1]
        if result.code != 2 or no_search or line.count("--") < 2:
            failures.append((combo, result.code, bool(no_search), line))
    assert not failures
