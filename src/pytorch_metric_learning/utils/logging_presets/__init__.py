"""Close the training loop: validate each epoch, record, keep the best model, stop early.

Example (``val_ds``, ``models``, ... stand for your own objects)::

    record_keeper, _, _ = logging_presets.get_record_keeper("logs", "tensorboard_logs")
    hooks = logging_presets.get_hook_container(record_keeper)
    tester = testers.GlobalEmbeddingSpaceTester(end_of_testing_hook=hooks.end_of_testing_hook)
    end_of_epoch_hook = hooks.end_of_epoch_hook(tester, {"val": val_ds}, "saved_models")
    trainer = trainers.MetricLossOnly(models, optimizers, batch_size, loss_funcs,
        mining_funcs, train_dataset, end_of_iteration_hook=hooks.end_of_iteration_hook,
        end_of_epoch_hook=end_of_epoch_hook)
    trainer.train(num_epochs=num_epochs)
"""

from __future__ import annotations

from .hook_container import HookContainer
from .metric_keys import resolve_metric_key
from .presets import EmptyContainer, get_hook_container, get_record_keeper
from .training_state import TrainingState

__all__ = [
    "EmptyContainer",
    "HookContainer",
    "TrainingState",
    "get_hook_container",
    "get_record_keeper",
    "resolve_metric_key",
]
