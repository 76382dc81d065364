"""Usage in resource-seconds, decayed with a half-life, kept incrementally per account.

Pure core: no clock; every call takes the time ``now`` (int seconds, the caller's clock).

A running job charges ``rate`` resource-units per second (``UsageWeights``: cores, GPUs and
nodes, each with a weight; Slurm's ``TRESBillingWeights`` summed, priority_multifactor.html
"Fair-share Factor"). Past usage decays continuously: a unit charged ``dt`` seconds ago
counts ``2**(-dt / half_life)`` (Slurm's ``PriorityDecayHalfLife``; Slurm applies the same
decay in steps of ``PriorityCalcPeriod``, classic_fair_share.html "Normalized Usage").

Each node of the account tree (leaf or account, accounts summing their descendants) keeps
only ``(u, rate, t)``: its decayed usage as of ``t`` and the total rate of its running jobs.
Its usage at ``now`` is closed-form::

    u(now) = u * D + rate * H / ln 2 * (1 - D),   D = 2 ** (-(now - t) / H)

so a job start or end updates the nodes on one path (O(depth)), and reading every node at
``now`` costs O(nodes) whatever the history: there is never a pass over past jobs. Usage is
linear in the events, so an event that arrives late (``at`` before the node's ``t``) is
applied exactly too: the result does not depend on the order events are fed in.
``half_life = 0`` means no decay (Slurm: usage then only resets).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fluxnetes.queue.accounts import AccountTree


class UsageError(ValueError):
    """A usage event that cannot be applied (unknown job or account, bad weights)."""


@dataclass(frozen=True)
class UsageWeights:
    """Resource-units per second a job charges per core, per GPU and per node."""

    core: float = 1.0
    gpu: float = 0.0
    node: float = 0.0

    def __post_init__(self) -> None:
        for name in ("core", "gpu", "node"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise UsageError(f"usage weights.{name}: must be a number >= 0, got {value!r}")


@dataclass(frozen=True)
class Resources:
    """What a job holds while it runs (for usage and limits)."""

    cores: int = 0
    gpus: int = 0
    nodes: int = 0

    def rate(self, weights: UsageWeights) -> float:
        return self.cores * weights.core + self.gpus * weights.gpu + self.nodes * weights.node


class HasJobspec(Protocol):
    @property
    def jobspec(self) -> Any: ...


def job_resources(job: HasJobspec) -> Resources:
    """Cores, GPUs and nodes from the jobspec's totals (``min_cores`` when it is set).
    A job that names no node level holds at least one node."""
    totals = getattr(job.jobspec, "totals", None)
    if not isinstance(totals, dict):
        return Resources(cores=int(getattr(job, "min_cores", 0) or 0), nodes=1)
    get = totals.get
    return Resources(int(getattr(job, "min_cores", 0) or get("core", 0)), int(get("gpu", 0)),
                     max(int(get("node", 0)), 1))


@dataclass
class _Acc:
    u: float = 0.0  # decayed usage as of t
    rate: float = 0.0  # units per second of the running jobs below this node
    t: int = 0


class Usage:
    """Decayed usage per node of ``tree``, updated by job start/end events."""

    def __init__(self, tree: AccountTree, half_life: int, weights: UsageWeights | None = None,
                 *, start: int = 0) -> None:
        if isinstance(half_life, bool) or not isinstance(half_life, int) or half_life < 0:
            raise UsageError(f"half_life: must be an integer number of seconds >= 0, got {half_life!r}")
        self.tree = tree
        self.half_life = half_life
        self.weights = weights or UsageWeights()
        self._acc: dict[str, _Acc] = {name: _Acc(t=start) for name in tree.nodes}
        self._running: dict[str, tuple[str, float, Resources]] = {}  # id -> (leaf, rate, res)
        self._cache: tuple[int, int, dict[str, float]] | None = None
        self.version = 0  # bumped by every event (lets readers cache per (now, version))
        # leaves touched by events since a reader last cleared it (fairrank.py keeps its
        # ranking up to date from it instead of reading every leaf)
        self.changed: set[str] = set()
        # counters of work done, so tests can show the cost per cycle is O(nodes)
        self.node_updates = 0
        self.node_reads = 0

    # --- the decay --------------------------------------------------------------------

    def _decay(self, dt: float) -> float:
        return 1.0 if self.half_life == 0 else 2.0 ** (-dt / self.half_life)

    def _accrued(self, rate: float, dt: float) -> float:
        """Usage charged by ``rate`` over the last ``dt`` seconds, as counted at the end."""
        if rate == 0.0 or dt == 0:
            return 0.0
        if self.half_life == 0:
            return rate * dt
        return rate * self.half_life / math.log(2) * (1.0 - self._decay(dt))

    def _value(self, acc: _Acc, now: int) -> float:
        dt = max(now - acc.t, 0)  # reads before the last event see the state at that event
        return acc.u * self._decay(dt) + self._accrued(acc.rate, dt)

    def _advance(self, acc: _Acc, now: int) -> None:
        if now > acc.t:
            acc.u = self._value(acc, now)
            acc.t = now

    def _apply(self, leaf: str, rate: float, at: int) -> None:
        """Add ``rate`` (negative: remove) from time ``at`` on, along the leaf's path."""
        for name in self.tree.path[leaf]:
            acc = self._acc[name]
            self._advance(acc, at)
            # a late event (at < acc.t): charge (or take back) what accrued in [at, acc.t]
            acc.u += self._accrued(rate, acc.t - at)
            acc.rate += rate
            if abs(acc.rate) < 1e-9 * max(abs(rate), 1.0):
                acc.rate = 0.0  # no float residue once every job has ended
            self.node_updates += 1
        self.version += 1
        self.changed.add(leaf)

    # --- events -----------------------------------------------------------------------

    def start(self, job_id: str, leaf: str, resources: Resources, at: int) -> None:
        """A job charging ``leaf`` started at ``at`` (may lie before earlier events)."""
        if job_id in self._running:
            raise UsageError(f"job {job_id!r}: already running")
        if leaf not in self.tree.nodes or not self.tree.is_leaf(leaf):
            raise UsageError(f"job {job_id!r}: {leaf!r} is not a leaf of the account tree")
        rate = resources.rate(self.weights)
        self._running[job_id] = (leaf, rate, resources)
        self._apply(leaf, rate, at)

    def end(self, job_id: str, at: int) -> bool:
        """The job ended at ``at``; False if it was not running (ended twice, never started)."""
        entry = self._running.pop(job_id, None)
        if entry is None:
            return False
        leaf, rate, _ = entry
        self._apply(leaf, -rate, at)
        return True

    def resize(self, job_id: str, resources: Resources, at: int) -> bool:
        """A running job holds ``resources`` from ``at`` on (part of a group ended)."""
        entry = self._running.get(job_id)
        if entry is None:
            return False
        leaf, rate, _ = entry
        new_rate = resources.rate(self.weights)
        self._running[job_id] = (leaf, new_rate, resources)
        self._apply(leaf, new_rate - rate, at)
        return True

    def charge(self, leaf: str, amount: float, at: int) -> None:
        """Add ``amount`` resource-seconds charged at time ``at`` (e.g. from a store)."""
        if leaf not in self.tree.nodes or not self.tree.is_leaf(leaf):
            raise UsageError(f"charge: {leaf!r} is not a leaf of the account tree")
        for name in self.tree.path[leaf]:
            acc = self._acc[name]
            self._advance(acc, at)
            acc.u += amount * self._decay(acc.t - at)
            self.node_updates += 1
        self.version += 1
        self.changed.add(leaf)

    def running(self) -> dict[str, str]:
        """Job id -> leaf of every job counted as running."""
        return {job_id: entry[0] for job_id, entry in self._running.items()}

    def running_count(self) -> int:
        """How many jobs are counted as running."""
        return len(self._running)

    def resources_of(self, job_id: str) -> Resources | None:
        """What a running job is charged for (None: not counted as running)."""
        entry = self._running.get(job_id)
        return None if entry is None else entry[2]

    def running_resources(self) -> dict[str, tuple[str, Resources]]:
        """Job id -> (leaf, resources) of every job counted as running."""
        return {job_id: (entry[0], entry[2]) for job_id, entry in self._running.items()}

    # --- reading ----------------------------------------------------------------------

    def totals(self, now: int) -> dict[str, float]:
        """Decayed usage of every node at ``now`` (accounts include their descendants).
        O(nodes); cached for the same ``now`` until the next event."""
        cached = self._cache
        if cached is not None and cached[0] == now and cached[1] == self.version:
            return cached[2]
        # _value() inlined (the same expressions, so the same floats): this runs every cycle
        half_life = self.half_life
        values: dict[str, float] = {}
        for name, acc in self._acc.items():
            dt = now - acc.t
            if dt <= 0:
                values[name] = acc.u
            elif half_life == 0:
                values[name] = acc.u + (acc.rate * dt if acc.rate != 0.0 else 0.0)
            else:
                decay = 2.0 ** (-dt / half_life)
                values[name] = acc.u * decay + (acc.rate * half_life / math.log(2) * (1.0 - decay)
                                                if acc.rate != 0.0 else 0.0)
        self.node_reads += len(values)
        self._cache = (now, self.version, values)
        return values

    def value_at(self, name: str, now: int) -> float:
        """One node's decayed usage at ``now``: the very float ``totals(now)[name]`` holds
        (the same expressions), for readers that need a few nodes, not all."""
        acc = self._acc[name]
        dt = now - acc.t
        if dt <= 0:
            return acc.u
        half_life = self.half_life
        if half_life == 0:
            return acc.u + (acc.rate * dt if acc.rate != 0.0 else 0.0)
        decay: float = 2.0 ** (-dt / half_life)
        return acc.u * decay + (acc.rate * half_life / math.log(2) * (1.0 - decay)
                                if acc.rate != 0.0 else 0.0)

    def state(self, name: str) -> tuple[float, float, int]:
        """A node's ``(usage as of t, rate, t)``: its usage at any later time follows in
        closed form (module docstring)."""
        acc = self._acc[name]
        return acc.u, acc.rate, acc.t

    def rates(self) -> dict[str, float]:
        """Resource units per second charged now under every node (its running jobs)."""
        return {name: acc.rate for name, acc in self._acc.items()}

    def of(self, name: str, now: int) -> float:
        return self._value(self._acc[name], now)

    # --- persistence (the store keeps these across restarts) --------------------------

    def snapshot(self, now: int) -> dict[str, float]:
        """Decayed usage per leaf at ``now``, including what running jobs accrued so far.
        After a restart, ``restore(values, at=now)`` and re-record the running jobs with
        ``start(..., at=now)`` (their past is already counted)."""
        return {leaf: self._value(self._acc[leaf], now) for leaf in self.tree.leaves}

    @classmethod
    def restore(cls, tree: AccountTree, half_life: int, values: Mapping[str, float], at: int,
                weights: UsageWeights | None = None) -> Usage:
        """A Usage whose leaves hold ``values`` at time ``at`` (leaves no longer in the tree
        are dropped: their usage goes with them)."""
        usage = cls(tree, half_life, weights, start=at)
        for leaf, value in values.items():
            if leaf in tree.nodes and tree.is_leaf(leaf) and value:
                usage.charge(leaf, value, at)
        return usage
