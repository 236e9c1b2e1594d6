"""``--ref-includes-query`` is checked against the files before any search, in the CLI's
own words: the option to drop, the files that differ, never the API's argument names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .conftest import assert_one_error

rng = np.random.default_rng(0)
QUERY = rng.standard_normal((6, 4)).astype(np.float32)
QUERY_LABELS = np.array([0, 1, 2, 0, 1, 2])
OTHERS = rng.standard_normal((9, 4)).astype(np.float32)
OTHER_LABELS = np.arange(9) % 3


def reference_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rows = np.concatenate([QUERY, OTHERS])
    labels = np.concatenate([QUERY_LABELS, OTHER_LABELS])
    moved = rows.copy()
    moved[2, 1] += 1.0
    relabelled = labels.copy()
    relabelled[4] = 2
    return {
        "a row differs": (moved, labels),
        "a label differs": (rows, relabelled),
        "query not first": (np.concatenate([OTHERS, QUERY]), np.concatenate([OTHER_LABELS, QUERY_LABELS])),
        "reference shorter": (QUERY[:4], QUERY_LABELS[:4]),
        "float16 rounding differs": (rows.astype(np.float16), labels),
    }  # fmt: skip


@pytest.mark.parametrize("case", sorted(reference_cases()))
def test_a_reference_that_does_not_start_with_the_query_is_refused(cli, tmp_path: Path, case):
    reference, reference_labels = reference_cases()[case]
    np.save(tmp_path / "q.npy", QUERY)
    np.save(tmp_path / "ql.npy", QUERY_LABELS)
    np.save(tmp_path / "r.npy", reference)
    np.save(tmp_path / "rl.npy", reference_labels)
    result = cli(
        "evaluate", tmp_path / "q.npy", "--labels", tmp_path / "ql.npy",
        "--reference", tmp_path / "r.npy", "--reference-labels", tmp_path / "rl.npy",
        "--ref-includes-query",
    )  # fmt: skip
    assert_one_error(result, 1, "--ref-includes-query")
    assert "r.npy" in result.err and "ref_includes_query" not in result.err


def test_a_float16_reference_that_starts_with_the_query_values_is_accepted(cli, tmp_path: Path):
    reference = np.concatenate([QUERY, OTHERS]).astype(np.float16)
    np.save(tmp_path / "q.npy", reference[: len(QUERY)].astype(np.float32))
    np.save(tmp_path / "ql.npy", QUERY_LABELS)
    np.save(tmp_path / "r.npy", reference)
    np.save(tmp_path / "rl.npy", np.concatenate([QUERY_LABELS, OTHER_LABELS]))
    result = cli(
        "evaluate", tmp_path / "q.npy", "--labels", tmp_path / "ql.npy",
        "--reference", tmp_path / "r.npy", "--reference-labels", tmp_path / "rl.npy",
        "--ref-includes-query",
    )  # fmt: skip
    assert result.code == 0, result.err
