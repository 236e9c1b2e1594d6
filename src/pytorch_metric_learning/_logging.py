"""The logger name of pytorch-metric-learning 2.x, on top of the package's module loggers.

The library logs through ``logging.getLogger(__name__)`` under ``pytorch_metric_learning``.
2.x logged through one logger named ``"PML"``, renamed with
``utils.common_functions.set_logger_name``. Code that configures that logger, or captures
it with ``assertLogs``, keeps working: every record of the package's loggers is also handed
to the handlers of the 2.x logger (and of its ancestors below the root, so a root handler
never sees a record twice), when that logger is enabled for the record's level. The
package loggers' own levels still decide which records are made at all.
"""

from __future__ import annotations

import logging

from .errors import InvalidTypeError  # not _validation: importing the package stays light

__all__ = ["PACKAGE_LOGGER", "install", "legacy_logger", "legacy_logger_name", "set_logger_name"]

PACKAGE_LOGGER = "pytorch_metric_learning"
_state = {"name": "PML"}


def legacy_logger_name() -> str:
    """The name 2.x code knows as ``LOGGER_NAME`` (``"PML"`` unless renamed)."""
    return _state["name"]


def legacy_logger() -> logging.Logger:
    """The logger 2.x code knows as ``LOGGER``."""
    return logging.getLogger(_state["name"])


def set_logger_name(name: str) -> None:
    """Rename the 2.x logger; records of the package's loggers go to the new name.

    Example:
        >>> set_logger_name("my_app.pml")
        >>> legacy_logger().name
        'my_app.pml'
        >>> set_logger_name("PML")
    """
    if not isinstance(name, str):
        raise InvalidTypeError(
            f"The 'name' parameter of set_logger_name must be a str. Got {name!r} instead."
        )
    _state["name"] = name


class _RouteToLegacyLogger(logging.Handler):
    """Hands each record of the package's loggers to the 2.x logger's own handlers."""

    def emit(self, record: logging.LogRecord) -> None:
        target = legacy_logger()
        name = target.name
        if target is logging.getLogger() or name.split(".")[0] == PACKAGE_LOGGER:
            return  # the record reaches these loggers by propagation already
        if not target.isEnabledFor(record.levelno) or target.disabled:
            return
        logger: logging.Logger | None = target
        while logger is not None and logger is not logging.getLogger():
            for handler in logger.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
            logger = logger.parent if logger.propagate else None


def install() -> None:
    """Attach the route to the package logger once (idempotent)."""
    package = logging.getLogger(PACKAGE_LOGGER)
    if not any(isinstance(handler, _RouteToLegacyLogger) for handler in package.handlers):
        package.addHandler(_RouteToLegacyLogger())
