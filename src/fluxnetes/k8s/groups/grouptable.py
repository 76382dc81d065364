"""The groups by key, with the indexes a scheduling cycle reads instead of sweeping every group.

With thousands of groups running, a cycle that walked every group several times (fair-share
charges, node rules, the queue, FluxJob writes due, the queue gauge) spent most of its time on
groups nothing had happened to (bench/cycle_groups_bench.py: 80 ms a cycle at 10,000 running
groups, the matching itself under 1 ms). The table keeps, as groups change:

* ``by_phase``: the groups in each phase (a Group tells its table when its ``phase`` is set);
* ``fj_dirty``: the groups whose FluxJob needs a write (``Group.fj_dirty`` set), in the order
  they came to need it (so those already given a ``fj_since`` come first, oldest first);
* ``touched``: the keys of groups whose phase or holdings changed, or that came or went, since
  fair share last took them (``take_touched``): its charges follow only those.

It is a dict (``groups[key]``, ``in``, ``get``, iteration) whose writes keep the indexes:
``[key] = group``, ``del``, ``pop`` and ``clear``; the other dict writes are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from fluxnetes.k8s.persistence.fluxjob import Phase

if TYPE_CHECKING:
    from fluxnetes.k8s.groups.group import Group

Key = tuple[str, str]


class GroupTable(dict[Key, "Group"]):
    def __init__(self) -> None:
        super().__init__()
        self.by_phase: dict[Phase, dict[Key, Group]] = {p: {} for p in Phase}
        self.fj_dirty: dict[Key, Group] = {}
        self.touched: set[Key] = set()

    # ------------------------------------------------------------ dict writes
    def __setitem__(self, key: Key, g: Group) -> None:
        old = self.get(key)
        if old is not None:
            self._unindex(key, old)
        super().__setitem__(key, g)
        g.table = self
        self.by_phase[g.phase][key] = g
        if g.fj_dirty:
            self.fj_dirty[key] = g
        self.touched.add(key)

    def __delitem__(self, key: Key) -> None:
        g = self[key]
        super().__delitem__(key)
        self._unindex(key, g)

    def pop(self, key: Key, *default: Any) -> Any:
        if key in self:
            g = self[key]
            del self[key]
            return g
        if default:
            return default[0]
        raise KeyError(key)

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def _refused(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("GroupTable: write groups with table[key] = group (the indexes follow)")

    setdefault = update = popitem = __ior__ = _refused

    def _unindex(self, key: Key, g: Group) -> None:
        self.by_phase[g.phase].pop(key, None)
        self.fj_dirty.pop(key, None)
        self.touched.add(key)
        if g.table is self:
            g.table = None

    # ------------------------------------------------------------ told by a Group
    def field_set(self, g: Group, name: str, old: Any, new: Any) -> None:
        """``g.<name>`` (an indexed field) goes from ``old`` to ``new``."""
        key = g.key
        if self.get(key) is not g:
            return  # (a group replaced under its key: no longer indexed)
        if name == "phase":
            if old != new:
                self.by_phase[old].pop(key, None)
                self.by_phase[new][key] = g
                self.touched.add(key)
        elif name == "fj_dirty":
            if new:
                self.fj_dirty[key] = g  # (appended: the dict is in the order writes became due)
            elif self.fj_dirty.pop(key, None) is not None:
                g.fj_since = None  # no write needed: none is waiting since any time
        else:  # held, released: what it holds
            self.touched.add(key)

    # ------------------------------------------------------------ reads
    def in_phase(self, *phases: Phase) -> list[Group]:
        """The groups in these phases (a list: the caller may change their phase)."""
        return [g for p in phases for g in self.by_phase[p].values()]

    def phase_counts(self) -> dict[str, int]:
        """Groups per phase (phases with none left out)."""
        return {str(p): len(d) for p, d in self.by_phase.items() if d}

    def take_touched(self) -> set[Key]:
        """The keys touched since the last call (and forget them)."""
        touched, self.touched = self.touched, set()
        return touched
