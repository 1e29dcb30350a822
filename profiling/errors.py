"""The one exception type of the profiling package."""

from __future__ import annotations


class ProfilingError(ValueError):
    """A trace could not be written or read: bad path, malformed line, bad field.

    The message is a single line meant to be shown to a user as is.
    """
