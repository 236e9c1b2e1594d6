"""The pip command that installs a known plugin *for the installation at hand*.

From a source checkout (the core installed with ``pip install -e .`` or from a local
folder), the published extra ``pytorch-metric-learning[faiss]`` would resolve to an
unrelated release on the package index; the plugin must come from the checkout's own
``plugins/`` folder instead. PEP 610's ``direct_url.json``, written by pip next to the
installed metadata, says which case this is.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

if sys.version_info >= (3, 10):
    from importlib.metadata import PackageNotFoundError, distribution
else:  # pragma: no cover
    from importlib_metadata import PackageNotFoundError, distribution

__all__ = ["plugin_install_hint", "extra_install_hint", "source_checkout"]

CORE_DISTRIBUTION = "pytorch-metric-learning"


def plugin_install_hint(plugin: str) -> str:
    """The command that installs the plugin behind backend name ``plugin`` (``"faiss"``).

    ``pip install -e CHECKOUT/plugins/faiss`` when the core runs from a source checkout
    that holds the plugin; otherwise ``pip install "pytorch-metric-learning[faiss]"``.

    Example:
        >>> hint = plugin_install_hint("faiss")
        >>> hint.startswith("pip install "), "faiss" in hint
        (True, True)
    """
    checkout = source_checkout()
    folder = checkout / "plugins" / plugin if checkout is not None else None
    if folder is not None and (folder / "pyproject.toml").is_file():
        return f"pip install -e {shlex.quote(str(folder))}"
    return f'pip install "{CORE_DISTRIBUTION}[{plugin}]"'


def extra_install_hint(extra: str) -> str:
    """The command that adds the core's optional extra ``extra`` (``"plots"``, ``"demo"``).

    From a source checkout, the checkout itself with the extra (``pip install -e
    'CHECKOUT[plots]'``); otherwise ``pip install "pytorch-metric-learning[plots]"``.

    Example:
        >>> hint = extra_install_hint("plots")
        >>> hint.startswith("pip install "), "[plots]" in hint
        (True, True)
    """
    checkout = source_checkout()
    if checkout is not None and (checkout / "pyproject.toml").is_file():
        return f"pip install -e {shlex.quote(f'{checkout}[{extra}]')}"
    return f'pip install "{CORE_DISTRIBUTION}[{extra}]"'


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
