"""The pytorch-metric-learning 2.x modules that this library does not contain.

This library keeps 2.x's import name and the 2.x import paths of what it contains
(distances, testers, ``AccuracyCalculator``, ``MetricLossOnly``, ...). A 2.x training
script also imports losses, miners and the like; importing one of those here raises
:class:`~pytorch_metric_learning.errors.NotInThisLibraryError` (an ``ImportError``) that says
what the module was and where to read on, instead of Python's bare "cannot import name".
"""

from __future__ import annotations

from typing import NoReturn

from . import __version__
from .errors import NotInThisLibraryError

__all__ = ["MISSING_MODULES", "MISSING_TRAINERS", "raise_missing"]

ROOT = "pytorch_metric_learning"

# module (under pytorch_metric_learning) -> what it held in 2.x
MISSING_MODULES: dict[str, str] = {
    "losses": "the loss functions (ContrastiveLoss, TripletMarginLoss, ArcFaceLoss, ...)",
    "miners": "the miners (MultiSimilarityMiner, TripletMarginMiner, ...)",
    "reducers": "the loss reducers (MeanReducer, ThresholdReducer, ...)",
    "regularizers": "the embedding and weight regularizers (LpRegularizer, ...)",
    "samplers": "the batch samplers (MPerClassSampler, ...)",
    "datasets": "the dataset downloaders (CUB, Cars196, INaturalist2018, SOP)",
    "utils.loss_and_miner_utils": "the helpers of the losses and miners "
    "(get_all_pairs_indices, ...)",
    "utils.distributed": "the distributed wrappers of losses and miners "
    "(DistributedLossWrapper, DistributedMinerWrapper)",
    "utils.key_checker": "the checks of the trainers' dict arguments (KeyChecker, KeyCheckerDict)",
    "utils.loss_tracker": "the LossTracker that sums the trainers' weighted losses",
    "utils.module_with_records": "ModuleWithRecords, the base class of the losses and miners",
    "utils.module_with_records_and_reducer": "ModuleWithRecordsAndReducer and its "
    "distance variants, the base classes of the losses",
    "trainers.cascaded_embeddings": "the CascadedEmbeddings trainer",
    "trainers.deep_adversarial_metric_learning": "the DeepAdversarialMetricLearning trainer",
    "trainers.twostream_metric_loss": "the TwoStreamMetricLoss trainer",
    "trainers.unsupervised_embeddings_using_augmentations": "the "
    "UnsupervisedEmbeddingsUsingAugmentations trainer",
}

# 2.x's trainer class -> its module here (``from ...trainers import CascadedEmbeddings``)
MISSING_TRAINERS: dict[str, str] = {
    "CascadedEmbeddings": "trainers.cascaded_embeddings",
    "DeepAdversarialMetricLearning": "trainers.deep_adversarial_metric_learning",
    "TwoStreamMetricLoss": "trainers.twostream_metric_loss",
    "UnsupervisedEmbeddingsUsingAugmentations": (
        "trainers.unsupervised_embeddings_using_augmentations"
    ),
}


def raise_missing(module: str) -> NoReturn:
    """Raise the error for 2.x module ``module`` (its full name or its name under the root).

    Example:
        >>> raise_missing("losses")
        Traceback (most recent call last):
        ...
        pytorch_metric_learning.errors.NotInThisLibraryError: pytorch_metric_learning.losses ...
    """
    short = module.removeprefix(f"{ROOT}.")
    full = f"{ROOT}.{short}"
    raise NotInThisLibraryError(
        f"{full} is part of pytorch-metric-learning 2.x ({MISSING_MODULES[short]}) and is "
        f"not in this library. This is pytorch-metric-learning {__version__}, the evaluation "
        "stack (distances, k-NN search, AccuracyCalculator, MatchFinder, testers, "
        "MetricLossOnly and TrainWithClassifier); it replaces 2.x in an environment, since "
        "both use the import name pytorch_metric_learning. Keep 2.x in a separate virtual "
        "environment to train with its losses and miners; docs/migrating.md says what "
        "carries over and how.",
        name=full,
    )
