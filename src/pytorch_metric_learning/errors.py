"""The library's exceptions.

Every exception raised on purpose by this library derives from :class:`PMLError`, and
also from the builtin that callers already catch (``ValueError``, ``TypeError``,
``ImportError``, ``ModuleNotFoundError``, ``RuntimeError`` or ``OSError``).
"""

from __future__ import annotations

__all__ = [
    "PMLError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "BackendError",
    "UnknownBackendError",
    "BackendNotInstalledError",
    "BackendImportError",
    "BackendConflictError",
    "BackendRuntimeError",
    "BackendDefinitionError",
    "InvalidBackendOptionError",
    "BackendOutputError",
    "BackendOutputTypeError",
    "InvalidStepError",
    "FileWriteError",
    "CorruptFileError",
    "ResumeError",
    "FolderInUseError",
    "MetricNotRecordedError",
    "NotInThisLibraryError",
    "InvalidKeysError",
]


class PMLError(Exception):
    """Root of every exception this library raises on purpose."""


class InvalidArgumentError(PMLError, ValueError):
    """An argument has the right type but an unusable value."""


class InvalidTypeError(PMLError, TypeError):
    """An argument has the wrong type."""


class BackendError(PMLError):
    """A k-NN or k-means backend could not be selected, loaded or run."""


class UnknownBackendError(BackendError, ValueError):
    """No installed or registered backend has the requested name."""


class BackendNotInstalledError(BackendError, ModuleNotFoundError):
    """The backend is a known plugin whose distribution is not installed."""


class BackendImportError(BackendError, ImportError):
    """The backend's distribution is installed but importing it failed."""


class BackendConflictError(BackendError, ValueError):
    """Several distributions claim the same backend name."""


class BackendRuntimeError(BackendError, RuntimeError):
    """A backend's own library failed while running a search or clustering."""


class BackendDefinitionError(BackendError, TypeError):
    """A backend's entry point or factory does not follow the plugin contract."""


class InvalidBackendOptionError(InvalidArgumentError, TypeError):
    """A backend spec passes an option that the backend's factory does not accept.

    A mistake in the caller's spec (a config file, say), not in the backend: a
    ``ValueError``, and a ``TypeError`` as the factory's own call would have raised.
    """


class BackendOutputError(BackendError, ValueError):
    """A k-NN backend returned results that break the k-NN contract."""


class BackendOutputTypeError(BackendOutputError, TypeError):
    """A k-NN backend returned something other than two tensors of the contract's dtypes."""


class InvalidStepError(InvalidTypeError, InvalidArgumentError):
    """A record's step is not an int: a ``TypeError``, and a ``ValueError`` as in 2.x."""


class FileWriteError(PMLError, OSError):
    """A file (checkpoint, records) could not be written; its previous version is intact."""


class CorruptFileError(PMLError, ValueError):
    """A checkpoint or records file exists but cannot be read (truncated, empty, garbage)."""


class ResumeError(PMLError, RuntimeError):
    """Resuming training would lose or mix up data, so nothing was loaded or changed."""


class FolderInUseError(FileWriteError, ResumeError):
    """Another live process holds the model or record folder (its lock file): two runs in
    one folder would mix their checkpoints and records. Nothing was written or loaded.

    A :class:`FileWriteError` (an ``OSError``) and a :class:`ResumeError` (a
    ``RuntimeError``), as either is what the write or the resume would have raised."""


class MetricNotRecordedError(InvalidArgumentError, KeyError):
    """A metric asked for is neither in the tester's accuracies nor in the records: a
    ``ValueError``, and a ``KeyError`` as 2.x's ``HookContainer.try_keys`` raised."""

    __str__ = Exception.__str__


class NotInThisLibraryError(PMLError, ImportError):
    """A pytorch-metric-learning 2.x module that this library does not contain (``losses``,
    ``miners``, ...): this library replaces 2.x in an environment, under the same name."""


class InvalidKeysError(InvalidArgumentError, AssertionError):
    """A trainer's dict argument (``models``, ``loss_funcs``, ``mining_funcs``,
    ``optimizers``, ``lr_schedulers``, ...) or ``freeze_these`` has a key that is unknown
    or lacks one that is required: a ``ValueError``, and an ``AssertionError`` as 2.x's key
    checks raised."""
