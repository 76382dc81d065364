"""Leadership on the local control plane: how long a new pod waits when the leader goes.

Two operator replicas share one webhook port. Each round:

- ``sigkill``: the leader is SIGKILLed, a pod is created in an opted-in namespace a second
  later (admitted and held by the follower's webhook), and the time from the kill until that
  pod is bound by the follower (now leader) is measured; the killed replica is restarted as
  the next follower.
- ``sigterm``: the leader's every scheduling cycle holds its event loop 12 s (more than the
  10 s lease, FLUXNETES_DEBUG_SLOW_CYCLE), it is sent SIGTERM in the middle of one, and the
  time until it exits and until the follower holds the Lease are measured.

    .venv/bin/python bench/leader_failover.py --rounds 5

Writes bench/results/leader_failover.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape

RESULTS = Path(__file__).resolve().parent / "results" / "leader_failover.json"
OP_NS = "fluxnetes-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(what: str, cond: Callable[[], Any], timeout: float = 120, interval: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            out = cond()
        except Exception:
            out = None
        if out:
            return out
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


class Replica:
    def __init__(self, cluster: Cluster, port: int, log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(cluster.kubeconfig),
             "--webhook-port", str(port), "--namespace", OP_NS, "--log-format", "text"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        wait("webhook serving", lambda: "webhook serving" in log.read_text())

    @property
    def identity(self) -> str:
        return f"{socket.gethostname()}-{self.proc.pid}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


def holder(cluster: Cluster) -> str:
    return str(cluster.kubectl_json("get", "lease", "-n", OP_NS, "fluxnetes-leader")["spec"].get("holderIdentity"))


def pod(name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fx-failover-"))
    cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=4, cpu="16", memory="64Gi"), dir=work / "cluster",
                                        die_with_parent=True))
    replicas: list[Replica] = []
    out: dict[str, Any] = {"parameters": {"rounds": args.rounds, "lease_seconds": 10, "renew_deadline": 7,
                                          "retry_period": 2, "slow_cycle_seconds": 12},
                           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                       "platform": platform.platform()}}
    try:
        ns = f"fx-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", ns, "fluxnetes.io/enabled=true")
        port = free_port()
        replicas = [Replica(cluster, port, work / "a.log"), Replica(cluster, port, work / "b.log")]
        kill_to_bound = []
        for i in range(args.rounds):
            leader = next(r for r in replicas if wait("a leader", lambda: holder(cluster)) == r.identity)
            follower = next(r for r in replicas if r is not leader)
            leader.stop(signal.SIGKILL)
            killed = time.monotonic()
            time.sleep(1)
            cluster.kubectl("create", "-n", ns, "-f", "-", input=pod(f"k{i}"))
            wait("bound", lambda i=i: cluster.kubectl_json("get", "pod", "-n", ns, f"k{i}")["spec"].get("nodeName"))
            kill_to_bound.append(time.monotonic() - killed)
            print(f"sigkill round {i}: kill -> bound {kill_to_bound[-1]:.1f} s", flush=True)
            replicas = [follower, Replica(cluster, port, work / f"a{i}.log")]
        exit_s, handover = [], []
        for i in range(args.rounds):
            for r in replicas:
                r.stop()
            slow = Replica(cluster, port, work / f"slow{i}.log", {"FLUXNETES_DEBUG_SLOW_CYCLE": "12"})
            wait("slow leader", lambda slow=slow: holder(cluster) == slow.identity)
            other = Replica(cluster, port, work / f"f{i}.log")
            wait("a slow cycle", lambda slow=slow: "holding the event loop" in slow.log.read_text())
            time.sleep(3)
            sent = time.monotonic()
            slow.proc.send_signal(signal.SIGTERM)
            slow.proc.wait(30)
            exit_s.append(time.monotonic() - sent)
            wait("handover", lambda other=other: holder(cluster) == other.identity, timeout=30)
            handover.append(time.monotonic() - sent)
            print(f"sigterm round {i}: exit {exit_s[-1]:.2f} s, follower holds the lease after {handover[-1]:.1f} s",
                  flush=True)
            replicas = [other]
        out["sigkill_to_bound_seconds"] = {"all": [round(x, 2) for x in kill_to_bound],
                                           "median": round(statistics.median(kill_to_bound), 2),
                                           "max": round(max(kill_to_bound), 2), "target": 15}
        out["sigterm_mid_cycle_exit_seconds"] = {"all": [round(x, 2) for x in exit_s],
                                                 "max": round(max(exit_s), 2), "target": 2}
        out["sigterm_to_follower_lease_seconds"] = {"all": [round(x, 2) for x in handover],
                                                    "max": round(max(handover), 2)}
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out, indent=2))
    finally:
        for r in replicas:
            r.stop()
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            cluster.kubectl("delete", kind, "fluxnetes.io", "--ignore-not-found", check=False)
        cluster.down()


if __name__ == "__main__":
    main()
