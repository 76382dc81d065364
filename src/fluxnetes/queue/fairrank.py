"""Fair-share factors of a few leaves of a flat account tree, without reading every leaf.

``fairshare.leaf_factors`` reads every node's usage and ranks every leaf: O(accounts) per
call, and a simulated scheduling pass (or an operator cycle) calls it whenever usage moved.
A queue only needs the factors of the accounts that have a job waiting. On a *flat* tree
(every leaf directly under the root: one account per user or per group) they follow from
far less:

* **classic**: a leaf's factor is ``2 ** (-(u / u_root) / S)``: its own usage and the root's.
* **Fair Tree**: a leaf's factor is ``rank / n``, where ``n - rank`` is the number of leaves
  ranked before it: those with a higher level fairshare ``S / (u / u_root)``, i.e. a lower
  ``log2(u) - log2(S)``. A leaf with no running job only decays, ``u(now) = u(t) *
  2 ** (-(now - t) / H)``, so its ``log2(u) - log2(S) + now / H`` never changes: those leaves
  sit in one sorted list keyed by it, updated only for the leaves an event touched
  (``Usage.changed``); the few leaves with running jobs are evaluated at ``now``. A rank is a
  bisection plus a pass over the running leaves.

Exactness: the factors are the very floats ``leaf_factors`` gives (the same expressions over
the same usage values, ``Usage.value_at``). Where the sorted keys could disagree with the
floats ``leaf_factors`` compares - another leaf whose key is within ``NEAR`` (1e-6 in log2
units, a thousand times Fair Tree's tie tolerance and far above rounding) of the asked leaf's,
where a tie or float rounding could decide the order - ``factors`` answers None and the
caller computes every leaf (``tests/test_queue_fairrank.py`` compares both on random event
streams). Pure core: no clock.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable

from fluxnetes.queue.accounts import ROOT, AccountTree
from fluxnetes.queue.fairshare import Algorithm, _shape
from fluxnetes.queue.usage import Usage

NEAR = 1e-6  # log2 units: keys closer than this are settled by the full computation


def is_flat(tree: AccountTree) -> bool:
    """Every account is a leaf directly under the root."""
    return all(tree.nodes[name].parent == ROOT for name in tree.order[1:])


class FlatRanker:
    """Factors of chosen leaves of a flat ``tree`` from ``usage`` (which must stay the one
    it was built with; ``FairShare`` makes a new ranker when it replaces its usage)."""

    def __init__(self, tree: AccountTree, usage: Usage, algorithm: Algorithm,
                 dampening: float = 1.0) -> None:
        if not is_flat(tree):
            raise ValueError("FlatRanker: the account tree is not flat")
        self.tree = tree
        self.usage = usage
        self.algorithm = algorithm
        self.dampening = dampening
        shape = _shape(tree)
        self.level = shape.level  # S among siblings (= of the machine: the tree is flat)
        self.norm = shape.norm
        self.n = len(tree.leaves)
        self.log_share = {name: math.log2(self.level[name]) for name in tree.leaves}
        self.inv_h = 1.0 / usage.half_life if usage.half_life else 0.0
        # idle leaves with usage, sorted by their time-free key; running leaves; the rest
        # have no usage (level fairshare infinite)
        self.keys: list[float] = []
        self.key_of: dict[str, float] = {}
        self.running: set[str] = set()
        usage.changed.update(tree.leaves)  # first sync places every leaf
        # counters (tests and benchmarks show how often the full computation was needed)
        self.answered = 0
        self.fallbacks = 0

    def _sync(self) -> None:
        changed = self.usage.changed
        if not changed:
            return
        for name in changed:
            key = self.key_of.pop(name, None)
            if key is not None:
                del self.keys[bisect_left(self.keys, key)]
            self.running.discard(name)
            u, rate, t = self.usage.state(name)
            if rate != 0.0:
                self.running.add(name)
            elif u > 0.0:
                key = math.log2(u) + t * self.inv_h - self.log_share[name]
                self.key_of[name] = key
                insort(self.keys, key)
        changed.clear()

    def factors(self, leaves: Iterable[str], now: int) -> dict[str, float] | None:
        """``{leaf: factor}`` for ``leaves`` at ``now``, equal to ``leaf_factors(...)``'s;
        None when a near tie makes the full computation necessary."""
        self._sync()
        usage = self.usage
        total = float(usage.value_at(ROOT, now))
        out: dict[str, float] = {}
        if self.algorithm == "classic":
            damp = self.dampening
            for name in leaves:
                raw = float(usage.value_at(name, now))
                if raw < 0.0:
                    raw = 0.0
                effective = raw / total if total > 0 else 0.0
                out[name] = 2.0 ** (-effective / self.norm[name] / damp)
            self.answered += 1
            return out
        n = self.n
        wanted = list(leaves)
        if total <= 0:  # no usage anywhere: every leaf ties at the top
            self.answered += 1
            return dict.fromkeys(wanted, n / n)
        # the running leaves at `now`: their level fairshare as leaf_factors computes it
        level = self.level
        run_lf: dict[str, float] = {}
        for name in self.running:
            r = float(usage.value_at(name, now))
            if r < 0.0:
                r = 0.0
            lv = r / total
            run_lf[name] = math.inf if lv <= 0 else level[name] / lv
        finite = sorted(lf for lf in run_lf.values() if lf != math.inf)
        infinite = self.n - len(self.key_of) - len(finite)
        shift = now * self.inv_h
        keys = self.keys
        key_of = self.key_of
        log_share = self.log_share
        for name in wanted:
            r = float(usage.value_at(name, now))
            if r < 0.0:
                r = 0.0
            lv = r / total
            if lv <= 0:
                out[name] = n / n  # in the infinite group: they tie at the top
                continue
            lf = level[name] / lv
            # ranked before it: every leaf with an infinite level fairshare, the idle ones
            # with a lower key, the running ones with a higher level fairshare; a leaf near
            # it (not itself) leaves the order to the full computation
            w = math.log2(r) - log_share[name] + shift  # its key as if it were idle
            lo = bisect_left(keys, w - NEAR)
            hi = bisect_right(keys, w + NEAR)
            rlo = bisect_left(finite, lf - NEAR * lf)
            rhi = bisect_right(finite, lf + NEAR * lf)
            own = 1 if (name in key_of or name in run_lf) else 0
            if (hi - lo) + (rhi - rlo) > own:
                self.fallbacks += 1
                return None
            out[name] = (n - (infinite + lo + len(finite) - rhi)) / n
        self.answered += 1
        return out
