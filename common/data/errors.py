"""Error types of the data layer.

They live in their own module so that the readers, the partitioners and the public API can all
raise them without importing each other.
"""

from __future__ import annotations


class DataError(Exception):
    """A data file is missing, truncated or malformed; the message names the path and the fix."""


class PartitionError(DataError, ValueError):
    """A partition cannot be built from these settings (too few writers, images or classes).

    It is also a ``ValueError`` because the cause is a configuration value, not a broken file:
    code that catches config mistakes as ``ValueError`` catches this too.
    """
