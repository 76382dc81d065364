"""Cores in use over time at the root, as the scheduler itself planned them.

Two cheap questions a scheduling cycle asks before it bothers the matcher:

* ``avail_during(now, d)``: the fewest cores free at any instant of ``[now, now+d)``. A job
  needing more cannot start now.
* ``earliest(now, d, c, exclude)``: the earliest time at which ``c`` cores stay free for
  ``d`` seconds (ignoring one span, e.g. the job's own reservation). No placement on the
  real graph can start earlier, so if a reserved job's reservation already starts there,
  asking the matcher again cannot move it.

The calendars are :class:`fluxnetes.plan.Planner`\\ s (one for the root, one per node with
``node_cores``), keyed by the caller's span keys. The profile only knows what this
scheduler allocated and reserved (not foreign allocations), and counts cores without
looking at where they are, so it can only over-estimate what is free: answers are necessary
conditions. Using them never changes a decision; it only saves matcher calls whose answer
is known.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from fluxnetes.plan import Planner

FOREVER = 2**62
# planners reach past FOREVER so that a "forever" window [t, FOREVER + t) starting at any
# t >= 0 covers every span (spans end at FOREVER at the latest)
_HORIZON = 2 * FOREVER


class CoreProfile:
    """Root-level core counts over time; with ``node_cores`` (cores of each node, by name)
    also per-node holdings, so that ``fits_now`` sees that a reservation pins *those*
    nodes' cores (Fluxion reservations are placements, not counts)."""

    def __init__(self, capacity: int, node_cores: Mapping[str, int] | None = None) -> None:
        self.capacity = capacity
        self._root = Planner(capacity, 0, _HORIZON)
        # per node: cores of each node, cores held now by running jobs (until removed, even
        # past their planned end), the nodes with a free core now, and each node's calendar
        self._node_cap: dict[str, int] = dict(node_cores or {})
        self._node_used: dict[str, int] = dict.fromkeys(self._node_cap, 0)
        self._free_nodes: set[str] = {n for n, c in self._node_cap.items() if c > 0}
        self._on_node: dict[str, Planner] = {}
        self._placed: dict[Hashable, list[tuple[str, int]]] = {}
        self._running_keys: set[Hashable] = set()

    def add(
        self,
        key: Hashable,
        start: int,
        duration: int,
        cores: int,
        shares: Sequence[tuple[str, int]] = (),
        *,
        running: bool = False,
    ) -> None:
        """Record ``cores`` over ``[start, start+duration)``; duration 0 = until removed.
        ``shares``: (node name, cores) of the placement; ``running``: held from now on."""
        if key in self._root:
            self.remove(key)
        end = start + duration if duration > 0 else FOREVER
        self._root.put(key, start, end, cores)
        if self._node_cap and shares:
            placed = [(name, c) for name, c in shares if name in self._node_cap and c > 0]
            self._placed[key] = placed
            for name, c in placed:
                cal = self._on_node.get(name)
                if cal is None:
                    cal = self._on_node[name] = Planner(self._node_cap[name], 0, _HORIZON)
                cal.put(key, start, end, c)
                if running:
                    used = self._node_used[name] + c
                    self._node_used[name] = used
                    if used >= self._node_cap[name]:
                        self._free_nodes.discard(name)
            if running:
                self._running_keys.add(key)

    def remove(self, key: Hashable) -> None:
        if self._root.pop(key) is None:
            return
        placed = self._placed.pop(key, None)
        if placed is not None:
            running = key in self._running_keys
            self._running_keys.discard(key)
            for name, c in placed:
                self._on_node[name].pop(key)
                if running:
                    used = self._node_used[name] - c
                    self._node_used[name] = used
                    if used < self._node_cap[name]:
                        self._free_nodes.add(name)

    def fits_now(self, now: int, duration: int, cores: int) -> bool:
        """Could ``cores`` cores be held over ``[now, now+duration)``? False only if surely
        not: fewer cores free at the root at some instant, or (with node data) fewer cores
        on nodes that stay free that long, given what is reserved on them."""
        if cores <= 0:
            return True
        if cores > self.avail_during(now, duration):
            return False
        if not self._node_cap:
            return True
        end = now + duration if duration > 0 else FOREVER
        total = 0
        for name in self._free_nodes:
            free = self._node_cap[name] - self._node_used[name]
            cal = self._on_node.get(name)
            if cal:
                held = cal.free(now, end)
                if held < free:
                    free = held
            if free > 0:
                total += free
                if total >= cores:
                    return True
        return False

    @property
    def per_node(self) -> bool:
        """Does it keep per-node calendars (``node_cores`` given)? Only then does ``add``
        read a placement's shares."""
        return bool(self._node_cap)

    def span(self, key: Hashable) -> tuple[int, int, int] | None:
        """(start, end, cores) of a recorded span (end FOREVER: until removed)."""
        return self._root.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._root

    def avail_during(self, now: int, duration: int) -> int:
        """Fewest cores free at any instant of ``[now, now+duration)`` (0 = forever)."""
        return self._root.free(now, now + duration if duration > 0 else FOREVER)

    def earliest(self, now: int, duration: int, cores: int, exclude: Hashable = None) -> int | None:
        """Earliest ``t >= now`` with ``cores`` free throughout ``[t, t+duration)``
        (0 = forever), ignoring the span ``exclude``; None if never."""
        return self._root.first_fit(
            now, duration if duration > 0 else FOREVER, max(cores, 0), exclude=exclude
        )

    def moves_earlier(self, now: int, duration: int, cores: int, at: int, exclude: Hashable) -> bool:
        """Would the span ``exclude`` (planned from ``at``) be placed elsewhere if asked
        again: is ``earliest(now, duration, cores, exclude)`` before ``at``, or None? Without
        searching past ``at`` (a kept reservation's "could it move earlier?")."""
        d = duration if duration > 0 else FOREVER
        c = max(cores, 0)
        earlier = self._root.fits_before(now, d, c, at, exclude=exclude)
        if earlier is None:  # (a window past the horizon: the full search's answer)
            low = self._root.first_fit(now, d, c, exclude=exclude)
            return low is None or low < at
        return earlier
