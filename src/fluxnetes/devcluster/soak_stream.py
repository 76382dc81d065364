"""The chaos soak's workloads (`chaos.Soak`): single gated pods, Jobs, gang Jobs, label groups
and Deployments scaled up and down, created, followed to their end, deleted, and judged at
the end (finished, explicitly failed with a reason, or lost)."""

from __future__ import annotations

import random
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fluxnetes.devcluster.cluster import Cluster
from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION

WORKLOAD_KINDS = ("pod", "job", "gang", "group", "deploy")
WORKLOAD_LABEL = "chaos.fluxnetes.io/workload"


# -- the workloads ------------------------------------------------------------------------------------
@dataclass
class Workload:
    id: str
    kind: str  # one of WORKLOAD_KINDS
    namespace: str
    name: str
    size: int  # pods (deploy: replicas now)
    cpu: int  # per pod
    submitted: float
    run_seconds: int = 0  # jobs: how long each pod runs; others: how long they live once running
    uid: str = ""
    running_since: float | None = None  # service-like: when fully running (at the current size)
    finished: float | None = None  # jobs: complete; others: ran at their final size
    failed: str = ""  # explicit failure with its reason
    deleted: float | None = None
    scales: list[int] = field(default_factory=list)  # deploy: replica counts still to apply

    @property
    def done(self) -> bool:
        return self.finished is not None or bool(self.failed)


def _container(cpu: int) -> list[dict[str, Any]]:
    req = {"cpu": str(cpu), "memory": f"{cpu}Gi"}
    return [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": req, "limits": req}}]


def _belongs(fj: Mapping[str, Any], w: Workload) -> bool:
    md = fj.get("metadata") or {}
    wl = (fj.get("spec") or {}).get("workload") or {}
    if md.get("namespace") != w.namespace:
        return False
    return bool(w.uid and wl.get("uid") == w.uid) or f"-{w.name}-" in f"-{md.get('name', '')}-"


class Stream:
    """Creates the workloads, follows them to their end and deletes the long-running ones."""

    def __init__(self, cluster: Cluster, rng: random.Random, namespaces: list[str],
                 max_cpu: int, job_seconds: tuple[int, int] = (8, 30),
                 life_seconds: tuple[int, int] = (10, 40)) -> None:
        self.cluster = cluster
        self.rng = rng
        self.namespaces = namespaces
        self.max_cpu = max_cpu
        self.job_seconds = job_seconds
        self.life_seconds = life_seconds
        self.workloads: list[Workload] = []
        self.api_errors = 0
        self._n = 0

    # API calls that ride out an API server restart
    def call(self, method: str, path: str, body: Any = None, patch: bool = False,
             patience: float = 90.0) -> Any:
        deadline = time.monotonic() + patience
        retried = False
        while True:
            try:
                return self.cluster.api_call(
                    method, path, body, content_type="application/merge-patch+json" if patch else "application/json")
            except urllib.error.HTTPError as exc:
                if exc.code == 404 and method == "DELETE":
                    return None
                if exc.code == 409 and method == "POST" and retried:
                    # an earlier attempt was created before the API server went away
                    return self.cluster.api_get(f"{path}/{body['metadata']['name']}")
                if exc.code not in (429, 500, 502, 503, 504) or time.monotonic() > deadline:
                    raise
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise
            self.api_errors += 1
            retried = True
            time.sleep(0.5)

    def submit(self, kind: str) -> Workload:
        self._n += 1
        ns = self.rng.choice(self.namespaces)
        wid = f"{kind}-{self._n}"
        cpu = self.rng.randint(1, max(1, min(4, self.max_cpu)))
        size = 1
        if kind in ("gang", "group"):
            size = self.rng.randint(2, 5)
        elif kind == "deploy":
            size = self.rng.randint(1, 4)
        run = self.rng.randint(*(self.job_seconds if kind in ("job", "gang") else self.life_seconds))
        w = Workload(wid, kind, ns, wid, size, cpu, time.time(), run)
        if kind == "deploy":
            w.scales = [self.rng.randint(1, 6)]
        labels = {WORKLOAD_LABEL: wid}
        try:
            if kind == "pod":
                body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": wid, "labels": labels},
                        "spec": {"containers": _container(cpu), "terminationGracePeriodSeconds": 0}}
                obj = self.call("POST", f"/api/v1/namespaces/{ns}/pods", body)
            elif kind == "group":
                group = {**labels, "fluxnetes.io/group": wid, "fluxnetes.io/group-size": str(size)}
                obj = None
                for i in range(size):
                    body = {"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": f"{wid}-{i}", "labels": group},
                            "spec": {"containers": _container(cpu), "terminationGracePeriodSeconds": 0}}
                    obj = self.call("POST", f"/api/v1/namespaces/{ns}/pods", body)
            elif kind in ("job", "gang"):
                spec: dict[str, Any] = {
                    "parallelism": size, "completions": size, "backoffLimit": 6,
                    "ttlSecondsAfterFinished": 120,
                    "template": {"metadata": {"labels": labels,
                                              "annotations": {TIMED_POD_ANNOTATION: f"{run}s"}},
                                 "spec": {"restartPolicy": "Never", "containers": _container(cpu),
                                          "terminationGracePeriodSeconds": 0}}}
                if kind == "gang":
                    spec["completionMode"] = "Indexed"
                if self.rng.random() < 0.5:
                    spec["activeDeadlineSeconds"] = 1800  # gives the queue a duration to backfill with
                body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": wid, "labels": labels},
                        "spec": spec}
                obj = self.call("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body)
            else:
                body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": wid, "labels": labels},
                        "spec": {"replicas": size, "selector": {"matchLabels": labels},
                                 "template": {"metadata": {"labels": labels},
                                              "spec": {"containers": _container(cpu),
                                                       "terminationGracePeriodSeconds": 0}}}}
                obj = self.call("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
            w.uid = str(((obj or {}).get("metadata") or {}).get("uid", ""))
        except urllib.error.HTTPError as exc:
            w.failed = f"refused at creation: HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}"
        except (urllib.error.URLError, OSError) as exc:
            w.failed = f"could not be created: {exc}"
        self.workloads.append(w)
        return w

    def follow(self, pods: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]],
               deployments: Sequence[Mapping[str, Any]], fluxjobs: Sequence[Mapping[str, Any]], now: float,
               draining: bool = False) -> None:
        """Advance every workload from a snapshot: mark finished ones, scale, delete aged ones."""
        by_wl: dict[str, list[Mapping[str, Any]]] = {}
        for p in pods:
            wid = ((p.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_LABEL)
            if wid:
                by_wl.setdefault(wid, []).append(p)
        job_of = {((j.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_LABEL): j for j in jobs}
        dep_of = {((d.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_LABEL): d for d in deployments}
        for w in self.workloads:
            if w.deleted is not None or (w.failed and w.kind in ("job", "gang")):
                continue
            if w.failed and not w.uid:
                continue
            ps = [p for p in by_wl.get(w.id, []) if not (p.get("metadata") or {}).get("deletionTimestamp")]
            running = [p for p in ps if (p.get("spec") or {}).get("nodeName")
                       and (p.get("status") or {}).get("phase") == "Running"]
            if w.kind in ("job", "gang"):
                j = job_of.get(w.id)
                if j is None:
                    continue
                for c in (j.get("status") or {}).get("conditions") or []:
                    if c.get("status") != "True":
                        continue
                    if c.get("type") == "Complete" and w.finished is None:
                        w.finished = now
                    elif c.get("type") == "Failed" and not w.done:
                        w.failed = f"Job failed: {c.get('reason')}: {c.get('message', '')}"
                continue
            if draining:
                w.scales = []  # the size it has now is its last
            target = w.size
            # a Deployment is judged by its pods (its own status may lag after API restarts)
            full = len(running) == target and (w.kind != "deploy" or w.id in dep_of)
            if full and w.running_since is None:
                w.running_since = now
            if not full:
                w.running_since = None
            if w.running_since is None:
                continue
            if w.kind == "deploy" and w.scales:  # not finished before its last size runs
                if now - w.running_since >= w.run_seconds / 2:
                    try:
                        self.call("PATCH", f"/apis/apps/v1/namespaces/{w.namespace}/deployments/{w.name}",
                                  {"spec": {"replicas": w.scales[0]}}, patch=True, patience=5)
                    except (urllib.error.URLError, OSError):
                        # the API server is away: scaled on a later pass. (Was: the new size was
                        # taken before the PATCH and its failure ignored, so the soak waited for
                        # replicas nobody asked for and judged the Deployment lost.)
                        continue
                    w.size = w.scales.pop(0)
                    w.running_since = None
                continue
            if w.finished is None:
                w.finished = now
            if draining or now - w.running_since >= w.run_seconds:
                self.delete(w, now)

    def judge_unfinished(self, fluxjobs: Sequence[Mapping[str, Any]]) -> None:
        """At the end: a workload that did not finish but whose newest FluxJob is final with a
        reason (Unsatisfiable, Failed, Cancelled) failed explicitly; the others are lost."""
        for w in self.workloads:
            if w.done:
                continue
            mine = [f for f in fluxjobs if _belongs(f, w)]
            if not mine:
                continue
            newest = max(mine, key=lambda f: str((f.get("metadata") or {}).get("creationTimestamp", "")))
            st = newest.get("status") or {}
            if st.get("phase") in ("Unsatisfiable", "Failed", "Cancelled") and st.get("reason"):
                w.failed = f"FluxJob {newest['metadata']['name']} {st['phase']}: {st['reason']}"

    def delete(self, w: Workload, now: float) -> None:
        opts = {"propagationPolicy": "Background"}
        try:
            if w.kind == "pod":
                self.call("DELETE", f"/api/v1/namespaces/{w.namespace}/pods/{w.name}", opts, patience=5)
            elif w.kind == "group":
                for i in range(w.size):
                    self.call("DELETE", f"/api/v1/namespaces/{w.namespace}/pods/{w.name}-{i}", opts, patience=5)
            elif w.kind == "deploy":
                self.call("DELETE", f"/apis/apps/v1/namespaces/{w.namespace}/deployments/{w.name}", opts,
                          patience=5)
            w.deleted = now
        except (urllib.error.URLError, OSError):
            pass  # the next pass tries again

    def summary(self) -> dict[str, Any]:
        by_kind: dict[str, dict[str, int]] = {}
        for w in self.workloads:
            k = by_kind.setdefault(w.kind, {"submitted": 0, "finished": 0, "failed": 0, "lost": 0})
            k["submitted"] += 1
            if w.finished is not None:
                k["finished"] += 1
            elif w.failed:
                k["failed"] += 1
            else:
                k["lost"] += 1
        return by_kind
