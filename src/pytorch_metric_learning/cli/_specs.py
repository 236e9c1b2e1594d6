"""Backend specs given on the command line: a name, or a JSON object with a ``name``.

Parsing a spec needs no torch (the parsers use it); describing one loads the registry."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from ..errors import InvalidArgumentError

__all__ = ["parse_spec", "spec_option", "describe_spec"]


def parse_spec(text: str, option: str) -> str | dict[str, Any]:
    """Turn ``--knn``/``--kmeans`` text into a registry spec.

    Example:
        >>> parse_spec('{"name": "custom", "distance": "cosine"}', "--knn")
        {'name': 'custom', 'distance': 'cosine'}
        >>> parse_spec("custom", "--knn")
        'custom'
    """
    text = text.strip()
    if not text:
        raise InvalidArgumentError(f"The {option} option needs a backend name or a JSON object.")
    if not text.startswith(("{", "[", '"')):
        return text
    import json  # only for JSON specs: not on every --help

    try:
        spec = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidArgumentError(
            f"The {option} option is not valid JSON ({error.msg} at column {error.colno}): {text}"
        ) from None
    except RecursionError:  # '[[[[...': nested deeper than the parser goes
        raise InvalidArgumentError(
            f"The {option} option is JSON nested too deeply to read; give a backend name or "
            f'a JSON object with a "name". Got {_shortened(text)} instead.'
        ) from None
    if isinstance(spec, str):
        return spec
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidArgumentError(
            f'The {option} option must be a backend name or a JSON object with a "name". '
            f"Got {_shortened(text)} instead."
        )
    return spec


def _shortened(text: str, most: int = 60) -> str:
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


def spec_option(option: str) -> Callable[[str], Any]:
    """An argparse ``type`` for ``option``: a malformed spec is a usage error (exit 2).

    Example:
        >>> spec_option("--knn")('{"name": "custom"}')
        {'name': 'custom'}
    """

    def parse(text: str) -> Any:
        try:
            return parse_spec(text, option)
        except InvalidArgumentError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def describe_spec(spec: str | dict[str, Any] | None, kind: str, default: str) -> dict[str, Any]:
    """The spec with the name, distribution and version of its backend, for a JSON record.

    Example:
        >>> describe_spec(None, "knn", "custom")["name"]
        'custom'
    """
    from ..evaluation.search.registry import backend_info  # torch: only when a command runs
    from ._versions import distribution_version  # importlib.metadata: not on the parse path

    name = default if spec is None else spec if isinstance(spec, str) else spec["name"]
    found = [info for info in backend_info(kind) if info.name == name]
    distributions = list(found[0].distributions) if found else []
    return {
        "spec": spec if spec is not None else name,
        "name": name,
        "distribution": ", ".join(distributions),
        "version": ", ".join(v for v in map(distribution_version, distributions) if v),
    }
