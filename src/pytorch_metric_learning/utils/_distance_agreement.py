"""Whether a k-NN backend and a match finder order embeddings the same way (2.x issue #430).

In 2.x, ``InferenceModel`` searched neighbours with faiss's squared Euclidean distance while
its match finder compared cosine similarities: on unnormalized embeddings a neighbour could
rank first and yet not match while a farther one did. Two distances *agree* here when they
sort any set of neighbours in the same order; on unit-length embeddings Euclidean distance,
dot product and cosine similarity all agree.
"""

from __future__ import annotations

from typing import Any

from ..distances import BaseDistance, CosineSimilarity, DotProductSimilarity, LpDistance
from ..evaluation.search.knn import default_custom_knn
from ..evaluation.verification.match_finder import MatchFinder

__all__ = ["default_knn_for", "knn_distance", "ranking", "disagreement"]


def ranking(distance: BaseDistance | None, unit_inputs: bool) -> str | None:
    """The name of the order ``distance`` puts neighbours in; None when it cannot be told.

    ``unit_inputs`` says whether the embeddings are already normalized to unit length.

    Example:
        >>> ranking(LpDistance(normalize_embeddings=False), unit_inputs=True)
        'cosine'
        >>> ranking(LpDistance(normalize_embeddings=False), unit_inputs=False)
        'euclidean'
    """
    if distance is None:
        return None
    unit = unit_inputs or distance.normalize_embeddings
    kind = type(distance)
    if kind is LpDistance and distance.power > 0 and not distance.is_inverted:
        if distance.p == 2:
            return "cosine" if unit else "euclidean"
        return f"L{distance.p} of unit vectors" if unit else f"L{distance.p}"
    if kind in (DotProductSimilarity, CosineSimilarity) and distance.power == 1:
        return "cosine" if unit else "dot product"
    return None


def knn_distance(knn_func: Any) -> BaseDistance | None:
    """The distance a k-NN backend ranks by, when it says (``CustomKNN``, ``FaissKNN``)."""
    distance = getattr(knn_func, "distance", None)
    return distance if isinstance(distance, BaseDistance) else None


def disagreement(knn_func: Any, match_finder: MatchFinder, unit_inputs: bool) -> str | None:
    """A sentence describing how the two orders differ, or None when they agree or are unknown.

    Example:
        >>> from pytorch_metric_learning.evaluation import CustomKNN
        >>> knn = CustomKNN(LpDistance(normalize_embeddings=False))
        >>> disagreement(knn, MatchFinder(CosineSimilarity()), unit_inputs=True) is None
        True
        >>> disagreement(knn, MatchFinder(CosineSimilarity()), unit_inputs=False)
        'the k-NN backend orders neighbours by euclidean but the match finder by cosine'
    """
    by_knn = ranking(knn_distance(knn_func), unit_inputs)
    by_matches = ranking(match_finder.distance, unit_inputs)
    if by_knn is None or by_matches is None or by_knn == by_matches:
        return None
    return f"the k-NN backend orders neighbours by {by_knn} but the match finder by {by_matches}"


def default_knn_for(match_finder: MatchFinder) -> Any:
    """An exact ``custom`` k-NN backend that ranks as ``match_finder`` decides matches.

    For cosine similarity it reports squared Euclidean distances between unit vectors
    (``2 - 2 cos``, smaller is closer: what 2.x's default faiss index returned for
    normalized embeddings); for any other distance, that distance itself.

    Example:
        >>> default_knn_for(MatchFinder(CosineSimilarity())).distance
        LpDistance(normalize_embeddings=True, p=2, power=2, is_inverted=False)
    """
    distance = match_finder.distance
    if type(distance) is CosineSimilarity and distance.power == 1:
        distance = LpDistance(normalize_embeddings=True, power=2)
    return default_custom_knn(distance)
