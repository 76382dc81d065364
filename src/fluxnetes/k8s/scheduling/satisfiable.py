"""Can a queued group ever run on this cluster? Asked for every group a cycle considers.

The queue's matcher calls judge satisfiability only for the jobs it asks to reserve (the head
under EASY): a job behind the reservation gets a plain ``allocate``, whose BUSY does not say
"never". So before each cycle every queued group answers the count questions of
``fluxnetes.queue.satisfy`` (totals per type, a pod that fits no node, more pods than the
nodes hold); a group the cycle leaves blocked also gets the matcher's full satisfiability
walk once per request shape. Both answers are remembered until the graph changes (nodes
added, removed or resized), so a steady queue costs one dictionary lookup per group.

Unsatisfiable is not for ever: when the graph or the nodes' labels/taints change,
``Judge.changed`` says so and the controller looks at its Unsatisfiable groups again.

Reasons speak Kubernetes: ``core`` is ``cpu``, the memory pool counts MiB, a slot is a pod.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any

from fluxnetes.k8s.resources import GPU
from fluxnetes.queue.protocol import status_name
from fluxnetes.queue.satisfy import MEMO_LIMIT, Capacity, shape_key

UNIT_NAMES = {"core": "cpu", "memory": "MiB memory", "gpu": GPU, "slot": "pod"}


class Judge:
    """Satisfiability answers for one controller, valid for one graph version."""

    def __init__(self) -> None:
        self._graph: Any = None
        self._version = -1
        self._capacity: Capacity | None = None
        self._possible: dict[Hashable, Any] = {}  # group key -> the jobspec found possible
        self._walked: dict[Hashable, Any] = {}  # group key -> the jobspec the walk found possible
        self._shapes_ok: set[Hashable] = set()  # shapes the matcher found satisfiable
        self._examined: tuple[Any, int, int] | None = None

    def capacity(self, matcher: Any) -> Capacity:
        graph = matcher.graph
        if self._capacity is None or graph is not self._graph or graph.version != self._version:
            self._graph, self._version = graph, graph.version
            self._capacity = Capacity.of(graph)
            self._possible.clear()
            self._walked.clear()
            self._shapes_ok.clear()
        return self._capacity

    def short(self, key: Hashable, js: Any, matcher: Any) -> str | None:
        """Why ``js`` can never run (the short resource), or None if it may. Cheap."""
        cap = self.capacity(matcher)
        if self._possible.get(key) is js:
            return None
        short = cap.check(js)
        if short is not None:
            self._possible.pop(key, None)
            return short.text(UNIT_NAMES)
        self._possible[key] = js
        return None

    def never(self, group: Hashable, js: Any, matcher: Any) -> str | None:
        """The matcher's own satisfiability walk (once per shape and graph version; it
        ignores whether nodes are up): why ``js`` can never run, or None."""
        self.capacity(matcher)
        if self._walked.get(group) is js:
            return None
        key = shape_key(js)
        if key in self._shapes_ok:
            self._walked[group] = js
            return None
        answer = matcher.satisfiability(js)
        if status_name(answer) == "UNSATISFIABLE":
            return str(getattr(answer, "reason", "") or "the request can never be satisfied on this graph")
        if len(self._shapes_ok) >= MEMO_LIMIT:
            self._shapes_ok.clear()
        self._shapes_ok.add(key)
        self._walked[group] = js
        return None

    def changed(self, matcher: Any, view_version: int) -> bool:
        """Did the graph or the nodes' labels/taints change since the last call? (The first
        call only takes note.)"""
        self.capacity(matcher)
        mark = (self._graph, self._version, view_version)
        old, self._examined = self._examined, mark
        if old is None:
            return False
        return old[0] is not mark[0] or old[1:] != mark[1:]

    def keep_only(self, keys: Collection[Hashable]) -> None:
        """Forget answers of groups that are gone (bounded memory)."""
        if len(self._possible) + len(self._walked) > 2 * len(keys) + 1024:
            self._possible = {k: v for k, v in self._possible.items() if k in keys}
            self._walked = {k: v for k, v in self._walked.items() if k in keys}
