"""Group files of ``pml-eval evaluate``: kinds must agree, errors name the option, and a
camera rule that can exclude nothing is reported (as the API warns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pytorch_metric_learning.evaluation.retrieval.accuracy_calculator import AccuracyCalculator

from .test_loaders import write

RNG = np.random.default_rng(7)
LABELS = RNG.integers(0, 4, 12)
REF_LABELS = RNG.integers(0, 4, 20)
DATA = {
    "query": (RNG.normal(size=(12, 3)) + LABELS[:, None]).astype(np.float32),
    "labels": LABELS,
    "reference": (RNG.normal(size=(20, 3)) + REF_LABELS[:, None]).astype(np.float32),
    "ref_labels": REF_LABELS,
}
INT_QUERY, INT_REF = np.arange(12) % 3, np.arange(20) % 3
NAME_QUERY = np.array([f"c{g}" for g in INT_QUERY])
NAME_REF = np.array([f"c{g}" for g in INT_REF])


def _run(cli, tmp_path: Path, query_groups, ref_groups, suffix=".npy"):
    paths = {name: write(tmp_path / f"{name}.npy", array) for name, array in DATA.items()}
    qg = write(tmp_path / f"qg{suffix}", query_groups)
    rg = write(tmp_path / f"rg{suffix}", ref_groups)
    return cli(
        "evaluate", paths["query"], "--labels", paths["labels"],
        "--reference", paths["reference"], "--reference-labels", paths["ref_labels"],
        "--query-groups", qg, "--reference-groups", rg, "--metrics", "precision_at_1",
        "--output", "-",
    )  # fmt: skip


@pytest.mark.parametrize("suffix", [".npy", ".csv"])
@pytest.mark.parametrize(
    ("query_groups", "ref_groups"), [(INT_QUERY, NAME_REF), (NAME_QUERY, INT_REF)]
)
def test_ints_in_one_group_file_and_names_in_the_other_are_refused(
    cli, tmp_path: Path, query_groups, ref_groups, suffix
) -> None:
    result = _run(cli, tmp_path, query_groups, ref_groups, suffix)
    assert result.code == 1
    assert "--query-groups" in result.err and "--reference-groups" in result.err
    assert "integers" in result.err and "names" in result.err


@pytest.mark.parametrize(
    ("query_groups", "ref_groups"), [(INT_QUERY, INT_REF), (NAME_QUERY, NAME_REF)]
)
def test_groups_of_one_kind_are_accepted_without_warning(
    cli, tmp_path: Path, query_groups, ref_groups
) -> None:
    result = _run(cli, tmp_path, query_groups, ref_groups)
    assert result.code == 0, result.err
    assert "No query group occurs" not in result.err
    assert "No group id of --query-groups" not in result.err


def test_groups_that_never_meet_are_reported_naming_the_options(cli, tmp_path: Path) -> None:
    result = _run(cli, tmp_path, INT_QUERY, INT_REF + 10)
    assert result.code == 0, result.err
    warnings = [line for line in result.err.splitlines() if "excludes nothing" in line]
    assert len(warnings) == 1, result.err  # once, in the options' terms
    assert "--query-groups" in warnings[0] and "--reference-groups" in warnings[0]
    assert "'query_groups'" not in result.err


def test_the_api_warns_when_groups_never_meet() -> None:
    calculator = AccuracyCalculator(include=("precision_at_1",))
    tensors = {name: torch.from_numpy(array) for name, array in DATA.items()}
    args = (tensors["query"], tensors["labels"], tensors["reference"], tensors["ref_labels"])
    with pytest.warns(UserWarning, match="No query group occurs"):
        calculator.get_accuracy(
            *args,
            query_groups=torch.from_numpy(INT_QUERY),
            reference_groups=torch.from_numpy(INT_REF + 10),
        )


@pytest.mark.parametrize(
    ("query_groups", "ref_groups", "option"),
    [
        (INT_QUERY[:5], INT_REF, "--query-groups"),  # wrong length
        (INT_QUERY, INT_REF[:5], "--reference-groups"),
        (INT_QUERY, INT_REF + 0.5, "--reference-groups"),  # not whole numbers
        (INT_QUERY.reshape(4, 3), INT_REF, "--query-groups"),  # not 1-D
    ],
    ids=["query-length", "reference-length", "float", "2-D"],
)
def test_group_file_errors_name_the_option(
    cli, tmp_path: Path, query_groups, ref_groups, option
) -> None:
    result = _run(cli, tmp_path, query_groups, ref_groups)
    assert result.code == 1
    assert f"group ids ({option})" in result.err
    assert "The labels in" not in result.err


def test_bool_groups_are_refused_by_the_cli_and_the_api(cli, tmp_path: Path) -> None:
    result = _run(cli, tmp_path, INT_QUERY.astype(bool), INT_REF)
    assert result.code == 1
    assert "group ids (--query-groups)" in result.err and "bool" in result.err
    calculator = AccuracyCalculator(include=("precision_at_1",))
    tensors = {name: torch.from_numpy(array) for name, array in DATA.items()}
    with pytest.raises(ValueError, match="'query_groups'"):
        calculator.get_accuracy(
            tensors["query"],
            tensors["labels"],
            tensors["reference"],
            tensors["ref_labels"],
            query_groups=torch.from_numpy(INT_QUERY.astype(bool)),
            reference_groups=torch.from_numpy(INT_REF),
        )
