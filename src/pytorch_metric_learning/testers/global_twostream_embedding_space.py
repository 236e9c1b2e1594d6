"""2.x's module path of :class:`GlobalTwoStreamEmbeddingSpaceTester` (here it lives in
:mod:`pytorch_metric_learning.testers.global_two_stream`), kept so that 2.x's import line
``from pytorch_metric_learning.testers.global_twostream_embedding_space import ...`` works.
"""

from __future__ import annotations

from .global_two_stream import GlobalTwoStreamEmbeddingSpaceTester

__all__ = ["GlobalTwoStreamEmbeddingSpaceTester"]
