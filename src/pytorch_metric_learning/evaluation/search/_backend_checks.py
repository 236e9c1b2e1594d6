"""The registry's diagnoses: what exactly is wrong with a plugin's entry point or factory.

Each function turns one way a plugin can be broken (a misspelled entry-point target, an
instance where a factory belongs, an option the factory does not take, a backend that
cannot be called as the protocol says) into an error that names the backend, its
distribution, and what to change.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, cast

from ...errors import (
    BackendDefinitionError,
    BackendImportError,
    BackendRuntimeError,
    InvalidBackendOptionError,
    PMLError,
)

__all__ = ["Origin", "load_target", "bind_options", "build_backend", "check_call_shape"]


@dataclass(frozen=True)
class Origin:
    """Where a backend name comes from, for messages."""

    kind: str  # "knn" or "kmeans"
    name: str
    distribution: str  # or "<registered in-process>"
    target: str = ""  # the entry point's value, "module:attribute"

    def __str__(self) -> str:
        if not self.target:
            return f"factory registered in-process as {self.name!r}"
        return f"entry point {self.name} = {self.target!r} of {self.distribution}"


def load_target(target: str, origin: Origin, others: list[str]) -> Any:
    """Import ``module:attribute`` of an entry point, naming the part that is missing."""
    module_name, _, attribute = target.split("[")[0].partition(":")
    try:
        module = importlib.import_module(module_name.strip())
    except ModuleNotFoundError as error:
        if error.name and _is_prefix(error.name, module_name.strip()):
            raise BackendImportError(
                f"The {origin} names the module {error.name!r}, which cannot be found: the "
                f"entry point is misspelled (fix it in {origin.distribution}'s pyproject.toml) "
                "or the distribution's files are missing."
            ) from error
        raise _failed_import(origin, error, others) from error
    except Exception as error:
        raise _failed_import(origin, error, others) from error
    except (SystemExit, KeyboardInterrupt) as error:  # a plugin must not end the program
        raise _ended_program(origin, error, "importing") from error
    return _attribute(module, attribute.strip(), origin)


def _ended_program(origin: Origin, error: BaseException, doing: str) -> BackendImportError:
    """A plugin raised ``SystemExit``/``KeyboardInterrupt`` while being imported or built."""
    code = f" (code {error.code!r})" if isinstance(error, SystemExit) else ""
    return BackendImportError(
        f"The {origin} raised {type(error).__name__}{code} "
        f"while {doing} it: a plugin must not end the program. Fix or uninstall "
        f"{origin.distribution}, or choose another backend."
    )


def _is_prefix(missing: str, module: str) -> bool:
    return module == missing or module.startswith(missing + ".")


def _failed_import(origin: Origin, error: Exception, others: list[str]) -> BackendImportError:
    missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    if missing:
        advice = (
            f"The module {missing!r} it imports is not installed: install the package that "
            f"provides it (and declare it in {origin.distribution}'s dependencies)"
        )
    else:
        advice = f"Fix or reinstall {origin.distribution}"
    return BackendImportError(
        f"The {origin.kind} backend {origin.name!r} of {origin.distribution} failed to import "
        f"({type(error).__name__}: {error}). {advice}, or choose another backend from "
        f"{others}."
    )


def _attribute(module: Any, path: str, origin: Origin) -> Any:
    value = module
    for part in path.split(".") if path else []:
        if not hasattr(value, part):
            close = difflib.get_close_matches(part, [n for n in dir(value) if n[:1] != "_"])
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise BackendImportError(
                f"The {origin} names {path!r} in module {module.__name__!r}, which has no "
                f"attribute {part!r}.{hint} Fix the entry point in {origin.distribution}'s "
                "pyproject.toml."
            )
        value = getattr(value, part)
    return value


def bind_options(
    factory: Callable[..., Any], options: dict[str, Any], origin: Origin, call_args: tuple
) -> None:
    """Raise unless ``factory(**options)`` fits the factory's signature."""
    if not callable(factory):
        raise BackendDefinitionError(
            f"The {origin} names {_short(factory)}, which is not callable: it must name a "
            f"factory (a class, or a function returning a {origin.kind} backend)."
        )
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a builtin without a signature: let the call speak
    try:
        signature.bind(**options)
        return
    except TypeError:
        pass
    if _binds(signature, call_args) and not inspect.isclass(factory):
        fix = "Point the entry point at" if origin.target else "Register"
        raise BackendDefinitionError(
            f"The {origin} is a {origin.kind} backend itself ({_kind_of(factory)}), not a "
            "factory that builds one: the registry calls it with the spec's options to get "
            f"the backend. {fix} the class, or a function that returns the backend."
        )
    raise _unknown_options(signature, options, origin)


def build_backend(factory: Callable[..., Any], options: dict[str, Any], origin: Origin) -> Any:
    """Call the factory; a plugin's own bare error comes back naming the backend.

    The library's errors and ``ImportError`` pass unchanged. A ``ValueError`` or ``TypeError`` becomes
    :class:`InvalidBackendOptionError` (still both), anything else
    :class:`BackendRuntimeError` (a ``RuntimeError``); the original is chained.
    """
    try:
        return factory(**options)
    except (SystemExit, KeyboardInterrupt) as error:  # a plugin must not end the program
        raise _ended_program(origin, error, "building") from error
    except (PMLError, ImportError):  # already says what it is (a missing library: its name)
        raise
    except Exception as error:
        wrapper = (
            InvalidBackendOptionError
            if isinstance(error, (ValueError, TypeError))
            else BackendRuntimeError
        )
        where = "in-process" if not origin.target else f"of {origin.distribution}"
        raise wrapper(
            f"The {origin.kind} backend {origin.name!r} ({where}) failed to build with the "
            f"options {options} ({type(error).__name__}: {error}). Check those options, or "
            f"choose another backend."
        ) from error


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _binds(signature: inspect.Signature, args: tuple) -> bool:
    try:
        signature.bind(*args)
    except TypeError:
        return False
    return True


def _kind_of(value: Any) -> str:
    if inspect.isfunction(value) or inspect.ismethod(value):
        return f"the function {value.__qualname__}"
    return f"an instance of {type(value).__qualname__}"


def _unknown_options(
    signature: inspect.Signature, options: dict[str, Any], origin: Origin
) -> InvalidBackendOptionError:
    named = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    accepted = [p.name for p in named]
    unknown = sorted(set(options) - set(accepted))
    if not unknown:  # the options are known but a required one is missing
        missing = [p.name for p in named if p.default is p.empty and p.name not in options]
        return InvalidBackendOptionError(
            f"The {origin.kind} backend {origin.name!r} needs the options {missing}. "
            f"Got {sorted(options)} instead."
        )
    close = {name: difflib.get_close_matches(name, accepted, n=1) for name in unknown}
    hints = "".join(f" Did you mean {c[0]!r} for {n!r}?" for n, c in close.items() if c)
    return InvalidBackendOptionError(
        f"Unknown option{'s' if len(unknown) > 1 else ''} {unknown} for the {origin.kind} "
        f"backend {origin.name!r} ({origin.distribution}). It accepts: {accepted}.{hints}"
    )


def check_call_shape(
    backend: Any, protocol: type, call_args: tuple, expected: str, origin: Origin
) -> None:
    """Raise unless ``backend`` is callable the way ``protocol`` says."""
    if not isinstance(backend, protocol):
        raise BackendDefinitionError(
            f"The {origin.kind} backend {origin.name!r} of {origin.distribution} built "
            f"{backend!r}, which is not callable. A {protocol.__name__} is called as {expected}."
        )
    try:
        signature = inspect.signature(cast(Callable[..., Any], backend))
    except (TypeError, ValueError):
        return
    if not _binds(signature, call_args):
        raise BackendDefinitionError(
            f"The {origin.kind} backend {origin.name!r} of {origin.distribution} cannot be "
            f"called as {protocol.__name__} requires: its call signature is {signature}, but "
            f"the contract calls {expected}."
        )
