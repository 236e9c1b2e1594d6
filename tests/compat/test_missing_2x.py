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
    "datasets",
    "utils.loss_and_miner_utils",
    "utils.distributed",
    "utils.key_checker",
    "utils.loss_tracker",
    "utils.module_with_records",
    "utils.module_with_records_and_reducer",
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


# Every module of pytorch-metric-learning 2.9.0, from the file list of its wheel
# (pytorch_metric_learning-2.9.0-py3-none-any.whl), written out here.
MODULES_2X = """
datasets datasets.base_dataset datasets.cars196 datasets.cub datasets.inaturalist2018
datasets.sop
distances distances.base_distance distances.batched_distance distances.cosine_similarity
distances.dot_product_similarity distances.lp_distance distances.snr_distance
losses losses.angular_loss losses.arcface_loss losses.base_loss_wrapper
losses.base_metric_loss_function losses.circle_loss losses.contrastive_loss
losses.cosface_loss losses.cross_batch_memory losses.dynamic_soft_margin_loss
losses.fast_ap_loss losses.generic_pair_loss losses.histogram_loss losses.instance_loss
losses.intra_pair_variance_loss losses.large_margin_softmax_loss losses.lifted_structure_loss
losses.manifold_loss losses.margin_loss losses.mixins losses.multi_similarity_loss
losses.multiple_losses losses.n_pairs_loss losses.nca_loss losses.normalized_softmax_loss
losses.ntxent_loss losses.p2s_grad_loss losses.pnp_loss losses.proxy_anchor_loss
losses.proxy_losses losses.ranked_list_loss losses.self_supervised_loss
losses.signal_to_noise_ratio_losses losses.smooth_ap losses.soft_triple_loss
losses.sphereface_loss losses.subcenter_arcface_loss losses.supcon_loss losses.tcm_loss
losses.triplet_margin_loss losses.tuplet_margin_loss losses.vicreg_loss
miners miners.angular_miner miners.base_miner miners.batch_easy_hard_miner
miners.batch_hard_miner miners.distance_weighted_miner
miners.embeddings_already_packaged_as_triplets miners.hdc_miner miners.multi_similarity_miner
miners.pair_margin_miner miners.triplet_margin_miner miners.uniform_histogram_miner
reducers reducers.avg_non_zero_reducer reducers.base_reducer reducers.class_weighted_reducer
reducers.divisor_reducer reducers.do_nothing_reducer reducers.mean_reducer
reducers.multiple_reducers reducers.per_anchor_reducer reducers.sum_reducer
reducers.threshold_reducer
regularizers regularizers.base_regularizer regularizers.center_invariant_regularizer
regularizers.lp_regularizer regularizers.regular_face_regularizer
regularizers.sparse_centers_regularizer regularizers.zero_mean_regularizer
samplers samplers.fixed_set_of_triplets samplers.hierarchical_sampler
samplers.m_per_class_sampler samplers.tuples_to_weights_sampler
testers testers.base_tester testers.global_embedding_space
testers.global_twostream_embedding_space testers.with_same_parent_label
trainers trainers.base_trainer trainers.cascaded_embeddings
trainers.deep_adversarial_metric_learning trainers.metric_loss_only
trainers.train_with_classifier trainers.twostream_metric_loss
utils utils.accuracy_calculator utils.common_functions utils.distributed utils.inference
utils.key_checker utils.logging_presets utils.loss_and_miner_utils utils.loss_tracker
utils.module_with_records utils.module_with_records_and_reducer
""".split()  # noqa: SIM905 (a list as 2.x's file list reads)


@pytest.mark.parametrize("module", MODULES_2X)
def test_every_2x_module_imports_or_says_it_is_not_here(module: str) -> None:
    full = f"pytorch_metric_learning.{module}"
    try:
        importlib.import_module(full)
    except NotInThisLibraryError as error:
        # the module itself, or the 2.x package that held it (losses.arcface_loss: losses)
        assert error.name is not None
        assert full == error.name or full.startswith(f"{error.name}.")
        _check_message(error, error.name.removeprefix("pytorch_metric_learning."))
    else:
        assert full in sys.modules


def test_the_2x_path_of_the_two_stream_tester() -> None:
    from pytorch_metric_learning.testers import GlobalTwoStreamEmbeddingSpaceTester
    from pytorch_metric_learning.testers.global_twostream_embedding_space import (
        GlobalTwoStreamEmbeddingSpaceTester as Tester2x,
    )

    assert Tester2x is GlobalTwoStreamEmbeddingSpaceTester


@pytest.mark.parametrize("name", ["distributed", "module_with_records", "key_checker"])
def test_from_utils_import_an_absent_2x_module(name: str) -> None:
    with pytest.raises(NotInThisLibraryError, match=f"pytorch_metric_learning.utils.{name}"):
        exec(f"from pytorch_metric_learning.utils import {name}", {})
