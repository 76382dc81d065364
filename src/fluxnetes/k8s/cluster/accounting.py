"""The accounting invariant: the graph's use equals the requests of the bound, unfinished
pods (in the matcher's units), node by node, plus the slots held for pods not bound yet.
``check_accounting`` compares (pure: the pods are passed in); ``accounting_check`` lists the
pods and logs the answer (after every recovery; every ``FLUXNETES_DEBUG_CHECK_SECONDS``).
``pod_share`` / ``shares_of_pods``: what a group's pods hold, as the matcher counts it."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from fluxnetes.k8s.context import Context
from fluxnetes.k8s.groups import GroupError, request_of
from fluxnetes.k8s.groups.group import Group
from fluxnetes.k8s.groups.grouptable import GroupTable
from fluxnetes.k8s.kube import PODS, ApiError, short, transient
from fluxnetes.k8s.objects import _ended, _meta
from fluxnetes.k8s.persistence.fluxjob import Phase
from fluxnetes.k8s.resources import PodResources
from fluxnetes.k8s.scheduling import shares
from fluxnetes.k8s.scheduling.placement import assigned_node

if TYPE_CHECKING:
    from fluxnetes.k8s.cluster.mirror import ClusterView

# one logger for every part of the state machine: its log lines read as before the split
log = logging.getLogger("fluxnetes.k8s.controller")

# FLUXNETES_DEBUG_CHECK_SECONDS=<s>: log the accounting check (graph use == bound pods) every s
CHECK_EVERY = "FLUXNETES_DEBUG_CHECK_SECONDS"


class AccountingView(Protocol):
    """What the accounting check reads: the cluster view (nodes, matcher, foreign pods not
    recorded yet) and the group book's groups."""

    @property
    def groups(self) -> GroupTable: ...
    @property
    def cluster(self) -> ClusterView: ...


class AccountingCheck:
    """The graph against the bound pods: a component of its own (its last answer is private);
    the other parts reach it as ``accounting``."""

    def __init__(self, ctx: Context, view: AccountingView) -> None:
        self._ctx, self._view = ctx, view
        self._last_check: dict[str, Any] | None = None

    @property
    def last_check(self) -> dict[str, Any] | None:
        """The last answer ``accounting_check`` logged."""
        return self._last_check

    def pod_share(self, g: Group, node: str) -> shares.Share:
        """What one pod of the group holds on ``node``, in the matcher's units (as the
        group's jobspec asks: whole cores, MiB)."""
        from fluxnetes.jobspec.pods import cores_for, extended_type, mib_for

        r = g.spec.request
        return shares.Share(node, cores_for(r.cpu_millis), r.gpus, mib_for(r.memory_bytes),
                            {extended_type(k): v for k, v in r.extended.items() if v})

    def shares_of_pods(self, g: Group, pods: list[dict[str, Any]]) -> list[shares.Share]:
        per: dict[str, int] = {}
        for p in pods:
            node = assigned_node(p)
            if node:
                per[node] = per.get(node, 0) + 1
        out = []
        for node, n in sorted(per.items()):
            one = self.pod_share(g, node)
            out.append(shares.Share(node, one.cores * n, one.gpus * n, one.memory * n,
                                    {k: v * n for k, v in one.extra.items()}))
        return out

    # ---------------------------------------------------------------- accounting check
    def check_accounting(self, pods: list[dict[str, Any]]) -> dict[str, Any]:
        """Does the graph's use equal the requests of the bound, unfinished pods (in the
        matcher's units), node by node? ``pods``: every pod, as the API server lists them.
        Returns {"ok", "problems", "nodes", "bound", "unbound"}: ``unbound`` counts slots of
        running groups whose pod is not bound yet (allocated, still held: at rest it is 0, and
        then the graph's use is exactly the bound pods')."""
        from collections import Counter

        def add(acc: dict[str, Counter[str]], s: shares.Share) -> None:
            c = acc.setdefault(s.node, Counter())
            c["cores"] += s.cores
            c["gpus"] += s.gpus
            c["memory"] += s.memory
            for k, v in s.extra.items():
                c[k] += v

        graph: dict[str, Counter[str]] = {}
        for rec in self._view.cluster.matcher.jobs.values():
            if rec.reserved:
                continue
            for ns_ in rec.nodes:
                add(graph, shares.Share(ns_.name, ns_.cores, ns_.gpus, ns_.memory, dict(ns_.extra or {})))
        expected: dict[str, Counter[str]] = {}
        foreign: dict[str, list[PodResources]] = {}
        bound_uids: set[str] = set()
        slot_of: dict[str, tuple[Group, int]] = {}
        for g in self._view.groups.values():
            if g.phase == Phase.RUNNING or (g.phase.final and g.held):  # (ended: slots kept for pods that run on)
                for i, u in enumerate(g.slot_pod):
                    if u and i not in g.released:
                        slot_of[u] = (g, i)
        bound = 0
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if not node or _ended(pod) or node not in self._view.cluster.nodes:  # (being deleted: still there)
                continue
            bound += 1
            uid = str(_meta(pod).get("uid", ""))
            hit = slot_of.get(uid)
            if hit is not None and hit[0].slots[hit[1]] == node:
                g = hit[0]
                bound_uids.add(uid)
                if g.spec.exclusive:
                    add(expected, g.held.get(node, shares.Share(node)))
                else:
                    add(expected, self.pod_share(g, node))
            else:
                try:
                    foreign.setdefault(node, []).append(request_of(pod.get("spec") or {}))
                except GroupError:
                    foreign.setdefault(node, [])
        for node, reqs in foreign.items():
            add(expected, shares.of_pods(node, reqs))
        unbound = 0
        for g in self._view.groups.values():
            if g.phase != Phase.RUNNING and not (g.phase.final and g.held):
                continue
            for i, node in enumerate(g.slots):
                u = g.slot_pod[i] if i < len(g.slot_pod) else None
                if i in g.released or (u and u in bound_uids):
                    continue
                unbound += 1
                add(expected, g.held.get(node, shares.Share(node)) if g.spec.exclusive else self.pod_share(g, node))
        problems = []
        for node in sorted(set(graph) | set(expected)):
            a, b = graph.get(node, Counter()), expected.get(node, Counter())
            if +a != +b:
                problems.append(f"{node}: graph {dict(+a)} != pods {dict(+b)}")
        return {"ok": not problems, "problems": problems, "nodes": len(self._view.cluster.nodes), "bound": bound,
                "unbound": unbound}

    async def accounting_check(self, delay: float = 0.0) -> dict[str, Any] | None:
        """List the pods from the API server and log ``check_accounting``'s answer."""
        if delay:
            await asyncio.sleep(delay)
        res: dict[str, Any] = {}
        for attempt in range(3):
            # the list is a moment older than the state it is compared with: while pods come
            # and go a difference may be that moment; only one seen three times is reported
            try:
                pods, _ = await self._ctx.kube.list(PODS)
            except Exception as exc:
                if not (isinstance(exc, ApiError) or transient(exc)):
                    raise
                log.info("accounting check: pods not listed: %s", short(exc))
                return None
            if self._view.cluster.foreign_dirty:
                self._view.cluster.flush_foreign()  # what the cluster shows now is what the graph must hold
            res = self.check_accounting(pods)
            if res["ok"]:
                break
            if attempt < 2:
                await asyncio.sleep(0.5)
        if res["ok"]:
            log.info("accounting check: ok (%d nodes, %d bound pods, %d slots not bound yet)",
                     res["nodes"], res["bound"], res["unbound"], extra={"accounting": res})
        else:
            log.warning("accounting check: MISMATCH %s", "; ".join(res["problems"][:20]), extra={"accounting": res})
        self._last_check = res
        return res

    async def check_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            if self._ctx.reconciled:
                await self.accounting_check()
