"""The operator against the real control plane (kube-apiserver, KCM, kube-scheduler, kwok nodes).

The dev cluster (tests/conftest.py) has 4 nodes kwok-node-0..3 with 16 cpu, 64Gi, 4 GPUs.
kwok runs bound pods at once and completes pods owned by Jobs at once; other pods run until
deleted. The operator runs as a subprocess (``python -m fluxnetes.k8s run``), like a user runs it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.k8s

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "k8s"
OP_NS = "fluxnetes-test"


# The tests written for the affinity placement and suspended Jobs (they check gates, node
# affinities, suspended Jobs) keep those modes; the default (auto/auto, k8s/admission/hold.py and
# admission.suspends) is tested end to end by tests/test_k8s_auto_mode.py, the chaos soak and
# the chart/image tests.
PINNED_MODES = ("--placement", "affinity", "--job-mode", "suspend")


class OperatorProc:
    def __init__(self, cluster: Any, log_dir: Path) -> None:
        self.cluster, self.log_dir = cluster, log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, *extra: str) -> None:
        self.starts += 1
        log = self.log_dir / f"operator-{self.starts}.log"
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fluxnetes.k8s",
                "run",
                "--kubeconfig",
                str(self.cluster.kubeconfig),
                "--webhook-port",
                "0",
                "--namespace",
                OP_NS,
                *PINNED_MODES,  # before ``extra``: a test's own --placement/--job-mode wins
                *extra,
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "operator ready" in log.read_text():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"operator did not start:\n{log.read_text()[-3000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def operator(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProc]:
    op = OperatorProc(k8s_cluster, tmp_path_factory.mktemp("operator"))
    op.start()
    try:
        yield op
    finally:
        op.kill(signal.SIGTERM)
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            k8s_cluster.kubectl("delete", kind, "fluxnetes.io", "--ignore-not-found", check=False)
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            k8s_cluster.kubectl("delete", kind, "fluxnetes.io-gate", "--ignore-not-found", check=False)
        k8s_cluster.kubectl(
            "delete",
            "namespace",
            "fluxnetes-probe",
            "--ignore-not-found",
            "--wait=false",
            check=False,
        )


@contextmanager
def namespace(cluster: Any) -> Iterator[str]:
    """A fresh namespace opted in to fluxnetes, deleted (and waited for) afterwards."""
    name = f"fx-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "fluxnetes.io/enabled=true")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=true", timeout=120, check=False)


@pytest.fixture
def ns(k8s_cluster: Any, operator: OperatorProc) -> Iterator[str]:
    with namespace(k8s_cluster) as name:
        yield name


def wait(what: str, cond: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except Exception as exc:  # object not there yet
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def apply(cluster: Any, ns: str, docs: str | list[dict[str, Any]], check: bool = True) -> Any:
    if isinstance(docs, list):
        # JSON, not YAML: the API server's YAML reads an unquoted "123e45" as a number.
        return cluster.kubectl("apply", "-n", ns, "-f", "-", check=check,
                               input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    docs = docs.replace("namespace: flux-demo", f"namespace: {ns}")
    return cluster.kubectl("apply", "-n", ns, "-f", "-", input=docs, check=check)


def example(name: str) -> str:
    return (EXAMPLES / name).read_text()


def pods(cluster: Any, ns: str, selector: str | None = None) -> list[dict[str, Any]]:
    args = ["get", "pods", "-n", ns]
    if selector:
        args += ["-l", selector]
    return list(cluster.kubectl_json(*args)["items"])


def fluxjob(cluster: Any, ns: str, name: str) -> dict[str, Any]:
    return dict(cluster.kubectl_json("get", "fluxjob", "-n", ns, name))


def fluxjob_or_none(cluster: Any, ns: str, name: str) -> dict[str, Any] | None:
    got = cluster.kubectl("get", "fluxjob", "-n", ns, name, "-o", "json", "--ignore-not-found").stdout
    return dict(json.loads(got)) if got.strip() else None


def fluxjob_phase(cluster: Any, ns: str, name: str) -> str:
    """The phase its FluxJob says, "" while it has none (the tests that run --fluxjobs all and
    read the FluxJob next: ``phase`` may answer from the pods before it is written)."""
    return str(((fluxjob_or_none(cluster, ns, name) or {}).get("status") or {}).get("phase", ""))


def placed_for(cluster: Any, ns: str, name: str) -> list[dict[str, Any]]:
    """The bound pods (running or finished) fluxnetes placed for group ``name``."""
    from fluxnetes.cli.ctl.unrecorded import group_pods

    return [dict(p) for p in group_pods(pods(cluster, ns), ns, name, include_finished=True)]


def phase(cluster: Any, ns: str, name: str) -> str:
    """The group's state as its user sees it: its FluxJob's phase; for a group placed at once,
    which has none in the default mode (``--fluxjobs waiting``), what its placed pods say
    (Running, then Completed or Failed once all have finished), as `kubectl fluxnetes explain`
    does; "" while neither exists."""
    from fluxnetes.cli.ctl.unrecorded import state_of

    fj = fluxjob_or_none(cluster, ns, name)
    if fj is not None:
        return str((fj.get("status") or {}).get("phase", ""))
    members = placed_for(cluster, ns, name)
    return state_of(members) if members else ""


def slot_nodes(cluster: Any, ns: str, name: str) -> list[str]:
    """Each slot's node in the group's allocation: its FluxJob's ``status.nodes``; without a
    FluxJob (placed at once, default mode), the allocation its placed pods carry (the
    ``fluxnetes.io/allocation`` note of a multi-pod group; a lone pod's own node)."""
    from fluxnetes.k8s.scheduling.allocation_note import decode

    fj = fluxjob_or_none(cluster, ns, name)
    if fj is not None:
        return list((fj.get("status") or {}).get("nodes") or [])
    members = placed_for(cluster, ns, name)
    for p in members:
        note = (p["metadata"].get("annotations") or {}).get("fluxnetes.io/allocation")
        placed = decode(note) if note else None
        if placed is not None:
            return list(placed.slots)
    by_slot = sorted(members, key=lambda p: int((p["metadata"].get("annotations") or {}).get("fluxnetes.io/slot", 0)))
    return [p["spec"]["nodeName"] for p in by_slot]


def pod(
    name: str,
    cpu: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    ns: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
    if ns:
        meta["namespace"] = ns
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def job(name: str, size: int, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": size,
            "completions": size,
            "completionMode": "Indexed",
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
                    ],
                }
            },
        },
    }


def job_complete(cluster: Any, ns: str, name: str) -> bool:
    j = cluster.kubectl_json("get", "job", "-n", ns, name)
    return any(
        c["type"] == "Complete" and c["status"] == "True"
        for c in j.get("status", {}).get("conditions", [])
    )


def on_chosen_nodes(cluster: Any, ns: str, group: str, pod_list: list[dict[str, Any]]) -> set[str]:
    """Every pod sits on the node the group's allocation gives for its slot (its FluxJob's
    status, or without one the note its pods carry: ``slot_nodes``)."""
    chosen = slot_nodes(cluster, ns, group)
    used = set()
    for p in pod_list:
        ann = p["metadata"].get("annotations") or {}
        assert ann.get("fluxnetes.io/fluxjob") == group, p["metadata"]["name"]
        slot = int(ann["fluxnetes.io/slot"])
        assert p["spec"]["nodeName"] == chosen[slot], (p["metadata"]["name"], chosen)
        used.add(p["spec"]["nodeName"])
    return used


# ------------------------------------------------------------------------------------------------


def test_job_of_four_is_gated_placed_completed_and_released(k8s_cluster: Any, ns: str) -> None:
    """The milestone: suspended, allocated, placed on the matcher's nodes, completes, released."""
    apply(k8s_cluster, ns, example("job.yaml"))
    j = k8s_cluster.kubectl_json("get", "job", "-n", ns, "job")
    tmpl = j["spec"]["template"]
    assert tmpl["spec"]["schedulingGates"] == [{"name": "fluxnetes.io/gate"}]
    wait("job complete", lambda: job_complete(k8s_cluster, ns, "job"))
    wait("FluxJob Completed", lambda: phase(k8s_cluster, ns, "job-job") == "Completed")
    ps = pods(k8s_cluster, ns, "job-name=job")
    assert len(ps) == 4
    on_chosen_nodes(k8s_cluster, ns, "job-job", ps)
    # released: a job that needs the whole cluster (4 x 16 cpu) runs right after
    apply(k8s_cluster, ns, [job("whole", 4, "16")])
    wait("whole-cluster job complete", lambda: job_complete(k8s_cluster, ns, "whole"))
    used = on_chosen_nodes(k8s_cluster, ns, "job-whole", pods(k8s_cluster, ns, "job-name=whole"))
    assert len(used) == 4
    # (a FluxJob only if it had to wait for the first Job's release: the default --fluxjobs waiting)
    wait("whole Completed", lambda: phase(k8s_cluster, ns, "job-whole") == "Completed")


def test_workloads_naming_fluxnetes_are_placed_with_or_without_the_webhook(
        k8s_cluster: Any, ns: str) -> None:
    """schedulerName: fluxnetes (as a Volcano or Fluence user writes it) opts a workload in:
    in a namespace without the label no webhook sees it and the operator still queues and
    binds it; in an opted-in one the webhook checks and labels it (it used to leave such pods
    alone as another scheduler's, and nobody placed them)."""
    bare = pod("named", "2")
    bare["spec"]["schedulerName"] = "fluxnetes"
    apply(k8s_cluster, ns, [bare])
    got = wait("named pod bound", lambda: [p for p in pods(k8s_cluster, ns) if p["spec"].get("nodeName")])
    assert got[0]["metadata"]["labels"]["fluxnetes.io/managed"] == "true"
    wait("FluxJob Running", lambda: phase(k8s_cluster, ns, "pod-named") == "Running")
    on_chosen_nodes(k8s_cluster, ns, "pod-named", got)
    plain = f"plain-{uuid.uuid4().hex[:6]}"
    k8s_cluster.kubectl("create", "namespace", plain)
    try:
        j = job("gang", 3, "4")
        j["spec"]["template"]["spec"]["schedulerName"] = "fluxnetes"
        apply(k8s_cluster, plain, [j])
        wait("job complete", lambda: job_complete(k8s_cluster, plain, "gang"))
        wait("FluxJob Completed", lambda: phase(k8s_cluster, plain, "job-gang") == "Completed")
        ps = pods(k8s_cluster, plain, "job-name=gang")
        assert len(ps) == 3 and not any("fluxnetes.io/managed" in (p["metadata"].get("labels") or {})
                                        for p in ps)  # no webhook saw them
        on_chosen_nodes(k8s_cluster, plain, "job-gang", ps)
    finally:
        k8s_cluster.kubectl("delete", "namespace", plain, "--wait=true", timeout=120, check=False)


def test_examples_reach_running_on_chosen_nodes(k8s_cluster: Any, ns: str) -> None:
    for name in ("pod.yaml", "deployment.yaml", "statefulset.yaml", "pod-group.yaml"):
        apply(k8s_cluster, ns, example(name))
    for f in sorted((EXAMPLES / "batch").glob("*.yaml")):
        apply(k8s_cluster, ns, f.read_text())

    def all_running() -> bool:
        ps = [p for p in pods(k8s_cluster, ns) if "job-name" not in p["metadata"].get("labels", {})]
        return len(ps) == 1 + 3 + 2 + 2 and all(p["status"].get("phase") == "Running" for p in ps)

    wait("pods running", all_running)
    for n in (1, 2, 3, 4, 6):
        wait(f"batch-{n} complete", lambda n=n: job_complete(k8s_cluster, ns, f"batch-{n}"))
    # the groups, as their placed pods name them (a group placed at once has no FluxJob in the
    # default mode, --fluxjobs waiting; one that waited has, and its size is checked)
    fluxjobs = {fj["metadata"]["name"]: fj for fj in k8s_cluster.kubectl_json("get", "fluxjobs", "-n", ns)["items"]}
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in pods(k8s_cluster, ns):
        name = (p["metadata"].get("annotations") or {}).get("fluxnetes.io/fluxjob")
        if name and p["spec"].get("nodeName"):
            groups.setdefault(name, []).append(p)
    for name, members in groups.items():
        if name in fluxjobs:
            assert len(members) == fluxjobs[name]["spec"]["size"], name
        on_chosen_nodes(k8s_cluster, ns, name, members)
    assert phase(k8s_cluster, ns, "pod-pod") == "Running"
    assert phase(k8s_cluster, ns, "statefulset-db") == "Running"
    assert any(n.startswith("replicaset-web-") for n in groups)


def test_gang_of_four_waits_for_a_free_node(k8s_cluster: Any, ns: str) -> None:
    apply(k8s_cluster, ns, [pod("blocker", "16")])
    wait("blocker running", lambda: pods(k8s_cluster, ns)[0]["status"].get("phase") == "Running")
    apply(k8s_cluster, ns, [job("gang", 4, "16")])
    wait("gang queued", lambda: phase(k8s_cluster, ns, "job-gang") in ("Pending", "Reserved"))
    time.sleep(3)
    j = k8s_cluster.kubectl_json("get", "job", "-n", ns, "gang")
    assert j["spec"]["suspend"] is True
    assert pods(k8s_cluster, ns, "job-name=gang") == []
    k8s_cluster.kubectl("delete", "pod", "-n", ns, "blocker")
    wait("gang complete", lambda: job_complete(k8s_cluster, ns, "gang"))
    used = on_chosen_nodes(k8s_cluster, ns, "job-gang", pods(k8s_cluster, ns, "job-name=gang"))
    assert len(used) == 4
    # only the operator writes FluxJobs: each patch asks the API server to keep no managed
    # fields for them (fluxjob.write_meta; a create still records its writer)
    wait("FluxJob Completed", lambda: phase(k8s_cluster, ns, "job-gang") == "Completed")
    fj = k8s_cluster.kubectl_json("get", "fluxjob", "-n", ns, "job-gang", "--show-managed-fields")
    assert "managedFields" not in fj["metadata"], fj["metadata"].get("managedFields")


def test_node_exclusive_puts_each_pod_on_its_own_node(k8s_cluster: Any, ns: str) -> None:
    labels = {"fluxnetes.io/group": "ex", "fluxnetes.io/group-size": "3"}
    apply(
        k8s_cluster,
        ns,
        [
            pod(f"ex-{i}", "1", labels=labels, annotations={"fluxnetes.io/exclusive": "true"})
            for i in range(3)
        ],
    )
    wait("exclusive group running", lambda: phase(k8s_cluster, ns, "ex") == "Running")
    ps = wait(
        "bound",
        lambda: (
            [p for p in pods(k8s_cluster, ns, "fluxnetes.io/group=ex") if p["spec"].get("nodeName")]
            if all(
                p["spec"].get("nodeName") for p in pods(k8s_cluster, ns, "fluxnetes.io/group=ex")
            )
            else None
        ),
    )
    assert len({p["spec"]["nodeName"] for p in ps}) == 3
    # without exclusivity, lonode packs the same group onto one node
    labels2 = {"fluxnetes.io/group": "packed", "fluxnetes.io/group-size": "3"}
    apply(k8s_cluster, ns, [pod(f"pk-{i}", "1", labels=labels2) for i in range(3)])
    wait("packed running", lambda: phase(k8s_cluster, ns, "packed") == "Running")
    assert len(set(slot_nodes(k8s_cluster, ns, "packed"))) == 1


def test_backfill_runs_short_job_and_shows_expected_start(k8s_cluster: Any, ns: str) -> None:
    hold = {"fluxnetes.io/group": "hold", "fluxnetes.io/group-size": "3"}
    apply(
        k8s_cluster,
        ns,
        [
            pod(f"hold-{i}", "16", labels=hold, annotations={"fluxnetes.io/duration": "1h"})
            for i in range(3)
        ],
    )
    wait("hold running", lambda: phase(k8s_cluster, ns, "hold") == "Running")
    big = {"fluxnetes.io/group": "big", "fluxnetes.io/group-size": "4"}
    apply(
        k8s_cluster,
        ns,
        [
            pod(f"big-{i}", "16", labels=big, annotations={"fluxnetes.io/duration": "1h"})
            for i in range(4)
        ],
    )
    before = time.time()
    wait("big reserved", lambda: phase(k8s_cluster, ns, "big") == "Reserved")
    st = fluxjob(k8s_cluster, ns, "big")["status"]
    from datetime import datetime

    expected = datetime.fromisoformat(st["expectedStart"].replace("Z", "+00:00")).timestamp()
    assert before + 3000 < expected < before + 3700
    apply(k8s_cluster, ns, [pod("short", "16", annotations={"fluxnetes.io/duration": "60"})])
    wait("short runs ahead", lambda: phase(k8s_cluster, ns, "pod-short") == "Running")
    st2 = fluxjob(k8s_cluster, ns, "big")["status"]
    assert st2["phase"] == "Reserved" and st2["expectedStart"] == st["expectedStart"]
    # a long job that would delay the reservation does not backfill
    k8s_cluster.kubectl("delete", "pod", "-n", ns, "short")
    apply(k8s_cluster, ns, [pod("long", "16", annotations={"fluxnetes.io/duration": "2h"})])
    wait("long queued", lambda: phase(k8s_cluster, ns, "pod-long") in ("Pending", "Reserved"))
    time.sleep(2)
    assert phase(k8s_cluster, ns, "pod-long") in ("Pending", "Reserved")


def test_default_scheduler_pods_reduce_and_return_capacity(k8s_cluster: Any, ns: str) -> None:
    other = f"{ns}-other"  # not opted in: the default scheduler's pods
    k8s_cluster.kubectl("create", "namespace", other)
    try:
        apply(
            k8s_cluster,
            other,
            [pod(f"f-{i}", "12", node=f"kwok-node-{i}", ns=other) for i in range(4)],
        )
        wait(
            "foreign pods running",
            lambda: (
                all(p["status"].get("phase") == "Running" for p in pods(k8s_cluster, other))
                and len(pods(k8s_cluster, other)) == 4
            ),
        )
        apply(k8s_cluster, ns, [pod("mine", "8")])
        wait("mine queued", lambda: phase(k8s_cluster, ns, "pod-mine") in ("Pending", "Reserved"))
        time.sleep(2)
        assert phase(k8s_cluster, ns, "pod-mine") in ("Pending", "Reserved")
        k8s_cluster.kubectl("delete", "pod", "-n", other, "f-2")
        wait(
            "mine runs where capacity came back",
            lambda: phase(k8s_cluster, ns, "pod-mine") == "Running",
        )
        assert fluxjob(k8s_cluster, ns, "pod-mine")["status"]["nodes"] == ["kwok-node-2"]
    finally:
        k8s_cluster.kubectl("delete", "namespace", other, "--wait=true", timeout=120, check=False)


def test_bad_input_is_reported_and_other_work_goes_on(k8s_cluster: Any, ns: str) -> None:
    messages = {
        "group-size-zero.yaml": "group size must be at least 1",
        "malformed-group.yaml": "group size must be a positive integer",
        "bad-jobspec.yaml": "fluxnetes.io/jobspec",
        "bad-duration.yaml": "fluxnetes.io/duration",
    }
    for name, text in messages.items():
        res = apply(k8s_cluster, ns, example(f"bad/{name}"), check=False)
        assert res.returncode != 0 and text in res.stderr, (name, res.stderr)
    apply(k8s_cluster, ns, example("bad/too-many-gpus.yaml"))
    apply(k8s_cluster, ns, example("bad/group-too-large.yaml"))
    wait("greedy unsatisfiable", lambda: phase(k8s_cluster, ns, "pod-greedy") == "Unsatisfiable")
    assert "gpu" in fluxjob(k8s_cluster, ns, "pod-greedy")["status"]["reason"]
    wait(
        "too-large unsatisfiable",
        lambda: phase(k8s_cluster, ns, "job-too-large") == "Unsatisfiable",
    )
    events = k8s_cluster.kubectl_json("get", "events", "-n", ns)["items"]
    assert any(
        e["reason"] == "Unsatisfiable" and e["involvedObject"]["name"] == "greedy" for e in events
    )
    apply(k8s_cluster, ns, example("pod.yaml"))
    wait("good pod runs", lambda: phase(k8s_cluster, ns, "pod-pod") == "Running")


def test_only_the_operator_removes_the_gate(k8s_cluster: Any, ns: str) -> None:
    k8s_cluster.kubectl(
        "create", "rolebinding", "mallory-edit", "-n", ns, "--clusterrole=edit", "--user=mallory"
    )
    labels = {"fluxnetes.io/group": "two", "fluxnetes.io/group-size": "2"}
    apply(k8s_cluster, ns, [pod("lonely", "1", labels=labels)])
    res = k8s_cluster.kubectl(
        "patch",
        "pod",
        "lonely",
        "-n",
        ns,
        "--as=mallory",
        "--type=json",
        "-p",
        json.dumps([{"op": "remove", "path": "/spec/schedulingGates/0"}]),
        check=False,
    )
    assert res.returncode != 0 and "fluxnetes.io/gate" in res.stderr
    # FluxJob statuses are written status_interval (1 s) after a change
    wait("FluxJob Provisional", lambda: phase(k8s_cluster, ns, "two") == "Provisional", timeout=20)


def test_restart_after_sigkill_recovers_without_double_booking(
    k8s_cluster: Any, ns: str, operator: OperatorProc
) -> None:
    hold = {"fluxnetes.io/group": "hold", "fluxnetes.io/group-size": "2"}
    apply(k8s_cluster, ns, [pod(f"hold-{i}", "16", labels=hold) for i in range(2)])
    wait("hold running", lambda: phase(k8s_cluster, ns, "hold") == "Running")
    before = slot_nodes(k8s_cluster, ns, "hold")  # (from its pods: placed at once, it has no FluxJob)
    operator.kill(signal.SIGKILL)
    # work submitted while the operator is down is not lost
    wide = {"fluxnetes.io/group": "wide", "fluxnetes.io/group-size": "3"}
    operator.start()
    apply(k8s_cluster, ns, [pod(f"wide-{i}", "16", labels=wide) for i in range(3)])
    wait("wide queued", lambda: phase(k8s_cluster, ns, "wide") in ("Pending", "Reserved"))
    assert phase(k8s_cluster, ns, "hold") == "Running" and slot_nodes(k8s_cluster, ns, "hold") == before
    time.sleep(3)
    assert phase(k8s_cluster, ns, "wide") in (
        "Pending",
        "Reserved",
    )  # only 2 nodes free: no double booking
    k8s_cluster.kubectl("delete", "pod", "-n", ns, "hold-0", "hold-1")
    wait("wide runs once hold is gone", lambda: phase(k8s_cluster, ns, "wide") == "Running")
    assert len(set(fluxjob(k8s_cluster, ns, "wide")["status"]["nodes"])) == 3


def test_node_added_used_and_removed_fails_its_groups(k8s_cluster: Any, ns: str) -> None:
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "kwok-extra-0",
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": "kwok-extra-0", "type": "kwok",
                                    "topology.kubernetes.io/zone": "zone-9", "fluxnetes.io/rack": "rack-9"}},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                       "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}
    k8s_cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
    try:
        wait("extra node ready", lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in k8s_cluster.kubectl_json("get", "node", "kwok-extra-0")["status"].get("conditions", [])))
        apply(k8s_cluster, ns, [pod("wide", "40")])  # only the new node can hold it
        wait("wide runs on the new node", lambda: phase(k8s_cluster, ns, "pod-wide") == "Running")
        assert slot_nodes(k8s_cluster, ns, "pod-wide") == ["kwok-extra-0"]
        # a cordoned node takes nothing new
        k8s_cluster.kubectl("cordon", "kwok-node-0")
        try:
            apply(k8s_cluster, ns, [pod("small", "1")])
            wait("small runs", lambda: phase(k8s_cluster, ns, "pod-small") == "Running")
            assert slot_nodes(k8s_cluster, ns, "pod-small") != ["kwok-node-0"]
        finally:
            k8s_cluster.kubectl("uncordon", "kwok-node-0")
        k8s_cluster.kubectl("delete", "node", "kwok-extra-0")
        wait("wide failed", lambda: fluxjob_phase(k8s_cluster, ns, "pod-wide") == "Failed")  # (failed: it gets one)
        assert "kwok-extra-0" in fluxjob(k8s_cluster, ns, "pod-wide")["status"]["reason"]
    finally:
        k8s_cluster.kubectl("delete", "node", "kwok-extra-0", "--ignore-not-found", check=False)


def test_two_replicas_only_the_leader_schedules(k8s_cluster: Any, ns: str, operator: OperatorProc,
                                               tmp_path: Path) -> None:
    standby = OperatorProc(k8s_cluster, tmp_path)
    standby.starts = 100
    log = tmp_path / "standby.log"
    standby.proc = subprocess.Popen(
        [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(k8s_cluster.kubeconfig),
         "--webhook-port", "0", "--namespace", OP_NS], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait("standby serving its webhook", lambda: "webhook serving" in log.read_text())
        time.sleep(3)
        assert "operator ready" not in log.read_text()  # not the leader: watches nothing
        operator.kill(signal.SIGKILL)
        wait("standby takes over", lambda: "operator ready" in log.read_text(), timeout=60)
        apply(k8s_cluster, ns, [pod("after-failover", "1")])
        wait("scheduled by the new leader", lambda: phase(k8s_cluster, ns, "pod-after-failover") == "Running")
    finally:
        standby.kill(signal.SIGTERM)
        operator.start()


def test_restart_while_jobs_flow_completes_each_job_once(k8s_cluster: Any, ns: str,
                                                          operator: OperatorProc, tmp_path: Path) -> None:
    """With a store (the queue's memory): SIGKILL while jobs flow; afterwards every job ran
    once, nothing was ever overbooked, and the store holds every job exactly once, completed,
    with no allocation left."""
    import threading

    url = f"sqlite:///{tmp_path / 'flow.db'}"
    operator.kill(signal.SIGTERM)
    # failurePolicy Ignore (the default is Fail, which refuses the Jobs below while the
    # operator is down; tests/test_k8s_outage.py covers that): they run unmanaged, counted as
    # foreign pods, and must still never be overbooked nor run twice
    operator.start("--store", url, "--failure-policy", "Ignore")

    nodes = {n["metadata"]["name"]: n for n in k8s_cluster.kubectl_json("get", "nodes")["items"]}
    from fluxnetes.k8s.resources import node_allocatable, pod_request

    violations: list[str] = []
    stop = threading.Event()

    def check() -> None:  # continuously: what is bound to a node never exceeds its allocatable
        while not stop.is_set():
            used: dict[str, int] = {}
            for p in k8s_cluster.kubectl_json("get", "pods", "-A")["items"]:
                node = p["spec"].get("nodeName")
                if node and p["status"].get("phase") not in ("Succeeded", "Failed"):
                    used[node] = used.get(node, 0) + pod_request(p["spec"]).cpu_millis
            for node, millis in used.items():
                if node in nodes and millis > node_allocatable(nodes[node]).cpu_millis:
                    violations.append(f"{node}: {millis}m bound")
            time.sleep(0.5)

    checker = threading.Thread(target=check, daemon=True)
    checker.start()
    total = 200
    docs = [job(f"flow-{i}", 1, "4") for i in range(total)]
    try:
        apply(k8s_cluster, ns, docs[:100])
        time.sleep(2)
        operator.kill(signal.SIGKILL)
        apply(k8s_cluster, ns, docs[100:])  # submitted while the operator is down
        operator.start("--store", url, "--failure-policy", "Ignore")

        def all_complete() -> bool:
            jobs = k8s_cluster.kubectl_json("get", "jobs", "-n", ns)["items"]
            return len(jobs) == total and all(
                any(c["type"] == "Complete" and c["status"] == "True" for c in j["status"].get("conditions", []))
                for j in jobs)

        wait("all 200 jobs complete", all_complete, timeout=300, interval=2)
        jobs = k8s_cluster.kubectl_json("get", "jobs", "-n", ns)["items"]
        assert all(j["status"].get("succeeded") == 1 and not j["status"].get("failed") for j in jobs)
        ps = pods(k8s_cluster, ns)
        assert len(ps) == total  # one pod per job: nothing ran twice
        assert violations == []

        from fluxnetes.store import Store

        store = Store(url)
        # jobs created while no webhook answered (failurePolicy Ignore) ran unmanaged, as
        # foreign pods: fluxnetes' queue (and so the store) holds exactly the managed ones
        uids = {j["metadata"]["uid"] for j in jobs
                if (j["spec"]["template"]["metadata"].get("labels") or {}).get("fluxnetes.io/managed") == "true"}
        assert len(uids) >= 100

        def stored() -> list[Any] | None:
            rows = [r for r in store.jobs() if r.namespace == ns]
            return rows if len(rows) >= len(uids) and all(str(r.state) == "completed" for r in rows) else None

        rows = wait("the store to record every job completed", stored, timeout=60, interval=1)
        assert len(rows) == len(uids) and len({r.name for r in rows}) == len(uids)  # each job exactly once
        assert {r.uid for r in rows} == uids
        assert all(r.kind == "Job" and r.start_time is not None and r.end_time is not None for r in rows)
        ids = {r.id for r in rows}
        assert not [a for a in store.allocations() if a.job_id in ids]  # nothing held by ended jobs
        for r in rows:  # every job's history is one legal chain ending in completed
            states = [str(e.to_state) for e in store.events(r.id)]
            assert states[-1] == "completed" and states.count("running") == 1, (r.name, states)
    finally:
        stop.set()
        checker.join(timeout=10)
        operator.kill(signal.SIGTERM)
        operator.start()


def test_store_records_every_decision(k8s_cluster: Any, ns: str, operator: OperatorProc, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fluxnetes.db'}"
    operator.kill(signal.SIGTERM)
    try:
        operator.start("--store", url)
        apply(k8s_cluster, ns, [job("stored", 2, "2")])
        wait("job complete", lambda: job_complete(k8s_cluster, ns, "stored"))
        wait("FluxJob completed", lambda: phase(k8s_cluster, ns, "job-stored") == "Completed")
        from fluxnetes.store import Store

        store = Store(url)

        def recorded() -> Any:
            uid = k8s_cluster.kubectl_json("get", "job", "-n", ns, "stored")["metadata"]["uid"]
            rec = store.find(ns, "job-stored", uid)
            return rec if rec is not None and str(rec.state) == "completed" else None

        rec = wait("store says completed", recorded, timeout=30)
        states = [str(e.to_state) for e in store.events(rec.id)]
        # a Job is a complete group at creation: it enters the store pending (no provisional step)
        assert states == ["pending", "running", "completed"], states
    finally:
        operator.kill(signal.SIGTERM)
        operator.start()


def test_job_mode_gate_places_without_suspending(k8s_cluster: Any, ns: str, operator: OperatorProc) -> None:
    operator.kill(signal.SIGTERM)
    try:
        operator.start("--job-mode", "gate")
        apply(k8s_cluster, ns, [pod("blocker", "16")])
        apply(k8s_cluster, ns, [job("gated", 4, "16")])
        wait("gang queued", lambda: phase(k8s_cluster, ns, "job-gated") in ("Pending", "Reserved"))
        j = k8s_cluster.kubectl_json("get", "job", "-n", ns, "gated")
        assert not j["spec"].get("suspend")
        time.sleep(2)
        gated = pods(k8s_cluster, ns, "job-name=gated")
        assert len(gated) == 4 and not any(p["spec"].get("nodeName") for p in gated)  # created, none started
        k8s_cluster.kubectl("delete", "pod", "-n", ns, "blocker")
        wait("job complete", lambda: job_complete(k8s_cluster, ns, "gated"))
        assert len(on_chosen_nodes(k8s_cluster, ns, "job-gated", pods(k8s_cluster, ns, "job-name=gated"))) == 4
    finally:
        operator.kill(signal.SIGTERM)
        operator.start()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    """/metrics as {'name{labels}': value} (labels as printed by prometheus_client)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _readyz(port: int) -> int:
    import urllib.error
    import urllib.request

    try:
        return int(urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_metrics_and_json_logs_follow_a_job(k8s_cluster: Any, ns: str, operator: OperatorProc) -> None:
    """`fluxnetes run` honours FLUXNETES_METRICS_PORT / FLUXNETES_LOG_FORMAT as the chart sets
    them; after a Job ran, the numbers on /metrics moved and the log lines name the job."""
    import os

    port = _free_port()
    operator.kill(signal.SIGTERM)
    env = {"FLUXNETES_METRICS_PORT": str(port), "FLUXNETES_LOG_FORMAT": "json"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        operator.start()
        # "operator ready" was logged (nodes and pods synced): /readyz follows within a moment
        wait("/readyz", lambda: _readyz(port) == 200, timeout=10, interval=0.2)
        before = _scrape(port)
        apply(k8s_cluster, ns, [job("metered", 2, "2")])
        wait("job complete", lambda: job_complete(k8s_cluster, ns, "metered"))
        wait("FluxJob completed", lambda: phase(k8s_cluster, ns, "job-metered") == "Completed")

        def moved() -> dict[str, float] | None:
            m = _scrape(port)
            done = (m.get("fluxnetes_queue_jobs{state=\"Pending\"}") == 0
                    and m.get("fluxnetes_queue_jobs{state=\"Completed\"}", 0) >= 1
                    and m.get("fluxnetes_releases_total{kind=\"full\"}", 0) >= 1)
            return m if done else None

        after = wait("metrics to settle", moved, timeout=30)
        assert after["fluxnetes_allocations_total"] >= before.get("fluxnetes_allocations_total", 0) + 1
        assert after["fluxnetes_allocated_pods_total"] >= before.get("fluxnetes_allocated_pods_total", 0) + 2
        assert after["fluxnetes_scheduling_cycle_duration_seconds_count"] >= 1
        assert after["fluxnetes_match_duration_seconds_count"] >= 1
        assert after["fluxnetes_match_outcomes_total{outcome=\"allocated\"}"] >= 1
        assert after["fluxnetes_leader"] == 1
        assert after["fluxnetes_nodes{status=\"up\"}"] >= 4
        assert after.get("fluxnetes_webhook_duration_seconds_count{kind=\"Job\",webhook=\"mutate\"}", 0) >= 1
        # the Job's pods were born gated (template mutated) and skipped the pod webhook; a lone pod does not
        pod_key = "fluxnetes_webhook_duration_seconds_count{kind=\"Pod\",webhook=\"mutate\"}"
        apply(k8s_cluster, ns, [pod("lone", "1")])
        wait("the pod webhook's answer time", lambda: _scrape(port).get(pod_key, 0) >= after.get(pod_key, 0) + 1,
             timeout=10)
        lines = [json.loads(line) for line in operator.log.read_text().splitlines() if line.startswith("{")]
        mine = [r for r in lines if r.get("job") == f"{ns}/job-metered"]
        assert mine and all(r["group"] == "job-metered" and r["namespace"] == ns for r in mine)
        assert {r.get("phase") for r in mine} >= {"Pending", "Running", "Completed"}
    finally:
        operator.kill(signal.SIGTERM)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        operator.start()


def test_missing_permission_is_a_clear_error_not_a_hang(k8s_cluster: Any, tmp_path: Path) -> None:
    """An identity without the permissions fluxnetes needs: the operator names the refused
    request and what to grant, and exits (status 2) instead of waiting forever."""
    sa_ns = f"fx-nobody-{uuid.uuid4().hex[:6]}"
    k8s_cluster.kubectl("create", "namespace", sa_ns)
    try:
        k8s_cluster.kubectl("create", "serviceaccount", "nobody", "-n", sa_ns)
        token = k8s_cluster.kubectl("create", "token", "nobody", "-n", sa_ns, "--duration=1h").stdout.strip()
        kc = yaml.safe_load(k8s_cluster.kubeconfig.read_text())
        kc["users"] = [{"name": "nobody", "user": {"token": token}}]
        for ctx in kc["contexts"]:
            ctx["context"]["user"] = "nobody"
        kubeconfig = tmp_path / "nobody.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(kc))
        res = subprocess.run(
            [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(kubeconfig),
             "--webhook-port", "0", "--namespace", OP_NS, "--log-format", "text"],
            capture_output=True, text=True, timeout=120, check=False,
        )
    finally:
        k8s_cluster.kubectl("delete", "namespace", sa_ns, "--wait=false", check=False)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "permission denied" in res.stderr and "RBAC" in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
