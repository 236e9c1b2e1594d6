"""Re-identification test sets (identities seen by cameras) and their evaluation."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from pytorch_metric_learning.evaluation.retrieval import AccuracyCalculator


@st.composite
def camera_sets(draw, num_query=(1, 25), num_gallery=(10, 60), identities=(1, 6)):
    """``(query, gallery, (query_ids, gallery_ids), (query_cams, gallery_cams))``: query
    identities from 1, gallery identities from -1 (junk) and 0 (distractor) up; small
    integer embeddings (many exact ties) or Gaussian ones."""
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    num_query, num_gallery = draw(st.integers(*num_query)), draw(st.integers(*num_gallery))
    num_ids = draw(st.integers(*identities))
    cameras = draw(st.integers(1, 3))
    if draw(st.booleans()):  # small integers: many exact ties
        query = torch.randint(-2, 3, (num_query, 3), generator=generator).float()
        gallery = torch.randint(-2, 3, (num_gallery, 3), generator=generator).float()
    else:
        query = torch.randn(num_query, 5, generator=generator)
        gallery = torch.randn(num_gallery, 5, generator=generator)
    query_ids = torch.randint(1, num_ids + 1, (num_query,), generator=generator)
    gallery_ids = torch.randint(-1, num_ids + 1, (num_gallery,), generator=generator)
    query_cams = torch.randint(0, cameras, (num_query,), generator=generator)
    gallery_cams = torch.randint(0, cameras, (num_gallery,), generator=generator)
    return query, gallery, (query_ids, gallery_ids), (query_cams, gallery_cams)


def evaluate_camera_set(data, metrics, k=None, budget=None, **options) -> tuple[Any, Any]:
    """``(result, calculator)`` of a :func:`camera_sets` set under the re-ID protocol:
    cameras as groups, label -1 junk, label 0 distractor, per-query results returned."""
    query, gallery, (query_ids, gallery_ids), (query_cams, gallery_cams) = data
    calculator = AccuracyCalculator(include=metrics, k=k, knn_output_budget=budget)
    result = calculator.get_accuracy(
        query,
        query_ids,
        gallery,
        gallery_ids,
        query_groups=query_cams,
        reference_groups=gallery_cams,
        junk_labels=(-1,),
        distractor_labels=(0,),
        return_per_query=True,
        **options,
    )
    return result, calculator
