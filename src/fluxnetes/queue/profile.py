"""Cores in use over time at the root, as the scheduler itself planned them.

Two cheap questions a scheduling cycle asks before it bothers the matcher:

* ``avail_during(now, d)``: the fewest cores free at any instant of ``[now, now+d)``. A job
  needing more cannot start now.
* ``earliest(now, d, c, exclude)``: the earliest time at which ``c`` cores stay free for
  ``d`` seconds (ignoring one span, e.g. the job's own reservation). No placement on the
  real graph can start earlier, so if a reserved job's reservation already starts there,
  asking the matcher again cannot move it.

The profile only knows what this scheduler allocated and reserved (not foreign
allocations), and counts cores without looking at where they are, so it can only
over-estimate what is free: answers are necessary conditions. Using them never changes a
decision; it only saves matcher calls whose answer is known.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Hashable, Mapping, Sequence

FOREVER = 2**62


class CoreProfile:
    """Root-level core counts over time; with ``node_cores`` (cores of each node, by name)
    also per-node holdings, so that ``fits_now`` sees that a reservation pins *those*
    nodes' cores (Fluxion reservations are placements, not counts)."""

    def __init__(self, capacity: int, node_cores: Mapping[str, int] | None = None) -> None:
        self.capacity = capacity
        self._spans: dict[Hashable, tuple[int, int, int]] = {}
        # per node: cores of each node, cores held now by running jobs, the nodes with a
        # free core now, and the spans (start, end, cores) placed on each node
        self._node_cap: dict[str, int] = dict(node_cores or {})
        self._node_used: dict[str, int] = dict.fromkeys(self._node_cap, 0)
        self._free_nodes: set[str] = {n for n, c in self._node_cap.items() if c > 0}
        self._on_node: dict[str, dict[Hashable, tuple[int, int, int]]] = {}
        self._placed: dict[Hashable, list[tuple[str, int]]] = {}
        self._running_keys: set[Hashable] = set()
        # change of cores in use at each time (+ at span starts, - at span ends), and the
        # sorted times with a non-zero change: kept up to date on add/remove so that a
        # rebuild is one pass, no sort
        self._delta: dict[int, int] = {}
        self._keys: list[int] = []
        self._built_for: int | None = None
        # step function from ``now``: avail[i] cores free on [times[i], times[i+1])
        self._times: list[int] = []
        self._avail: list[int] = []
        self._prefix_min: list[int] = []

    def _shift(self, t: int, change: int) -> None:
        old = self._delta.get(t, 0)
        new = old + change
        if new:
            self._delta[t] = new
            if not old:
                insort(self._keys, t)
        else:
            del self._delta[t]
            del self._keys[bisect_left(self._keys, t)]

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
        if key in self._spans:
            self.remove(key)
        end = start + duration if duration > 0 else FOREVER
        self._spans[key] = (start, end, cores)
        if cores:
            self._shift(start, cores)
            if end < FOREVER:
                self._shift(end, -cores)
        self._built_for = None
        if self._node_cap and shares:
            placed = [(name, c) for name, c in shares if name in self._node_cap and c > 0]
            self._placed[key] = placed
            for name, c in placed:
                self._on_node.setdefault(name, {})[key] = (start, end, c)
                if running:
                    used = self._node_used[name] + c
                    self._node_used[name] = used
                    if used >= self._node_cap[name]:
                        self._free_nodes.discard(name)
            if running:
                self._running_keys.add(key)

    def remove(self, key: Hashable) -> None:
        span = self._spans.pop(key, None)
        if span is None:
            return
        start, end, cores = span
        if cores:
            self._shift(start, -cores)
            if end < FOREVER:
                self._shift(end, cores)
        self._built_for = None
        placed = self._placed.pop(key, None)
        if placed is not None:
            running = key in self._running_keys
            self._running_keys.discard(key)
            for name, c in placed:
                self._on_node[name].pop(key, None)
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
            cap = self._node_cap[name]
            spans = self._on_node.get(name)
            free = cap - self._node_used[name]
            if spans:
                # free cores on this node at each instant of the window: they only drop
                # when a reservation starts, so look at now and every such start
                checks = [now] + [s for s, e, _ in spans.values() if now < s < end]
                for t in checks:
                    held = 0
                    for s, e, c in spans.values():
                        if s <= t < e:
                            held += c
                    free = min(free, cap - held)
            if free > 0:
                total += free
                if total >= cores:
                    return True
        return False

    def span(self, key: Hashable) -> tuple[int, int, int] | None:
        return self._spans.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._spans

    def _build(self, now: int) -> None:
        keys, delta = self._keys, self._delta
        split = bisect_right(keys, now)
        avail = self.capacity
        for t in keys[:split]:
            avail -= delta[t]
        times = [now]
        avails = [avail]
        prefix = [avail]
        low = avail
        for t in keys[split:]:
            avail -= delta[t]
            if avail < low:
                low = avail
            times.append(t)
            avails.append(avail)
            prefix.append(low)
        self._times = times
        self._avail = avails
        self._prefix_min = prefix
        self._built_for = now

    def avail_during(self, now: int, duration: int) -> int:
        """Fewest cores free at any instant of ``[now, now+duration)`` (0 = forever)."""
        if self._built_for != now:
            self._build(now)
        if duration <= 0:
            return self._prefix_min[-1]
        idx = bisect_left(self._times, now + duration)
        return self._prefix_min[idx - 1]

    def earliest(self, now: int, duration: int, cores: int, exclude: Hashable = None) -> int | None:
        """Earliest ``t >= now`` with ``cores`` free throughout ``[t, t+duration)``
        (0 = forever), ignoring the span ``exclude``; None if never."""
        if self._built_for != now:
            self._build(now)
        times, avail = self._times, self._avail
        skip = self._spans.get(exclude) if exclude is not None else None
        s0, e0, c0 = skip if skip is not None else (0, 0, 0)
        n = len(times)
        i = 0
        while i < n:
            t = times[i]
            if (avail[i] + c0 if s0 <= t < e0 else avail[i]) < cores:
                i += 1
                continue
            end = t + duration if duration > 0 else FOREVER
            j = i + 1
            while j < n:
                u = times[j]
                if u >= end or (avail[j] + c0 if s0 <= u < e0 else avail[j]) < cores:
                    break
                j += 1
            if j >= n or times[j] >= end:
                return t
            i = j + 1
        return None
