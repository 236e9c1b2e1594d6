"""The distance interface shared by every distance and similarity."""

from __future__ import annotations

import numbers
import sys
from typing import Any

import torch

from .._validation import check_matrix, check_tensor, invalid
from ..errors import InvalidArgumentError, InvalidTypeError
from . import _records
from ._zero_safe import zero_safe_power

__all__ = ["BaseDistance"]

_HALF_DTYPES = (torch.float16, torch.bfloat16)


_C_F_MODULE = "pytorch_metric_learning.utils.common_functions"
_STAT_NAMES = (
    "initial_avg_query_norm",
    "initial_avg_ref_norm",
    "final_avg_query_norm",
    "final_avg_ref_norm",
)


class BaseDistance(torch.nn.Module):
    """A distance (smaller is closer) or, with ``is_inverted=True``, a similarity.

    Subclasses implement :meth:`compute_mat` and :meth:`compute_pairwise` on embeddings
    that are already normalized; this class handles validation, dtype rules,
    normalization and ``power``. A subclass written for pytorch-metric-learning 2.x, with
    ``compute_mat`` and ``pairwise_distance``, works too: its ``pairwise_distance``
    receives prepared (normalized) rows. A subclass with ``compute_mat`` alone gets
    row-pair values from the diagonal of ``compute_mat``.

    Distances are ``torch.nn.Module``s, as in 2.x, so they can be children of a loss
    module; they hold no parameters or buffers.

    Args:
        normalize_embeddings: L_p-normalize each row before comparing.
        p: The norm used for normalization (and by :class:`LpDistance`).
        power: Every value is raised to this power.
        is_inverted: True when larger values mean more alike.
        collect_stats: As in 2.x: when True, each call stores the average norms of the
            inputs before and after normalization in ``initial_avg_query_norm``,
            ``initial_avg_ref_norm``, ``final_avg_query_norm`` and
            ``final_avg_ref_norm``. ``None`` (the default) reads
            ``common_functions.COLLECT_STATS`` (False unless set).

    Half-precision inputs are computed in float32. The result keeps the input dtype when
    embeddings are normalized (values are bounded) and is float32 otherwise, so squared
    norms cannot overflow float16.
    """

    normalize_embeddings: bool
    p: float
    power: float
    is_inverted: bool
    collect_stats: bool

    def __init__(
        self,
        normalize_embeddings: bool = True,
        p: float = 2,
        power: float = 1,
        is_inverted: bool = False,
        collect_stats: bool | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        if not isinstance(normalize_embeddings, bool):
            raise invalid(
                "normalize_embeddings", owner, "a bool", normalize_embeddings, InvalidTypeError
            )
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not p > 0:
            raise invalid("p", owner, "a positive number", p)
        if isinstance(power, bool) or not isinstance(power, numbers.Real) or power != power:
            raise invalid("power", owner, "a real number", power)
        self.normalize_embeddings = normalize_embeddings
        self.p = p
        self.power = power
        self.is_inverted = bool(is_inverted)
        self.collect_stats = _collect_stats_flag(collect_stats, owner)
        for name in _STAT_NAMES:
            setattr(self, name, 0.0)
        self.add_to_recordable_attributes(list_of_names=["p", "power"], is_stat=False)
        self.add_to_recordable_attributes(list_of_names=list(_STAT_NAMES), is_stat=True)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(normalize_embeddings={self.normalize_embeddings}, "
            f"p={self.p}, power={self.power}, is_inverted={self.is_inverted})"
        )

    def forward(self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None = None) -> torch.Tensor:
        """Return the ``(len(query_emb), len(ref_emb))`` matrix of values.

        ``ref_emb=None`` compares ``query_emb`` with itself.

        Example:
            >>> from pytorch_metric_learning.distances import LpDistance
            >>> LpDistance()(torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 1.0]])).shape
            torch.Size([1, 1])
        """
        self.reset_stats()
        query, ref, out_dtype = self.prepare(query_emb, ref_emb)
        if self.collect_stats:
            self.set_default_stats(query_emb, ref_emb, query, ref)
        return self.powered_mat(query, ref).to(out_dtype)

    def pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Return one value per row pair: the value between ``x[i]`` and ``y[i]``.

        Example:
            >>> from pytorch_metric_learning.distances import LpDistance
            >>> d = LpDistance(normalize_embeddings=False)
            >>> d.pairwise(torch.tensor([[0.0, 0.0]]), torch.tensor([[3.0, 4.0]])).tolist()
            [5.0]
        """
        owner = f"{type(self).__name__}.pairwise"
        check_tensor(x, "x", owner)
        check_tensor(y, "y", owner)
        if x.shape != y.shape:
            raise InvalidArgumentError(
                f"The inputs of {type(self).__name__}.pairwise must have the same shape. "
                f"Got {tuple(x.shape)} and {tuple(y.shape)} instead."
            )
        first, second, out_dtype = self.prepare(x, y)
        return self.powered_pairwise(first, second).to(out_dtype)

    def pairwise_distance(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        """The same as :meth:`pairwise`; the name used by pytorch-metric-learning 2.x.

        Unlike 2.x, the rows are normalized (when ``normalize_embeddings``) and the values
        raised to ``power``, as in the matrix; see ``docs/migrating.md``.
        """
        return self.pairwise(query_emb, ref_emb)

    def check_shapes(self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None) -> None:
        """Refuse inputs this distance cannot compare; every call checks through here.

        The default accepts floating-point 2-D tensors ``(rows, dims)`` with the same
        number of columns on the same device. As in 2.x, a subclass may override it (for
        example with ``pass``) to accept other shapes that its ``compute_mat`` handles.
        """
        owner = type(self).__name__
        check_matrix(query_emb, "query_emb", owner)
        if ref_emb is None:
            return
        check_matrix(ref_emb, "ref_emb", owner)
        if query_emb.shape[1] != ref_emb.shape[1] or query_emb.device != ref_emb.device:
            raise InvalidArgumentError(
                f"The query_emb and ref_emb of {owner} must have the same number of columns "
                f"and device. Got {tuple(query_emb.shape)} on {query_emb.device} and "
                f"{tuple(ref_emb.shape)} on {ref_emb.device} instead."
            )

    def prepare(
        self, query_emb: torch.Tensor, ref_emb: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
        """Check (by :meth:`check_shapes`), upcast and normalize inputs; return them with
        the output dtype."""
        self.check_shapes(query_emb, ref_emb)
        if ref_emb is None:
            query = self.maybe_normalize(_compute_dtype(query_emb, query_emb))
            return query, query, self.output_dtype(query_emb.dtype)
        common = torch.promote_types(query_emb.dtype, ref_emb.dtype)
        query = self.maybe_normalize(_compute_dtype(query_emb, ref_emb))
        ref = self.maybe_normalize(_compute_dtype(ref_emb, query_emb))
        return query, ref, self.output_dtype(common)

    def output_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        """The dtype of results for inputs of ``input_dtype``."""
        if input_dtype in _HALF_DTYPES and not self.normalize_embeddings:
            return torch.float32
        return input_dtype

    def finish(self, values: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """Apply ``power`` to raw values and cast them to the output dtype."""
        return self.apply_power(values).to(out_dtype)

    def powered_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """``compute_mat`` raised to ``power``, for already-prepared embeddings."""
        return self.apply_power(self.compute_mat(query, ref))

    def powered_pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``compute_pairwise`` raised to ``power``, for already-prepared embeddings."""
        return self.apply_power(self.compute_pairwise(x, y))

    def apply_power(self, values: torch.Tensor) -> torch.Tensor:
        """Raise ``values`` to ``power`` (a no-op for power 1); finite gradients at 0."""
        return values if self.power == 1 else zero_safe_power(values, self.power)

    def maybe_normalize(self, embeddings: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Normalize when ``normalize_embeddings`` is set, else return ``embeddings``."""
        return self.normalize(embeddings, dim=dim) if self.normalize_embeddings else embeddings

    def normalize(self, embeddings: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """L_p-normalize along ``dim``."""
        return torch.nn.functional.normalize(embeddings, p=self.p, dim=dim)

    def compute_mat(self, query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """The matrix of raw values between already-normalized embeddings."""
        raise NotImplementedError

    def compute_pairwise(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The raw value between ``x[i]`` and ``y[i]`` for already-normalized rows.

        By default: a 2.x-style subclass's own ``pairwise_distance``, or else the diagonal
        of :meth:`compute_mat` computed in blocks of rows.
        """
        if type(self).pairwise_distance is not BaseDistance.pairwise_distance:
            return self.pairwise_distance(x, y)
        return _diagonal_by_blocks(self.compute_mat, x, y)

    def smallest_dist(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The closest value along a dimension: max for similarities, min for distances."""
        if self.is_inverted:
            return torch.max(*args, **kwargs)
        return torch.min(*args, **kwargs)

    def largest_dist(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The farthest value along a dimension: min for similarities, max for distances."""
        if self.is_inverted:
            return torch.min(*args, **kwargs)
        return torch.max(*args, **kwargs)

    def margin(self, x: Any, y: Any) -> Any:
        """``x - y`` for distances, ``y - x`` for similarities, as in 2.x.

        Positive when ``y`` is closer than ``x`` (e.g. ``margin(d_an, d_ap)`` is positive
        when the positive is closer than the negative).
        """
        return y - x if self.is_inverted else x - y

    def get_norm(self, embeddings: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The L_p norm of each row (``dim=1``)."""
        return torch.linalg.vector_norm(embeddings, ord=self.p, dim=dim)

    @torch.no_grad()
    def set_default_stats(
        self,
        query_emb: torch.Tensor,
        ref_emb: torch.Tensor | None,
        query: torch.Tensor,
        ref: torch.Tensor,
    ) -> None:
        """Store the average input norms before and after normalization (2.x's stats)."""
        ref_emb = query_emb if ref_emb is None else ref_emb
        tensors = (query_emb, ref_emb, query, ref)
        for name, tensor in zip(_STAT_NAMES, tensors):
            setattr(self, name, self.get_norm(tensor.float()).mean().item())

    def add_to_recordable_attributes(
        self,
        name: str | None = None,
        list_of_names: list[str] | tuple[str, ...] | None = None,
        is_stat: bool = False,
    ) -> None:
        """Record attribute names as 2.x did: in ``_record_these`` (settings) or, when
        ``is_stat``, in ``_record_these_stats`` (zeroed by :meth:`reset_stats`); a new
        attribute starts at 0. As in 2.x, stats are recorded only when ``collect_stats``.
        """
        if is_stat and not self.collect_stats:
            return
        _records.add_to_recordable_attributes(
            self, name=name, list_of_names=list_of_names, is_stat=is_stat
        )

    def reset_stats(self) -> None:
        """Set the collected stats (every name in ``_record_these_stats``) back to 0."""
        for name in _STAT_NAMES:
            setattr(self, name, 0.0)
        _records.reset_stats(self)


def check_not_inverted(distance: BaseDistance, owner: str) -> None:
    """Raise ``InvalidArgumentError`` if ``distance`` was built with ``is_inverted=True``.

    For the distances (``owner``: the class name for the message) that only measure how far
    apart rows are, where a similarity reading would turn every ranking upside down.
    """
    if distance.is_inverted:
        raise InvalidArgumentError(
            f"The 'is_inverted' parameter of {owner} must be False (smaller is closer). "
            "Got True instead."
        )


def _collect_stats_flag(collect_stats: bool | None, owner: str) -> bool:
    if collect_stats is None:
        # Read lazily, without importing utils: 2.x code sets c_f.COLLECT_STATS = True.
        c_f = sys.modules.get(_C_F_MODULE)
        return bool(getattr(c_f, "COLLECT_STATS", False))
    if not isinstance(collect_stats, bool):
        raise invalid("collect_stats", owner, "a bool or None", collect_stats, InvalidTypeError)
    return collect_stats


# Rows per block when row-pair values come from the diagonal of compute_mat.
_DIAGONAL_BLOCK = 256


def _diagonal_by_blocks(compute_mat: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    blocks = [
        compute_mat(
            x[start : start + _DIAGONAL_BLOCK], y[start : start + _DIAGONAL_BLOCK]
        ).diagonal()
        for start in range(0, len(x), _DIAGONAL_BLOCK)
    ]
    if not blocks:
        return x.new_zeros(0)
    return torch.cat(blocks)


def _compute_dtype(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    dtype = torch.promote_types(x.dtype, other.dtype)
    if dtype in _HALF_DTYPES:
        dtype = torch.float32
    return x if x.dtype == dtype else x.to(dtype)
