"""packer's exceptions. A :class:`PackerError` is a user-facing problem: the CLI prints its
message as one line (no traceback) and exits with :attr:`PackerError.exit_code`."""

from __future__ import annotations

__all__ = ["PackerError", "OptionError", "SourceError", "OutputExistsError", "OutputError", "InputError", "SourceChangedError", "DatasetReadError"]


class PackerError(Exception):
    """A problem the user can fix; the message names the file or value and the fix."""

    exit_code = 1


class OptionError(PackerError, ValueError):
    """An option value is invalid or options contradict each other. The message names the
    option as the CLI spells it (``--on-error``); from Python it is the keyword or options
    field of the same name with underscores (``on_error=``, ``ImageOptions(resize_mode=...)``)."""

    exit_code = 2


class SourceError(PackerError):
    """The source is missing, unreadable or has nothing to convert."""


class OutputExistsError(PackerError):
    """The destination exists and ``overwrite`` was not given."""


class OutputError(PackerError):
    """The destination cannot be written (disk full, permissions, ...)."""


class InputError(PackerError):
    """An input could not be converted and ``on_error='fail'`` was asked for."""


class SourceChangedError(InputError):
    """The source changed under the conversion: it stops, and its checkpoint is not kept (a
    ``--resume`` would be refused: the source is not the one it converted)."""


class DatasetReadError(PackerError):
    """A packed dataset at a URL cannot be read (the network, the credentials, a missing fsspec backend)."""
