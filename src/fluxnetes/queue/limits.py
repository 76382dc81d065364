"""Per-account limits: which queued jobs are held, and the reason naming the limit.

Pure core. A limit set on an account counts everything below it (its sub-accounts and
users), as Slurm's association ``Grp*`` limits do. Limits (``accounts.Limits``):

* ``max_running_cores`` / ``max_running_gpus`` / ``max_running_nodes`` /
  ``max_running_jobs``: what the account's running jobs may hold at once;
* ``max_queued_jobs``: how many of the account's pending jobs are eligible at once (in
  queue order); the rest wait, held, until earlier ones start or leave.

``held_jobs`` walks the queue in order and admits a job only if it fits the limits
together with the running jobs *and* the jobs admitted before it, as if all of them
started: a held job never pushes an account over a limit, whatever the cycle starts, so
the cycle needs no limit logic of its own (the held jobs are simply not passed to it). The
price: a job held behind an admitted job that cannot start yet does not backfill past it.
``LimitState.check`` / ``add`` are the exact per-start form for a cycle that checks each
job just before it starts it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fluxnetes.queue.accounts import AccountTree
from fluxnetes.queue.usage import Resources


@dataclass
class _Count:
    cores: int = 0
    gpus: int = 0
    nodes: int = 0
    jobs: int = 0


_RUNNING = (
    ("max_running_cores", "cores", "cores"),
    ("max_running_gpus", "gpus", "GPUs"),
    ("max_running_nodes", "nodes", "nodes"),
    ("max_running_jobs", "jobs", "jobs"),
)


class LimitState:
    """Running totals per account (descendants included) and the limits' verdicts."""

    def __init__(self, tree: AccountTree) -> None:
        self.tree = tree
        # only accounts with limits need counting
        self._limited = {name for name, node in tree.nodes.items() if node.limits.any()}
        self.running: dict[str, _Count] = {name: _Count() for name in self._limited}
        self.admitted: dict[str, _Count] = {name: _Count() for name in self._limited}
        self.queued: dict[str, int] = dict.fromkeys(self._limited, 0)
        self._paths: dict[str, list[str]] = {}

    def _limited_path(self, leaf: str) -> list[str]:
        # nearest account first, so a reason names the tightest scope
        path = self._paths.get(leaf)
        if path is None:
            path = [name for name in reversed(self.tree.path[leaf]) if name in self._limited]
            self._paths[leaf] = path
        return path

    def add_running(self, leaf: str, res: Resources) -> None:
        """A job charging ``leaf`` runs (holds ``res``)."""
        self._add(self.running, leaf, res)

    def _add(self, table: dict[str, _Count], leaf: str, res: Resources) -> None:
        for name in self._limited_path(leaf):
            count = table[name]
            count.cores += res.cores
            count.gpus += res.gpus
            count.nodes += res.nodes
            count.jobs += 1

    def check(self, leaf: str, res: Resources, *, queued: bool = False) -> str | None:
        """Why a job charging ``leaf`` and holding ``res`` may not be admitted now, or None.
        ``queued``: also apply ``max_queued_jobs`` to the jobs admitted so far."""
        need = {"cores": res.cores, "gpus": res.gpus, "nodes": res.nodes, "jobs": 1}
        for name in self._limited_path(leaf):
            limits = self.tree.nodes[name].limits
            running, ahead = self.running[name], self.admitted[name]
            for field_name, key, label in _RUNNING:
                limit = getattr(limits, field_name)
                if limit is None:
                    continue
                now, before = getattr(running, key), getattr(ahead, key)
                if now + before + need[key] <= limit:
                    continue
                if now >= limit:
                    return f"account {name}: max running {label} {limit} reached ({now} running)"
                parts = [f"{now} running"]
                if before:
                    parts.append(f"{before} for jobs ahead in the queue")
                parts.append(f"{need[key]} requested")
                return f"account {name}: max running {label} {limit} would be exceeded ({', '.join(parts)})"
            if queued and limits.max_queued_jobs is not None and self.queued[name] >= limits.max_queued_jobs:
                return (f"account {name}: max queued jobs {limits.max_queued_jobs} reached "
                        f"({self.queued[name]} queued ahead)")
        return None

    def admit(self, leaf: str, res: Resources) -> None:
        """Count a queued job as if it started (it passed ``check``)."""
        self._add(self.admitted, leaf, res)
        for name in self._limited_path(leaf):
            self.queued[name] += 1


def held_jobs(
    tree: AccountTree,
    running: Iterable[tuple[str, Resources]],
    queued: Sequence[tuple[str, str, Resources]],
) -> dict[str, str]:
    """Job id -> reason for every queued job a limit holds.

    ``running``: (leaf, resources) of each running job; ``queued``: (job id, leaf,
    resources) in queue order. Costs O(running + queued * depth)."""
    state = LimitState(tree)
    if not state._limited:
        return {}
    for leaf, res in running:
        state.add_running(leaf, res)
    held: dict[str, str] = {}
    for job_id, leaf, res in queued:
        reason = state.check(leaf, res, queued=True)
        if reason is None:
            state.admit(leaf, res)
        else:
            held[job_id] = reason
    return held
