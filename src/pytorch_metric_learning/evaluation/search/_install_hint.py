"""The pip command that installs a known plugin or an extra *for the installation at hand*.

Two facts shape it. First, the package index holds only the older 2.x under the name
``pytorch-metric-learning`` (a different library with the same import name), and this
version and its faiss plugin are not published there yet: a name-based
``pip install "pytorch-metric-learning[...]"`` would replace this library with 2.x. So a
source checkout (the core installed with ``pip install -e .`` or from a local folder; PEP
610's ``direct_url.json``, written by pip next to the installed metadata, says which case
this is) installs the plugin from its own ``plugins/`` folder, and an extra is installed as
its own requirements, read from the installed metadata. Second, the command names the
interpreter that is running (``<sys.executable> -m pip``): a bare ``pip`` may belong to
another environment than the one a script such as ``.venv/bin/pml-eval`` runs in.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from ..._metadata import PackageNotFoundError, distribution

__all__ = [
    "pip_command",
    "plugin_install_hint",
    "extra_install_hint",
    "extra_requirements",
    "source_checkout",
]

CORE_DISTRIBUTION = "pytorch-metric-learning"
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")


def pip_command() -> str:
    """``<this interpreter> -m pip``: the pip of the environment this code runs in.

    Example:
        >>> pip_command().endswith(" -m pip")
        True
    """
    return f"{shlex.quote(sys.executable)} -m pip"


def plugin_install_hint(plugin: str) -> str:
    """The command that installs the plugin behind backend name ``plugin`` (``"faiss"``).

    ``<python> -m pip install -e CHECKOUT/plugins/faiss`` when the core runs from a source
    checkout that holds the plugin. Otherwise the same command with a placeholder for the
    checkout, and a note that the plugin is not on the package index yet.

    Example:
        >>> hint = plugin_install_hint("faiss")
        >>> hint.startswith(pip_command() + " install -e "), "plugins/faiss" in hint
        (True, True)
    """
    checkout = source_checkout()
    folder = checkout / "plugins" / plugin if checkout is not None else None
    if folder is not None and (folder / "pyproject.toml").is_file():
        return f"{pip_command()} install -e {shlex.quote(str(folder))}"
    return (
        f"{pip_command()} install -e CLONE/plugins/{plugin} (CLONE: a clone of the source "
        f"repository; the {plugin} plugin is not on the package index yet)"
    )


def extra_install_hint(extra: str) -> str:
    """The command that adds the core's optional extra ``extra`` (``"plots"``, ``"demo"``).

    From a source checkout, the checkout itself with the extra (``<python> -m pip install -e
    'CHECKOUT[plots]'``), constrained by the checkout's ``constraints.txt`` when it has one
    (``-c CHECKOUT/constraints.txt``: the pins that keep torch at the tested version instead
    of letting the extra's requirements pull another, e.g. a CUDA build); otherwise the extra's own requirements as the installed metadata
    lists them (``<python> -m pip install 'matplotlib>=3.5'``), since the name on the
    package index is 2.x's.

    Example:
        >>> hint = extra_install_hint("plots")
        >>> hint.startswith(pip_command() + " install "), "[plots]" in hint or "matplotlib" in hint
        (True, True)
    """
    checkout = source_checkout()
    if checkout is not None and (checkout / "pyproject.toml").is_file():
        constraints = checkout / "constraints.txt"
        pinned = f"-c {shlex.quote(str(constraints))} " if constraints.is_file() else ""
        return f"{pip_command()} install {pinned}-e {shlex.quote(f'{checkout}[{extra}]')}"
    requirements = extra_requirements(extra)
    if requirements:
        return f"{pip_command()} install {' '.join(map(shlex.quote, requirements))}"
    return f'{pip_command()} install "{CORE_DISTRIBUTION}[{extra}]"'


def extra_requirements(extra: str, name: str = CORE_DISTRIBUTION) -> list[str]:
    """The requirements of extra ``extra`` of the installed distribution ``name``.

    Example:
        >>> extra_requirements("no-such-extra")
        []
    """
    try:
        requires = distribution(name).requires or []
    except PackageNotFoundError:
        return []
    found = []
    for line in requires:
        requirement, _, marker = line.partition(";")
        match = _EXTRA_MARKER.search(marker)
        if match is not None and match.group(1) == extra:
            found.append(requirement.strip())
    return found


def source_checkout(name: str = CORE_DISTRIBUTION) -> Path | None:
    """The local folder distribution ``name`` was installed from, or ``None``.

    ``None`` as well for an installation from an index, an archive or a VCS URL, and when
    ``name`` is not installed at all (code run from ``sys.path`` without installing).

    Example:
        >>> source_checkout("no-such-distribution-here") is None
        True
    """
    try:
        text = distribution(name).read_text("direct_url.json")
    except PackageNotFoundError:
        return None
    try:
        record = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(record, dict) or "dir_info" not in record:
        return None
    url = str(record.get("url", ""))
    return Path(url2pathname(urlparse(url).path)) if url.startswith("file:") else None
