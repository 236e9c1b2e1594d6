"""2.x user code that trains with ``utils.logging_presets``: the 2.x HookContainer methods
and get_record_keeper's 2.x signature, checked against nearest neighbours found by a plain
loop in this file."""

import inspect
import math
import os
import re
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

from pytorch_metric_learning import testers, trainers
from pytorch_metric_learning.errors import (
    InvalidArgumentError,
    MetricNotRecordedError,
    ResumeError,
)
from pytorch_metric_learning.utils import logging_presets
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

VAL_X = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [0.8, 0.6]])
VAL_Y = torch.tensor([0, 0, 1, 1, 1])
KEY = "precision_at_1_level0"
# The trunk's weights during each epoch: accuracy 0.8, 1.0, 0.8, 0.8 (see the oracle).
WEIGHTS = {1: torch.eye(2), 2: torch.diag(torch.tensor([1.0, 3.0]))}


def weights_of(epoch):
    return WEIGHTS.get(epoch, torch.eye(2))


def precision_at_1_by_loop(weight):
    """Cosine nearest neighbour of each point among the others, by a plain loop."""
    points = [weight @ x for x in VAL_X]
    points = [p / p.norm() for p in points]
    correct = 0
    for i, p in enumerate(points):
        sims = [(float(p @ q), j) for j, q in enumerate(points) if j != i]
        correct += int(VAL_Y[max(sims)[1]] == VAL_Y[i])
    return correct / len(points)


def trunk_files(folder):
    return sorted(
        name
        for name in os.listdir(folder)
        if re.fullmatch(r"trunk_\w*\d+\.pth", name) and "optimizer" not in name
    )


def spread_loss(embeddings, labels, indices_tuple):
    return -torch.pdist(embeddings).mean()


def train_as_2x_docs(tmp_path, num_epochs=10, patience=1):
    """The training loop of 2.x's documentation, with a trunk whose weights are set for
    each epoch (lr=0, so training itself changes nothing)."""
    trunk = torch.nn.Linear(2, 2, bias=False)
    models = {"trunk": trunk, "embedder": torch.nn.Identity()}
    optimizers = {"trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.0)}
    train_dataset = TensorDataset(VAL_X.repeat(4, 1), VAL_Y.repeat(4))
    record_keeper, _, _ = logging_presets.get_record_keeper(str(tmp_path / "example_logs"), None)
    hooks = logging_presets.get_hook_container(record_keeper, primary_metric="precision_at_1")
    dataset_dict = {"val": TensorDataset(VAL_X, VAL_Y)}
    model_folder = str(tmp_path / "example_saved_models")
    tester = testers.GlobalEmbeddingSpaceTester(
        end_of_testing_hook=hooks.end_of_testing_hook,
        dataloader_num_workers=0,
        accuracy_calculator=AccuracyCalculator(include=("precision_at_1",), k="max_bin_count"),
    )
    end_of_epoch_hook = hooks.end_of_epoch_hook(
        tester, dataset_dict, model_folder, test_interval=1, patience=patience
    )

    def set_weights_then_test(trainer):
        with torch.no_grad():
            trunk.weight.copy_(weights_of(trainer.epoch))
        return end_of_epoch_hook(trainer)

    trainer = trainers.MetricLossOnly(
        models,
        optimizers,
        5,
        {"metric_loss": spread_loss},
        train_dataset,
        mining_funcs={},
        dataloader_num_workers=0,
        end_of_iteration_hook=hooks.end_of_iteration_hook,
        end_of_epoch_hook=set_weights_then_test,
    )
    trainer.train(num_epochs=num_epochs)
    return SimpleNamespace(
        hooks=hooks,
        tester=tester,
        trainer=trainer,
        trunk=trunk,
        folder=model_folder,
        dataset_dict=dataset_dict,
    )


@pytest.fixture
def run(tmp_path):
    return train_as_2x_docs(tmp_path)


def test_the_oracle_gives_the_planned_accuracies():
    assert [precision_at_1_by_loop(weights_of(e)) for e in (1, 2, 3, 4)] == [0.8, 1.0, 0.8, 0.8]


def test_training_stops_after_patience_and_keeps_the_best_epoch(run):
    # best epoch 2; patience 1: epoch 4 is the first with epoch - best > 1.
    assert run.trainer.epoch == 4
    assert run.hooks.get_best_epoch_and_accuracy(run.tester, "val") == (2, 1.0)
    assert trunk_files(run.folder) == ["trunk_4.pth", "trunk_best2.pth"]


def test_get_best_epoch_and_accuracy_ignore_epoch(run):
    hooks, tester = run.hooks, run.tester
    # Without epoch 2, the first of the tied 0.8 epochs wins, as in 2.x.
    assert hooks.get_best_epoch_and_accuracy(tester, "val", ignore_epoch=(2,)) == (1, 0.8)
    assert hooks.get_best_epoch_and_accuracy(tester, "val", ignore_epoch=(1, 2)) == (3, 0.8)
    assert hooks.get_best_epoch_and_accuracy(tester, "val", (1, 2, 3, 4)) == (None, 0)
    assert hooks.get_best_epoch_and_accuracy(tester, "val", ignore_epoch=[-1]) == (2, 1.0)


def test_get_accuracies_of_epoch(run):
    hooks, tester = run.hooks, run.tester
    assert hooks.get_accuracies_of_epoch(tester, "val", 3, select_all=False) == [
        {"epoch": 3, KEY: 0.8}
    ]
    assert hooks.get_accuracies_of_epoch(tester, "val", 2) == [{"epoch": 2, KEY: 1.0}]
    assert hooks.get_accuracies_of_epoch(tester, "val", 7) == []
    assert hooks.get_accuracies_of_epoch(tester, "train", 1) == []  # never recorded


def test_get_accuracies_of_best_epoch(run):
    hooks, tester = run.hooks, run.tester
    rows, key = hooks.get_accuracies_of_best_epoch(tester, "val", select_all=False)
    assert (rows, key) == ([{"epoch": 2, KEY: 1.0}], KEY)
    rows, key = hooks.get_accuracies_of_best_epoch(tester, "val", ignore_epoch=(2,))
    assert [row["epoch"] for row in rows] == [1, 3, 4] and key == KEY
    assert hooks.get_accuracies_of_best_epoch(tester, "test") == ([], None)


def test_current_metric_and_is_new_best(run):
    hooks, tester = run.hooks, run.tester
    assert hooks.get_curr_primary_metric(tester, "val") == pytest.approx(0.8)  # epoch 4
    assert hooks.is_new_best_accuracy(tester, "val", 4) == (False, pytest.approx(0.8), 2, 1.0)
    # Epoch 2 against the others: it beats every one of them.
    tester.all_accuracies = {"val": {"epoch": 2, KEY: 1.0}}
    assert hooks.is_new_best_accuracy(tester, "val", 2) == (True, 1.0, 2, 1.0)


def test_try_keys_tries_the_average_key_first(run):
    hooks, tester = run.hooks, run.tester
    seen = []

    def lookup(key):
        seen.append(key)
        return tester.all_accuracies["val"][key]

    assert hooks.try_keys(["precision_at_1"], tester, lookup) == pytest.approx(0.8)
    assert seen == ["AVERAGE_precision_at_1", KEY]
    assert hooks.try_primary_metric(tester, lambda key: key) == "AVERAGE_precision_at_1"


def test_an_unknown_metric_raises_a_key_error_naming_the_keys(run):
    hooks = logging_presets.get_hook_container(run.hooks.record_keeper, primary_metric="NMI")
    with pytest.raises(KeyError) as caught:
        hooks.get_curr_primary_metric(run.tester, "val")
    assert isinstance(caught.value, (MetricNotRecordedError, InvalidArgumentError))
    assert "NMI_level0" in str(caught.value) and "AVERAGE_NMI" in str(caught.value)


def test_load_latest_saved_models_best(run):
    hooks, trainer, trunk = run.hooks, run.trainer, run.trunk
    with torch.no_grad():
        trunk.weight.zero_()
    assert hooks.load_latest_saved_models(trainer, run.folder, best=True) == 3
    assert torch.equal(trunk.weight, weights_of(2))
    assert trunk_files(run.folder) == ["trunk_4.pth", "trunk_best2.pth"]  # untouched
    assert hooks.load_latest_saved_models(trainer, run.folder, None, False) == 5
    assert torch.equal(trunk.weight, weights_of(4))
    with pytest.raises(InvalidArgumentError, match="best"):
        hooks.load_latest_saved_models(trainer, run.folder, best=True, start_fresh=True)


def test_load_latest_saved_models_best_from_a_folder_without_the_recorded_best(run, tmp_path):
    # The records name epoch 2 best, but the folder holds no checkpoint (a mistyped
    # folder, say): refuse rather than silently start over.
    empty = tmp_path / "nothing_here"
    empty.mkdir()
    with pytest.raises(ResumeError, match="nothing_here"):
        run.hooks.load_latest_saved_models(run.trainer, str(empty), best=True)
    assert list(empty.iterdir()) == []


def test_run_tester_separately(run):
    hooks, tester, trunk = run.hooks, run.tester, run.trunk
    # Epoch 4 is recorded already: nothing to do, as in 2.x.
    assert hooks.run_tester_separately(tester, run.dataset_dict, 4, trunk, None) is False
    weight = torch.diag(torch.tensor([3.0, 1.0]))
    with torch.no_grad():
        trunk.weight.copy_(weight)
    assert hooks.run_tester_separately(tester, run.dataset_dict, 9, trunk, None) is True
    expected = precision_at_1_by_loop(weight)
    assert hooks.get_accuracies_of_epoch(tester, "val", 9) == [{"epoch": 9, KEY: expected}]
    assert hooks.get_splits_to_eval(tester, run.dataset_dict, 9, None) == []
    assert hooks.get_splits_to_eval(tester, run.dataset_dict, 10, ["val"]) == [("val", ["val"])]
    # Asked to test again: it does (the record of epoch 9 is replaced, not duplicated).
    again = hooks.run_tester_separately(
        tester, run.dataset_dict, 9, trunk, None, skip_eval_if_already_done=False
    )
    assert again is True
    assert hooks.get_accuracy_history(tester, "val")["epoch"] == [1, 2, 3, 4, 9]


def test_save_models_and_eval(run):
    hooks, trainer, trunk = run.hooks, run.trainer, run.trunk
    trainer.epoch = 5
    with torch.no_grad():
        trunk.weight.copy_(weights_of(2))  # 1.0 again: ties the best, so not a new best
    best_epoch = hooks.save_models_and_eval(
        trainer, run.dataset_dict, run.folder, 1, run.tester, None, None
    )
    assert best_epoch == 2
    assert trunk_files(run.folder) == ["trunk_5.pth", "trunk_best2.pth"]
    assert hooks.get_accuracies_of_epoch(run.tester, "val", 5, False) == [{"epoch": 5, KEY: 1.0}]


def test_optimizer_custom_attr_func(run):
    optimizer = run.trainer.optimizers["trunk_optimizer"]
    assert run.hooks.optimizer_custom_attr_func(optimizer) == {"lr": 0.0}


def test_nan_is_never_a_new_best(tmp_path):
    record_keeper, _, _ = logging_presets.get_record_keeper(str(tmp_path))
    hooks = logging_presets.get_hook_container(record_keeper, primary_metric="precision_at_1")
    tester = testers.GlobalEmbeddingSpaceTester()
    for epoch, value in [(1, math.nan), (2, 0.5)]:
        tester.all_accuracies = {"val": {"epoch": epoch, KEY: value}}
        hooks.end_of_testing_hook(tester)
    tester.all_accuracies = {"val": {"epoch": 3, KEY: math.nan}}
    assert hooks.is_new_best_accuracy(tester, "val", 3) == (
        False,
        pytest.approx(math.nan, nan_ok=True),
        2,
        0.5,
    )
    rows, _ = hooks.get_accuracies_of_best_epoch(tester, "val", ignore_epoch=(2,))
    assert rows == []


def test_get_record_keeper_has_the_2x_signature(tmp_path):
    parameters = inspect.signature(logging_presets.get_record_keeper).parameters
    assert list(parameters)[:6] == [
        "csv_folder",
        "tensorboard_folder",
        "global_db_path",
        "experiment_name",
        "is_new_experiment",
        "save_lists",
    ]
    defaults = [parameters[name].default for name in list(parameters)[1:6]]
    assert defaults == [None, None, None, True, False]
    keeper, db, writer = logging_presets.get_record_keeper(
        str(tmp_path), None, None, "my_experiment", False, False
    )
    assert writer is None and db.path == tmp_path / "records.db"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"global_db_path": "all_experiments.db"}, "global_db_path"),
        ({"save_lists": True}, "save_lists"),
    ],
)
def test_get_record_keeper_refuses_what_it_cannot_do(tmp_path, kwargs, name):
    with pytest.raises(InvalidArgumentError, match=name):
        logging_presets.get_record_keeper(str(tmp_path / "logs"), **kwargs)
    assert not (tmp_path / "all_experiments.db").exists()
    assert not (tmp_path / "logs").exists()


def test_get_hook_container_without_record_keeper_gives_hooks_that_do_nothing(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="pytorch_metric_learning"):
        hooks = logging_presets.get_hook_container(None)
    assert isinstance(hooks, logging_presets.EmptyContainer)
    assert "No record_keeper" in caplog.text
    trunk = torch.nn.Linear(2, 2)
    trainer = trainers.MetricLossOnly(
        {"trunk": trunk},
        {"trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.0)},
        5,
        {"metric_loss": spread_loss},
        TensorDataset(VAL_X, VAL_Y),
        dataloader_num_workers=0,
        end_of_iteration_hook=hooks.end_of_iteration_hook,
        end_of_epoch_hook=hooks.end_of_epoch_hook(None, {"val": None}, str(tmp_path / "m")),
    )
    trainer.train(num_epochs=2)
    assert trainer.epoch == 2 and os.listdir(tmp_path) == []


values = st.one_of(st.sampled_from([0.25, 0.5, 0.75, math.nan]), st.floats(0, 1))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(history=st.lists(values, min_size=1, max_size=6), ignored=st.sets(st.integers(0, 6)))
def test_best_epoch_ignoring_epochs_matches_a_loop(tmp_path_factory, history, ignored):
    record_keeper, _, _ = logging_presets.get_record_keeper(str(tmp_path_factory.mktemp("h")))
    hooks = logging_presets.get_hook_container(record_keeper, primary_metric="precision_at_1")
    tester = testers.GlobalEmbeddingSpaceTester()
    for epoch, value in enumerate(history, start=1):
        tester.all_accuracies = {"val": {"epoch": epoch, KEY: value}}
        hooks.end_of_testing_hook(tester)
    expected = (None, 0)
    for epoch, value in enumerate(history, start=1):  # first strictly greater, never NaN
        if epoch not in ignored and value == value and (expected[0] is None or value > expected[1]):
            expected = (epoch, value)
    got = hooks.get_best_epoch_and_accuracy(tester, "val", ignore_epoch=tuple(ignored) or (-1,))
    assert got == expected
    rows, _ = hooks.get_accuracies_of_best_epoch(tester, "val", ignore_epoch=tuple(ignored))
    assert (rows[0]["epoch"] if rows else None) == expected[0]
    record_keeper.close()
