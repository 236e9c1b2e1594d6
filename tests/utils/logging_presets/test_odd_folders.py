"""Odd model and record folders, found by running the training loop as a user would.

Each test builds the odd folder for real (a folder named like a checkpoint, another
project's weights, a file where a folder should be) and asserts what the user relies on:
no file of theirs moves or disappears, the saved state loads, and errors are the library's
own, naming the path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hook_fakes import ScriptedTester, folder_snapshot, make_trainer

from pytorch_metric_learning.errors import (
    FileWriteError,
    InvalidArgumentError,
    PMLError,
    ResumeError,
)
from pytorch_metric_learning.utils import logging_presets
from pytorch_metric_learning.utils.record_keeping import RecordKeeper

ACCS = {1: 0.1, 2: 0.3, 3: 0.2, 4: 0.25, 5: 0.4}


class Run:
    """One training process writing to ``root/logs`` and ``root/models``."""

    def __init__(self, root: Path, model_folder: Path | None = None, **kwargs: object) -> None:
        self.model_folder = model_folder or root / "models"
        record_keeper, _, _ = logging_presets.get_record_keeper(root / "logs")
        self.hooks = logging_presets.get_hook_container(record_keeper)
        self.tester = ScriptedTester(ACCS, end_of_testing_hook=self.hooks.end_of_testing_hook)
        hook = self.hooks.end_of_epoch_hook(self.tester, {"val": None}, self.model_folder)
        self.trainer = make_trainer(
            end_of_iteration_hook=self.hooks.end_of_iteration_hook,
            end_of_epoch_hook=hook,
            **kwargs,
        )

    def resume(self) -> int:
        return self.hooks.load_latest_saved_models(self.trainer, self.model_folder)


def test_folders_named_like_checkpoints_are_not_loaded_pruned_or_moved(tmp_path: Path) -> None:
    first = Run(tmp_path)
    first.trainer.train(num_epochs=2)
    weights_at_2 = first.tester.snapshots[2]["weight"]
    names = ["trunk", "embedder", "trunk_optimizer", "embedder_optimizer"]
    for name in names:  # a newer "set" that is only folders, and one named like an old file
        (first.model_folder / f"{name}_9.pth").mkdir()
    (first.model_folder / "trunk_1.pth").mkdir()
    second = Run(tmp_path)
    assert second.resume() == 3
    assert torch.equal(second.trainer.models["trunk"].weight, weights_at_2)
    second.trainer.train(start_epoch=3, num_epochs=4)  # saves and prunes around the folders
    assert (first.model_folder / "trunk_1.pth").is_dir()
    assert all((first.model_folder / f"{name}_9.pth").is_dir() for name in names)
    assert (first.model_folder / "trunk_4.pth").is_file()
    # A new run whose model folder holds only folders named like checkpoints: no set.
    only_folders = tmp_path / "only_folders"
    for name in names:
        (only_folders / f"{name}_3.pth").mkdir(parents=True)
    assert Run(tmp_path / "new", model_folder=only_folders).resume() == 1


def test_a_mistyped_record_folder_refuses_instead_of_forgetting_the_best(tmp_path: Path) -> None:
    first = Run(tmp_path)
    first.trainer.train(num_epochs=4)  # best epoch 2, latest 4
    before = folder_snapshot(tmp_path / "models")
    typo = Run(tmp_path / "lgos", model_folder=first.model_folder)
    with pytest.raises(ResumeError, match="no validation") as caught:
        typo.resume()
    assert "[2, 4]" in str(caught.value) and str(first.model_folder) in str(caught.value)
    assert folder_snapshot(tmp_path / "models") == before


def test_an_uncommitted_first_save_is_set_aside(tmp_path: Path) -> None:
    first = Run(tmp_path / "killed")
    first.trainer.train(num_epochs=1)
    # As if killed after epoch 1's checkpoints, before its records: a new record folder.
    files = {p.name: p.read_bytes() for p in first.model_folder.glob("*.pth")}
    second = Run(tmp_path / "restarted", model_folder=first.model_folder)
    with pytest.warns(RuntimeWarning, match="epoch 1"):
        assert second.resume() == 1
    moved = {p.name: p.read_bytes() for p in first.model_folder.glob("superseded/*/*.pth")}
    assert moved == files
    second.trainer.train(num_epochs=2)
    assert second.hooks.get_accuracy_history(second.tester, "val")["epoch"] == [1, 2]


def test_other_weights_in_the_model_folder_are_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    theirs = folder / "pretrained_backbone.pth"
    torch.save({"w": torch.ones(3)}, theirs)
    precious = theirs.read_bytes()
    run = Run(tmp_path)
    assert run.resume() == 1  # not a checkpoint of this run: no ResumeError
    run.trainer.train(num_epochs=2)
    assert run.resume() == 3
    assert run.hooks.load_latest_saved_models(run.trainer, folder, start_fresh=True) == 1
    assert theirs.read_bytes() == precious  # start_fresh moved this run's files, not theirs
    assert not list(folder.glob("trunk_*.pth"))


def test_a_file_where_the_record_folder_should_be(tmp_path: Path) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("my notes")
    for make in (lambda: RecordKeeper(blocker), lambda: logging_presets.get_record_keeper(blocker)):
        with pytest.raises(FileWriteError, match="logs"):
            make()
    with pytest.raises(FileWriteError, match="logs"):
        RecordKeeper(blocker / "sub")
    assert blocker.read_text() == "my notes"


def test_a_file_where_the_model_folder_should_be(tmp_path: Path) -> None:
    blocker = tmp_path / "models"
    blocker.write_text("my notes")
    run = Run(tmp_path)
    with pytest.raises(FileWriteError, match="models") as caught:
        run.trainer.train(num_epochs=1)
    assert isinstance(caught.value, OSError)
    assert blocker.read_text() == "my notes"
    assert not list(tmp_path.rglob("*.tmp"))


def test_load_best_refuses_when_an_object_has_no_best_checkpoint(tmp_path: Path) -> None:
    first = Run(tmp_path)
    first.trainer.train(num_epochs=3)
    before = folder_snapshot(tmp_path)
    trunk = first.trainer.models["trunk"]
    weights = trunk.weight.detach().clone()
    scheduler = torch.optim.lr_scheduler.StepLR(first.trainer.optimizers["trunk_optimizer"], 2)
    state = logging_presets.TrainingState(
        models=first.trainer.models,
        optimizers=first.trainer.optimizers,
        lr_schedulers={"trunk_scheduler": scheduler},
    )
    with pytest.raises(ResumeError, match="trunk_scheduler") as caught:
        first.hooks.load_best_saved_models(state, first.model_folder)
    assert str(first.model_folder) in str(caught.value)
    assert torch.equal(trunk.weight, weights)
    assert folder_snapshot(tmp_path) == before
    # Loading a subset (the models alone, for inference) is fine.
    models_only = logging_presets.TrainingState(models=first.trainer.models)
    assert first.hooks.load_best_saved_models(models_only, first.model_folder) == 2
    assert torch.equal(trunk.weight, first.tester.snapshots[2]["weight"])


def test_load_best_from_a_mistyped_folder_refuses(tmp_path: Path) -> None:
    first = Run(tmp_path)
    first.trainer.train(num_epochs=3)
    typo = tmp_path / "modles"
    with pytest.raises(ResumeError, match="modles") as caught:
        first.hooks.load_best_saved_models(first.trainer, typo)
    assert "epoch 2" in str(caught.value)
    assert not typo.exists()


def test_a_bad_value_queues_none_of_the_records(tmp_path: Path) -> None:
    keeper = RecordKeeper(tmp_path)
    with pytest.raises(PMLError, match="records"):
        keeper.update_records({"loss": 0.5, "acc": "high"}, 1, "g")
    keeper.update_records({"loss": 0.25}, 2, "g")
    keeper.save_records()
    assert keeper.history("g") == ([2], {"loss": [0.25]})


def test_resuming_a_changed_model_names_the_file_and_changes_nothing(tmp_path: Path) -> None:
    first = Run(tmp_path)
    first.trainer.train(num_epochs=2)
    before = folder_snapshot(tmp_path)
    wider = torch.nn.Linear(6, 5)  # the saved trunk is Linear(6, 4)
    weights = wider.weight.detach().clone()
    second = Run(tmp_path, models={"trunk": wider, "embedder": torch.nn.Linear(5, 3)})
    for load in (second.hooks.load_latest_saved_models, second.hooks.load_best_saved_models):
        with pytest.raises(PMLError, match="trunk_(best)?2.pth"):
            load(second.trainer, second.model_folder)
        assert torch.equal(wider.weight, weights)
    assert folder_snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "make_odd", [Path.mkdir, lambda p: p.symlink_to(p.parent / "gone" / "x.db")]
)
def test_a_records_database_that_cannot_be_opened(tmp_path: Path, make_odd: object) -> None:
    database = tmp_path / "logs" / "records.db"
    database.parent.mkdir()
    make_odd(database)  # type: ignore[operator]
    with pytest.raises(FileWriteError, match="records.db"):
        logging_presets.get_record_keeper(tmp_path / "logs")


def test_only_our_own_temporary_files_are_cleaned(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.trainer.train(num_epochs=1)
    folder = run.model_folder
    ours = folder / ".trunk_1.pth.0a1b2c3d.tmp"  # what a save killed by SIGKILL leaves
    theirs = [folder / ".trunk_1.pth.backup01.tmp", folder / ".trunk_1.pth.tmp"]
    for path in [ours, *theirs]:
        path.write_bytes(b"partial")
    run.trainer.train(start_epoch=2, num_epochs=2)
    assert not ours.exists()
    assert all(path.read_bytes() == b"partial" for path in theirs)


def test_a_file_named_superseded_stops_resume_with_our_error(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.trainer.train(num_epochs=4)
    blocker = run.model_folder / "superseded"
    blocker.write_text("my notes")
    with pytest.raises(FileWriteError, match="superseded"):
        run.hooks.load_latest_saved_models(run.trainer, run.model_folder, start_fresh=True)
    assert blocker.read_text() == "my notes"
    assert sorted(p.name for p in run.model_folder.glob("trunk_[0-9b]*.pth")) == [
        "trunk_4.pth",
        "trunk_best2.pth",
    ]


@pytest.mark.parametrize("device", ["nonsense", pytest.param("cuda", id="cuda")])
def test_a_device_this_machine_lacks_is_not_called_a_damaged_checkpoint(
    tmp_path: Path, device: str
) -> None:
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    run = Run(tmp_path)
    run.trainer.train(num_epochs=2)
    before = folder_snapshot(tmp_path)
    for load in (run.hooks.load_latest_saved_models, run.hooks.load_best_saved_models):
        with pytest.raises(InvalidArgumentError, match="'device'") as caught:
            load(run.trainer, run.model_folder, device)
        assert "damaged" not in str(caught.value)
    assert folder_snapshot(tmp_path) == before
    assert run.resume() == 3  # the checkpoints were fine all along
