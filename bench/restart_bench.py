"""Restart under load (issue 17, item 4): SIGKILL the operator holding a full cluster and a
backlog, start a new one, and measure how soon it binds again.

Per round, on one dev cluster of kwok nodes (32 cpu, 256Gi each; Job pods run 24 h, so they
hold their room) with the operator as a user runs it (`fluxnetes run`, leader election on, a
PostgreSQL store of its own, placement and job mode at their defaults):

1. --running single-pod Jobs of --running-cpu cpu (default 5,000 x 6 cpu: the operator's
   lonode policy puts 5 on each of 1,000 nodes, 2 cpu stay free per node) in namespace
   rR-run, all bound;
2. --queued single-pod Jobs of --queued-cpu cpu (default 1,000 x 16: none fits) in rR-q; the
   store holds them all waiting; how long `kubectl get fluxjobs` takes to show them is
   recorded (FluxJob lag before the restart);
3. SIGKILL the operator; while it is down every Job running on the first --free-nodes nodes
   (default 40 nodes = 200 Jobs) is deleted (Jobs and pods; we wait until the pods are gone),
   so room for 2 x 40 = 80 queued pods exists when the new process starts (counted from the
   cluster and recorded as room_at_start_slots);
4. a new operator process starts (time 0); measured: its leadership line, its "operator
   ready" line, the first queued pod bound (first_bind_s; the target is <= 10 s), when the
   FluxJobs per phase first match the store again (per namespace: Running, and Pending or
   Reserved);
5. at the first bind every Job on the next --drain-nodes nodes (default 460) is deleted, which
   makes room for the rest of the queue; drain_s = time 0 to the last queued pod bound;
6. the no-double-booking invariant on every bound pod (sum of the requests of the bound,
   unfinished pods on each node <= its allocatable: devcluster.invariants' check) on a full
   snapshot every few seconds from the kill to the end of the drain, and once more at the end.

The lease of the killed leader still runs when the new process starts (SIGKILL gives nothing
up): lease_left_at_start_s says how long it had left; the new process cannot lead before.

    .venv/bin/python bench/restart_bench.py                       # 1,000 nodes, 3 rounds
    .venv/bin/python bench/restart_bench.py --nodes 100 --running 500 --queued 100 \\
        --free-nodes 4 --drain-nodes 46 --rounds 1 --out /tmp/restart_small.json   # dry run
    ... --profile DIR     # py-spy (wall clock, idle included) of round 1's new process, first 60 s

Writes bench/results/restart_bench.json (parameters, figures per round, load averages, machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape, procs
from fluxnetes.devcluster.apicalls import Request, create_jobs, send_all
from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION
from fluxnetes.devcluster.invariants import Checker, Snapshot
from fluxnetes.devcluster.soak_processes import Postgres

OUT = Path(__file__).resolve().parent / "results" / "restart_bench.json"
OPERATOR_NAMESPACE = "fluxnetes-system"
LEASE = "fluxnetes-leader"
WAITING = ("Pending", "Reserved")
T0 = time.monotonic()
# the operator's start-up, step by step, as its log lines show it
MARKS = {
    "imported": "operator starting:",  # the interpreter started, the operator's modules imported
    "setup_begins": "operator identity:",  # API server reached, CRDs ensured
    "webhook_serving": "webhook serving on",
    "listed": "standby: the cluster is listed",  # (when the listing ends before leading)
    "leads": " leads (lease",
    "store_read": "live jobs read back",
    "ready": "operator ready",
    "first_decision": "Pending -> Running",
}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - T0:6.0f}s] {msg}", flush=True)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def job_body(name: str, ns: str, cpu: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {TIMED_POD_ANNOTATION: "24h"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox",
                                    "resources": {"requests": {"cpu": str(cpu), "memory": "1Gi"}}}],
                },
            },
        },
    }


# -- reading the cluster and the store ------------------------------------------------------------
class View:
    def __init__(self, cluster: Cluster, store_url: str) -> None:
        self.cluster = cluster
        self.store_url = store_url
        self._engine: Any = None

    def pods(self, ns: str | None = None, field: str = "") -> list[dict[str, Any]]:
        base = f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods"
        sel = f"&fieldSelector={field}" if field else ""
        items: list[dict[str, Any]] = self.cluster.api_get(f"{base}?resourceVersion=0{sel}", 60)["items"]
        return items

    def bound(self, ns: str) -> list[dict[str, Any]]:
        return self.pods(ns, "spec.nodeName!=")

    def snapshot(self) -> Snapshot:
        at = time.time()
        nodes = self.cluster.api_get("/api/v1/nodes?resourceVersion=0", 60)["items"]
        return Snapshot(at=at, nodes=nodes, pods=self.pods())

    def store_counts(self) -> dict[str, dict[str, int]]:
        """{namespace: {"Running": n, "waiting": n}} of the store's groups not yet ended."""
        import sqlalchemy as sa

        if self._engine is None:
            self._engine = sa.create_engine(self.store_url)
        out: dict[str, dict[str, int]] = {}
        with self._engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT namespace, state, count(*) FROM jobs "
                                        "WHERE state IN ('pending', 'reserved', 'running') GROUP BY 1, 2"))
            for ns, state, n in rows:
                key = "Running" if state == "running" else "waiting"
                d = out.setdefault(str(ns), {"Running": 0, "waiting": 0})
                d[key] += int(n)
        return out

    def fluxjob_counts(self) -> dict[str, dict[str, int]]:
        """The same from `kubectl get fluxjobs -A` (what a user sees)."""
        res = self.cluster.kubectl("get", "fluxjobs", "-A", "-o",
                                   'jsonpath={range .items[*]}{.metadata.namespace} {.status.phase}{"\\n"}{end}')
        out: dict[str, dict[str, int]] = {}
        for row in (line.split() for line in res.stdout.splitlines()):
            if len(row) != 2 or row[1] not in ("Running", *WAITING):
                continue
            d = out.setdefault(row[0], {"Running": 0, "waiting": 0})
            d["Running" if row[1] == "Running" else "waiting"] += 1
        return out

    def lease_left(self) -> float | None:
        from datetime import datetime

        try:
            lease = self.cluster.api_get(
                f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/{LEASE}")
        except Exception:
            return None
        spec = lease.get("spec") or {}
        renew = spec.get("renewTime")
        if not renew:
            return None
        t = datetime.fromisoformat(str(renew).replace("Z", "+00:00")).timestamp()
        return round(t + float(spec.get("leaseDurationSeconds") or 0) - time.time(), 2)


def overbooked(snap: Snapshot) -> list[dict[str, Any]]:
    """The invariant on every bound pod: per node, the requests of the bound, unfinished pods
    <= allocatable (devcluster.invariants' check). Pods being deleted (deletionTimestamp set)
    count: kube-scheduler and the kubelet count them until they are gone. Each violation
    says which of its pods were terminating and whether the node is over without them
    ("live_over")."""
    from fluxnetes.devcluster.invariants import _allocatable, _request

    nodes = {str((n.get("metadata") or {}).get("name")): n for n in snap.nodes}
    found = [v.as_dict() for v in Checker()._overbooked(snap, nodes)]
    if not found:
        return found
    live: Counter[str] = Counter()
    terminating: dict[str, list[str]] = {}
    for p in snap.pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        md = p.get("metadata") or {}
        if md.get("deletionTimestamp"):
            terminating.setdefault(node, []).append(f"{md.get('namespace')}/{md.get('name')}")
        else:
            live[node] += _request(p)[0]
    for v in found:
        node = v["evidence"]["node"]
        v["terminating_pods"] = sorted(terminating.get(node, []))
        v["live_over"] = live[node] > _allocatable(nodes[node])[0]
    return found


def free_slots(snap: Snapshot, cpu: int) -> int:
    """How many pods of `cpu` cores fit on the nodes now (from the bound, unfinished pods)."""
    from fluxnetes.devcluster.invariants import _allocatable, _request

    used: Counter[str] = Counter()
    for p in snap.pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            used[node] += _request(p)[0]
    return sum(max(0, _allocatable(n)[0] - used[str(n["metadata"]["name"])]) // (cpu * 1000)
               for n in snap.nodes)


# -- the operator --------------------------------------------------------------------------------
class Operator:
    def __init__(self, cluster: Cluster, store_url: str, workdir: Path, extra: list[str],
                 identity: str | None = None) -> None:
        self.cluster, self.store_url, self.workdir, self.extra = cluster, store_url, workdir, extra
        # one --leader-identity for every process: a restart as kubelet does it (the same pod,
        # the operator PID 1 again), which takes its own Lease back at once
        self.identity = identity
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None
        self.count = 0
        self.spies: list[subprocess.Popen[bytes]] = []

    def start(self, profile: Path | None = None, extra: list[str] | None = None, src: Path | None = None) -> float:
        """Start an operator process (``src``: run the fluxnetes package found there instead,
        e.g. a worktree of an earlier commit, for a before/after in one run)."""
        self.count += 1
        self.log = self.workdir / f"operator-{self.count}.log"
        argv = [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(self.cluster.kubeconfig),
                "--store", self.store_url, "--webhook-port", "0", "--log-format", "text",
                "--log-level", "INFO", *self.extra, *(extra or [])]
        if self.identity is not None:
            argv += ["--leader-identity", self.identity]
        with self.log.open("wb") as out:
            t = time.time()
            env = {**os.environ, "PYTHONPATH": str(src)} if src is not None else None
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env)
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            self.spies.append(subprocess.Popen(
                [spy, "record", "--pid", str(self.proc.pid), "--idle", "--format", "raw", "--rate", "100",
                 "--duration", "60", "--output", str(profile / f"operator-{self.count}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return t

    def wait_line(self, text: str, timeout: float) -> float | None:
        """Wall time when `text` first appeared in the log (polled every 0.05 s)."""
        return self.wait_lines([text], timeout).get(text)

    def wait_lines(self, texts: list[str], timeout: float, seen: dict[str, float] | None = None) -> dict[str, float]:
        """Wall time at which each of `texts` first appeared in the log (the log is read as it
        grows, every 0.05 s), until all were seen or `timeout`; into `seen` as they appear (a
        line that never comes does not hide the others)."""
        seen = {} if seen is None else seen
        pos, tail = 0, ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(seen) < len(texts):
            if self.log is not None and self.log.exists():
                with self.log.open("rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                pos += len(chunk)
                text = tail + chunk.decode(errors="replace")
                now = time.time()
                for t in texts:
                    if t not in seen and t in text:
                        seen[t] = now
                tail = text[-300:]
            if self.proc is not None and self.proc.poll() is not None:
                raise SystemExit(f"the operator exited ({self.proc.returncode}); see {self.log}")
            time.sleep(0.05)
        return seen

    def cpu_seconds(self) -> float | None:
        """CPU seconds the operator process (and its children: the webhook server) used so
        far: what start-up costs whatever the machine's load (the wall time also holds the
        waits for a core on a shared machine)."""
        import psutil

        if self.proc is None:
            return None
        try:
            p = psutil.Process(self.proc.pid)
            total = float(sum(p.cpu_times()[:2]))
            for c in p.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += float(sum(c.cpu_times()[:2]))
        except psutil.Error:
            return None
        return round(total, 2)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        procs.signal_and_wait(self.proc, sig, timeout=60)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        for spy in self.spies:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(timeout=90)


# -- one round --------------------------------------------------------------------------------------
def delete_jobs(cluster: Cluster, ns: str, jobs: list[str], pods: list[str]) -> None:
    opts = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
            "gracePeriodSeconds": 0}
    reqs = [Request("DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs/{j}", opts, f"job {j}",
                    ignore=frozenset({404})) for j in jobs]
    reqs += [Request("DELETE", f"/api/v1/namespaces/{ns}/pods/{p}", opts, f"pod {p}",
                     ignore=frozenset({404})) for p in pods]
    asyncio.run(send_all(cluster.api_url, cluster.ssl_context(), reqs, 16))


def jobs_on_nodes(pods: Sequence[Mapping[str, Any]], nodes: list[str]) -> tuple[list[str], list[str]]:
    want = set(nodes)
    jobs, names = [], []
    for p in pods:
        if (p.get("spec") or {}).get("nodeName") in want:
            names.append(p["metadata"]["name"])
            jobs.append((p["metadata"].get("labels") or {}).get("job-name", ""))
    return [j for j in jobs if j], names


def wait_until(what: str, check: Any, timeout: float, every: float = 2.0) -> float | None:
    t = time.monotonic()
    deadline = t + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic() - t
        time.sleep(every)
    say(f"timed out waiting for {what} ({timeout:.0f} s)")
    return None


def counts_match(store: dict[str, dict[str, int]], fj: dict[str, dict[str, int]], namespaces: list[str]) -> bool:
    empty = {"Running": 0, "waiting": 0}
    return all(bool(store.get(ns, empty) == fj.get(ns, empty)) for ns in namespaces)


def run_round(args: argparse.Namespace, r: int, cluster: Cluster, view: View, op: Operator) -> dict[str, Any]:
    run_ns, q_ns = f"r{r}-run", f"r{r}-q"
    out: dict[str, Any] = {"round": r, "load_at_start": load()}
    for ns in (run_ns, q_ns):
        cluster.api_call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": ns, "labels": {"fluxnetes.io/enabled": "true"}}})
    # 1. the running pods
    say(f"round {r}: creating {args.running} Jobs of {args.running_cpu} cpu")
    t = time.monotonic()
    create_jobs(cluster.kubeconfig, [job_body(f"run-{i}", run_ns, args.running_cpu) for i in range(args.running)])
    out["create_running_s"] = round(time.monotonic() - t, 1)

    def all_running() -> bool:
        n = len(view.pods(run_ns, "status.phase=Running"))
        say(f"  running: {n}/{args.running}")
        return bool(n >= args.running)

    waited = wait_until("the running pods", all_running, args.timeout, every=10)
    if waited is None:
        raise SystemExit("the running pods did not all start")
    out["running_bound_s"] = round(time.monotonic() - t, 1)
    # 2. the backlog
    say(f"round {r}: creating {args.queued} Jobs of {args.queued_cpu} cpu (no room)")
    t = time.monotonic()
    create_jobs(cluster.kubeconfig, [job_body(f"q-{i}", q_ns, args.queued_cpu) for i in range(args.queued)])
    out["create_queued_s"] = round(time.monotonic() - t, 1)
    in_store = wait_until("the store to hold the backlog",
                          lambda: view.store_counts().get(q_ns, {}).get("waiting", 0) >= args.queued, 300, 1)
    out["store_holds_backlog_s"] = None if in_store is None else round(time.monotonic() - t, 1)
    fj_seen = wait_until("the FluxJobs to show the backlog",
                         lambda: view.fluxjob_counts().get(q_ns, {}).get("waiting", 0) >= args.queued, 120, 1)
    out["fluxjobs_show_backlog_s"] = None if fj_seen is None else round(time.monotonic() - t, 1)
    time.sleep(args.settle)
    out["bound_queued_before_kill"] = len(view.bound(q_ns))
    out["before_kill"] = {"store": view.store_counts(), "fluxjobs": view.fluxjob_counts()}
    say(f"round {r}: before the kill {out['before_kill']}")
    # 3. SIGKILL; room made while it is down
    out["load_at_kill"] = load()
    op.kill()
    t_kill = time.time()
    say(f"round {r}: operator SIGKILLed")
    violations: list[dict[str, Any]] = []
    snap = view.snapshot()
    violations += overbooked(snap)
    run_pods = [p for p in snap.pods if (p.get("metadata") or {}).get("namespace") == run_ns]
    per_node = Counter(str(p["spec"]["nodeName"]) for p in run_pods if (p.get("spec") or {}).get("nodeName"))
    order = sorted(per_node, key=lambda n: (len(n), n))
    free_nodes, drain_nodes = order[:args.free_nodes], order[args.free_nodes:args.free_nodes + args.drain_nodes]
    jobs, pods = jobs_on_nodes(run_pods, free_nodes)
    delete_jobs(cluster, run_ns, jobs, pods)
    gone = set(pods)
    wait_until("the freed pods to go",
               lambda: not gone & {p["metadata"]["name"] for p in view.pods(run_ns)}, 120, 0.5)
    out["deleted_while_down"] = {"nodes": len(free_nodes), "jobs": len(jobs)}
    if args.down_at_least:
        time.sleep(max(0.0, t_kill + args.down_at_least - time.time()))
    snap = view.snapshot()
    out["room_at_start_slots"] = free_slots(snap, args.queued_cpu)
    out["lease_left_at_start_s"] = view.lease_left()
    out["down_s"] = round(time.time() - t_kill, 2)
    # 4. the new process
    out["load_at_restart"] = load()
    # profiled in round 1 only: py-spy's own CPU would slow the other rounds' start-up
    src = args.compare_src / "src" if args.compare_src is not None and r % 2 == 1 else None
    out["restarted_code"] = str(src) if src is not None else "this tree"
    t0 = op.start(Path(args.profile) / f"round{r}" if args.profile and r == 1 else None, src=src)
    say(f"round {r}: new operator started (room for {out['room_at_start_slots']} queued pods, "
        f"lease left {out['lease_left_at_start_s']} s)")
    marks: dict[str, float] = {}

    def lines() -> None:
        op.wait_lines(list(MARKS.values()), 180, marks)

    watcher = threading.Thread(target=lines, daemon=True)
    watcher.start()
    first_bind: float | None = None
    while time.time() - t0 < args.timeout:
        if view.bound(q_ns)[out["bound_queued_before_kill"]:]:
            first_bind = time.time()
            out["operator_cpu_s_at_first_bind"] = op.cpu_seconds()
            break
        time.sleep(0.2)
    out["first_bind_s"] = None if first_bind is None else round(first_bind - t0, 2)
    say(f"round {r}: first bind after {out['first_bind_s']} s")
    watcher.join(timeout=20)  # (the marks fill in as their lines appear)
    # when each start-up step's log line appeared (seen by tailing the log: +0.05 s)
    out["log_lines_s"] = {k: round(marks[v] - t0, 2) if v in marks else None for k, v in MARKS.items()}
    out["lead_s"], out["ready_line_s"] = out["log_lines_s"]["leads"], out["log_lines_s"]["ready"]
    # 5. room for the rest, then the drain; the invariant and the FluxJob counts meanwhile
    # the deletions run in a thread: the drain and the FluxJob counts are sampled meanwhile
    t_more = time.time()
    jobs, pods = jobs_on_nodes(run_pods, drain_nodes)
    deleted: dict[str, Any] = {"nodes": len(drain_nodes), "jobs": len(jobs), "at_s": round(t_more - t0, 2)}

    def delete_more() -> None:
        delete_jobs(cluster, run_ns, jobs, pods)
        deleted["took_s"] = round(time.time() - t_more, 2)

    deleter = threading.Thread(target=delete_more, daemon=True)
    deleter.start()
    out["deleted_after_first_bind"] = deleted
    namespaces = [run_ns, q_ns]
    match_s: float | None = None
    samples: list[dict[str, Any]] = []
    drained: float | None = None
    snapshots = 0
    last_snap = 0.0
    while time.time() - t0 < args.timeout:
        now = time.time()
        bound = len(view.bound(q_ns))
        store, fj = view.store_counts(), view.fluxjob_counts()
        same = counts_match(store, fj, namespaces)
        if same and match_s is None:
            match_s = round(now - t0, 2)
        samples.append({"t": round(now - t0, 1), "bound_queued": bound, "store_q": store.get(q_ns),
                        "fluxjobs_q": fj.get(q_ns), "store_run": store.get(run_ns), "fluxjobs_run": fj.get(run_ns)})
        if now - last_snap >= args.check_every:
            violations += overbooked(view.snapshot())
            snapshots += 1
            last_snap = now
        if bound >= args.queued and drained is None:
            drained = now
            say(f"round {r}: drained after {drained - t0:.1f} s")
        if drained is not None and not deleter.is_alive() and (same or now - drained > 120):
            break
        if len(samples) % 5 == 1:
            say(f"  t={now - t0:.0f}s bound {bound}/{args.queued}; store {store.get(q_ns)} fluxjobs {fj.get(q_ns)}")
        time.sleep(1)
    deleter.join(timeout=60)
    out["drain_s"] = None if drained is None else round(drained - t0, 2)
    out["fluxjobs_first_match_store_s"] = match_s
    out["fluxjobs_lag"] = fluxjob_lag(samples, deleted)
    final_store, final_fj = view.store_counts(), view.fluxjob_counts()
    out["fluxjobs_match_store_at_end"] = counts_match(final_store, final_fj, namespaces)
    out["at_end"] = {"store": final_store, "fluxjobs": final_fj}
    snap = view.snapshot()
    violations += overbooked(snap)
    bound_pods = [p for p in snap.pods if (p.get("spec") or {}).get("nodeName")
                  and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    out["invariant"] = {"snapshots": snapshots + 3, "bound_pods_checked_at_end": len(bound_pods),
                        "overbooked": violations[:20], "overbooked_count": len(violations),
                        # over even without the pods being deleted (a double booking of live pods)
                        "overbooked_live_count": sum(1 for v in violations if v["live_over"])}
    out["samples"] = samples
    out["load_at_end"] = load()
    out["operator_log"] = str(op.log)
    say(f"round {r}: first bind {out['first_bind_s']} s, ready line {out['ready_line_s']} s, "
        f"leads {out['lead_s']} s, drain {out['drain_s']} s, FluxJobs = store after {match_s} s, "
        f"overbooked {len(violations)} ({out['invariant']['overbooked_live_count']} without terminating pods)")
    return out


def fluxjob_lag(samples: list[dict[str, Any]], deleted: Mapping[str, Any]) -> dict[str, Any]:
    """How far `kubectl get fluxjobs` was behind the store during the drain: per sample, the
    groups a user sees in another state than the store's (Running vs waiting; FluxJobs of
    deleted Jobs not yet gone count as seen Running), for the queued namespace (whose groups
    start) and the running one (whose Jobs are deleted); and how long after the last deletion
    the two agreed (the deletions themselves take minutes: the first full match cannot come
    earlier)."""
    def off(a: Mapping[str, int] | None, b: Mapping[str, int] | None) -> int:
        a, b = a or {}, b or {}
        return max(abs(int(a.get(k, 0)) - int(b.get(k, 0))) for k in ("Running", "waiting"))

    q = [off(x["store_q"], x["fluxjobs_q"]) for x in samples]
    run = [off(x["store_run"], x["fluxjobs_run"]) for x in samples]
    done = deleted.get("at_s", 0.0) + deleted.get("took_s", 0.0) if "took_s" in deleted else None
    after = next((x["t"] - done for x, a, b in zip(samples, q, run, strict=True)
                  if done is not None and x["t"] >= done and a == 0 and b == 0), None)
    return {"queued_ns_groups_off": {"max": max(q, default=0), "median": sorted(q)[len(q) // 2] if q else 0},
            "running_ns_groups_off": {"max": max(run, default=0), "median": sorted(run)[len(run) // 2] if run else 0},
            "match_after_last_deletion_s": None if after is None else round(after, 1)}


def clean_round(cluster: Cluster, view: View, r: int) -> None:
    for ns in (f"r{r}-run", f"r{r}-q"):
        with contextlib.suppress(Exception):
            cluster.api_call("DELETE", f"/api/v1/namespaces/{ns}")
    wait_until("the round's namespaces to go", lambda: not any(
        (p.get("metadata") or {}).get("namespace", "").startswith(f"r{r}-") for p in view.pods()), 600, 5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--running", type=int, default=5000, help="single-pod Jobs running at the kill")
    ap.add_argument("--running-cpu", type=int, default=6)
    ap.add_argument("--queued", type=int, default=1000, help="single-pod Jobs waiting at the kill")
    ap.add_argument("--queued-cpu", type=int, default=16)
    ap.add_argument("--free-nodes", type=int, default=40, help="nodes emptied while the operator is down")
    ap.add_argument("--drain-nodes", type=int, default=460, help="nodes emptied at the first bind")
    ap.add_argument("--down-at-least", type=float, default=0.0,
                    help="seconds the operator stays down at least (e.g. 11: the killed leader's lease ends)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between the backlog and the kill")
    ap.add_argument("--check-every", type=float, default=5.0, help="seconds between invariant snapshots")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--operator-arg", action="append", default=[], help="extra `fluxnetes run` argument")
    ap.add_argument("--fill-operator-arg", action="append", default=[],
                    help="extra `fluxnetes run` argument for the first operator only (it fills the cluster; "
                         "e.g. --fill-operator-arg=--lease-duration=60 when the machine is too busy for it "
                         "to keep a 10 s lease); the restarted one runs with the defaults")
    ap.add_argument("--restart-as", choices=("new-pod", "container"), default="new-pod",
                    help="new-pod: the new process has an identity of its own and waits for the killed "
                         "one's Lease to run out (a replacement pod); container: the same --leader-identity "
                         "(a container restarted in its pod, as kubelet does after a crash: the chart's "
                         "operator is PID 1 of its pod, so its default identity is the same again)")
    ap.add_argument("--profile", help="py-spy the new operator's first 60 s in round 1 into DIR/round1/")
    ap.add_argument("--compare-src", type=Path, metavar="DIR",
                    help="a checkout of earlier code (e.g. `git worktree add DIR COMMIT`): the odd rounds' "
                         "restarted operator runs DIR/src, the even rounds' this tree (before/after in one run)")
    ap.add_argument("--keep-dir", type=Path, help="work directory (cluster, logs) to keep")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "restart_bench",
        "parameters": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                       if k not in ("out", "keep_dir")},
        "workload": f"{args.running} single-pod Jobs of {args.running_cpu} cpu running, {args.queued} single-pod "
                    f"Jobs of {args.queued_cpu} cpu queued; nodes of 32 cpu, 256Gi; Job pods run 24 h",
        "target": {"first_bind_s": 10},
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "rounds": [],
    }
    # a SIGTERM (e.g. `kill PID` of this bench) still stops the operator, the cluster and PostgreSQL
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = args.keep_dir or Path(tempfile.mkdtemp(prefix="fx-restart-"))
    workdir.mkdir(parents=True, exist_ok=True)
    pg = Postgres().start()
    say(f"PostgreSQL at {pg.url}; work dir {workdir}")
    cluster: Cluster | None = None
    op: Operator | None = None
    try:
        t = time.monotonic()
        cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=args.nodes, cpu="32", memory="256Gi"),
                                            dir=workdir / "cluster", die_with_parent=True, timed_pods=True,
                                            log=lambda m: say(f"cluster: {m}")))
        result["cluster_up_s"] = round(time.monotonic() - t, 1)
        view = View(cluster, pg.url)
        op = Operator(cluster, pg.url, workdir, args.operator_arg,
                      identity="restart-bench-operator" if args.restart_as == "container" else None)
        op.start(extra=args.fill_operator_arg)
        if op.wait_line("operator ready", 180) is None:
            raise SystemExit(f"the first operator is not ready; see {op.log}")
        for r in range(1, args.rounds + 1):
            result["rounds"].append(run_round(args, r, cluster, view, op))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            if r < args.rounds:
                clean_round(cluster, view, r)
    finally:
        if op is not None:
            op.stop()
        if cluster is not None:
            cluster.down()
        pg.stop()
    firsts = [x["first_bind_s"] for x in result["rounds"]]
    result["summary"] = {"first_bind_s": firsts, "restarted_code": [x["restarted_code"] for x in result["rounds"]],
                         "within_target": [f is not None and f <= 10 for f in firsts],
                         "overbooked": sum(x["invariant"]["overbooked_count"] for x in result["rounds"]),
                         "overbooked_live": sum(x["invariant"]["overbooked_live_count"] for x in result["rounds"])}
    result["load_at_end"] = load()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    say(f"wrote {args.out}: {result['summary']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
