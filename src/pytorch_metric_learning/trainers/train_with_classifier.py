"""Train with a classification loss on a classifier's logits, plus an optional metric loss."""

from __future__ import annotations

import logging
from typing import Any

import torch

from .._validation import invalid
from ..errors import InvalidKeysError, InvalidTypeError
from .metric_loss_only import MetricLossOnly

__all__ = ["TrainWithClassifier"]

logger = logging.getLogger(__name__)


class TrainWithClassifier(MetricLossOnly):
    """2.x's ``TrainWithClassifier``: ``models["classifier"]`` turns embeddings into logits.

    Each batch gets ``loss_funcs["classifier_loss"](logits, labels)`` (e.g.
    ``torch.nn.CrossEntropyLoss()``) and, when ``loss_funcs`` has one,
    ``loss_funcs["metric_loss"](embeddings, labels, indices_tuple)``. As in 2.x, a loss
    whose ``loss_weights`` entry is 0 is not computed. Without a ``models["classifier"]`` or
    a ``loss_funcs["classifier_loss"]`` it logs a warning and trains the metric loss alone,
    as 2.x did; with neither loss it raises ``InvalidKeysError``. Labels for the classifier must run
    from 0 to ``num_classes - 1`` (see ``set_min_label_to_zero``). The arguments are those
    of :class:`~pytorch_metric_learning.trainers.BaseTrainer`.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> trunk, classifier = torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)
        >>> parameters = list(trunk.parameters()) + list(classifier.parameters())
        >>> trainer = TrainWithClassifier(
        ...     models={"trunk": trunk, "classifier": classifier},
        ...     optimizers={"trunk_optimizer": torch.optim.SGD(parameters, lr=0.1)},
        ...     batch_size=4,
        ...     loss_funcs={"classifier_loss": torch.nn.CrossEntropyLoss()},
        ...     dataset=TensorDataset(torch.randn(8, 4), torch.arange(8) % 2),
        ...     dataloader_num_workers=0,
        ... )
        >>> trainer.train(num_epochs=1)
        >>> sorted(trainer.losses)
        ['classifier_loss', 'metric_loss', 'total_loss']
    """

    required_loss_funcs: tuple[str, ...] = ()  # either loss, checked below
    allowed_models = ("trunk", "embedder", "classifier")
    allowed_loss_funcs = ("metric_loss", "classifier_loss")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        owner = type(self).__name__
        classifier = self.models.get("classifier")
        if classifier is not None and not callable(classifier):
            raise invalid(
                "models", owner, 'a callable "classifier"', type(classifier), InvalidTypeError
            )
        if self._trains_classifier():
            return
        if "metric_loss" not in self.loss_funcs:
            raise invalid(
                "loss_funcs",
                owner,
                'a dict with "classifier_loss" (and models["classifier"]) or "metric_loss"',
                list(self.loss_funcs),
                InvalidKeysError,
            )
        logger.warning(
            '%s has no models["classifier"] or no loss_funcs["classifier_loss"]: '
            "only the metric loss is trained.",
            owner,
        )

    def _trains_classifier(self) -> bool:
        return callable(self.models.get("classifier")) and "classifier_loss" in self.loss_funcs

    def calculate_loss(self, curr_batch: tuple[Any, Any]) -> dict[str, Any]:
        """The classifier loss (and the metric loss, if given) of one batch."""
        data, labels = curr_batch
        embeddings = self.compute_embeddings(data)
        losses: dict[str, Any] = {}
        if self._weighted("metric_loss"):
            indices_tuple = self.maybe_mine_embeddings(embeddings, labels)
            losses["metric_loss"] = self.loss_funcs["metric_loss"](
                embeddings, labels, indices_tuple
            )
        else:
            losses["metric_loss"] = 0.0  # as 2.x: the key stays, at 0
        if self._trains_classifier() and self._weighted("classifier_loss"):
            logits = self.models["classifier"](embeddings)
            losses["classifier_loss"] = self.loss_funcs["classifier_loss"](
                logits, torch.as_tensor(labels, device=logits.device)
            )
        else:
            losses["classifier_loss"] = 0.0  # as 2.x: the key stays, at 0
        return losses

    def _weighted(self, name: str) -> bool:
        return name in self.loss_funcs and self.loss_weights.get(name, 0.0) > 0
