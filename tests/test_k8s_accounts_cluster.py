"""Fair share against the real kube-apiserver: the FluxAccount CRD (installed from deploy/crds,
as the chart ships it) refuses bad accounts by its OpenAPI rules; examples/accounts.yaml is
accepted; the operator's FairShareBook reads the accounts and namespaces from the cluster,
publishes each account's status, and `kubectl fluxnetes accounts` shows it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fluxnetes.cli.ctl import build
from fluxnetes.k8s.fairshare.fairshare_book import FairShareBook
from fluxnetes.queue.job import QueuedJob
from fluxnetes.queue.priority import FairShareConfig
from fluxnetes.queue.usage import Resources

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "accounts.yaml"
HOUR = 3600

pytestmark = pytest.mark.k8s


@dataclass
class Spec:
    totals: dict[str, int] = field(default_factory=dict)


def job(job_id: str, cores: int = 1, submit: int = 0) -> QueuedJob:
    return QueuedJob(id=job_id, jobspec=Spec({"core": cores}), submit_time=submit)


@pytest.fixture(scope="module")
def accounts_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session cluster with both CRDs and examples/accounts.yaml applied (removed after)."""
    cluster = request.getfixturevalue("k8s_cluster")
    for crd in ("fluxjobs.fluxnetes.io", "fluxaccounts.fluxnetes.io"):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "deploy/crds" / f"{crd}.yaml"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}")
    cluster.kubectl("apply", "-f", str(EXAMPLE))
    try:
        yield cluster
    finally:
        cluster.kubectl("delete", "-f", str(EXAMPLE), "--wait=false", check=False)


BAD = [
    ({"name": "bad-shares"}, {"shares": 0}, "spec.shares"),
    ({"name": "root"}, {}, "'root' is the implicit top of the account tree"),
    ({"name": "bad-limit"}, {"limits": {"maxRunningCores": -1}}, "spec.limits.maxRunningCores"),
    ({"name": "bad-self"}, {"parent": "bad-self"}, "an account cannot be its own parent"),
]


@pytest.mark.parametrize(("meta", "spec", "field_name"), BAD, ids=[b[0]["name"] for b in BAD])
def test_the_crd_refuses_bad_accounts(accounts_cluster: Any, meta: dict[str, Any], spec: dict[str, Any],
                                      field_name: str) -> None:
    obj = {"apiVersion": "fluxnetes.io/v1alpha1", "kind": "FluxAccount", "metadata": meta, "spec": spec}
    res = accounts_cluster.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)
    assert res.returncode != 0 and field_name in res.stderr, res.stderr


def test_accounts_command_shows_what_the_operator_published(accounts_cluster: Any) -> None:
    from fluxnetes.k8s.kube import Kube

    cluster = accounts_cluster
    fluxaccounts = cluster.kubectl_json("get", "fluxaccounts")["items"]
    assert {a["metadata"]["name"] for a in fluxaccounts} >= {"research", "research-ml", "research-sim", "operations"}
    # shares defaulted by the CRD
    assert all(isinstance(a["spec"].get("shares"), int) for a in fluxaccounts)
    namespaces = cluster.kubectl_json("get", "namespaces")["items"]

    # what the operator does: configure from the cluster, record work, publish the status
    book = FairShareBook(FairShareConfig(half_life=HOUR))
    assert book.configure(fluxaccounts, namespaces, 0) == []
    assert book.accounts.namespaces["ml-team"] == "research-ml"
    assert book.accounts.default == "operations"
    book.record_start(job("ml-team/train", 8), 0, Resources(cores=8, gpus=4, nodes=1))
    book.record_start(job("sim-team/run", 2), 0)
    ordered, held = book.arrange([job("ml-team/more", submit=5), job("default/other", submit=6)], HOUR)
    assert held == {} and len(ordered) == 2

    async def publish() -> int:
        kube = await Kube.from_config(str(cluster.kubeconfig))
        try:
            return await book.publish(kube, HOUR)
        finally:
            await kube.close()

    assert asyncio.run(publish()) == len(fluxaccounts)
    assert asyncio.run(publish()) == 0  # nothing changed: nothing written
    want = {r.name: r for r in book.snapshot(HOUR)}

    ctl = build()
    res = CliRunner().invoke(ctl, ["accounts", "-o", "json", "--kubeconfig", str(cluster.kubeconfig)])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert [n for n in rows if n.startswith(("research", "operations"))] == [
        "operations", "research", "research-ml", "research-sim"]
    assert rows["research-ml"]["depth"] == 1 and rows["research-ml"]["parent"] == "research"
    for name in ("research", "research-ml", "research-sim", "operations"):
        assert rows[name]["fairShare"] == pytest.approx(want[name].factor, abs=1e-6), name
        assert rows[name]["usage"] == pytest.approx(want[name].usage, abs=0.1), name
        assert rows[name]["normalizedShares"] == pytest.approx(want[name].shares_norm, abs=1e-6), name
        assert rows[name]["running"] == want[name].running, name
        assert rows[name]["queued"] == want[name].queued, name
        assert rows[name]["error"] == ""
    assert rows["research"]["running"] == 2 and rows["research-ml"]["runningCores"] == 8
    assert rows["research-ml"]["queued"] == 1 and rows["operations"]["queued"] == 1
    assert rows["research-ml"]["namespaces"] == ["ml-team"]
    assert rows["research-ml"]["usage"] > rows["research-sim"]["usage"] > 0

    table = CliRunner().invoke(ctl, ["accounts", "--kubeconfig", str(cluster.kubeconfig)],
                               env={"COLUMNS": "300"})
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert any(line.split()[:1] == ["ACCOUNT"] and "FAIRSHARE" in line for line in lines)
    ml = next(line for line in lines if line.strip().startswith("research-ml"))
    assert line_has(ml, f"{want['research-ml'].factor:.4f}", "8", "gpus<=8,queued<=500", "ml-team")
    assert any(line.strip().startswith("operations (default)") for line in lines)

    # `kubectl get fluxaccounts` shows the published figures in its columns
    got = cluster.kubectl("get", "fluxaccounts", "research-ml").stdout.splitlines()
    assert got[0].split() == ["NAME", "PARENT", "SHARES", "USAGE", "FAIRSHARE", "RUNNING", "QUEUED", "AGE"]
    assert got[1].split()[:3] == ["research-ml", "research", "2"] and got[1].split()[5:7] == ["1", "1"]

    # a refused configuration is written into the FluxAccount it names
    cycle = [{"metadata": {"name": "research"}, "spec": {"parent": "research-sim", "shares": 70}},
             *[a for a in fluxaccounts if a["metadata"]["name"] != "research"]]
    (notice,) = book.configure(cycle, namespaces, HOUR)
    assert "spec.parent: cycle" in notice.message
    post_event(cluster, notice)  # the API server takes it as the controller would post it
    assert asyncio.run(publish()) >= 1
    res = CliRunner().invoke(ctl, ["accounts", "-o", "json", "--kubeconfig", str(cluster.kubeconfig)])
    errors = {r["name"]: r["error"] for r in json.loads(res.output) if r["error"]}
    assert len(errors) == 1 and next(iter(errors.values())).startswith("spec.parent: cycle")


def line_has(line: str, *parts: str) -> bool:
    return all(p in line.split() for p in parts)



def post_event(cluster: Any, notice: Any) -> None:
    """Post a Notice as the controller's ``event()`` does (Events of cluster-scoped objects
    go to "default") and read it back."""
    ns = notice.ref.get("namespace") or "default"
    body = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{notice.ref['name']}.", "namespace": ns},
            "involvedObject": notice.ref, "type": "Warning", "reason": notice.reason, "message": notice.message,
            "source": {"component": "fluxnetes"}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(body))
    events = cluster.kubectl_json("get", "events", "-n", ns,
                                  f"--field-selector=involvedObject.name={notice.ref['name']},reason={notice.reason}")
    assert any(e["message"] == notice.message for e in events["items"])


def test_a_namespace_problem_becomes_an_event_in_that_namespace(accounts_cluster: Any) -> None:
    cluster = accounts_cluster
    cluster.kubectl("label", "namespace", "sim-team", "fluxnetes.io/account=nobody", "--overwrite")
    try:
        book = FairShareBook()
        notices = book.configure(cluster.kubectl_json("get", "fluxaccounts")["items"],
                                 cluster.kubectl_json("get", "namespaces")["items"], 0)
        (notice,) = [n for n in notices if n.ref["name"] == "sim-team"]
        assert "unknown FluxAccount 'nobody'" in notice.message
        assert book.account_of("sim-team/x") == "operations"  # the default account
        post_event(cluster, notice)
    finally:
        cluster.kubectl("label", "namespace", "sim-team", "fluxnetes.io/account=research-sim", "--overwrite")
