"""Find k-NN and k-means backends by name: installed entry points and in-process registrations.

A backend *spec* is a callable (returned as is), a name, or a mapping
``{"name": ..., **options}``. Entry points are read lazily, the first time a name is
needed, and only the selected backend's module is imported.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import logging
import sys
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Callable

from ..._metadata import EntryPoint, entry_points
from ..._seen import first_time
from ..._warnings import warn_external
from ...distances import (
    BaseDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
    SNRDistance,
)
from ...errors import (
    BackendConflictError,
    BackendNotInstalledError,
    InvalidArgumentError,
    InvalidTypeError,
    UnknownBackendError,
)
from ._backend_checks import Origin, bind_options, build_backend, check_call_shape, load_target
from ._install_hint import plugin_install_hint
from .protocols import KMeansFunc, KNNFunc

__all__ = [
    "KNN_GROUP",
    "KMEANS_GROUP",
    "list_knn_backends",
    "list_kmeans_backends",
    "load_knn_func",
    "load_kmeans_func",
    "register_knn_backend",
    "register_kmeans_backend",
    "backend_info",
    "distance_from_name",
    "backend_name",
]

logger = logging.getLogger(__name__)

KNN_GROUP = "pytorch_metric_learning.knn_backends"
KMEANS_GROUP = "pytorch_metric_learning.kmeans_backends"
CORE_DISTRIBUTION = "pytorch-metric-learning"

# Plugins this project knows of (the command that installs each: plugin_install_hint).
KNOWN_PLUGINS: dict[str, str] = {
    "faiss": "pytorch-metric-learning-faiss",
}

_DISTANCES: dict[str, Callable[[], BaseDistance]] = {
    "euclidean": lambda: LpDistance(normalize_embeddings=False),
    "squared_euclidean": lambda: LpDistance(normalize_embeddings=False, power=2),
    "cosine": lambda: CosineSimilarity(),
    "dot_product": lambda: DotProductSimilarity(normalize_embeddings=False),
    "snr": lambda: SNRDistance(normalize_embeddings=False),
}

Spec = Any  # a callable, a backend name, or a mapping {"name": ..., **options}

# The name each backend built by the registry was asked for by, for error messages.
_BUILT_NAMES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
# The distance object each backend built with a 'distance' option was given.
_CONFIGURED_DISTANCES: weakref.WeakKeyDictionary[Any, BaseDistance] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class BackendInfo:
    """What the registry knows of one backend name, without importing it."""

    name: str
    distributions: tuple[str, ...]
    value: str


def distance_from_name(name: str | BaseDistance) -> BaseDistance:
    """Turn a distance name into a distance object; a distance object is returned as is.

    Names: ``euclidean``, ``squared_euclidean``, ``dot_product`` and ``snr`` compare raw
    embeddings; ``cosine`` normalizes them.

    Example:
        >>> distance_from_name("cosine")
        CosineSimilarity(normalize_embeddings=True, p=2, power=1, is_inverted=True)
    """
    if isinstance(name, BaseDistance):
        return name
    if not isinstance(name, str) or name not in _DISTANCES:
        raise InvalidArgumentError(
            f"The 'distance' option must be a BaseDistance or one of {sorted(_DISTANCES)}. "
            f"Got {name!r} instead."
        )
    return _DISTANCES[name]()


def _distribution_name(entry_point: EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    name = getattr(dist, "name", None) or (dist.metadata["Name"] if dist is not None else None)
    return name or "<unknown distribution>"


def _normalized(distribution: str) -> str:
    return distribution.lower().replace("_", "-").replace(".", "-")


def _dedupe(points: Iterable[EntryPoint]) -> list[EntryPoint]:
    """Drop repeats of one entry point (a distribution seen twice on ``sys.path``)."""
    seen: set[tuple[str, str, str]] = set()
    unique = []
    for point in points:
        key = (point.name, point.value, _normalized(_distribution_name(point)))
        if key not in seen:
            seen.add(key)
            unique.append(point)
    return unique


def _is_core(point: EntryPoint) -> bool:
    return _normalized(_distribution_name(point)) == CORE_DISTRIBUTION


def core_name_claims(points: Iterable[EntryPoint]) -> list[EntryPoint]:
    """The plugins' entry points that claim a name the core distribution declares."""
    points = _dedupe(points)
    core_names = {point.name for point in points if _is_core(point)}
    return [point for point in points if point.name in core_names and not _is_core(point)]


def build_table(points: Iterable[EntryPoint]) -> dict[str, list[EntryPoint]]:
    """Group entry points by name, leaving out the plugins that claim a core name."""
    points = _dedupe(points)
    claims = {id(point) for point in core_name_claims(points)}
    table: dict[str, list[EntryPoint]] = {}
    for point in points:
        if id(point) not in claims:
            table.setdefault(point.name, []).append(point)
    return dict(sorted(table.items()))


def _version(point: EntryPoint) -> str:
    return str(getattr(getattr(point, "dist", None), "version", "") or "")


def warn_about_claims(claims: list[EntryPoint]) -> None:
    """Warn that claims on core names are ignored: once per environment, then log."""
    if not claims:
        return
    facts = sorted(f"{_distribution_name(p)}=={_version(p)}:{p.name}={p.value}" for p in claims)
    key = hashlib.sha256("\n".join([sys.prefix, *facts]).encode()).hexdigest()
    message = "; ".join(
        f"Ignoring the backend {p.name!r} of {_distribution_name(p)}: "
        f"that name belongs to {CORE_DISTRIBUTION}"
        for p in claims
    )
    if first_time(f"core-name-claims:{key}"):
        warn_external(
            f"{message}. (Shown once until the installed plugins change.)", RuntimeWarning
        )
    else:
        logger.info("%s.", message)


class _Registry:
    """One entry-point group's backends, discovered lazily and cached."""

    def __init__(
        self, group: str, protocol: type, kind: str, call_args: tuple[Any, ...], call_shape: str
    ) -> None:
        self.group = group
        self.protocol = protocol
        self.kind = kind
        self.call_args = call_args
        self.call_shape = call_shape
        self._table: dict[str, list[EntryPoint]] | None = None
        self._loaded: dict[str, Callable[..., Any]] = {}
        self._registered: dict[str, Callable[..., Any]] = {}

    def table(self) -> dict[str, list[EntryPoint]]:
        if self._table is None:
            points = list(entry_points(group=self.group))
            self._table = build_table(points)
            warn_about_claims(core_name_claims(points))
        return self._table

    def reset(self) -> None:
        """Forget discovered and in-process backends (for tests)."""
        self._table = None
        self._loaded.clear()
        self._registered.clear()

    def names(self) -> list[str]:
        return sorted(set(self.table()) | set(self._registered))

    def register(self, name: str, factory: Callable[..., Any], override: bool) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(
                f"A {self.kind} backend name must be a non-empty str. Got {name!r} instead."
            )
        if not callable(factory):
            raise InvalidTypeError(
                f"The factory of {self.kind} backend {name!r} must be callable. Got {factory!r} instead."
            )
        if not override and name in self.names():
            raise InvalidArgumentError(
                f"A {self.kind} backend named {name!r} already exists; pass override=True to replace it."
            )
        self._registered[name] = factory

    def factory(self, name: str) -> Callable[..., Any]:
        if name in self._registered:
            return self._registered[name]
        if name not in self._loaded:
            self._loaded[name] = self._load_entry_point(name)
        return self._loaded[name]

    def _load_entry_point(self, name: str) -> Callable[..., Any]:
        points = self.table().get(name)
        if not points:
            raise self._missing(name)
        if len(points) > 1:
            owners = ", ".join(sorted(_distribution_name(point) for point in points))
            raise BackendConflictError(
                f"Several distributions provide the {self.kind} backend {name!r}: {owners}. "
                "Uninstall all but one, or register the one you want with "
                f"register_{self.kind}_backend({name!r}, factory, override=True)."
            )
        point = points[0]
        others = [other for other in self.names() if other != name]
        factory = load_target(point.value, self.origin(name), others)
        logger.debug("Loaded %s backend %r from %s", self.kind, name, point.value)
        return factory

    def origin(self, name: str) -> Origin:
        """Where ``name`` comes from: an in-process registration or an entry point."""
        points = self.table().get(name) if name not in self._registered else None
        if not points:
            return Origin(self.kind, name, "<registered in-process>")
        return Origin(self.kind, name, _distribution_name(points[0]), points[0].value)

    def _missing(self, name: str) -> Exception:
        installed = self.names()
        if name in KNOWN_PLUGINS:
            return BackendNotInstalledError(
                f"The {self.kind} backend {name!r} is not installed. Install it with: "
                f"{plugin_install_hint(name)}  (installed backends: {installed})",
                name=name,
            )
        close = difflib.get_close_matches(name, installed, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return UnknownBackendError(
            f"Unknown {self.kind} backend {name!r}. Installed backends: {installed}.{hint}"
        )

    def load(self, spec: Spec, options: dict[str, Any]) -> Any:
        name, options = self._split_spec(spec, options)
        if name is None:
            return spec
        if "distance" in options:
            options["distance"] = distance_from_name(options["distance"])
        factory = self.factory(name)
        bind_options(factory, options, self.origin(name), self.call_args)
        backend = build_backend(factory, options, self.origin(name))
        self.check(backend, name)
        _remember_name(backend, name)
        if isinstance(options.get("distance"), BaseDistance):
            with contextlib.suppress(TypeError):
                _CONFIGURED_DISTANCES[backend] = options["distance"]
        return backend

    def _split_spec(self, spec: Spec, options: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        if isinstance(spec, str):
            return spec, dict(options)
        if isinstance(spec, Mapping):
            spec = dict(spec)
            name = spec.pop("name", None)
            if not isinstance(name, str):
                raise InvalidArgumentError(
                    f"A {self.kind} backend mapping must have a 'name' str. Got {name!r} instead."
                )
            clash = sorted(set(spec) & set(options))
            if clash:
                raise InvalidArgumentError(
                    f"The options {clash} were given twice for backend {name!r}."
                )
            return name, {**spec, **options}
        if callable(spec):
            if options:
                raise InvalidTypeError(
                    f"Options {sorted(options)} can only be given with a backend name, not with a callable."
                )
            return None, options
        raise InvalidTypeError(
            f"A {self.kind} backend spec must be a callable, a name or a mapping with a 'name'. "
            f"Got {spec!r} instead."
        )

    def check(self, backend: Any, name: str) -> None:
        """Raise ``TypeError`` when ``backend`` does not follow the protocol's call shape."""
        origin = self.origin(name)
        check_call_shape(backend, self.protocol, self.call_args, self.call_shape, origin)

    def info(self) -> list[BackendInfo]:
        rows = [
            BackendInfo(name, tuple(_distribution_name(p) for p in points), points[0].value)
            for name, points in self.table().items()
        ]
        rows += [
            BackendInfo(name, ("<registered in-process>",), repr(factory))
            for name, factory in self._registered.items()
        ]
        return sorted(rows, key=lambda row: row.name)


_KNN = _Registry(
    KNN_GROUP,
    KNNFunc,
    "knn",
    ("query", 1, None, False),
    "backend(query, k, reference=None, ref_includes_query=False) -> (distances, indices)",
)
_KMEANS = _Registry(
    KMEANS_GROUP,
    KMeansFunc,
    "kmeans",
    ("x", 2),
    "backend(x, num_clusters) -> cluster ids",
)


def _remember_name(backend: Any, name: str) -> None:
    # Not hashable or not weakly referenceable: messages name its class instead.
    with contextlib.suppress(TypeError):
        _BUILT_NAMES[backend] = name


def backend_name(backend: Any) -> str | None:
    """The registry name ``backend`` was built under by a load function, if any.

    Example:
        >>> backend_name(load_knn_func("custom")), backend_name(len)
        ('custom', None)
    """
    try:
        return _BUILT_NAMES.get(backend)
    except TypeError:
        return None


def configured_distance(backend: Any) -> BaseDistance | None:
    """The distance object a k-NN backend works with: the one its spec configured, else its own.

    The ``distance`` option given to :func:`load_knn_func` wins (a plugin that ignores it
    is the mistake to catch), then a :class:`BaseDistance` ``distance`` attribute of the
    backend; ``None`` when neither is known.

    Example:
        >>> configured_distance(load_knn_func("custom", distance="cosine"))
        CosineSimilarity(normalize_embeddings=True, p=2, power=1, is_inverted=True)
        >>> configured_distance(len) is None
        True
    """
    try:
        configured = _CONFIGURED_DISTANCES.get(backend)
    except TypeError:
        configured = None
    if configured is not None:
        return configured
    own = getattr(backend, "distance", None)
    return own if isinstance(own, BaseDistance) else None


def knn_backend_origin(backend: Any) -> str | None:
    """The distribution a k-NN backend built by :func:`load_knn_func` comes from, if any.

    ``"registered in-process"`` for a name given to :func:`register_knn_backend`.

    Example:
        >>> knn_backend_origin(load_knn_func("custom")), knn_backend_origin(len)
        ('pytorch-metric-learning', None)
    """
    name = backend_name(backend)
    if name is None or name not in _KNN.names():
        return None
    origin = _KNN.origin(name)
    return "registered in-process" if not origin.target else origin.distribution


def list_knn_backends() -> list[str]:
    """Sorted names of the installed and registered k-NN backends (nothing is imported).

    Example:
        >>> "custom" in list_knn_backends()
        True
    """
    return _KNN.names()


def list_kmeans_backends() -> list[str]:
    """Sorted names of the installed and registered k-means backends (nothing is imported)."""
    return _KMEANS.names()


def load_knn_func(spec: Spec, **options: Any) -> KNNFunc:
    """Turn a spec into a k-NN backend.

    Args:
        spec: A callable (returned unchanged), a backend name, or a mapping
            ``{"name": ..., **options}`` as read from a config file.
        **options: Keyword options for the backend's factory. A ``distance`` option may
            be a distance name (see :func:`distance_from_name`) or a distance object.

    Raises:
        ValueError: for an unknown name (the message lists the installed ones).
        ModuleNotFoundError: for a known plugin that is not installed (with its pip command).
        ImportError: when the backend's distribution fails to import.

    Example:
        >>> knn = load_knn_func({"name": "custom", "distance": "cosine", "batch_size": 1024})
        >>> knn.batch_size
        1024
    """
    return _KNN.load(spec, options)


def load_kmeans_func(spec: Spec, **options: Any) -> KMeansFunc:
    """Turn a spec into a k-means backend, as :func:`load_knn_func` does for k-NN."""
    return _KMEANS.load(spec, options)


def register_knn_backend(name: str, factory: Callable[..., Any], *, override: bool = False) -> None:
    """Make ``factory`` selectable by ``name`` in this process.

    Example:
        >>> from pytorch_metric_learning.evaluation import CustomKNN
        >>> from pytorch_metric_learning.distances import CosineSimilarity
        >>> register_knn_backend("my_cosine", lambda: CustomKNN(CosineSimilarity()), override=True)
        >>> load_knn_func("my_cosine").distance.is_inverted
        True
    """
    _KNN.register(name, factory, override)


def register_kmeans_backend(
    name: str, factory: Callable[..., Any], *, override: bool = False
) -> None:
    """Make ``factory`` selectable as a k-means backend by ``name`` in this process."""
    _KMEANS.register(name, factory, override)


def backend_info(kind: str = "knn") -> list[BackendInfo]:
    """Name, distributions and entry-point value of every ``kind`` ("knn" or "kmeans") backend."""
    registries = {"knn": _KNN, "kmeans": _KMEANS}
    if kind not in registries:
        raise InvalidArgumentError(
            f"The 'kind' parameter of backend_info must be 'knn' or 'kmeans'. Got {kind!r} instead."
        )
    return registries[kind].info()


def knn_factory(name: str) -> Callable[..., Any]:
    """The factory behind a k-NN backend name (imports that backend only)."""
    return _KNN.factory(name)


def kmeans_factory(name: str) -> Callable[..., Any]:
    """The factory behind a k-means backend name (imports that backend only)."""
    return _KMEANS.factory(name)


def _reset_for_tests() -> None:
    _KNN.reset()
    _KMEANS.reset()
