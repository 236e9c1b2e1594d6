"""Names of plugin classes that import even when the plugin is not installed."""

from __future__ import annotations

from typing import Any

from .registry import kmeans_factory, knn_factory

__all__ = ["FaissKNN", "FaissKMeans"]


class _PluginClassMeta(type):
    """Makes ``isinstance(obj, Proxy)`` true for instances of the plugin's class."""

    _backend: str
    _factory_getter: Any

    def __instancecheck__(cls, instance: Any) -> bool:
        try:
            target = cls._factory_getter(cls._backend)
        except ImportError:
            return False
        return isinstance(target, type) and isinstance(instance, target)


class FaissKNN(metaclass=_PluginClassMeta):
    """k-NN search with faiss, from the ``pytorch-metric-learning-faiss`` plugin.

    Constructing it without the plugin raises ``ModuleNotFoundError`` with the pip
    command that installs it here; see the plugin for the arguments.
    """

    _backend = "faiss"
    _factory_getter = staticmethod(knn_factory)

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return knn_factory("faiss")(*args, **kwargs)


class FaissKMeans(metaclass=_PluginClassMeta):
    """k-means with faiss, from the ``pytorch-metric-learning-faiss`` plugin.

    Constructing it without the plugin raises ``ModuleNotFoundError`` with the pip
    command that installs it here; keyword arguments go to ``faiss.Kmeans``.
    """

    _backend = "faiss"
    _factory_getter = staticmethod(kmeans_factory)

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return kmeans_factory("faiss")(*args, **kwargs)
