"""Fair share in the simulator: accounts from a trace, the fair-share queue order, and the
per-account report (mean wait, bounded slowdown, Jain's fairness index, share vs usage).

The order is the core's (``fluxnetes.queue.priority.FairShare``: decayed usage, Fair Tree or
Slurm's classic factor, multifactor priority), the same object the operator keeps. The
simulator only feeds it: every start and end (as an observer) charges the job's account,
and before every scheduling pass the waiting jobs are put in ``FairShare.order``'s order
(``reorder``, the fast engine's hook; the queue engine takes the same hook), so EASY's
reservation is for the head of the fair-share order and backfilling keeps its guarantee
for that head.

Accounts (``--fairshare``):

* ``users``: one leaf per SWF user (field 12), equal shares, named ``user-<N>``;
* ``groups``: one leaf per SWF group (field 13), equal shares, named ``group-<N>``;
* a YAML file: an account tree in the core's format (``fluxnetes.queue.accounts``), whose
  leaves name trace users or groups as above (``users: [user-3, user-7]``); a job charges
  its user's leaf if there is one, else its group's, else the file's ``default``;
* or a file of FluxAccount manifests (several YAML documents or a ``kind: List``, e.g.
  ``examples/accounts.yaml``), read by the operator's own reader; Namespaces in it named
  ``user-<N>`` or ``group-<N>`` choose a trace user's or group's account with the
  ``fluxnetes.io/account`` label, as a namespace does on a cluster; every other job charges
  the default account (``spec.default``, else ``default``, as the operator).
  Limits in the file are reported as not simulated.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fluxnetes.queue.accounts import AccountError, AccountTree
from fluxnetes.queue.fairshare import ALGORITHMS
from fluxnetes.queue.priority import FairShare, FairShareConfig, PriorityError
from fluxnetes.queue.usage import Resources
from fluxnetes.sim.engine import SimJob, SimObserver, SimRun
from fluxnetes.sim.metrics import bounded_slowdown

UNKNOWN = "unknown"


class FairShareSimError(ValueError):
    """Bad --fairshare input (file, flags); the message names the file or flag and field."""


def user_name(user_id: int) -> str:
    return f"user-{user_id}" if user_id >= 0 else f"user-{UNKNOWN}"


def group_name(group_id: int) -> str:
    return f"group-{group_id}" if group_id >= 0 else f"group-{UNKNOWN}"


def trace_owners(trace: Any, jobs: Iterable[SimJob]) -> dict[str, tuple[str, str]]:
    """Job id -> (user leaf name, group leaf name) from the SWF records (fields 12, 13)."""
    records = {str(r.job_number): r for r in trace.records}
    out: dict[str, tuple[str, str]] = {}
    for job in jobs:
        r = records.get(job.id)
        out[job.id] = ((user_name(r.user_id), group_name(r.group_id)) if r is not None
                       else (user_name(-1), group_name(-1)))
    return out


# ------------------------------------------------------------------ accounts


@dataclass
class Accounts:
    """The tree and which leaf each job charges; ``notes`` are worth telling the user."""

    tree: AccountTree
    account_of: dict[str, str]  # job id -> leaf
    user_of: dict[str, str]  # job id -> SWF user (for Jain's index, whatever the accounts)
    source: str  # "users", "groups" or the file's path
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AccountFile:
    """An ``--fairshare FILE``: the tree, which trace user or group (``user-<N>``,
    ``group-<N>``) charges which leaf, and what is worth telling the user."""

    tree: AccountTree
    leaf_of: dict[str, str]  # trace user / group name -> leaf
    notes: tuple[str, ...] = ()


def load_account_file(path: Path) -> AccountFile:
    """``--fairshare FILE``: a tree in the core's format (one YAML document, see
    ``fluxnetes.queue.accounts``; its leaves name trace users or groups), or Kubernetes
    manifests (several documents or a ``kind: List``): FluxAccounts read exactly as the
    operator reads them (``fluxnetes.k8s.fairshare.accounts.parse_accounts``), and
    Namespaces named after trace users or groups that choose their account with the
    ``fluxnetes.io/account`` label, as on a cluster where each user has a namespace."""
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise FairShareSimError(f"--fairshare {path}: cannot read ({exc.strerror or exc})") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise FairShareSimError(f"--fairshare {path}: not valid YAML{where}: {problem}") from None
    if any(isinstance(d, Mapping) and ("kind" in d or "apiVersion" in d) for d in docs):
        return _from_manifests(path, docs)
    if len(docs) > 1:
        raise FairShareSimError(
            f"--fairshare {path}: {len(docs)} YAML documents: a tree file is one document "
            "(accounts, default); manifests need kind: FluxAccount or Namespace on each")
    try:
        tree = AccountTree.from_dict(docs[0] if docs else None)
    except AccountError as exc:
        raise FairShareSimError(f"--fairshare {path}: {exc}") from None
    return AccountFile(tree, {leaf: leaf for leaf in tree.leaves})


def _from_manifests(path: Path, docs: Sequence[Any]) -> AccountFile:
    """FluxAccount and Namespace manifests -> the tree the operator would build from them.
    The operator's reader is pure (plain dicts in, the core tree out; it imports no client),
    so the simulator uses it as is: one reading of a FluxAccount, one set of rules."""
    from fluxnetes.k8s import names
    from fluxnetes.k8s.fairshare.accounts import KIND, AccountConfigError, parse_accounts

    api = f"{names.API_GROUP}/{names.API_VERSION}"  # (the operator's own group/version)
    items: list[tuple[str, Any]] = []
    for i, doc in enumerate(docs, 1):
        if isinstance(doc, Mapping) and str(doc.get("kind") or "").endswith("List"):
            listed = doc.get("items")
            if not isinstance(listed, list):
                raise FairShareSimError(f"--fairshare {path}: document {i}: items: a {doc.get('kind')} "
                                        "needs a list of manifests")
            items += [(f"document {i}: items[{j}]", item) for j, item in enumerate(listed)]
        else:
            items.append((f"document {i}", doc))
    accounts, namespaces = [], []
    for where, item in items:
        kind = item.get("kind") if isinstance(item, Mapping) else None
        if kind == KIND:
            if item.get("apiVersion") != api:
                raise FairShareSimError(f"--fairshare {path}: {where}: apiVersion: a FluxAccount is "
                                        f"{api}, got {item.get('apiVersion')!r}")
            accounts.append(item)
        elif kind == "Namespace":
            namespaces.append(item)
        else:
            raise FairShareSimError(
                f"--fairshare {path}: {where}: kind: only FluxAccount and Namespace manifests (or a "
                f"List of them) describe accounts, got {kind!r}")
    if not accounts:
        raise FairShareSimError(f"--fairshare {path}: no FluxAccount (fair share is off on a cluster "
                                "without one); declare the accounts as kind: FluxAccount")
    try:
        config = parse_accounts(accounts, namespaces)
    except AccountConfigError as exc:
        raise FairShareSimError(f"--fairshare {path}: {exc}") from None
    notes = [str(p) for p in config.problems]
    if config.implicit_default:
        notes.append(f"no FluxAccount is the default: trace users without a namespace choosing an "
                     f"account charge the implicit account {config.default!r} (1 share), as on a cluster")
    return AccountFile(config.tree, dict(config.namespaces), tuple(notes))


def accounts_for(how: str, trace: Any, jobs: Sequence[SimJob]) -> Accounts:
    """``how``: ``users``, ``groups`` or a YAML file's path (see the module docstring)."""
    owners = trace_owners(trace, jobs)
    user_of = {job_id: user for job_id, (user, _) in owners.items()}
    if how in ("users", "groups"):
        pick = 0 if how == "users" else 1
        account_of = {job_id: pair[pick] for job_id, pair in owners.items()}
        tree = AccountTree.flat(sorted(set(account_of.values()), key=_natural))
        return Accounts(tree, account_of, user_of, how)
    path = Path(how)
    if path.suffix.lower() not in (".yaml", ".yml") and not path.exists():
        raise FairShareSimError(f"--fairshare must be users, groups or a YAML file (got {how!r})")
    loaded = load_account_file(path)
    tree = loaded.tree
    account_of = {}
    missing: Counter[str] = Counter()
    defaulted: Counter[str] = Counter()
    for job_id, (user, group) in owners.items():
        leaf = loaded.leaf_of.get(user) or loaded.leaf_of.get(group)
        if leaf is not None:
            account_of[job_id] = leaf
        elif tree.default is not None:
            account_of[job_id] = tree.default
            defaulted[user] += 1
        else:
            missing[user] += 1
    if missing:
        shown = ", ".join(f"{u} ({n} jobs)" for u, n in missing.most_common(5))
        raise FairShareSimError(
            f"--fairshare {path}: {len(missing)} trace user(s) in no account, e.g. {shown}; "
            "list them (or their group-<N>) as leaves, or set 'default: <leaf>'")
    notes = list(loaded.notes)
    if defaulted:
        notes.append(f"{len(defaulted)} trace user(s) ({sum(defaulted.values())} jobs) charge "
                     f"the default account {tree.default}")
    limited = [n.name for n in tree.nodes.values() if n.limits.any()]
    if limited:
        notes.append(f"limits of {', '.join(limited[:5])} are not simulated (the simulator "
                     "orders by fair share only)")
    unused = [leaf for leaf in tree.leaves if leaf not in set(account_of.values())]
    if unused:
        notes.append(f"{len(unused)} leaf account(s) charge no job of the trace, e.g. "
                     + ", ".join(unused[:5]))
    return Accounts(tree, account_of, user_of, str(path), notes)


def _natural(name: str) -> tuple[str, int, str]:
    head, _, tail = name.rpartition("-")
    return (head, int(tail), "") if tail.isdigit() else (head, 1 << 62, tail)


# ------------------------------------------------------------------ configuration


ALGO_NAMES = {"fairtree": "fair_tree", "fair_tree": "fair_tree", "fair-tree": "fair_tree",
              "classic": "classic"}
_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, flag: str) -> int:
    """``3600``, ``90m``, ``12h``, ``7d``, ``2w`` -> seconds; FairShareSimError naming the flag."""
    raw = text.strip().lower()
    number, unit = raw, "s"
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if raw.endswith(suffix):
            number, unit = raw[: -len(suffix)].strip(), suffix
            break
    try:
        value = float(number)
    except ValueError:
        raise FairShareSimError(f"{flag}: must be a duration like 3600, 12h or 7d (got {text!r})") from None
    if not math.isfinite(value) or value < 0:
        raise FairShareSimError(f"{flag}: must be >= 0 (got {text!r})")
    return round(value * _UNITS[unit])


def make_config(*, algorithm: str, half_life: int, max_age: int, weights: Mapping[str, float],
                total_cores: int) -> FairShareConfig:
    """A validated FairShareConfig; errors name the flag."""
    algo = ALGO_NAMES.get(algorithm.strip().lower())
    if algo is None:
        raise FairShareSimError(f"--fairshare-algo: must be fairtree or classic (got {algorithm!r})")
    assert algo in ALGORITHMS
    if max_age <= 0:
        raise FairShareSimError("--max-age: must be > 0")
    for name, value in weights.items():
        if not math.isfinite(value) or value < 0:
            raise FairShareSimError(f"--weight-{name.replace('_', '-')}: must be a number >= 0 "
                                    f"(got {value})")
    try:
        return FairShareConfig.from_dict({
            "algorithm": algo, "half_life": half_life, "max_age": max_age,
            "weights": dict(weights), "total_cores": total_cores})
    except PriorityError as exc:  # not expected after the checks above; still no traceback
        raise FairShareSimError(f"fair share: {exc}") from None


@dataclass(frozen=True)
class FairShareSetup:
    """What a fair-share run needs (one ``FairShareOrder`` per run is made from it)."""

    accounts: Accounts
    config: FairShareConfig

    def describe(self) -> str:
        c = self.config
        w = c.weights
        algo = "Fair Tree" if c.algorithm == "fair_tree" else "classic (Slurm NO_FAIR_TREE)"
        leaves = len(self.accounts.tree.leaves)
        return (f"fair share {algo}, {leaves} leaf accounts ({self.accounts.source}), half-life "
                f"{_dur(c.half_life)}, max age {_dur(c.max_age)}; weights age {w.age:g}, "
                f"fairshare {w.fairshare:g}, size {w.job_size:g}, qos {w.qos:g}")


def _dur(seconds: int) -> str:
    if seconds == 0:
        return "none"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# ------------------------------------------------------------------ the order


@dataclass(slots=True)
class _Queued:
    """A SimJob as ``FairShare`` reads a job (what ``QueuedJob`` offers)."""

    id: str
    submit_time: int
    priority: int
    min_cores: int
    account: str
    jobspec: Any = None


class FairShareOrder:
    """One run's fair-share state: the reorder hook and the usage-recording observer.

    ``inner``: another observer to forward every event to (e.g. the store recorder)."""

    def __init__(self, setup: FairShareSetup, inner: SimObserver | None = None, *,
                 start: int = 0) -> None:
        self.setup = setup
        self.fs = FairShare(setup.accounts.tree, setup.config, start=start)
        self.inner = inner
        self._adapters: dict[str, _Queued] = {}
        self.passes = 0

    def _adapter(self, job: SimJob) -> _Queued:
        found = self._adapters.get(job.id)
        if found is None:
            found = _Queued(job.id, job.submit, job.priority, job.procs,
                            self.setup.accounts.account_of[job.id])
            self._adapters[job.id] = found
        return found

    def reorder(self, now: int, waiting: list[SimJob]) -> list[int]:
        """Positions of ``waiting`` in the fair-share order at ``now``."""
        self.passes += 1
        return self.fs.order_positions([self._adapter(job) for job in waiting], now)

    # the observer: usage is charged from a job's start to its end
    def on_submit(self, job: SimJob, now: int) -> None:
        if self.inner is not None:
            self.inner.on_submit(job, now)

    def on_start(self, job: SimJob, now: int, allocation: Any) -> None:
        shares = getattr(allocation, "nodes", None)
        cores = job.procs
        nodes = 1
        if isinstance(shares, tuple) and shares and hasattr(shares[0], "cores"):
            cores = sum(s.cores for s in shares)  # what it holds (whole nodes: all their cores)
            nodes = len({s.name for s in shares})
        self.fs.usage.start(job.id, self._adapter(job).account, Resources(cores, 0, nodes), now)
        if self.inner is not None:
            self.inner.on_start(job, now, allocation)

    def on_end(self, job: SimJob, now: int) -> None:
        self.fs.record_end(job.id, now)
        self._adapters.pop(job.id, None)
        if self.inner is not None:
            self.inner.on_end(job, now)

    def on_reject(self, job: SimJob, now: int, reason: str) -> None:
        if self.inner is not None:
            self.inner.on_reject(job, now, reason)


# ------------------------------------------------------------------ the report


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n when one
    value holds everything (Jain, Chiu, Hawe, DEC-TR-301, 1984)."""
    if not values:
        raise ValueError("jain_index: no values")
    if any(v < 0 or not math.isfinite(v) for v in values):
        raise ValueError("jain_index: values must be finite and >= 0")
    squares = sum(v * v for v in values)
    if squares == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)


@dataclass(frozen=True)
class AccountRow:
    name: str
    share: float  # normalized share of the machine (product along the path)
    jobs: int
    core_seconds: int
    usage_fraction: float  # of all core-seconds delivered in the run
    mean_wait: float
    mean_bsld: float


@dataclass(frozen=True)
class FairnessReport:
    accounts: dict[str, AccountRow]  # leaf -> row
    user_bsld: dict[str, float]  # SWF user -> mean bounded slowdown
    jain: float  # over the users' mean bounded slowdown

    def as_dict(self) -> dict[str, Any]:
        return {"jain_users_mean_bsld": self.jain, "users": len(self.user_bsld),
                "accounts": {name: {"share": r.share, "jobs": r.jobs, "core_seconds": r.core_seconds,
                                    "usage_fraction": r.usage_fraction, "mean_wait": r.mean_wait,
                                    "mean_bsld": r.mean_bsld}
                             for name, r in self.accounts.items()}}


def fairness(run: SimRun, accounts: Accounts) -> FairnessReport:
    """Per-account mean wait and bounded slowdown (tau = 10 s, as ``metrics``), delivered
    usage against share, and Jain's index over the users' mean bounded slowdown."""
    waits: dict[str, list[int]] = defaultdict(list)
    bslds: dict[str, list[float]] = defaultdict(list)
    used: Counter[str] = Counter()
    by_user: dict[str, list[float]] = defaultdict(list)
    for o in run.outcomes:
        if o.start is None or o.end is None:
            continue
        leaf = accounts.account_of[o.job.id]
        b = bounded_slowdown(o)
        waits[leaf].append(o.start - o.job.submit)
        bslds[leaf].append(b)
        used[leaf] += o.cores * (o.end - o.start)
        by_user[accounts.user_of[o.job.id]].append(b)
    total = sum(used.values()) or 1
    shares = normalized_shares(accounts.tree)
    rows = {leaf: AccountRow(leaf, shares[leaf], len(waits[leaf]), used[leaf], used[leaf] / total,
                             statistics.fmean(waits[leaf]), statistics.fmean(bslds[leaf]))
            for leaf in accounts.tree.leaves if waits.get(leaf)}
    user_bsld = {u: statistics.fmean(v) for u, v in by_user.items()}
    jain = jain_index(list(user_bsld.values())) if user_bsld else 1.0
    return FairnessReport(rows, user_bsld, jain)


def normalized_shares(tree: AccountTree) -> dict[str, float]:
    out = {"root": 1.0}
    for name in tree.order[1:]:
        node = tree.nodes[name]
        assert node.parent is not None
        siblings = sum(tree.nodes[c].shares for c in tree.children[node.parent])
        out[name] = out[node.parent] * node.shares / siblings
    return out


def usage_over_time(run: SimRun, accounts: Accounts, width: int) -> tuple[list[int], dict[str, list[float]]]:
    """Bin starts and, per leaf, the core-seconds delivered in each bin of ``width`` s."""
    ran = [o for o in run.outcomes if o.start is not None and o.end is not None]
    if not ran:
        return [], {}
    t0 = min(o.job.submit for o in ran)
    t1 = max(o.end for o in ran if o.end is not None)
    nbins = max(1, (t1 - t0) // width + 1)
    per: dict[str, list[float]] = {}
    for o in ran:
        assert o.start is not None and o.end is not None
        row = per.setdefault(accounts.account_of[o.job.id], [0.0] * nbins)
        t = o.start
        while t < o.end:
            b = (t - t0) // width
            edge = min(o.end, t0 + (b + 1) * width)
            row[b] += o.cores * (edge - t)
            t = edge
    return [t0 + i * width for i in range(nbins)], per


def write_share_plot(runs: Mapping[str, SimRun], accounts: Accounts, path: Path, *,
                     top: int = 6, title: str = "") -> Path:
    """``fairshare_usage.png``: per run, for the ``top`` accounts by delivered usage, the
    fraction of the machine's delivered core-seconds each got per bin (solid) against its
    share (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    day = 86400
    spans = [max((o.end or 0) for o in r.outcomes) - min(o.job.submit for o in r.outcomes)
             for r in runs.values() if r.outcomes]
    span = max(spans, default=day)
    # about 60 bins, of whole days (whole minutes for traces shorter than 20 days)
    width = day * max(1, span // (60 * day)) if span > 20 * day else 60 * max(1, span // 3600)
    shares = normalized_shares(accounts.tree)
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.6 * len(runs)), sharex=True, squeeze=False)
    first = next(iter(runs.values()))
    _, base = usage_over_time(first, accounts, width)
    chosen = sorted(base, key=lambda a: -sum(base[a]))[:top]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, run) in zip(axes[:, 0], runs.items(), strict=True):
        starts, per = usage_over_time(run, accounts, width)
        if not starts:
            continue
        totals = [sum(per[a][i] for a in per) for i in range(len(starts))]
        xs = [(s - starts[0]) / day for s in starts]
        for k, acct in enumerate(chosen):
            color = colors[k % len(colors)]
            row = per.get(acct, [0.0] * len(starts))
            ax.plot(xs, [100 * v / t if t else 0.0 for v, t in zip(row, totals, strict=True)],
                    color=color, linewidth=0.9, label=f"{acct} delivered")
            ax.axhline(100 * shares[acct], color=color, linestyle="--", linewidth=0.8)
        ax.set_ylabel("% of delivered core-s")
        ax.set_title(f"{name}: delivered usage per {_dur(width)} bin vs share (dashed) {title}".strip())
        ax.set_ylim(bottom=0)
    axes[0, 0].legend(fontsize=7, ncol=3, loc="upper right")
    axes[-1, 0].set_xlabel("time since first submit (days)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
