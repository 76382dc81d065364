"""What the queue needs from a matcher (``fluxnetes.match.Matcher`` satisfies it)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol


class NodeShareLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def cores(self) -> int: ...


class MatchResultLike(Protocol):
    """The fields of ``fluxnetes.match.MatchResult`` the queue reads."""

    @property
    def status(self) -> Any: ...  # MatchStatus; compared by ``.name``

    @property
    def jobid(self) -> Any: ...

    @property
    def at(self) -> int: ...

    @property
    def duration(self) -> int: ...

    @property
    def reason(self) -> str: ...

    @property
    def nodes(self) -> Sequence[NodeShareLike]: ...


class MatcherLike(Protocol):
    """The matcher operations a scheduling cycle uses."""

    def allocate(self, jobspec: Any, *, now: int, jobid: Any = None) -> Any: ...

    def allocate_orelse_reserve(self, jobspec: Any, *, now: int, jobid: Any = None) -> Any: ...

    def cancel(self, jobid: Any) -> Any: ...


_STATUS_NAMES: dict[Any, str] = {}  # status object -> its name (asked once per match)


def status_name(result: Any) -> str:
    """``ALLOCATED`` / ``RESERVED`` / ``BUSY`` / ``UNSATISFIABLE`` of a match result."""
    status = result.status
    try:
        return _STATUS_NAMES[status]
    except (KeyError, TypeError):  # (TypeError: an unhashable status, never remembered)
        pass
    name = str(getattr(status, "name", status)).upper()
    if len(_STATUS_NAMES) < 64:
        with contextlib.suppress(TypeError):
            _STATUS_NAMES[status] = name
    return name


def shares_of(result: Any) -> list[tuple[str, int]]:
    """(node name, cores) of each node a match result holds."""
    known = getattr(result, "core_shares", None)  # (fluxnetes.match results keep them)
    if known is not None:
        return list(known)
    return [(str(share.name), int(share.cores)) for share in result.nodes]


def share_tuple(result: Any) -> tuple[tuple[str, int], ...]:
    """``shares_of`` as a tuple: the result's own when it keeps one (no copy)."""
    known = getattr(result, "core_shares", None)
    if isinstance(known, tuple):
        return known
    return tuple(shares_of(result))


def cores_of(result: Any) -> int:
    """Cores a match result holds, summed over its nodes."""
    held = getattr(result, "cores_held", None)  # (fluxnetes.match results keep the sum)
    if held is not None:
        return int(held)
    known = getattr(result, "core_shares", None)
    if known is not None:
        return sum(cores for _, cores in known)
    return sum(int(share.cores) for share in result.nodes)
