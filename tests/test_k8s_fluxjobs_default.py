"""The default ``--fluxjobs waiting`` on the real control plane (issue 31): a Job placed at
once gets no FluxJob, and its user still sees it (its pods, their Events, `kubectl fluxnetes
queue / explain / nodes`); a Job that waits gets one, with its expected start, and keeps it.

The operator runs with ``--status-interval 10`` so that "placed at once" (before its first
status write is due) holds on a slow, busy machine. No sleeps: a group's write comes due in
the order the groups changed, so once the FluxJob of the Job that arrived last exists, the
groups before it had their turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from fluxnetes.cli.ctl import build
from k8s_helpers import Operator, namespace, operator_session
from test_k8s_operator import apply, fluxjob_or_none, job, job_complete, phase, pod, pods, wait

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def op(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    # (no --fluxjobs: the default is what is tested)
    with operator_session(k8s_cluster, tmp_path_factory, "operator-fj-default", "--status-interval", "10") as o:
        yield o


@pytest.fixture
def ns(k8s_cluster: Any, op: Operator) -> Iterator[str]:
    with namespace(k8s_cluster) as name:
        yield name


def ctl(cluster: Any, *args: str) -> str:
    res = CliRunner().invoke(build(), [*args, "--kubeconfig", str(cluster.kubeconfig)])
    assert res.exit_code == 0, res.output
    return str(res.stdout)


def test_only_the_job_that_waits_gets_a_fluxjob(k8s_cluster: Any, ns: str, op: Operator) -> None:
    # placed at once, completes (kwok completes a Job's pods at once)
    apply(k8s_cluster, ns, [job("quick", 2, "2")])
    wait("quick complete", lambda: job_complete(k8s_cluster, ns, "quick"))
    # the whole cluster (4 nodes of 16 cpu) for an hour, placed at once: runs without a FluxJob
    hold = {"fluxnetes.io/group": "hold", "fluxnetes.io/group-size": "4"}
    apply(k8s_cluster, ns, [pod(f"hold-{i}", "16", labels=hold, annotations={"fluxnetes.io/duration": "1h"})
                            for i in range(4)])
    wait("hold bound", lambda: len([p for p in pods(k8s_cluster, ns, "fluxnetes.io/group=hold")
                                    if p["spec"].get("nodeName")]) == 4)
    # has to wait for hold: gets its FluxJob, Reserved at hold's end
    late = job("late", 1, "16")
    late["spec"]["activeDeadlineSeconds"] = 60
    apply(k8s_cluster, ns, [late])

    def reserved() -> dict[str, Any] | None:
        fj = fluxjob_or_none(k8s_cluster, ns, "job-late")
        st = (fj or {}).get("status") or {}
        return st if st.get("phase") == "Reserved" and st.get("expectedStart") else None

    st = wait("job-late Reserved with its expected start", reserved, timeout=90)
    # quick and hold arrived before late: their first status writes were due before its, and
    # placed at once they got none
    names = [f["metadata"]["name"] for f in k8s_cluster.kubectl_json("get", "fluxjobs", "-n", ns)["items"]]
    assert names == ["job-late"]
    # still answered for, from the pods: the Job's pods say where they ran, kube-scheduler's
    # Events that they were bound there
    quick = pods(k8s_cluster, ns, "job-name=quick")
    assert len(quick) == 2 and all(p["metadata"]["annotations"]["fluxnetes.io/fluxjob"] == "job-quick"
                                   and p["status"]["phase"] == "Succeeded" for p in quick)
    events = k8s_cluster.kubectl_json("get", "events", "-n", ns)["items"]
    scheduled = {e["involvedObject"]["name"] for e in events if e["reason"] == "Scheduled"}
    assert {p["metadata"]["name"] for p in quick} <= scheduled
    # the groups' own Events name what exists, never a FluxJob they do not have: the Job, with
    # its uid (so `kubectl describe job` lists them), and for a label group its first pod
    ours = [e for e in events if "fluxnetes" in (e.get("reportingComponent"), (e.get("source") or {}).get("component"))]
    assert not [e["involvedObject"] for e in ours if e["involvedObject"].get("kind") == "FluxJob"
                and e["involvedObject"].get("name") in ("job-quick", "hold")]
    quick_uid = k8s_cluster.kubectl_json("get", "job", "-n", ns, "quick")["metadata"]["uid"]
    assert "Allocated" in {e["reason"] for e in ours if e["involvedObject"].get("uid") == quick_uid}, ours
    assert "Allocated" in k8s_cluster.kubectl("describe", "job", "-n", ns, "quick").stdout
    assert "Allocated" in k8s_cluster.kubectl("describe", "pod", "-n", ns, "hold-0").stdout
    info = json.loads(ctl(k8s_cluster, "explain", f"{ns}/job-quick", "-o", "json"))
    assert (info["state"], info["fluxJob"], info["size"]) == ("Completed", False, 2)
    assert info["workloads"] == [{"kind": "Job", "name": "quick"}]
    assert "Completed (no FluxJob)" in ctl(k8s_cluster, "explain", "quick", "-n", ns)  # by the Job's own name
    info = json.loads(ctl(k8s_cluster, "explain", f"{ns}/hold", "-o", "json"))
    assert (info["state"], info["fluxJob"], info["size"], len(info["nodes"])) == ("Running", False, 4, 4)
    rows = json.loads(ctl(k8s_cluster, "queue", "-n", ns, "-o", "json"))
    assert [(r["name"], r["state"], r.get("fluxJob", True)) for r in rows] == [
        ("hold", "Running", False), ("job-late", "Reserved", True)]
    assert rows[1]["expectedStart"] == st["expectedStart"]
    done = json.loads(ctl(k8s_cluster, "queue", "-n", ns, "--all", "-o", "json"))
    assert ("job-quick", "Completed", False) in [(r["name"], r["state"], r.get("fluxJob", True)) for r in done]
    # every node is charged with hold's pod, and agrees with what is bound
    nodes = json.loads(ctl(k8s_cluster, "nodes", "-o", "json"))
    ours = [r for r in nodes if r["node"] in info["nodes"]]
    assert len(ours) == 4 and all(r["coresUsed"] >= 16 and r["agrees"] == "yes" for r in ours), ours
    # once hold is gone, late runs and keeps its FluxJob
    k8s_cluster.kubectl("delete", "pod", "-n", ns, "-l", "fluxnetes.io/group=hold")
    wait("late complete", lambda: job_complete(k8s_cluster, ns, "late"), timeout=90)
    wait("job-late's FluxJob Completed", lambda: phase(k8s_cluster, ns, "job-late") == "Completed", timeout=60)
