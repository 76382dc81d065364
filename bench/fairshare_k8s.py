"""Fair share on the real control plane, the issue's full size: two accounts with shares
70/30 each submit 200 one-core Jobs onto a full cluster (issue 16; the CI-sized version is
tests/test_k8s_fairshare.py).

A dev cluster of its own (kwok nodes, Job pods run for the duration in their
``pod-complete.stage.kwok.x-k8s.io/delay`` annotation), the operator as a subprocess (SQLite
store), FluxAccounts ``bench-a`` (70) and ``bench-b`` (30), a namespace each; 200 Jobs each,
durations spread over ``--min-seconds``..``--max-seconds``. Every ``--interval`` seconds the
Running FluxJobs per namespace are counted (the cores the scheduler allocated to each
account; one core each) while both accounts have queued work.

Reported: the mean share of account a in the allocated cores while both are backlogged (the
target: 0.70 +- 0.10), the share of samples within 0.60..0.80, the accounts' usage at the
end of the backlogged window (from their FluxAccount status, published every 10 s) and its
ratio, the time to run everything, jobs/s.

Each ``--running-horizon`` value (the operator's ``--fairshare-running-horizon``; default
0 = Slurm's formula exactly, then 600 = the operator's default) is one run on a fresh cluster,
in the same invocation: the before/after of charging running jobs ahead.

Run:  .venv/bin/python bench/fairshare_k8s.py [--nodes 4 --cpu 8 --jobs 200] [--running-horizon 0 600]
      (writes bench/results/fairshare_k8s.json; about 4-6 minutes per horizon on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fluxnetes.devcluster.apicalls import create_jobs, fluxjobs_per_namespace

ROOT = Path(__file__).resolve().parents[1]
DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"


def job(name: str, ns: str, seconds: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                     "template": {"metadata": {"annotations": {DELAY: f"{seconds}s"}},
                                  "spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "busybox",
                                                           "resources": {"requests": {"cpu": "1"}}}]}}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--cpu", default="8")
    ap.add_argument("--jobs", type=int, default=200, help="Jobs per account")
    ap.add_argument("--min-seconds", type=int, default=15)
    ap.add_argument("--max-seconds", type=int, default=30)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--running-horizon", type=int, nargs="+", default=[0, 600],
                    help="the operator's --fairshare-running-horizon, one run each")
    ap.add_argument("--out", default=str(ROOT / "bench/results/fairshare_k8s.json"))
    args = ap.parse_args()
    runs = []
    for horizon in args.running_horizon:
        out = run_once(args, horizon)
        print(f"running horizon {horizon} s:", json.dumps(out["figures"], indent=1), flush=True)
        runs.append(out)
    result = {
        "benchmark": "fairshare_k8s",
        "parameters": {**runs[0]["parameters"], "running_horizon": args.running_horizon},
        "runs": [{"running_horizon": r["parameters"]["running_horizon"], "figures": r["figures"],
                  "samples": r["samples"], "machine": r["machine"]} for r in runs],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def run_once(args: Any, horizon: int) -> dict[str, Any]:
    from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape

    work = Path(tempfile.mkdtemp(prefix="fairshare-k8s-"))
    t_up = time.monotonic()
    cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=args.nodes, cpu=args.cpu, memory="64Gi"),
                                        dir=work / "cluster", timed_pods=True, die_with_parent=True))
    up_seconds = time.monotonic() - t_up
    log = (work / "operator.log").open("wb")
    op = subprocess.Popen([sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(cluster.kubeconfig),
                           "--webhook-port", "0", "--namespace", "fluxnetes-bench", "--owner-cluster-role", "",
                           "--store", f"sqlite:///{work / 'store.db'}", "--status-interval", "0.3",
                           "--fairshare-running-horizon", str(horizon)],
                          stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while "operator ready" not in (work / "operator.log").read_text():
            if op.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("operator did not start:\n" + (work / "operator.log").read_text()[-3000:])
            time.sleep(0.3)
        accounts = [{"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxAccount", "metadata": {"name": name},
                     "spec": {"shares": shares}} for name, shares in (("bench-a", 70), ("bench-b", 30))]
        cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": accounts}))
        for ns in ("bench-a", "bench-b"):
            cluster.kubectl("create", "namespace", ns)
            cluster.kubectl("label", "namespace", ns, "fluxnetes.io/enabled=true", f"fluxnetes.io/account={ns}")
        span = args.max_seconds - args.min_seconds + 1
        jobs = [job(f"j{i}", ns, args.min_seconds + (i * 7) % span)
                for i in range(args.jobs) for ns in ("bench-a", "bench-b")]
        t0 = time.monotonic()
        create_jobs(cluster.kubeconfig, jobs)
        submitted = time.monotonic() - t0
        samples: list[dict[str, Any]] = []
        both = []
        window_usage: dict[str, float] | None = None
        seen = False
        while True:
            running, waiting = fluxjobs_per_namespace(cluster)
            t = round(time.monotonic() - t0, 2)
            a, b = running.get("bench-a", 0), running.get("bench-b", 0)
            samples.append({"t": t, "a": a, "b": b, "waitingA": waiting.get("bench-a", 0),
                            "waitingB": waiting.get("bench-b", 0)})
            if waiting.get("bench-a") and waiting.get("bench-b") and a + b:
                both.append((a, b))
            elif both and window_usage is None:  # the backlogged window just ended
                window_usage = {name: float((cluster.kubectl_json("get", "fluxaccount", name).get("status") or {})
                                            .get("usage") or 0) for name in ("bench-a", "bench-b")}
            seen = seen or bool(a + b or waiting)
            if seen and not waiting.get("bench-a") and not waiting.get("bench-b") and a + b == 0:
                break  # (not before the first FluxJob shows: the operator may lag the creates)
            if t > 3600:
                raise SystemExit("not done after an hour")
            time.sleep(args.interval)
        total = time.monotonic() - t0
        share = sum(a for a, _ in both) / max(1, sum(a + b for a, b in both))
        within = sum(1 for a, b in both if 0.6 <= a / (a + b) <= 0.8) / max(1, len(both))
        usage = window_usage or {"bench-a": 0.0, "bench-b": 0.0}
        out = {
            "benchmark": "fairshare_k8s",
            "parameters": {"nodes": args.nodes, "cpu_per_node": args.cpu, "jobs_per_account": args.jobs,
                           "job_seconds": [args.min_seconds, args.max_seconds], "shares": {"bench-a": 70, "bench-b": 30},
                           "sample_interval": args.interval, "running_horizon": horizon},
            "figures": {
                "mean_share_a_while_both_backlogged": round(share, 4),
                "target": 0.70, "tolerance": 0.10, "within_target": abs(share - 0.70) <= 0.10,
                "fraction_of_samples_within_0.6_0.8": round(within, 4),
                "backlogged_samples": len(both),
                "usage_at_window_end": usage,
                "usage_share_a_at_window_end": round(usage["bench-a"] / max(1e-9, sum(usage.values())), 4),
                "submit_seconds": round(submitted, 1), "total_seconds": round(total, 1),
                "jobs_per_second": round(2 * args.jobs / total, 2), "cluster_up_seconds": round(up_seconds, 1),
            },
            "samples": samples,
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform(),
                        "loadavg": os.getloadavg()},
        }
        return out
    finally:
        op.send_signal(signal.SIGTERM)
        try:
            op.wait(timeout=30)
        except subprocess.TimeoutExpired:
            op.kill()
        cluster.down()


if __name__ == "__main__":
    main()
