"""Nearest-neighbour search, thresholds, clustering and accuracy of embeddings.

The package is four rooms, each importing only those below it: ``search`` (the k-NN
contract, registry and CustomKNN), ``clustering`` (k-means, mutual information),
``verification`` (MatchFinder, thresholds, operating points) and ``retrieval``
(AccuracyCalculator, metrics, bootstrap); ``distributed`` runs them over a process group.
Importing this package imports neither faiss nor scikit-learn.
"""

from __future__ import annotations

from . import clustering, retrieval, search, verification
from .clustering import *  # noqa: F403
from .retrieval import *  # noqa: F403
from .search import *  # noqa: F403
from .verification import *  # noqa: F403

__all__ = [*search.__all__, *clustering.__all__, *verification.__all__, *retrieval.__all__]
