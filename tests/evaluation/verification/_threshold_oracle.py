"""A brute-force oracle for threshold selection, written plainly from the spec's sentences.

Nothing here imports the code under test: candidates are enumerated one by one, decisions
are counted pair by pair, and thresholds follow the spec's rules literally.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

PyMetric = Callable[[int, int, int, int], float]

TORCH_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
NUMPY_DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


def divide(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def py_accuracy(tp: int, fp: int, tn: int, fn: int) -> float:
    return divide(tp + tn, tp + fp + tn + fn)


def py_balanced_accuracy(tp: int, fp: int, tn: int, fn: int) -> float:
    return (divide(tp, tp + fn) + divide(tn, tn + fp)) / 2


def py_f1(tp: int, fp: int, tn: int, fn: int) -> float:
    return divide(2 * tp, 2 * tp + fp + fn)


def round_to(value: float, dtype_name: str) -> float:
    """``value`` rounded to the dtype (to nearest), back as a Python float."""
    return torch.tensor(value, dtype=torch.float64).to(TORCH_DTYPES[dtype_name]).item()


def distinct_strongest_first(scores: list[float], is_inverted: bool) -> list[float]:
    distinct: list[float] = []
    for score in sorted(scores, reverse=is_inverted):
        if not distinct or score != distinct[-1]:
            distinct.append(score)
    return distinct


def count(scores: list[float], labels: list[bool], matched: list[bool]) -> tuple[int, ...]:
    tp = fp = tn = fn = 0
    for label, match in zip(labels, matched):
        if match and label:
            tp += 1
        elif match:
            fp += 1
        elif label:
            fn += 1
        else:
            tn += 1
    return tp, fp, tn, fn


def candidate_counts(
    scores: list[float], labels: list[bool], is_inverted: bool
) -> list[tuple[int, ...]]:
    """Candidate j matches the pairs whose score is one of the j most alike distinct scores."""
    distinct = distinct_strongest_first(scores, is_inverted)
    result = []
    for j in range(len(distinct) + 1):
        chosen = distinct[:j]
        result.append(count(scores, labels, [score in chosen for score in scores]))
    return result


def candidate_threshold(distinct: list[float], j: int, dtype_name: str, is_inverted: bool) -> float:
    """The spec's rule for the threshold of candidate j."""
    if j == 0:
        return math.inf if is_inverted else -math.inf
    if j == len(distinct):
        return distinct[-1]
    stronger, weaker = distinct[j - 1], distinct[j]
    total = stronger + weaker
    mid = total / 2 if math.isfinite(total) else stronger / 2 + weaker / 2
    low, high = min(stronger, weaker), max(stronger, weaker)
    if low < mid < high and low < round_to(mid, dtype_name) < high:
        return mid
    return stronger


def oracle_selection(
    scores: list[float], labels: list[bool], metric: PyMetric, dtype_name: str, is_inverted: bool
) -> tuple[float, float] | None:
    """(threshold, value) maximizing ``metric``; the first (fewest matches) wins ties."""
    best_j, best_value = None, None
    for j, counts in enumerate(candidate_counts(scores, labels, is_inverted)):
        value = metric(*counts)
        if math.isnan(value):
            continue
        if best_value is None or value > best_value:
            best_j, best_value = j, value
    if best_j is None:
        return None
    distinct = distinct_strongest_first(scores, is_inverted)
    return candidate_threshold(distinct, best_j, dtype_name, is_inverted), best_value


def decide(scores: list[float], threshold: float, is_inverted: bool) -> list[bool]:
    return [s >= threshold if is_inverted else s <= threshold for s in scores]


@st.composite
def score_pools(draw: st.DrawFn, dtype_name: str) -> list[float]:
    """A few values of the dtype, each with some of its adjacent floats (heavy ties)."""
    torch_dtype = TORCH_DTYPES[dtype_name]
    finfo = torch.finfo(torch_dtype)
    specials = [0.0, -0.0, finfo.max, -finfo.max, finfo.tiny, finfo.smallest_normal / 4]
    pool: list[float] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            base = draw(st.sampled_from(specials))
        else:
            base = draw(st.floats(-100.0, 100.0, allow_nan=False))
        value = torch.tensor(base, dtype=torch.float64).to(torch_dtype)
        pool.append(value.item())
        for _ in range(draw(st.integers(0, 3))):
            value = _next_float(value, dtype_name, up=draw(st.booleans()))
            pool.append(value.item())
    return [v for v in pool if math.isfinite(v)]


def _next_float(value: torch.Tensor, dtype_name: str, up: bool) -> torch.Tensor:
    if dtype_name in NUMPY_DTYPES:
        np_dtype = NUMPY_DTYPES[dtype_name]
        target = np_dtype(np.inf if up else -np.inf)
        with np.errstate(over="ignore"):
            stepped = np.nextafter(np_dtype(value.item()), target)
        return torch.tensor(float(stepped), dtype=torch.float64).to(value.dtype)
    target = torch.tensor(math.inf if up else -math.inf, dtype=value.dtype)
    return torch.nextafter(value, target)


@st.composite
def validation_pairs(
    draw: st.DrawFn, dtype_names: tuple[str, ...] = tuple(TORCH_DTYPES), max_size: int = 12
) -> tuple[list[float], list[bool], str]:
    dtype_name = draw(st.sampled_from(dtype_names))
    pool = draw(score_pools(dtype_name))
    assume(pool)
    scores = draw(st.lists(st.sampled_from(pool), min_size=2, max_size=max_size))
    labels = draw(st.lists(st.booleans(), min_size=len(scores), max_size=len(scores)))
    assume(any(labels) and not all(labels))
    return scores, labels, dtype_name


def as_tensor(scores: list[float], dtype_name: str) -> torch.Tensor:
    return torch.tensor(scores, dtype=torch.float64).to(TORCH_DTYPES[dtype_name])
