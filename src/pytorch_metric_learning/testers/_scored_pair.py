"""A query split and its reference, embedded, as one value that testers score level by level."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

__all__ = ["ScoredPair"]


class ScoredPair(NamedTuple):
    """Embeddings and labels (every level, 2-D) of a query split and its reference, with
    the protocol they are scored under (groups, single-gallery-shot)."""

    query: torch.Tensor
    query_labels: torch.Tensor
    reference: torch.Tensor
    reference_labels: torch.Tensor
    ref_includes_query: bool
    query_groups: torch.Tensor | None = None
    reference_groups: torch.Tensor | None = None
    single_gallery_shot: bool = False
    single_gallery_shot_draws: int | None = None

    def accuracy_arguments(
        self,
        level: int,
        query_rows: torch.Tensor | None = None,
        reference_rows: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """``get_accuracy``'s keyword arguments for the labels of ``level``, on a subset of
        rows when ``query_rows``/``reference_rows`` (boolean masks) are given."""
        all_query = slice(None) if query_rows is None else query_rows
        all_reference = slice(None) if reference_rows is None else reference_rows
        arguments = {
            "query": self.query[all_query],
            "query_labels": self.query_labels[all_query, level],
            "reference": self.reference[all_reference],
            "reference_labels": self.reference_labels[all_reference, level],
            "ref_includes_query": self.ref_includes_query,
        }
        if self.query_groups is not None and self.reference_groups is not None:
            arguments["query_groups"] = self.query_groups[all_query]
            arguments["reference_groups"] = self.reference_groups[all_reference]
        if self.single_gallery_shot:
            arguments["single_gallery_shot"] = True
            arguments["single_gallery_shot_draws"] = self.single_gallery_shot_draws
        return arguments
