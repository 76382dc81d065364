"""Multifactor priority and ``FairShare``, the object a scheduling loop keeps.

Pure core (time is the ``now: int`` passed in). Slurm's multifactor priority
(https://slurm.schedmd.com/priority_multifactor.html)::

    priority = W_age * age + W_fairshare * fairshare + W_jobsize * job_size + W_qos * qos

every factor in [0, 1]:

* ``age``: time since submission / ``max_age``, capped at 1.0 (``PriorityMaxAge``);
* ``fairshare``: the leaf's factor under the selected algorithm (``fairshare.py``);
* ``job_size``: cores / ``total_cores`` (the whole machine = 1.0); with ``favor_small`` a
  one-core job gets 1.0 and larger ones less (``PriorityFavorSmall``);
* ``qos``: the job's ``priority`` (a Kubernetes PriorityClass value) / ``qos_max`` (0: the
  highest priority among the jobs being ordered), clamped to [0, 1].

The queue order is priority (higher first), then submit time, then id (numeric ids
numerically), Slurm's evaluation order. Priorities are kept as floats (Slurm truncates to
an integer), so small fair-share differences are not lost to rounding.

Jobs are anything with ``id``, ``submit_time``, ``priority``, ``jobspec`` (the core
``QueuedJob``) and an account: ``job.account`` when the job has it (proposed field on
``QueuedJob``), else ``FairShare(account_of=...)``, else the tree's default leaf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fluxnetes.queue.accounts import AccountError, AccountTree
from fluxnetes.queue.fairrank import FlatRanker, is_flat
from fluxnetes.queue.fairshare import ALGORITHMS, Algorithm, ShareRow, factors, leaf_factors
from fluxnetes.queue.limits import held_jobs
from fluxnetes.queue.usage import Resources, Usage, UsageError, UsageWeights, job_resources

DAY = 86400


class PriorityError(ValueError):
    """Bad fair-share / priority configuration; the message names the field."""


class Job(Protocol):
    """What the fair-share queue reads from a job (``QueuedJob`` has all of it)."""

    @property
    def id(self) -> str: ...
    @property
    def submit_time(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def jobspec(self) -> Any: ...


J = TypeVar("J", bound=Job)


def _id_key(job_id: str) -> tuple[int, int, str]:
    # the core queue's rule: all-digit ids compare as numbers, others as text after them
    return (0, int(job_id), "") if job_id.isdigit() else (1, 0, job_id)


def _cores(job: Any) -> int:
    # job_resources(job).cores without building Resources (order() calls it per job)
    cores = getattr(job, "min_cores", 0)
    if cores:
        return int(cores)
    totals = getattr(job.jobspec, "totals", None)
    return int(totals.get("core", 0)) if isinstance(totals, dict) else 0


@dataclass(frozen=True)
class PriorityWeights:
    """Weights of the factors (Slurm's PriorityWeight*; its documented example values)."""

    age: float = 1000
    fairshare: float = 10000
    job_size: float = 1000
    qos: float = 1000


@dataclass(frozen=True)
class FairShareConfig:
    """Everything the fair-share queue is configured with (defaults as Slurm's)."""

    algorithm: Algorithm = "fair_tree"
    half_life: int = 7 * DAY  # PriorityDecayHalfLife; 0 = no decay
    max_age: int = 7 * DAY  # PriorityMaxAge
    weights: PriorityWeights = field(default_factory=PriorityWeights)
    usage_weights: UsageWeights = field(default_factory=UsageWeights)
    total_cores: int = 0  # job size denominator (the machine's cores); 0 = factor 0
    favor_small: bool = False
    qos_max: int = 0  # 0 = the highest priority among the jobs being ordered
    dampening: float = 1.0  # classic only: FairShareDampeningFactor
    # seconds of usage the running jobs are charged ahead when the factors are computed: a
    # start is felt at once, not only as its usage accrues. 0 = Slurm's formula exactly (the
    # factor follows accrued usage only, so with every account backlogged the running split
    # swings around the shares with the jobs' durations); > 0 keeps the split near the shares
    # (each account's running rate x this horizon counts as used), like Kueue's and Volcano's
    # fair sharing of what runs now, while past usage still decides over the long run
    running_horizon: int = 0

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise PriorityError(f"algorithm: must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        for name in ("half_life", "max_age", "total_cores", "qos_max", "running_horizon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PriorityError(f"{name}: must be an integer >= 0, got {value!r}")
        if self.max_age == 0:
            raise PriorityError("max_age: must be > 0 seconds")
        for name in ("age", "fairshare", "job_size", "qos"):
            value = getattr(self.weights, name)
            if not (isinstance(value, int | float) and not isinstance(value, bool)
                    and math.isfinite(value) and value >= 0):
                raise PriorityError(f"weights.{name}: must be a number >= 0, got {value!r}")
        if not (isinstance(self.dampening, int | float) and math.isfinite(self.dampening)
                and self.dampening > 0):
            raise PriorityError(f"dampening: must be a number > 0, got {self.dampening!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FairShareConfig:
        """From plain values (YAML / flags); unknown keys are errors naming the key."""
        known = {"algorithm", "half_life", "max_age", "weights", "usage_weights", "total_cores",
                 "favor_small", "qos_max", "dampening", "running_horizon"}
        for key in data:
            if key not in known:
                raise PriorityError(f"{key}: unknown field (known: {', '.join(sorted(known))})")
        values = dict(data)
        try:
            if "weights" in values:
                values["weights"] = PriorityWeights(**dict(values["weights"]))
            if "usage_weights" in values:
                values["usage_weights"] = UsageWeights(**dict(values["usage_weights"]))
        except TypeError as exc:
            raise PriorityError(f"weights: {exc}") from None
        except UsageError as exc:
            raise PriorityError(str(exc)) from None
        return cls(**values)


@dataclass(frozen=True)
class PriorityBreakdown:
    """A job's priority and the factors it is made of (for ``explain``)."""

    job_id: str
    account: str  # the leaf charged ("" if the job's account is unknown)
    priority: float
    age: float
    fairshare: float
    job_size: float
    qos: float
    weights: PriorityWeights
    note: str = ""  # e.g. why the account could not be resolved

    def contributions(self) -> dict[str, float]:
        w = self.weights
        return {"age": w.age * self.age, "fairshare": w.fairshare * self.fairshare,
                "job_size": w.job_size * self.job_size, "qos": w.qos * self.qos}

    def explain(self) -> str:
        w = self.weights
        terms = " + ".join(f"{name} {weight:g}*{value:.4f}" for name, weight, value in (
            ("age", w.age, self.age), ("fairshare", w.fairshare, self.fairshare),
            ("jobsize", w.job_size, self.job_size), ("qos", w.qos, self.qos)))
        who = f"account {self.account}" if self.account else f"no account ({self.note})"
        return f"priority {self.priority:.1f} = {terms} [{who}]"


def multifactor(job: Job, now: int, fairshare: float, config: FairShareConfig, *,
                account: str = "", qos_max: int = 0, note: str = "") -> PriorityBreakdown:
    """One job's multifactor priority at ``now``, given its fair-share factor."""
    age = min(max(now - job.submit_time, 0), config.max_age) / config.max_age
    cores = _cores(job)
    total = config.total_cores
    if total <= 0:
        size = 0.0
    elif config.favor_small:
        size = max(0.0, 1.0 - (max(cores, 1) - 1) / total)
    else:
        size = min(cores / total, 1.0)
    top = config.qos_max or qos_max
    qos = 0.0 if top <= 0 else min(max(job.priority / top, 0.0), 1.0)
    w = config.weights
    value = w.age * age + w.fairshare * fairshare + w.job_size * size + w.qos * qos
    return PriorityBreakdown(job.id, account, value, age, fairshare, size, qos, w, note)


class FairShare:
    """Accounts, decayed usage, fair-share factors, the multifactor order and the limits.

    Feed it job starts and ends as they happen (``record_start`` / ``record_end``); each
    cycle ask ``held`` (drop those jobs) and ``order`` (the queue order), then run the
    cycle with ``Scheduler.cycle(order, now, ordered=True)``. A cycle costs O(accounts)
    for the factors (cached per ``now`` until the next event) plus O(jobs log jobs)."""

    def __init__(self, tree: AccountTree, config: FairShareConfig | None = None, *,
                 account_of: Callable[[Any], str] | None = None, start: int = 0) -> None:
        self.tree = tree
        self.config = config or FairShareConfig()
        self.account_of = account_of
        self.usage = Usage(tree, self.config.half_life, self.config.usage_weights, start=start)
        self._rows: tuple[int, int, dict[str, ShareRow]] | None = None
        self._factors: tuple[int, int, dict[str, float]] | None = None
        self._qos_max = 0  # highest job priority seen by the last order()
        self._ranker: FlatRanker | None = None  # factors of a few leaves (flat trees)
        self._leaf_of: dict[str, str | None] = {}  # order(): account name -> leaf (None: unknown)

    # --- accounts ---------------------------------------------------------------------

    def account_name(self, job: Any) -> str:
        """The account the job names (before resolving it to a leaf)."""
        if self.account_of is not None:
            return self.account_of(job)
        return str(getattr(job, "account", "") or "")

    def leaf(self, job: Any) -> str:
        """The leaf the job charges; AccountError naming the account if there is none."""
        name = self.account_name(job)
        if not name:
            if self.tree.default is None:
                raise AccountError("account", "job names no account and there is no default")
            return self.tree.default
        return self.tree.resolve(name)

    # --- events -----------------------------------------------------------------------

    def record_start(self, job: Job, now: int) -> None:
        """The job started at ``now`` (its resources charge its account from then on)."""
        try:
            leaf = self.leaf(job)
        except AccountError as exc:
            raise UsageError(f"job {job.id}: {exc}") from None
        self.usage.start(job.id, leaf, job_resources(job), now)

    def record_end(self, job: Job | str, now: int) -> bool:
        """The job ended at ``now``; False if it was not recorded as running."""
        return self.usage.end(job if isinstance(job, str) else job.id, now)

    def record_resize(self, job: Job | str, resources: Resources, now: int) -> bool:
        """Part of a running group went away: it holds ``resources`` from ``now`` on."""
        return self.usage.resize(job if isinstance(job, str) else job.id, resources, now)

    # --- factors and priority ---------------------------------------------------------

    def rows(self, now: int) -> dict[str, ShareRow]:
        """Every node's shares, usage and factor at ``now`` (``kubectl fluxnetes accounts``)."""
        cached = self._rows
        if cached is not None and cached[0] == now and cached[1] == self.usage.version:
            return cached[2]
        rows = factors(self.config.algorithm, self.tree, self.effective_usage(now), self.config.dampening)
        self._rows = (now, self.usage.version, rows)
        return rows

    def effective_usage(self, now: int) -> dict[str, float]:
        """The usage the factors are computed from: decayed usage at ``now`` plus, with a
        ``running_horizon``, what the running jobs charge over that horizon."""
        totals = self.usage.totals(now)
        horizon = self.config.running_horizon
        if not horizon:
            return totals
        rates = self.usage.rates()
        return {name: u + rates[name] * horizon for name, u in totals.items()}

    def leaf_factors(self, now: int) -> dict[str, float]:
        """Each leaf's fair-share factor at ``now`` (what the order uses; the same numbers
        as ``rows(now)[leaf].factor``, cheaper: no rows are built)."""
        cached = self._factors
        if cached is not None and cached[0] == now and cached[1] == self.usage.version:
            return cached[2]
        rows = self._rows
        if rows is not None and rows[0] == now and rows[1] == self.usage.version:
            values = {leaf: rows[2][leaf].factor for leaf in self.tree.leaves}
        else:
            values = leaf_factors(self.config.algorithm, self.tree, self.effective_usage(now),
                                  self.config.dampening)
        self._factors = (now, self.usage.version, values)
        return values

    def factors_for(self, leaves: Collection[str], now: int) -> Mapping[str, float]:
        """The factors of ``leaves`` at ``now`` (at least those; the same numbers as
        ``leaf_factors``): on a flat tree without a running horizon from ``FlatRanker``
        (no pass over every account), else every leaf's."""
        cached = self._factors
        if cached is not None and cached[0] == now and cached[1] == self.usage.version:
            return cached[2]
        if self.config.running_horizon == 0 and len(leaves) < len(self.tree.leaves):
            ranker = self._ranker
            if ranker is None or ranker.usage is not self.usage:
                ranker = None
                if is_flat(self.tree):
                    ranker = self._ranker = FlatRanker(self.tree, self.usage, self.config.algorithm,
                                                       self.config.dampening)
            if ranker is not None:
                found = ranker.factors(leaves, now)
                if found is not None:
                    return found
        return self.leaf_factors(now)

    def priority(self, job: Job, now: int) -> PriorityBreakdown:
        rows = self.leaf_factors(now)
        try:
            leaf = self.leaf(job)
        except AccountError as exc:
            return multifactor(job, now, 0.0, self.config, qos_max=self._qos_max or job.priority,
                               note=exc.rule)
        return multifactor(job, now, rows[leaf], self.config, account=leaf,
                           qos_max=self._qos_max or job.priority)

    def breakdowns(self, jobs: Iterable[J], now: int) -> list[tuple[J, PriorityBreakdown]]:
        """Each job with its breakdown, in queue order (for ``explain``)."""
        ordered = self.order(jobs, now)
        return [(job, self.priority(job, now)) for job in ordered]

    def order(self, jobs: Iterable[J], now: int) -> list[J]:
        """The queue order under the multifactor priority (stable; ties by submit time,
        then id). The factors of the queued accounts (``factors_for``) + O(jobs log jobs)."""
        jobs = list(jobs)
        return [jobs[i] for i in self.order_positions(jobs, now)]

    def order_positions(self, jobs: Sequence[Job], now: int) -> list[int]:
        """``order``'s answer as positions in ``jobs`` (for callers that keep their own
        job objects: the simulator's reorder hook)."""
        self._qos_max = max((job.priority for job in jobs), default=0)
        config, w = self.config, self.config.weights
        account_of = self.account_of
        # each account named once: its leaf (None: unknown, fair-share term 0), then only
        # those leaves' factors
        leaf_of: dict[str, str | None] = {}
        names: list[str] = []
        known = self._leaf_of  # account name -> leaf, kept until the tree changes
        for job in jobs:
            name = account_of(job) if account_of is not None else (getattr(job, "account", "") or "")
            names.append(name)
            if name not in leaf_of:
                if name in known:
                    leaf_of[name] = known[name]
                    continue
                try:
                    leaf_of[name] = known[name] = self.leaf(job)
                except AccountError:
                    leaf_of[name] = known[name] = None
        rows = self.factors_for({leaf for leaf in leaf_of.values() if leaf is not None}, now)
        fair = {name: (0.0 if leaf is None else w.fairshare * rows[leaf])
                for name, leaf in leaf_of.items()}  # account name -> weighted fair-share term
        top = config.qos_max or self._qos_max
        max_age, total, small = config.max_age, config.total_cores, config.favor_small
        w_age, w_qos = w.age, (w.qos if top > 0 else 0.0)
        w_size = w.job_size if total > 0 else 0.0
        keys: list[tuple[float, int, tuple[int, int, str], int]] = []
        # one plain loop (no per-job helper calls): this runs over the whole queue every cycle
        for i, job in enumerate(jobs):
            fs_term = fair[names[i]]
            # the same terms, summed in the same order, as multifactor() (explain must agree)
            age_term = w_age * (min(max(now - job.submit_time, 0), max_age) / max_age) if w_age else 0.0
            size_term = 0.0
            if w_size:
                cores = _cores(job)
                size_term = w_size * (max(0.0, 1.0 - (max(cores, 1) - 1) / total) if small
                                      else min(cores / total, 1.0))
            qos_term = w_qos * min(max(job.priority / top, 0.0), 1.0) if w_qos else 0.0
            value = age_term + fs_term + size_term + qos_term
            job_id = job.id
            keys.append((-value, job.submit_time,
                         (0, int(job_id), "") if job_id.isdigit() else (1, 0, job_id), i))
        keys.sort()
        return [k[3] for k in keys]

    # --- limits -----------------------------------------------------------------------

    def held(self, running: Iterable[Job], queued: Sequence[Job], now: int) -> dict[str, str]:
        """Job id -> reason for each of ``queued`` (in queue order) that must wait for a
        limit, or because its account is unknown. ``running``: the jobs running now."""
        del now  # limits do not depend on time; kept so every question takes ``now``
        out: dict[str, str] = {}
        leaves: dict[str, str | AccountError] = {}  # account name -> leaf (or why none)

        def leaf(job: Any) -> str | AccountError:
            name = self.account_name(job)
            found = leaves.get(name)
            if found is None:
                try:
                    found = self.leaf(job)
                except AccountError as exc:
                    found = exc
                leaves[name] = found
            return found

        limited = any(node.limits.any() for node in self.tree.nodes.values())
        run: list[tuple[str, Resources]] = []
        if limited:
            for job in running:
                where = leaf(job)
                if isinstance(where, str):  # a job charged nowhere counts against no account
                    run.append((where, job_resources(job)))
        queue: list[tuple[str, str, Resources]] = []
        for job in queued:
            where = leaf(job)
            if isinstance(where, AccountError):
                out[job.id] = where.rule
            elif limited:
                queue.append((job.id, where, job_resources(job)))
        if limited:
            out.update(held_jobs(self.tree, run, queue))
        return out

    # --- configuration changes and restarts -------------------------------------------

    def snapshot(self, now: int) -> dict[str, float]:
        """Per-leaf decayed usage at ``now``, for the store."""
        return self.usage.snapshot(now)

    def reconfigure(self, tree: AccountTree, now: int, config: FairShareConfig | None = None) -> None:
        """Switch to a new (already validated) tree and/or config at ``now``, keeping the
        usage of leaves that remain and the running jobs whose leaf remains."""
        config = config or self.config
        values = self.usage.snapshot(now)
        running = self.usage.running_resources()
        usage = Usage.restore(tree, config.half_life, values, now, config.usage_weights)
        for job_id, (leaf, res) in running.items():
            if leaf in tree.nodes and tree.is_leaf(leaf):
                usage.start(job_id, leaf, res, now)
        self.tree, self.config, self.usage, self._rows = tree, config, usage, None
        self._factors = None
        self._ranker = None
        self._leaf_of = {}
