"""Euclidean searches of embeddings far from the origin, moved near it first.

A matrix product scores a pair as ``|q|^2 + |r|^2 - 2 q.r``, whose rounding grows with the
squared norms, not with the distance: embeddings that lie 1,000 away from the origin with
a spread of 1 are scored with errors larger than the gaps between their neighbours, and
nearly every row had to be searched again whole (30 to 50 times a float64 brute force).
Distances do not change when both sides move by one vector, so such a search runs on the
rows less their reference's mean; the distances it reports are scored again from the
original pairs (see ``_pair_scores``), so the results do not depend on the move.
"""

from __future__ import annotations

import torch

from ...distances import BaseDistance

__all__ = ["CENTRE_RATIO", "SAMPLE_ROWS", "centre_of", "centred"]

# The reference is moved when its mean's squared norm exceeds this many times its rows'
# mean squared distance to the mean (the rounding then shrinks by that much or more);
# nearer the origin the copies would cost memory for little (uniform [0, 1] coordinates
# give 3, rectified Gaussian ones 0.5).
CENTRE_RATIO = 8.0
# Rows of the evenly spaced sample that the mean is taken over: every Euclidean search
# takes it, in float64 (4 MiB at 128 dimensions; the centre need not be exact).
SAMPLE_ROWS = 4096


def centre_of(distance: BaseDistance, reference: torch.Tensor) -> torch.Tensor | None:
    """The vector (float64) to move a Euclidean search's inputs by, or None where
    ``distance`` is not a distance between unnormalized rows or ``reference`` lies near
    the origin."""
    if distance.normalize_embeddings or distance.is_inverted or not len(reference):
        return None
    step = max(1, len(reference) // SAMPLE_ROWS)
    sample = reference[::step].double()
    mean = sample.mean(dim=0)
    spread = (sample - mean).square().sum(dim=1).mean()
    if float(mean.square().sum()) <= CENTRE_RATIO * float(spread):
        return None
    return mean


def centred(rows: torch.Tensor, centre: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``rows - centre``, in the type a search of ``rows`` against ``other`` computes in."""
    dtype = torch.promote_types(rows.dtype, other.dtype)
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    return rows.to(dtype) - centre.to(dtype)
