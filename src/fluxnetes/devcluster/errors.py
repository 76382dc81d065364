"""Errors of the dev cluster; messages say what failed and what to do."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The dev cluster could not be started, found or used; the message says what to do."""


class BinariesMissing(ClusterError):
    pass
