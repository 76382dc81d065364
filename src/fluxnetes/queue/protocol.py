"""What the queue needs from a matcher (``fluxnetes.match.Matcher`` satisfies it)."""

from __future__ import annotations

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


# id(status object) -> (the object, its name): asked once per match. Keyed by identity, not
# by the object: hashing an Enum member runs enum's interpreted __hash__ (even in the native
# build); the entry holds the object, so its id is not reused while remembered
_STATUS_NAMES: dict[int, tuple[Any, str]] = {}


def status_name(result: Any) -> str:
    """``ALLOCATED`` / ``RESERVED`` / ``BUSY`` / ``UNSATISFIABLE`` of a match result."""
    status = result.status
    known = _STATUS_NAMES.get(id(status))
    if known is not None and known[0] is status:
        return known[1]
    name = str(getattr(status, "name", status)).upper()
    if len(_STATUS_NAMES) < 64:
        _STATUS_NAMES[id(status)] = (status, name)
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
