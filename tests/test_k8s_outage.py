"""The outage story and leadership on the real control plane (issue #11, items 5, 7, 8).

- With every operator stopped, creating pods and Jobs in an opted-in namespace is refused
  (failurePolicy Fail) while other namespaces, kube-system included, are untouched.
- A pod bound by hand (spec.nodeName) in an opted-in namespace is refused, opted out or not.
- Two replicas sharing the webhook port: with the leader SIGKILLed the follower's webhook
  keeps admitting (and holding) work, and the follower binds it once it has the lease.
- A leader whose scheduling cycles hold its event loop longer than the lease keeps the lease
  (renewed from its own thread); SIGTERM in the middle of such a cycle ends it promptly and
  the follower takes over at once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from k8s_helpers import Operator, cleanup_webhooks, namespace
from test_k8s_operator import OP_NS, PINNED_MODES, job, pod, pods, wait

pytestmark = pytest.mark.k8s

LEASE = 10  # the default --lease-duration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Follower:
    """A second replica: started like the first, ready once its webhook serves."""

    def __init__(self, cluster: Any, log: Path, port: int, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(cluster.kubeconfig),
             "--webhook-port", str(port), "--webhook-share-port", "--namespace", OP_NS, *PINNED_MODES],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        wait("the follower's webhook", lambda: "webhook serving" in log.read_text() or self.proc.poll() is not None)
        assert self.proc.poll() is None, log.read_text()[-3000:]

    def leads(self) -> bool:
        return "operator ready" in self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


def identity(proc: subprocess.Popen[bytes]) -> str:
    return f"{socket.gethostname()}-{proc.pid}"


def lease(cluster: Any) -> dict[str, Any]:
    return dict(cluster.kubectl_json("get", "lease", "-n", OP_NS, "fluxnetes-leader")["spec"])


def lease_age(spec: dict[str, Any]) -> float:
    renew = datetime.fromisoformat(spec["renewTime"].replace("Z", "+00:00"))
    return (datetime.now(UTC) - renew).total_seconds()


def create(cluster: Any, obj: dict[str, Any], ns: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(obj), check=False)  # type: ignore[no-any-return]


@pytest.fixture
def plain(k8s_cluster: Any) -> Iterator[str]:
    """A namespace that is not opted in."""
    name = f"plain-{uuid.uuid4().hex[:6]}"
    k8s_cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        k8s_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def webhooks_removed(k8s_cluster: Any) -> Iterator[None]:
    """The Fail webhooks must not outlive the test's operators (later tests would be refused)."""
    yield
    cleanup_webhooks(k8s_cluster)


def test_outage_refuses_opted_in_work_only_and_bound_pods_always(
        k8s_cluster: Any, tmp_path: Path, plain: str, webhooks_removed: None) -> None:
    port = free_port()
    op = Operator(k8s_cluster, tmp_path)
    op.start("--webhook-port", str(port))
    try:
        with namespace(k8s_cluster) as ns:
            # a pod bound by hand: refused in an opted-in namespace (the real API server sends it
            # through the webhook's matchConditions even when opted out), allowed elsewhere
            for labels in ({}, {"fluxnetes.io/enabled": "false"}):
                res = create(k8s_cluster, pod(f"by-hand-{len(labels)}", "1", node="kwok-node-0", labels=labels), ns)
                assert res.returncode != 0, res.stdout
                assert "spec.nodeName" in res.stderr and "nodeSelector" in res.stderr, res.stderr
            bad_job = job("by-hand", 1, "1")
            bad_job["spec"]["template"]["spec"]["nodeName"] = "kwok-node-0"
            res = create(k8s_cluster, bad_job, ns)
            assert res.returncode != 0 and "spec.template.spec.nodeName" in res.stderr, res.stderr
            assert create(k8s_cluster, pod("by-hand", "1", node="kwok-node-0"), plain).returncode == 0
            # opted out, not bound: not held, not refused
            assert create(k8s_cluster, pod("out", "1", labels={"fluxnetes.io/enabled": "false"}), ns).returncode == 0
            out = k8s_cluster.kubectl_json("get", "pod", "-n", ns, "out")
            assert not out["spec"].get("schedulingGates")

            op.kill(signal.SIGKILL)  # the only operator: its webhook process follows it
            wait("the webhook to stop answering", lambda: not serving(port), timeout=10)
            res = create(k8s_cluster, pod("during", "1"), ns)
            assert res.returncode != 0 and "pods.mutate.fluxnetes.io" in res.stderr, res.stderr
            res = create(k8s_cluster, job("during", 1, "1"), ns)
            assert res.returncode != 0 and "workloads.mutate.fluxnetes.io" in res.stderr, res.stderr
            assert not [p for p in pods(k8s_cluster, ns) if p["metadata"]["name"] != "out"]  # nothing ran unmanaged
            # nothing else in the cluster is affected
            assert create(k8s_cluster, pod("during", "1"), plain).returncode == 0
            assert create(k8s_cluster, pod(f"fx-outage-{uuid.uuid4().hex[:5]}", "10m"), "kube-system").returncode == 0

            op.start("--webhook-port", str(port))  # back: the namespace takes work again, held
            assert create(k8s_cluster, pod("after", "1"), ns).returncode == 0
            after = k8s_cluster.kubectl_json("get", "pod", "-n", ns, "after")
            assert after["metadata"]["labels"].get("fluxnetes.io/managed") == "true"
    finally:
        op.kill(signal.SIGTERM)
        for p in k8s_cluster.kubectl_json("get", "pods", "-n", "kube-system")["items"]:
            if p["metadata"]["name"].startswith("fx-outage-"):
                k8s_cluster.kubectl("delete", "pod", "-n", "kube-system", p["metadata"]["name"], "--wait=false",
                                    check=False)


def test_follower_keeps_admitting_and_binds_new_work_after_the_leader_is_killed(
        k8s_cluster: Any, tmp_path: Path, webhooks_removed: None) -> None:
    port = free_port()
    leader = Operator(k8s_cluster, tmp_path)
    leader.start("--webhook-port", str(port), "--webhook-share-port")
    follower = Follower(k8s_cluster, tmp_path / "follower.log", port)
    try:
        with namespace(k8s_cluster) as ns:
            assert leader.proc is not None
            first = identity(leader.proc)
            wait("the lease held by the first replica", lambda: lease(k8s_cluster)["holderIdentity"] == first)
            assert not follower.leads()
            leader.kill(signal.SIGKILL)
            killed = time.monotonic()
            time.sleep(1)  # the leader's webhook process is gone too; the follower has no lease yet
            assert not follower.leads()
            res = create(k8s_cluster, pod("during", "1"), ns)
            assert res.returncode == 0, res.stderr  # admitted by the follower's webhook ...
            held = k8s_cluster.kubectl_json("get", "pod", "-n", ns, "during")
            assert {"name": "fluxnetes.io/gate"} in held["spec"]["schedulingGates"]  # ... and held

            def bound() -> bool:
                return bool(k8s_cluster.kubectl_json("get", "pod", "-n", ns, "during")["spec"].get("nodeName"))

            wait("the follower to take over and bind it", bound, timeout=LEASE + 5, interval=0.2)
            took = time.monotonic() - killed
            assert follower.leads() and lease(k8s_cluster)["holderIdentity"] == identity(follower.proc)
            print(f"failover: SIGKILL to bound in {took:.1f} s (lease {LEASE} s)")
    finally:
        follower.stop()
        leader.kill(signal.SIGTERM)


def test_cycles_longer_than_the_lease_keep_it_and_sigterm_mid_cycle_is_prompt(
        k8s_cluster: Any, tmp_path: Path, webhooks_removed: None) -> None:
    """Every cycle of the leader holds its event loop 12 s (> the 10 s lease), as a huge backlog
    would: the Lease stays fresh and the follower never takes it. SIGTERM in the middle of such
    a cycle: the leader is gone within 2 s and the follower leads right after."""
    port = free_port()
    leader = Operator(k8s_cluster, tmp_path)
    leader.start_with({"FLUXNETES_DEBUG_SLOW_CYCLE": "12"}, "--webhook-port", str(port), "--webhook-share-port")
    follower = Follower(k8s_cluster, tmp_path / "follower.log", port)
    try:
        assert leader.proc is not None
        me = identity(leader.proc)
        wait("a slow cycle", lambda: "holding the event loop" in leader.log.read_text())
        ages = []
        end = time.monotonic() + 16  # more than one whole slow cycle
        while time.monotonic() < end:
            spec = lease(k8s_cluster)
            assert spec["holderIdentity"] == me
            ages.append(lease_age(spec))
            time.sleep(1)
        assert max(ages) < LEASE, ages  # renewed while the loop was held
        print(f"lease age while every cycle holds the loop 12 s: max {max(ages):.1f} s")
        assert not follower.leads()
        log = leader.log.read_text()
        assert "stepping down" not in log and "write refused" not in log
        leader.proc.send_signal(signal.SIGTERM)  # the loop is held: mid-cycle
        sent = time.monotonic()
        leader.proc.wait(timeout=30)
        stopped = time.monotonic() - sent
        assert stopped < 2, f"SIGTERM took {stopped:.1f} s"
        assert "lease" in leader.log.read_text() and lease(k8s_cluster)["holderIdentity"] in ("", identity(
            follower.proc))
        wait("the follower leads", follower.leads, timeout=10, interval=0.2)
        print(f"SIGTERM mid-cycle: exited in {stopped:.2f} s; follower led "
              f"{time.monotonic() - sent:.1f} s after the signal")
    finally:
        follower.stop()
        leader.kill(signal.SIGTERM)
