"""Testers: embed dataset splits with a model and score them with an AccuracyCalculator."""

from __future__ import annotations

from .base_tester import BaseTester
from .global_embedding_space import GlobalEmbeddingSpaceTester
from .global_two_stream import GlobalTwoStreamEmbeddingSpaceTester
from .label_mapper import LabelMapper
from .with_same_parent_label import WithSameParentLabelTester

__all__ = [
    "BaseTester",
    "GlobalEmbeddingSpaceTester",
    "GlobalTwoStreamEmbeddingSpaceTester",
    "LabelMapper",
    "WithSameParentLabelTester",
]
