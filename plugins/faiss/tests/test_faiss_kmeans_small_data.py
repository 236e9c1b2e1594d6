"""Small data: faiss's raw "WARNING clustering" print is replaced by a Python warning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch

from pytorch_metric_learning_faiss import FaissKMeans

pytestmark = pytest.mark.faiss

FAISS_TEXT = "WARNING clustering"


def _points(rows: int) -> torch.Tensor:
    return torch.randn(rows, 4, generator=torch.Generator().manual_seed(0))


def test_the_capture_sees_faiss_printing(capfd: pytest.CaptureFixture[str]) -> None:
    """Control: raw faiss does print on small data, and capfd catches it."""
    faiss.Kmeans(4, 4, seed=0).train(_points(100).numpy())
    captured = capfd.readouterr()
    assert FAISS_TEXT in captured.out + captured.err


def test_small_data_warns_in_python_and_faiss_prints_nothing(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with pytest.warns(UserWarning, match=r"100 points into 4 clusters.*NMI and AMI") as caught:
        labels = FaissKMeans(seed=0)(_points(100), 4)
    captured = capfd.readouterr()
    assert FAISS_TEXT not in captured.out + captured.err
    assert "at least 156" in str(caught[0].message)  # faiss's default: 39 points per cluster
    assert labels.shape == (100,) and set(labels.tolist()) <= {0, 1, 2, 3}


def test_enough_data_does_not_warn(recwarn: pytest.WarningsRecorder) -> None:
    FaissKMeans(seed=0)(_points(39 * 2), 2)
    assert not [w for w in recwarn if "points per cluster" in str(w.message)]


def test_a_users_minimum_is_respected(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.warns(UserWarning, match="fewer than 60 points per cluster"):
        FaissKMeans(seed=0, min_points_per_centroid=60)(_points(100), 2)
    captured = capfd.readouterr()
    assert FAISS_TEXT not in captured.out + captured.err


def test_the_command_line_shows_it_as_a_warning_line(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.save(tmp_path / "q.npy", rng.normal(size=(100, 4)).astype(np.float32))
    np.save(tmp_path / "l.npy", rng.integers(0, 4, 100))
    command = [sys.executable, "-m", "pytorch_metric_learning", "evaluate", str(tmp_path / "q.npy")]
    command += ["--labels", str(tmp_path / "l.npy"), "--kmeans", "faiss", "--metrics", "NMI"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert FAISS_TEXT not in done.stdout + done.stderr
    assert "pml-eval: warning: FaissKMeans: clustering 100 points into 4 clusters" in done.stderr
