"""benchmarks/gpu_check.py without a GPU: the clean exit and the CPU dry run of its checks."""

from __future__ import annotations

import sys

import pytest
import torch

from ._scripts import load_script


@pytest.fixture(scope="module")
def gpu_check():
    return load_script("gpu_check")


def test_without_cuda_it_says_so_and_exits_cleanly(gpu_check, monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert "CUDA is not available" in capsys.readouterr().out


@pytest.mark.slow
def test_dry_run_passes_every_check_it_can_run_on_cpu(gpu_check, capsys) -> None:
    # This project stands in for 2.9.0: its utils.accuracy_calculator has 2.x's interface.
    assert gpu_check.main(["--dry-run", "--n", "600", "--pml29-python", sys.executable]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    status = {line.split()[1]: line.split()[0] for line in lines}
    assert status == {
        "custom_knn": "OK",
        "accuracy": "OK",
        "pml29": "OK",
        "faiss_rules": "SKIP",
        "gloo": "OK",
    }


def test_a_check_that_finds_a_difference_fails(gpu_check) -> None:
    distances = torch.tensor([[0.0, 1.0]])
    ok, _ = gpu_check.same_neighbours(
        (distances, torch.tensor([[3, 4]])), (distances, torch.tensor([[3, 5]]))
    )
    assert not ok
    ok, _ = gpu_check.same_neighbours(
        (distances, torch.tensor([[3, 4]])), (distances + 1, torch.tensor([[3, 4]]))
    )
    assert not ok


def test_a_check_that_raises_is_reported_and_the_others_run(gpu_check, monkeypatch, capsys):
    def broken(setup):
        raise RuntimeError("injected")

    monkeypatch.setattr(gpu_check, "CHECKS", (broken, gpu_check.check_faiss_rules))
    setup = gpu_check.Setup(torch.device("cpu"), 100, 4, 3, None, "gloo")
    results = gpu_check.run_checks(setup)
    assert [r.status for r in results] == ["FAIL", "SKIP"]
    assert "RuntimeError: injected" in results[0].detail
