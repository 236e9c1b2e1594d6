"""Evaluation across the ranks of a ``torch.distributed`` process group.

Every rank holds a shard of the embeddings; the results equal a single process given the
shards concatenated in rank order. Importing this package does not initialize
``torch.distributed``.
"""

from __future__ import annotations

from ._collectives import DistributedEvaluationError
from .accumulator import AccuracyAccumulator
from .accuracy import DistributedAccuracyCalculator
from .exclusion import ShardExclusion
from .kmeans import DistributedKMeans
from .knn import DistributedKNN, merge_order, merge_top_k

__all__ = [
    "AccuracyAccumulator",
    "DistributedAccuracyCalculator",
    "DistributedEvaluationError",
    "DistributedKMeans",
    "DistributedKNN",
    "ShardExclusion",
    "merge_order",
    "merge_top_k",
]
