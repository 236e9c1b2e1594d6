"""The CMC of the single-gallery-shot protocol (torchreid's CUHK03 mode), exactly.

After the re-identification protocol's exclusions, each query's candidates are ranked;
the single-shot protocol then keeps *one* candidate per identity, drawn uniformly at
random, and asks at which rank the query's identity comes in that subset. torchreid
(``evaluate_rank(..., use_metric_cuhk03=True)``) estimates the resulting CMC by averaging
10 draws per query. Its expectation over the draws has a closed form, which is what
:func:`expected_cmc` computes, so that two evaluations of the same embeddings give the same
numbers: if the drawn item of the query's identity sits at ranked position ``p``, another
identity ``j`` comes before it exactly when its own draw lands before ``p``, with
probability ``c_j(p) / n_j`` (``c_j(p)`` of its ``n_j`` candidates precede ``p``), and the
identities are drawn independently. The number of identities before ``p`` is therefore a
Poisson-binomial variable, whose distribution below ``max_rank`` a short recursion over
the identities gives; the CMC at rank ``K`` averages ``P(fewer than K before p)`` over the
query identity's candidates ``p``. :func:`drawn_cmc` makes the draws themselves, from
NumPy's global random state in torchreid's order, to reproduce its numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..._validation import check_positive_int, invalid
from ...errors import InvalidTypeError
from ._metric_names import parse_metric_name

__all__ = [
    "SingleShot",
    "drawn_cmc",
    "expected_cmc",
    "single_shot_option",
    "single_shot_rank",
]

logger = logging.getLogger(__name__)
CALLER = "AccuracyCalculator.get_accuracy"

# float64 elements of the (queries, relevant items, identities) block of one step.
_BLOCK_ELEMENTS = 1 << 22
# Random integers drawn at once by the single-shot draws (8 bytes each: 8 MiB; with the
# chunk's other temporaries about six times that).
_DRAW_ELEMENTS = 1 << 20
# Skipped: a relevant candidate's chances whose bound is below exp(-50) (about 2e-22).
_NEGLIGIBLE_EXPONENT = 50.0


def single_shot_rank(name: str) -> int | None:
    """The rank ``K`` whose single-shot CMC a metric is, or None for the other metrics.

    Example:
        >>> single_shot_rank("recall_at_5"), single_shot_rank("precision_at_1")
        (5, 1)
        >>> single_shot_rank("mean_average_precision") is None
        True
    """
    if name == "precision_at_1":
        return 1
    parsed = parse_metric_name(name)
    return parsed.k if parsed is not None and parsed.family == "recall" else None


def expected_cmc(identities: torch.Tensor, relevance: torch.Tensor, max_rank: int) -> torch.Tensor:
    """Each query's single-shot CMC up to ``max_rank``, as the exact expectation over the draws.

    Args:
        identities: ``(n, L)`` long: the identity id (``>= 0``) of each query's ranked
            candidates, nearest first; ``-1`` past a row's last candidate.
        relevance: ``(n, L)`` bool: which candidates have the query's identity (every row
            has at least one).
        max_rank: The last rank of the curve.

    Returns:
        ``(n, max_rank)`` float64: entry ``[q, K - 1]`` is the probability that the query's
        identity comes within the first ``K`` identities of a random single-shot draw.

    Example:
        >>> ids = torch.tensor([[0, 1, 1, 0]])  # query identity 0, two candidates each
        >>> expected_cmc(ids, ids == 0, 2).tolist()  # 1st: rank 1; 4th: rank 1 w.p. 0
        [[0.5, 1.0]]
    """
    found = torch.zeros(len(identities), max_rank, dtype=torch.float64)
    if len(identities) == 0 or max_rank == 0:
        return found
    identities, relevance = identities.cpu(), relevance.cpu()
    num_ids = int(identities.max()) + 1
    most_relevant = int(relevance.sum(dim=1).max())
    rows = max(1, _BLOCK_ELEMENTS // ((most_relevant + 1) * num_ids))
    for start in range(0, len(identities), rows):
        block = slice(start, start + rows)
        found[block] = _expected_block(identities[block], relevance[block], num_ids, max_rank)
    return found


def _expected_block(
    identities: torch.Tensor, relevance: torch.Tensor, num_ids: int, max_rank: int
) -> torch.Tensor:
    """:func:`expected_cmc` of a block of queries."""
    before, totals = _counts_before(identities, relevance, num_ids)
    counts = relevance.sum(dim=1)
    real = torch.arange(before.shape[1]).unsqueeze(0) < counts.unsqueeze(1)
    totals = totals.unsqueeze(1).expand_as(before)[real]
    before = before[real]  # (relevant candidates of the block, identities)
    share = before / totals.clamp_min(1)  # P(identity j is drawn before the candidate)
    certain = ((before == totals) & (totals > 0)).sum(dim=1)
    partial = torch.where((share > 0) & (share < 1), share, torch.zeros_like(share))
    room = max_rank - 1 - certain  # how many partial ones may come before it, at most
    alive = (room >= 0) & ~_surely_more(partial.sum(dim=1), room)
    chance = torch.zeros(len(before), max_rank, dtype=torch.float64)
    if bool(alive.any()):
        fewer = _poisson_binomial_cdf(partial[alive], max_rank)  # P(partial before <= s)
        shifted = torch.arange(max_rank).unsqueeze(0) - certain[alive].unsqueeze(1)
        chance[alive] = fewer.gather(1, shifted.clamp_min(0)) * (shifted >= 0)
    per_query = torch.zeros(len(identities), max_rank, dtype=torch.float64)
    rows = torch.arange(len(identities)).unsqueeze(1).expand_as(real)[real]
    per_query.index_add_(0, rows, chance)
    return per_query / counts.unsqueeze(1)


def _surely_more(mean: torch.Tensor, room: torch.Tensor) -> torch.Tensor:
    """Where a sum of independent trials with this ``mean`` is at most ``room`` with a
    probability below ``exp(-50)`` (Chernoff's lower tail ``exp(-(mean - room)^2 / (2
    mean))``): far below the rounding of a float64 CMC value, so those are not computed."""
    gap = mean - room
    return (gap > 0) & (gap * gap > _NEGLIGIBLE_EXPONENT * 2 * mean)


def _counts_before(
    identities: torch.Tensor, relevance: torch.Tensor, num_ids: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(before, totals)``: ``before[q, i, j]`` candidates of the other identity ``j`` rank
    before query ``q``'s ``i``-th relevant candidate; ``totals[q, j]`` are all of them."""
    num_rows = len(identities)
    most = int(relevance.sum(dim=1).max())
    # segment of a candidate: how many relevant candidates rank before it
    segment = (relevance.cumsum(dim=1) - relevance.long()).clamp_max(most)
    other = (identities >= 0) & ~relevance
    row = torch.arange(num_rows).unsqueeze(1).expand_as(identities)
    flat = (row * (most + 1) + segment) * num_ids + identities.clamp_min(0)
    counts = torch.zeros(num_rows * (most + 1) * num_ids, dtype=torch.float64)
    counts.index_add_(0, flat[other], torch.ones(int(other.sum()), dtype=torch.float64))
    counts = counts.view(num_rows, most + 1, num_ids)
    return counts.cumsum(dim=1)[:, :most], counts.sum(dim=1)


def _poisson_binomial_cdf(chances: torch.Tensor, size: int) -> torch.Tensor:
    """``P(S <= s)`` for ``s < size``, each row's ``S`` the number of successes of
    independent trials with that row's success chances (truncated recursion, float64).

    Each row's nonzero chances are moved to its first columns and the rows sorted by how
    many they have, so step ``m`` of the recursion updates only the rows with more than
    ``m`` (a good model's early relevant candidates have few identities partly ahead).
    """
    counts = (chances != 0).sum(dim=1)
    order = counts.argsort(descending=True)
    by_trial = _nonzero_first(chances[order]).t().contiguous()  # one row per step
    active = (counts[order].unsqueeze(0) > torch.arange(len(by_trial)).unsqueeze(1)).sum(1)
    mass = torch.zeros(size, len(chances), dtype=torch.float64)  # mass[s]: P(S = s)
    mass[0] = 1.0
    for chance, rows in zip(by_trial, active.tolist()):
        chance, part = chance[:rows], mass[:, :rows]
        moved = part[:-1] * chance
        part.mul_(1.0 - chance)
        part[1:] += moved
    found = torch.empty_like(mass)
    found[:, order] = mass.cumsum(dim=0)
    return found.t()


def _nonzero_first(values: torch.Tensor) -> torch.Tensor:
    """Each row's nonzero values in its first columns (in order), then zeros; as many
    columns as the row with the most nonzero values."""
    nonzero = values != 0
    width = int(nonzero.sum(dim=1).max()) if len(values) else 0
    column = nonzero.long().cumsum(dim=1) - 1
    packed = torch.zeros(len(values), width, dtype=values.dtype)
    rows = torch.arange(len(values)).unsqueeze(1).expand_as(values)
    packed[rows[nonzero], column[nonzero]] = values[nonzero]
    return packed


def drawn_cmc(
    identities: torch.Tensor, relevance: torch.Tensor, max_rank: int, draws: int
) -> torch.Tensor:
    """Each query's single-shot CMC up to ``max_rank``, averaged over ``draws`` random draws.

    The draws come from NumPy's global random state in torchreid's order: query by query,
    ``draws`` times, one candidate per identity, the identities in the order of their
    first candidate, each drawn as ``np.random.choice`` over that identity's positions
    would draw it. After the same ``np.random.seed``, torchreid's
    ``evaluate_rank(..., use_metric_cuhk03=True)`` (10 draws) makes the same draws.

    Args:
        identities: As for :func:`expected_cmc`.
        relevance: As for :func:`expected_cmc`.
        max_rank: The last rank of the curve.
        draws: Draws per query.

    Returns:
        ``(n, max_rank)`` float64: the share of the draws in which the query's identity
        comes within the first ``K`` identities, at ``[q, K - 1]``.
    """
    found = torch.zeros(len(identities), max_rank, dtype=torch.float64)
    for row, (ids, relevant) in enumerate(zip(identities.cpu().numpy(), relevance.cpu().numpy())):
        hits = _drawn_hits(ids[ids >= 0], relevant[ids >= 0], draws, max_rank)
        found[row] = torch.from_numpy(hits / draws)
    return found


def _drawn_hits(ids: np.ndarray, relevant: np.ndarray, draws: int, max_rank: int) -> np.ndarray:
    """How many of ``draws`` single-shot draws of one query's ranked candidates ``ids``
    put its identity within each rank ``1 .. max_rank`` (float64 counts).

    The draws are made in chunks of at most :data:`_DRAW_ELEMENTS` random integers, one
    after the other from the same random state (so the numbers do not depend on the chunk
    size), and only counts are kept: any number of draws runs in bounded memory.
    """
    identity = _identities_by_first(ids)
    sizes = np.bincount(identity)
    positions = np.argsort(identity, kind="stable")  # grouped by identity, nearest first
    starts = np.cumsum(sizes) - sizes
    own_identity = identity[np.flatnonzero(relevant)[0]]
    ranks = np.arange(1, max_rank + 1)
    hits = np.zeros(max_rank, dtype=np.float64)
    chunk = max(1, _DRAW_ELEMENTS // len(sizes))
    done = 0
    while done < draws:
        size = min(chunk, draws - done)
        # a bounded integer per (draw, identity), as np.random.choice(positions of j) draws it
        picks = np.random.randint(0, np.tile(sizes, size)).reshape(size, len(sizes))
        chosen = positions[starts[None, :] + picks]
        drawn = (chosen < chosen[:, own_identity : own_identity + 1]).sum(axis=1) + 1
        hits += (drawn[:, None] <= ranks[None, :]).sum(axis=0)
        done += size
    return hits


def _identities_by_first(ids: np.ndarray) -> np.ndarray:
    """Each candidate's identity, the identities numbered in order of first appearance."""
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.empty(len(first), dtype=np.int64)
    order[np.argsort(first, kind="stable")] = np.arange(len(first))
    return order[inverse.reshape(-1)]


@dataclass(frozen=True)
class SingleShot:
    """The single-gallery-shot option of one ``get_accuracy`` call.

    Attributes:
        draws: ``None`` for the exact expectation, else the random draws per query.
    """

    draws: int | None = None


def single_shot_option(enabled: Any, draws: Any) -> SingleShot | None:
    """The checked ``single_gallery_shot`` and ``single_gallery_shot_draws`` arguments."""
    if not isinstance(enabled, (bool, np.bool_)):
        raise invalid("single_gallery_shot", CALLER, "True or False", enabled, InvalidTypeError)
    if draws is not None:
        if not enabled:
            raise invalid(
                "single_gallery_shot_draws",
                CALLER,
                "None unless single_gallery_shot=True (it sets how many random draws make "
                "the single-shot CMC)",
                draws,
            )
        draws = check_positive_int(draws, "single_gallery_shot_draws", CALLER)
    return SingleShot(draws) if enabled else None
