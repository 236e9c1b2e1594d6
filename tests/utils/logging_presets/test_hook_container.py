"""HookContainer with a scripted tester: records, best epoch, checkpoints, patience, intervals."""

from __future__ import annotations

import csv
import math
import sqlite3
from pathlib import Path

import pytest
import torch
from hook_fakes import PRIMARY_KEY, ScriptedTester, make_trainer
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.errors import InvalidArgumentError, InvalidTypeError
from pytorch_metric_learning.utils import logging_presets

DATASETS = {"val": object(), "train": object()}


def oracle(
    accuracies: dict[int, float],
    num_epochs: int,
    test_interval: int = 1,
    patience: int | None = None,
) -> tuple[list[int], int | None, int]:
    """Tested epochs, best epoch and last epoch run, by the 2.x rules, as a plain loop.

    NaN is never a best; while there is no best, patience cannot run out."""
    tested, best_epoch, best_value = [], None, None
    for epoch in range(1, num_epochs + 1):
        if epoch % test_interval:
            continue
        tested.append(epoch)
        value = accuracies[epoch]
        if value == value and (best_value is None or value > best_value):
            best_epoch, best_value = epoch, value
        if patience is not None and best_epoch is not None and epoch - best_epoch > patience:
            return tested, best_epoch, epoch
    return tested, best_epoch, num_epochs


def run(
    tmp_path: Path,
    accuracies: dict[int, float],
    num_epochs: int,
    container_kwargs: dict | None = None,
    **hook_kwargs,
):
    record_keeper, db, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper, **(container_kwargs or {}))
    tester = ScriptedTester(accuracies, end_of_testing_hook=hooks.end_of_testing_hook)
    end_of_epoch = hooks.end_of_epoch_hook(tester, DATASETS, tmp_path / "models", **hook_kwargs)
    trainer = make_trainer(
        end_of_iteration_hook=hooks.end_of_iteration_hook, end_of_epoch_hook=end_of_epoch
    )
    trainer.train(num_epochs=num_epochs)
    return hooks, tester, trainer, db


def sqlite_rows(db_path: Path, group: str, name: str) -> list[tuple[int, float]]:
    with sqlite3.connect(db_path) as conn:
        sql = "SELECT step, value FROM records WHERE record_group = ? AND name = ? ORDER BY step"
        return conn.execute(sql, (group, name)).fetchall()


def csv_rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


ACCS = {1: 0.2, 2: 0.5, 3: 0.4, 4: 0.5, 5: 0.6, 6: 0.1, 7: 0.3, 8: 0.55, 9: 0.2, 10: 0.9}


def test_every_epoch_is_recorded_in_sqlite_and_csv(tmp_path: Path) -> None:
    hooks, tester, _, db = run(tmp_path, ACCS, num_epochs=6)
    assert tester.calls == [1, 2, 3, 4, 5, 6]
    for split in ("val", "train"):
        expected = [(e, ACCS[e]) for e in range(1, 7)]
        assert sqlite_rows(db.path, f"accuracies_{split}", PRIMARY_KEY) == expected
        rows = csv_rows(tmp_path / "logs" / f"accuracies_{split}" / f"{PRIMARY_KEY}.csv")
        assert rows[0] == ["epoch", PRIMARY_KEY]
        assert [(int(e), float(v)) for e, v in rows[1:]] == expected


def test_history_returns_recorded_values(tmp_path: Path) -> None:
    hooks, tester, _, _ = run(tmp_path, ACCS, num_epochs=5)
    history = hooks.get_accuracy_history(tester, "val")
    assert history == {"epoch": [1, 2, 3, 4, 5], PRIMARY_KEY: [ACCS[e] for e in range(1, 6)]}
    history = hooks.get_accuracy_history(tester, "val", metrics=["precision_at_1"])
    assert history["precision_at_1_level0"] == [1.0 - ACCS[e] for e in range(1, 6)]
    everything = hooks.get_accuracy_history(tester, "train", return_all_metrics=True)
    # 2.x's layout: every metric, plus the best epoch and accuracy so far after each epoch
    assert set(everything) == {
        "epoch",
        PRIMARY_KEY,
        "precision_at_1_level0",
        "best_epoch",
        "best_accuracy",
        "~iteration~",  # 2.x recorded accuracies at iteration = epoch
    }
    assert everything["~iteration~"] == everything["epoch"]
    best_epochs, best_values, best = [], [], None
    for epoch, value in zip(everything["epoch"], everything[PRIMARY_KEY]):
        if best is None or value > best[1]:
            best = (epoch, value)
        best_epochs.append(best[0])
        best_values.append(best[1])
    assert everything["best_epoch"] == best_epochs
    assert everything["best_accuracy"] == best_values
    with pytest.raises(InvalidArgumentError, match="NMI"):
        hooks.get_accuracy_history(tester, "val", metrics=["NMI"])


def test_history_before_any_test_is_empty(tmp_path: Path) -> None:
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path)
    hooks = logging_presets.get_hook_container(record_keeper)
    tester = ScriptedTester(ACCS, end_of_testing_hook=hooks.end_of_testing_hook)
    assert hooks.get_accuracy_history(tester, "val") == {}
    assert hooks.get_best_epoch_and_accuracy(tester, "val") == (None, 0.0)
    assert hooks.get_loss_history() == {}


def test_best_checkpoint_matches_best_epoch(tmp_path: Path) -> None:
    hooks, tester, trainer, _ = run(tmp_path, ACCS, num_epochs=9)
    _, best_epoch, _ = oracle(ACCS, 9)
    assert best_epoch == 5
    assert hooks.get_best_epoch_and_accuracy(tester, "val") == (5, ACCS[5])
    names = ["trunk", "embedder", "trunk_optimizer", "embedder_optimizer"]
    files = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert files == sorted([f"{n}_9.pth" for n in names] + [f"{n}_best5.pth" for n in names])
    saved = torch.load(tmp_path / "models" / "trunk_best5.pth", weights_only=True)
    for key, value in tester.snapshots[5].items():
        assert torch.equal(saved[key], value)
    fresh = make_trainer()
    assert hooks.load_best_saved_models(fresh, tmp_path / "models") == 5
    assert torch.equal(fresh.models["trunk"].weight, tester.snapshots[5]["weight"])


def test_a_tie_is_not_a_new_best(tmp_path: Path) -> None:
    hooks, tester, _, _ = run(tmp_path, ACCS, num_epochs=4)
    assert ACCS[4] == ACCS[2]
    assert hooks.get_best_epoch_and_accuracy(tester, "val") == (2, 0.5)
    assert (tmp_path / "models" / "trunk_best2.pth").exists()


@pytest.mark.parametrize("patience", [0, 1, 2, 3])
def test_patience_stops_early(tmp_path: Path, patience: int) -> None:
    _, tester, trainer, _ = run(tmp_path, ACCS, num_epochs=10, patience=patience)
    tested, _, last = oracle(ACCS, 10, patience=patience)
    assert last < 10
    assert trainer.epoch == last
    assert tester.calls == tested


@pytest.mark.parametrize("test_interval", [2, 3])
def test_test_interval_skips_epochs(tmp_path: Path, test_interval: int) -> None:
    hooks, tester, _, db = run(tmp_path, ACCS, num_epochs=10, test_interval=test_interval)
    tested, best_epoch, _ = oracle(ACCS, 10, test_interval=test_interval)
    assert tester.calls == tested
    assert [e for e, _ in sqlite_rows(db.path, "accuracies_val", PRIMARY_KEY)] == tested
    assert hooks.get_best_epoch_and_accuracy(tester, "val")[0] == best_epoch
    assert (tmp_path / "models" / f"trunk_{tested[-1]}.pth").exists()
    assert (tmp_path / "models" / f"trunk_best{best_epoch}.pth").exists()


@pytest.mark.parametrize("log_freq", [1, 2, 3, 50])
def test_losses_and_learning_rates_are_recorded(tmp_path: Path, log_freq: int) -> None:
    hooks, _, trainer, db = run(
        tmp_path, ACCS, num_epochs=2, container_kwargs={"log_freq": log_freq}
    )
    per_epoch = trainer.iterations_per_epoch
    # 2.x: a row when the iteration within the epoch (from 0) is a multiple of log_freq
    logged = [g for g in range(2 * per_epoch) if (g % per_epoch) % log_freq == 0]
    history = hooks.get_loss_history()
    assert history["iteration"] == logged
    assert history["~iteration~"] == logged  # 2.x's column name
    assert set(history) == {"iteration", "~iteration~", "metric_loss", "total_loss"}
    rows = sqlite_rows(db.path, "learning_rates", "trunk_optimizer")
    assert rows == [(i, 0.05) for i in logged]
    # 2.x: with loss_names, exactly the requested columns
    assert hooks.get_loss_history(["metric_loss"]).keys() == {"metric_loss"}
    assert trainer.losses == {"metric_loss": 0.0, "total_loss": 0.0}  # zeroed, as in 2.x


def test_best_epoch_is_tracked_when_the_testing_hook_is_the_users(tmp_path: Path) -> None:
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper)
    seen = []
    tester = ScriptedTester(ACCS, end_of_testing_hook=lambda t: seen.append(dict(t.all_accuracies)))
    end_of_epoch = hooks.end_of_epoch_hook(tester, DATASETS, tmp_path / "models", patience=1)
    trainer = make_trainer(end_of_epoch_hook=end_of_epoch)
    trainer.train(num_epochs=10)
    tested, best_epoch, last = oracle(ACCS, 10, patience=1)
    assert len(seen) == len(tested) and trainer.epoch == last
    assert hooks.get_best_epoch_and_accuracy(tester, "val") == (best_epoch, ACCS[best_epoch])
    assert hooks.get_accuracy_history(tester, "val")["epoch"] == tested


def test_testing_hook_called_directly_uses_the_stored_epoch(tmp_path: Path) -> None:
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path)
    hooks = logging_presets.get_hook_container(record_keeper, primary_metric="precision_at_1")
    tester = ScriptedTester(lambda e: {"epoch": e, "precision_at_1_level0": 0.1 * e})
    tester.test({"val": None}, 7, torch.nn.Linear(2, 2))
    hooks.end_of_testing_hook(tester)
    assert hooks.get_best_epoch_and_accuracy(tester, "val") == (7, pytest.approx(0.7))
    assert hooks.get_accuracy_history(tester, "val") == {
        "epoch": [7],
        "precision_at_1_level0": [pytest.approx(0.7)],
    }
    no_epoch = ScriptedTester({1: 0.5})
    no_epoch.test({"val": None}, 1, torch.nn.Linear(2, 2))
    with pytest.raises(InvalidArgumentError, match="epoch"):
        hooks.end_of_testing_hook(no_epoch)


def test_nan_accuracy_is_never_best(tmp_path: Path) -> None:
    accs = {1: math.nan, 2: 0.3, 3: math.nan, 4: 0.2}
    hooks, tester, _, _ = run(tmp_path, accs, num_epochs=4)
    assert hooks.get_best_epoch_and_accuracy(tester, "val") == (2, 0.3)
    history = hooks.get_accuracy_history(tester, "val")[PRIMARY_KEY]
    assert math.isnan(history[0]) and history[1] == 0.3


def test_average_key_is_preferred(tmp_path: Path) -> None:
    def script(epoch: int) -> dict[str, float]:
        return {
            "AVERAGE_precision_at_1": [0.5, 0.7, 0.6][epoch - 1],
            "precision_at_1_level0": [0.9, 0.1, 0.1][epoch - 1],
        }

    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper, primary_metric="precision_at_1")
    tester = ScriptedTester(script, end_of_testing_hook=hooks.end_of_testing_hook)
    hook = hooks.end_of_epoch_hook(tester, {"val": None}, tmp_path / "models")
    make_trainer(end_of_epoch_hook=hook).train(num_epochs=3)
    assert hooks.get_best_epoch_and_accuracy(tester, "val") == (2, 0.7)


def test_save_models_false_writes_no_checkpoint(tmp_path: Path) -> None:
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper, save_models=False)
    tester = ScriptedTester(ACCS, end_of_testing_hook=hooks.end_of_testing_hook)
    hook = hooks.end_of_epoch_hook(tester, DATASETS, tmp_path / "models")
    make_trainer(end_of_epoch_hook=hook).train(num_epochs=3)
    assert not (tmp_path / "models").exists()
    assert hooks.get_best_epoch_and_accuracy(tester, "val") == (2, 0.5)


def test_plateau_schedulers_get_the_validation_accuracy(tmp_path: Path) -> None:
    class Plateau:
        def __init__(self) -> None:
            self.values: list[float] = []

        def step(self, value: float) -> None:
            self.values.append(value)

    plateau = Plateau()
    record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper)
    tester = ScriptedTester(ACCS, end_of_testing_hook=hooks.end_of_testing_hook)
    hook = hooks.end_of_epoch_hook(tester, DATASETS, tmp_path / "models", test_interval=2)
    trainer = make_trainer(end_of_epoch_hook=hook, lr_schedulers={"trunk_by_plateau": plateau})
    trainer.train(num_epochs=6)
    assert plateau.values == [ACCS[2], ACCS[4], ACCS[6]]


def test_record_group_prefix(tmp_path: Path) -> None:
    record_keeper, db, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper, record_group_name_prefix="exp1")
    tester = ScriptedTester(ACCS, end_of_testing_hook=hooks.end_of_testing_hook)
    hook = hooks.end_of_epoch_hook(tester, DATASETS, tmp_path / "models")
    make_trainer(end_of_epoch_hook=hook).train(num_epochs=2)
    assert sqlite_rows(db.path, "exp1_accuracies_val", PRIMARY_KEY) == [(1, 0.2), (2, 0.5)]
    assert hooks.get_accuracy_history(tester, "val")["epoch"] == [1, 2]


class TestArgumentErrors:
    def hooks(self, tmp_path: Path, **kwargs):
        record_keeper, _, _ = logging_presets.get_record_keeper(tmp_path)
        return logging_presets.get_hook_container(record_keeper, **kwargs)

    def test_validation_split_must_be_in_dataset_dict(self, tmp_path: Path) -> None:
        hooks = self.hooks(tmp_path)
        with pytest.raises(InvalidArgumentError, match="'dataset_dict'.*'val'"):
            hooks.end_of_epoch_hook(ScriptedTester(ACCS), {"train": None}, tmp_path)

    def test_validation_split_must_be_a_query_split(self, tmp_path: Path) -> None:
        hooks = self.hooks(tmp_path)
        with pytest.raises(InvalidArgumentError, match="splits_to_eval"):
            hooks.end_of_epoch_hook(
                ScriptedTester(ACCS), DATASETS, tmp_path, splits_to_eval=[("train", ["val"])]
            )

    @pytest.mark.parametrize(
        "kwargs, error",
        [
            ({"test_interval": 0}, InvalidArgumentError),
            ({"test_interval": 1.5}, InvalidTypeError),
            ({"patience": -1}, InvalidArgumentError),
            ({"patience": "3"}, InvalidTypeError),
        ],
    )
    def test_interval_and_patience(self, tmp_path: Path, kwargs, error) -> None:
        with pytest.raises(error, match=next(iter(kwargs))):
            self.hooks(tmp_path).end_of_epoch_hook(
                ScriptedTester(ACCS), DATASETS, tmp_path, **kwargs
            )

    def test_log_freq_and_primary_metric(self, tmp_path: Path) -> None:
        with pytest.raises(InvalidArgumentError, match="log_freq"):
            self.hooks(tmp_path, log_freq=0)
        with pytest.raises(InvalidTypeError, match="primary_metric"):
            self.hooks(tmp_path, primary_metric=None)

    def test_primary_metric_unknown_to_the_calculator(self, tmp_path: Path) -> None:
        class Calculator:
            def get_curr_metrics(self) -> list[str]:
                return ["precision_at_1"]

        tester = ScriptedTester(ACCS)
        tester.accuracy_calculator = Calculator()  # type: ignore[attr-defined]
        with pytest.raises(InvalidArgumentError, match="primary_metric"):
            self.hooks(tmp_path).end_of_epoch_hook(tester, DATASETS, tmp_path)

    def test_primary_metric_missing_from_results(self, tmp_path: Path) -> None:
        hooks = self.hooks(tmp_path, primary_metric="NMI")
        tester = ScriptedTester(ACCS, end_of_testing_hook=hooks.end_of_testing_hook)
        hook = hooks.end_of_epoch_hook(tester, DATASETS, tmp_path / "models")
        with pytest.raises(InvalidArgumentError, match="NMI"):
            make_trainer(end_of_epoch_hook=hook).train(num_epochs=1)


ODD_NAMES = ["p@1'; DROP TABLE records; --", 'a"b', "../../x", "名前", "new\nline", "", "nul\x00"]


def test_odd_metric_names_are_safe_in_sqlite(tmp_path: Path) -> None:
    def script(epoch: int) -> dict[str, float]:
        odd = {name: epoch + i / 10 for i, name in enumerate(ODD_NAMES)}
        return {PRIMARY_KEY: ACCS[epoch], **odd}

    record_keeper, db, _ = logging_presets.get_record_keeper(tmp_path / "logs")
    hooks = logging_presets.get_hook_container(record_keeper)
    tester = ScriptedTester(script, end_of_testing_hook=hooks.end_of_testing_hook)
    state = logging_presets.TrainingState(models={"trunk": torch.nn.Linear(2, 2)})
    hook = hooks.end_of_epoch_hook(tester, {"val": None}, tmp_path / "models")
    for state.epoch in range(1, 4):
        hook(state)
    for i, name in enumerate(ODD_NAMES):
        assert sqlite_rows(db.path, "accuracies_val", name) == [(e, e + i / 10) for e in (1, 2, 3)]
    history = hooks.get_accuracy_history(tester, "val", return_all_metrics=True)
    assert history["epoch"] == [1, 2, 3]
    assert all(history[name] == [e + i / 10 for e in (1, 2, 3)] for i, name in enumerate(ODD_NAMES))
    assert hooks.get_accuracy_history(tester, "val", metrics=[ODD_NAMES[0]]) == {
        "epoch": [1, 2, 3],
        ODD_NAMES[0]: [1.0, 2.0, 3.0],
    }
    with sqlite3.connect(db.path) as conn:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    # The library's own tables only: no name was executed as SQL.
    assert sorted(t for (t,) in tables) == [
        "csv_files",
        "csv_pending",
        "record_groups",
        "records",
        "superseded_records",
    ]
    assert all((tmp_path / "logs") in p.parents for p in tmp_path.rglob("*.csv"))


@example(
    values=[math.nan, 0.1, 0.1, 0.1, 0.2, 0.1, 0.1, 0.1], patience=0, test_interval=1, num_epochs=8
)
@example(values=[0.5, 0.1, 0.1, 0.1, 0.5, 0.1, 0.1, 0.1], patience=2, test_interval=2, num_epochs=8)
@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.sampled_from([0.1, 0.2, 0.3, 0.5, math.nan]), min_size=8, max_size=8),
    patience=st.one_of(st.none(), st.integers(0, 3)),
    test_interval=st.integers(1, 3),
    num_epochs=st.integers(1, 8),
)
def test_stop_and_best_epoch_follow_the_2x_rules(values, patience, test_interval, num_epochs):
    import tempfile

    accs = dict(enumerate(values, start=1))
    with tempfile.TemporaryDirectory() as folder:
        record_keeper, db, _ = logging_presets.get_record_keeper(folder)
        hooks = logging_presets.get_hook_container(record_keeper, save_models=False)
        tester = ScriptedTester(accs, end_of_testing_hook=hooks.end_of_testing_hook)
        hook = hooks.end_of_epoch_hook(
            tester, {"val": None}, folder, test_interval=test_interval, patience=patience
        )
        state = logging_presets.TrainingState(models={"trunk": torch.nn.Linear(1, 1)})
        for state.epoch in range(1, num_epochs + 1):
            if hook(state) is False:
                break
        tested, best_epoch, last = oracle(accs, num_epochs, test_interval, patience)
        assert tester.calls == tested
        assert state.epoch == last
        expected = (best_epoch, accs[best_epoch]) if best_epoch else (None, 0.0)
        assert hooks.get_best_epoch_and_accuracy(tester, "val") == expected
        db.close()
