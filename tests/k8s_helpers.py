"""Helpers shared by the operator tests that restart or reconfigure the operator (the
operator process, waiting, objects), on top of tests/test_k8s_operator.py's."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from test_k8s_operator import OperatorProc, pods, wait
from test_k8s_operator import (
    namespace as namespace,  # re-exported: the helpers tests import it from here
)

CRASH_AT = "FLUXNETES_DEBUG_EXIT_AT"
SLOW_CYCLE = "FLUXNETES_DEBUG_SLOW_CYCLE"
CRASH_HOOK = str(Path(__file__).resolve().parent / "crashhook")


class Operator(OperatorProc):
    """The operator subprocess, startable with extra environment (FLUXNETES_DEBUG_EXIT_AT)."""

    def start_with(self, env: dict[str, str], *extra: str) -> None:
        if CRASH_AT in env or SLOW_CYCLE in env:  # the process installs the tests' hook (tests/crashhook)
            env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (CRASH_HOOK, os.environ.get("PYTHONPATH")) if p)}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.start(*extra)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def restart(self, *extra: str) -> None:
        self.kill(signal.SIGTERM)
        self.start(*extra)


def cleanup_webhooks(cluster: Any) -> None:
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, "fluxnetes.io", "--ignore-not-found", check=False)
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        cluster.kubectl("delete", kind, "fluxnetes.io-gate", "--ignore-not-found", check=False)


@contextmanager
def operator_session(cluster: Any, tmp_path_factory: Any, label: str, *args: str,
                     start: bool = True) -> Iterator[Operator]:
    """An operator for a test module (started with ``args`` unless ``start`` is False),
    stopped and its webhook configurations removed at the end."""
    o = Operator(cluster, tmp_path_factory.mktemp(label))
    if start:
        o.start(*args)
    try:
        yield o
    finally:
        o.kill(signal.SIGTERM)
        cleanup_webhooks(cluster)




class OverbookingWatch:
    """Checks continuously (in a thread) that what is bound to each node never exceeds its
    allocatable cpu; ``violations`` lists what was seen otherwise."""

    def __init__(self, cluster: Any) -> None:
        from fluxnetes.k8s.resources import node_allocatable

        self.cluster = cluster
        self.alloc = {n["metadata"]["name"]: node_allocatable(n).cpu_millis
                      for n in cluster.kubectl_json("get", "nodes")["items"]}
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from fluxnetes.k8s.resources import pod_request

        while not self._stop.is_set():
            used: dict[str, int] = {}
            try:
                items = self.cluster.kubectl_json("get", "pods", "-A")["items"]
            except Exception:
                continue
            for p in items:
                node = p["spec"].get("nodeName")
                if node and p["status"].get("phase") not in ("Succeeded", "Failed"):
                    used[node] = used.get(node, 0) + pod_request(p["spec"]).cpu_millis
            for node, millis in used.items():
                if node in self.alloc and millis > self.alloc[node]:
                    self.violations.append(f"{node}: {millis}m bound > {self.alloc[node]}m")
            time.sleep(0.3)

    def __enter__(self) -> OverbookingWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def bound_nodes(cluster: Any, ns: str, selector: str, count: int) -> list[str]:
    """Nodes of the ``count`` pods matching ``selector`` once all are bound (sorted)."""
    def ready() -> list[str] | None:
        ps = pods(cluster, ns, selector)
        nodes = [p["spec"].get("nodeName") for p in ps]
        return sorted(nodes) if len(ps) == count and all(nodes) else None

    return list(wait(f"{count} pods bound ({selector})", ready, timeout=90))


def store_at(url: str) -> Any:
    from fluxnetes.store import Store

    return Store(url)


def log_path(op: Operator) -> Path:
    return Path(op.log)


def dev_cluster(tmp_path_factory: Any, label: str, nodes: Any, *, timed_pods: bool = False) -> Iterator[Any]:
    """A plain dev cluster (no addons) for a module fixture: skipped without the control plane,
    failed instead when FLUXNETES_REQUIRE_K8S=1 says it must be there. ``timed_pods``: kwok
    completes a pod after its ``pod-complete.stage.kwok.x-k8s.io/delay`` annotation."""
    import pytest

    from conftest import k8s_missing_reason
    from fluxnetes.devcluster import Cluster, ClusterOptions

    reason = k8s_missing_reason()
    if reason:
        if os.environ.get("FLUXNETES_REQUIRE_K8S") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    c = Cluster.up(ClusterOptions(nodes=nodes, dir=tmp_path_factory.mktemp(label), timed_pods=timed_pods,
                                  die_with_parent=True))
    try:
        yield c
    finally:
        c.down()


def addon_cluster(tmp_path_factory: Any, label: str, nodes: Any, *, timed_pods: bool = False,
                  names: tuple[str, ...] | None = None) -> Iterator[Any]:
    """A dev cluster running the four workload controllers (MPI Operator, JobSet, Trainer,
    LWS), or the addons ``names``, for a module fixture: skipped without the control plane or
    the addon builds, failed instead when FLUXNETES_REQUIRE_K8S / FLUXNETES_REQUIRE_ADDONS=1
    say they must be there."""
    import pytest

    from conftest import k8s_missing_reason
    from fluxnetes.devcluster import Cluster, ClusterOptions
    from fluxnetes.devcluster import addons as addon_defs

    reason = k8s_missing_reason()
    if reason:
        if os.environ.get("FLUXNETES_REQUIRE_K8S") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    wanted = names if names is not None else addon_defs.WORKLOAD_ADDONS
    absent = addon_defs.missing(wanted)
    if absent:
        msg = addon_defs.missing_message(wanted, absent)
        if os.environ.get("FLUXNETES_REQUIRE_ADDONS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    c = Cluster.up(ClusterOptions(nodes=nodes, dir=tmp_path_factory.mktemp(label), die_with_parent=True,
                                  timed_pods=timed_pods, addons=wanted))
    try:
        yield c
    finally:
        c.down()
