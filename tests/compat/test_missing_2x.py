"""A 2.x script's imports of what this library lacks fail with an error that says why."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from pytorch_metric_learning.errors import NotInThisLibraryError, PMLError

# Written out here (not read from the library): 2.x's modules that are not in this one.
ABSENT_MODULES = [
    "losses",
    "miners",
    "reducers",
    "regularizers",
    "samplers",
    "utils.loss_and_miner_utils",
    "trainers.cascaded_embeddings",
    "trainers.deep_adversarial_metric_learning",
    "trainers.twostream_metric_loss",
    "trainers.unsupervised_embeddings_using_augmentations",
]
ABSENT_TRAINERS = [
    "CascadedEmbeddings",
    "DeepAdversarialMetricLearning",
    "TwoStreamMetricLoss",
    "UnsupervisedEmbeddingsUsingAugmentations",
]


def _check_message(error: BaseException, module: str) -> None:
    text = str(error)
    assert f"pytorch_metric_learning.{module}" in text
    assert "2.x" in text and "replaces 2.x" in text
    assert "docs/migrating.md" in text


@pytest.mark.parametrize("module", ABSENT_MODULES)
def test_importing_an_absent_2x_module_says_what_it_was(module: str) -> None:
    with pytest.raises(ImportError) as caught:
        importlib.import_module(f"pytorch_metric_learning.{module}")
    assert isinstance(caught.value, NotInThisLibraryError)
    assert isinstance(caught.value, PMLError)
    assert caught.value.name == f"pytorch_metric_learning.{module}"
    _check_message(caught.value, module)
    assert f"pytorch_metric_learning.{module}" not in sys.modules  # a retry fails again


@pytest.mark.parametrize("name", ABSENT_TRAINERS)
def test_from_trainers_import_an_absent_2x_trainer(name: str) -> None:
    with pytest.raises(ImportError) as caught:
        exec(f"from pytorch_metric_learning.trainers import {name}", {})
    assert isinstance(caught.value, NotInThisLibraryError)
    assert name in str(caught.value)


def test_the_trainers_that_are_here_still_import() -> None:
    from pytorch_metric_learning.trainers import BaseTrainer, MetricLossOnly, TrainWithClassifier

    assert {BaseTrainer.__name__, MetricLossOnly.__name__, TrainWithClassifier.__name__} == {
        "BaseTrainer",
        "MetricLossOnly",
        "TrainWithClassifier",
    }


def test_an_unknown_trainer_name_is_still_an_attribute_error() -> None:
    import pytorch_metric_learning.trainers as trainers

    with pytest.raises(AttributeError, match="NoSuchTrainer"):
        trainers.NoSuchTrainer  # noqa: B018


def test_the_first_line_of_a_2x_training_script() -> None:
    """As a user meets it: in a fresh interpreter, the traceback's last line explains."""
    code = "from pytorch_metric_learning import losses, miners, samplers"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pytorch_metric_learning.errors.NotInThisLibraryError: ")
    _check_message(SystemError(last), "losses")
