"""What the satisfiability walk (far future, status ignored) answered, remembered per request,
and the slot counts of the empty graph that answer ``slot[N] -> {leaves}`` without a walk
(``match/pristine.py``). See match/README.md "Failing matches".

The matcher decides when remembering is sound (``fast_fail``, no span reaching the walk's
window) and tells this cache when its answers go stale: ``forget_walks`` when only the walk's
order moved (a commit under ``first``, leaving the counters), ``forget`` when the structure or
the properties changed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from fluxnetes.graph.model import gc_paused
from fluxnetes.jobspec.constraints import Constraint
from fluxnetes.jobspec.model import Jobspec, Resource
from fluxnetes.match.counts import calc_count
from fluxnetes.match.engine import Engine
from fluxnetes.match.pristine import PristineSlots
from fluxnetes.match.shapes import slot_shape

SAT_CACHE_MAX = 4096  # request shapes remembered (a bound for long-lived operators)


class SatAnswers:
    """Satisfiability answers per request, and empty-graph slot counts per slot element types."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.answers: dict[Hashable, bool] = {}
        self.pristine: dict[frozenset[str], PristineSlots] = {}

    def answer(self, js: Jobspec, duration: int, walk: Callable[[], bool],
               counted: Callable[[], bool | None]) -> bool:
        """The remembered answer, else ``counted()`` (None: cannot tell), else ``walk()``."""
        key = request_key(js, duration)
        if key is None:
            return walk()
        hit = self.answers.get(key)
        if hit is not None:
            return hit
        ok = counted()
        if ok is None:
            ok = walk()
        if len(self.answers) >= SAT_CACHE_MAX:
            self.answers.clear()
        self.answers[key] = ok
        return ok

    def slot_total(self, elems: list[Resource], constraint: Constraint | None) -> int | None:
        """Slots of ``elems`` the empty graph holds (PristineSlots.total; None: not counted)."""
        types = frozenset(e.type for e in elems)
        ps = self.pristine.get(types)
        if ps is None:
            with gc_paused():
                ps = self.pristine[types] = PristineSlots(self.engine, types)
        return ps.total(elems, constraint)

    def counted(self, js: Jobspec) -> bool | None:
        """The walk's answer for ``slot[N] -> {leaves}`` from slot counts on the empty graph
        (for policies that explore every child with stable ties, as the index fast paths: the
        count does not depend on the order the policy ranks candidates in); None: walk."""
        shape = slot_shape(js.resources)
        if shape is None:
            return None
        slot, elems = shape
        total = self.slot_total(elems, js.constraint)
        if total is None:
            return None
        return calc_count(slot.count, total) > 0

    def forget_walks(self) -> None:
        """The walk's order moved: remembered answers are stale (the counts are not)."""
        self.answers.clear()

    def forget(self) -> None:
        """The graph's structure or properties changed: answers and counts are stale."""
        self.answers.clear()
        self.pristine.clear()


def _resources_key(resources: list[Resource]) -> tuple[Any, ...]:
    # (labels and ids name slots for tasks and pod sets; the walk does not read them, so
    # groups of the same shape share one answer)
    return tuple((r.type, r.count, r.unit, r.exclusive, _resources_key(r.with_)) for r in resources)


def request_key(js: Jobspec, duration: int) -> Hashable | None:
    """What a satisfiability walk reads of a request (None: not hashable, do not cache)."""
    key = (_resources_key(js.resources), js.constraint, duration)
    try:
        hash(key)
    except TypeError:
        return None
    return key
