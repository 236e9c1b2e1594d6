"""Exceptions of the faiss plugin, each also a builtin that callers already catch."""

from __future__ import annotations

from pytorch_metric_learning.errors import BackendRuntimeError

__all__ = ["IndexFileNotFoundError"]


class IndexFileNotFoundError(BackendRuntimeError, FileNotFoundError):
    """:meth:`FaissKNN.load <pytorch_metric_learning_faiss.FaissKNN.load>` got a path with no file.

    It is a ``BackendRuntimeError`` (so a ``RuntimeError``) and a ``FileNotFoundError``.
    """
