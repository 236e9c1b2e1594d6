"""Per-query values of the k-NN metrics, kept instead of averaged.

An average hides which queries fail and how noisy it is. Keeping one float64 value per
non-lone query lets users slice by class, list failure cases, and bootstrap intervals
(:mod:`.bootstrap`) from the same numbers the averages come from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..._validation import check_positive_int
from ...errors import InvalidArgumentError
from ._metric_names import per_query_function
from ._single_shot import single_shot_rank
from .metrics import first_relevant_rank

__all__ = ["PerQueryValues", "cmc_curve", "collect_per_query", "per_query_values"]


@dataclass
class PerQueryValues:
    """Each k-NN metric's value for every non-lone query.

    Attributes:
        query_indices: Long tensor: the rows of the query that have at least one relevant
            reference (lone queries have no value), in increasing order. With one set in
            two roles (``is_query``/``is_reference``) the query is the set's query rows,
            so these count positions among them (as ``query_categories`` does).
        query_rows: The same queries as rows of the embeddings given to ``get_accuracy``:
            equal to ``query_indices``, except with ``is_query``/``is_reference``, where
            they are rows of the one set (as ``query_groups``, ``excluded_pairs`` and
            ``find_worst_queries`` number them). None where no call filled it in.
        query_labels: The labels of those queries (for slicing or resampling by class).
        values: ``{metric name: float64 tensor}``, aligned with ``query_indices``; its mean
            is the metric as ``get_accuracy`` reports it without ``avg_of_avgs``.
        first_relevant_rank: Long tensor aligned with ``query_indices``: the rank (from 1)
            of each query's first relevant neighbour among the retrieved ones, 0 when none
            of them is relevant (the CMC curve, see :meth:`cmc_curve`).
        num_retrieved: Neighbours retrieved per query (candidates, under a protocol).
        single_shot_cmc: With ``single_gallery_shot``: float64 ``(len(query_indices),
            max_rank)``, each query's single-shot CMC up to the largest ``recall_at_<K>``
            selected (which :meth:`cmc_curve` averages); None otherwise.
        computed_under: What ``get_accuracy`` computed the values under: ``{argument:
            digest}`` of the calculator's ``k``, the inputs' labels and sizes and every
            protocol argument (groups, junk and distractor labels, excluded pairs, roles,
            single-gallery-shot and its draws), so that a reuser
            (``find_worst_queries(per_query=...)``) can refuse values of another protocol.
            None when built by hand.
    """

    query_indices: torch.Tensor
    query_labels: torch.Tensor
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    first_relevant_rank: torch.Tensor | None = None
    num_retrieved: int = 0
    single_shot_cmc: torch.Tensor | None = None
    query_rows: torch.Tensor | None = None
    computed_under: dict[str, str] | None = None

    def __len__(self) -> int:
        return len(self.query_indices)

    def cmc_curve(self, max_rank: int) -> torch.Tensor:
        """The CMC curve up to ``max_rank``: see :func:`cmc_curve`."""
        return cmc_curve(self, max_rank)


def cmc_curve(per_query: PerQueryValues, max_rank: int) -> torch.Tensor:
    """The cumulative matching characteristic: entry ``r - 1`` is the share of the queries
    (those with a relevant reference) whose first relevant neighbour has rank ``r`` or less,
    i.e. ``recall_at_<r>``, for ``r = 1 .. max_rank``; float64.

    ``max_rank`` may not exceed the neighbours retrieved, unless every query already found a
    relevant one. The metrics requested decide how many are retrieved: ``recall_at_<K>``
    keeps K, ``mean_average_precision`` with ``k=None`` every reference; so include
    ``recall_at_<max_rank>`` for a curve up to ``max_rank``.

    Example:
        >>> import torch
        >>> from pytorch_metric_learning.evaluation.retrieval import AccuracyCalculator
        >>> calc = AccuracyCalculator(include=("recall_at_3",))
        >>> x = torch.tensor([[0.0], [0.1], [1.0], [1.1]])
        >>> out = calc.get_accuracy(x[:2], torch.tensor([0, 1]), x, torch.tensor([0, 0, 1, 1]),
        ...                         return_per_query=True)
        >>> cmc_curve(out["per_query"], 3).tolist()
        [0.5, 0.5, 1.0]
    """
    max_rank = check_positive_int(max_rank, "max_rank", "cmc_curve")
    if per_query.single_shot_cmc is not None:
        return _single_shot_curve(per_query.single_shot_cmc, max_rank)
    ranks = per_query.first_relevant_rank
    if ranks is None:
        raise InvalidArgumentError(
            "cmc_curve needs the per-query values of a k-NN metric (get_accuracy(..., "
            "return_per_query=True) with one selected). Got none instead."
        )
    found = ranks > 0
    if max_rank > per_query.num_retrieved and not bool(found.all()):
        raise InvalidArgumentError(
            f"The 'max_rank' parameter of cmc_curve must be at most the {per_query.num_retrieved} "
            f"neighbours retrieved per query. Got {max_rank} instead. The metrics requested "
            "decide how many neighbours are kept (recall_at_<K> keeps K); for a curve up to "
            f"rank {max_rank}, include recall_at_{max_rank} (or mean_average_precision with "
            "k=None, which ranks every reference)."
        )
    if len(ranks) == 0:
        return torch.full((max_rank,), float("nan"), dtype=torch.float64)
    counts = torch.bincount(ranks[found].clamp_max(max_rank + 1), minlength=max_rank + 2)
    return counts[1 : max_rank + 1].cumsum(0).to(torch.float64).cpu() / len(ranks)


def _single_shot_curve(cmc: torch.Tensor, max_rank: int) -> torch.Tensor:
    """The mean of the queries' single-shot CMC rows, up to ``max_rank``."""
    if max_rank > cmc.shape[1]:
        raise InvalidArgumentError(
            f"The 'max_rank' parameter of cmc_curve must be at most {cmc.shape[1]}, the "
            f"largest rank of the single-shot CMC computed. Got {max_rank} instead; include "
            f"recall_at_{max_rank} in the metrics for a curve up to rank {max_rank}."
        )
    if len(cmc) == 0:
        return torch.full((max_rank,), float("nan"), dtype=torch.float64)
    return cmc[:, :max_rank].mean(dim=0).cpu()


def per_query_values(
    metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    relevance: torch.Tensor,
    num_relevant: torch.Tensor,
    block: int,
) -> torch.Tensor:
    """Apply a per-query metric in row blocks of about ``block`` relevance elements."""
    rows = max(1, block // max(1, relevance.shape[1]))
    return torch.cat(
        [
            metric(relevance[start : start + rows], num_relevant[start : start + rows])
            for start in range(0, len(relevance), rows)
        ]
    )


def collect_per_query(names: list[str], kwargs: dict[str, Any], block: int) -> PerQueryValues:
    """Per-query values of the named built-in or parametrized metrics from the k-NN outputs."""
    query_labels = kwargs["query_labels"]
    stats = kwargs.get("label_stats")
    if stats is None:  # no k-NN metric was selected
        empty = torch.zeros(0, dtype=torch.long, device=query_labels.device)
        return PerQueryValues(empty, query_labels[:0], first_relevant_rank=empty)
    keep = stats.not_lone
    if kwargs.get("knn_values") is not None:  # computed block by block of queries
        found = kwargs["knn_values"][keep]
        return PerQueryValues(
            keep.nonzero().flatten(),
            query_labels[keep],
            {name: found.values[name] for name in names if name in found.values},
            found.first_relevant_rank,
            found.num_retrieved,
        )
    relevance, num_relevant = kwargs["relevance"][keep], stats.num_relevant[keep]
    single_shot = kwargs.get("single_shot_cmc")
    single_shot = None if single_shot is None else single_shot[keep]
    values = {}
    for name in names:
        metric = per_query_function(name)
        rank = single_shot_rank(name)
        if single_shot is not None and rank is not None:
            values[name] = single_shot[:, rank - 1]
        elif metric is not None:
            values[name] = (
                per_query_values(metric, relevance, num_relevant, block)
                if len(relevance)
                else torch.zeros(0, dtype=torch.float64, device=relevance.device)
            )
    return PerQueryValues(
        keep.nonzero().flatten(),
        query_labels[keep],
        values,
        first_relevant_rank(relevance),
        relevance.shape[1],
        single_shot,
    )
