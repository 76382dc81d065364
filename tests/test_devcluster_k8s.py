"""The dev cluster is a real Kubernetes: scheduler, controllers, kwok nodes, CRDs, clean teardown.

All tests here need the binaries from hack/build-k8s.sh (marker `k8s`; skipped without them).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from fluxnetes.devcluster import (
    GPU_RESOURCE,
    RACK_LABEL,
    ZONE_LABEL,
    Cluster,
    ClusterError,
    ClusterOptions,
    NodeShape,
    port_open,
    procs,
    toolchain,
)
from helpers import cli_app

pytestmark = pytest.mark.k8s


@pytest.fixture
def namespace(k8s_cluster: Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    k8s_cluster.kubectl("create", "namespace", name)
    yield name
    k8s_cluster.kubectl("delete", "namespace", name, "--wait=false")


def kwok_nodes(cluster: Cluster) -> set[str]:
    items = cluster.kubectl_json("get", "nodes", "-l", "type=kwok")["items"]
    return {n["metadata"]["name"] for n in items}


def test_nodes_have_the_requested_shape_and_topology(k8s_cluster: Cluster) -> None:
    # other tests share the session cluster and may add nodes: look at the fixture's four
    wanted = [f"kwok-node-{i}" for i in range(4)]
    nodes = {
        n["metadata"]["name"]: n for n in k8s_cluster.kubectl_json("get", "nodes", *wanted)["items"]
    }
    assert sorted(nodes) == wanted
    for node in nodes.values():
        assert node["status"]["allocatable"][GPU_RESOURCE] == "4"
        assert node["status"]["capacity"]["cpu"] == "16"
        assert node["status"]["capacity"]["memory"] == "64Gi"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    zones = {
        n: (v["metadata"]["labels"][ZONE_LABEL], v["metadata"]["labels"][RACK_LABEL])
        for n, v in nodes.items()
    }
    assert zones == {
        "kwok-node-0": ("zone-0", "rack-0"),
        "kwok-node-1": ("zone-0", "rack-0"),
        "kwok-node-2": ("zone-1", "rack-1"),
        "kwok-node-3": ("zone-1", "rack-1"),
    }


def test_every_listener_is_on_loopback(k8s_cluster: Cluster) -> None:
    listening: set[int] = set()
    for pid in k8s_cluster.pids.values():
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                assert conn.laddr.ip == "127.0.0.1", (pid, conn)
                listening.add(conn.laddr.port)
    assert set(k8s_cluster.ports.values()) <= listening
    assert k8s_cluster.api_url.startswith("https://127.0.0.1:")


def test_proxy_variables_never_divert_loopback_traffic(
    k8s_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a proxy on a closed loopback port: any request sent through it would fail
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert k8s_cluster.api_get("/version")["gitVersion"].startswith("v1.")
    assert "kwok-node-0" in k8s_cluster.kubectl("get", "nodes", "-o", "name").stdout


def test_deployment_pods_run_on_kwok_nodes_via_default_scheduler(
    k8s_cluster: Cluster, namespace: str
) -> None:
    k = k8s_cluster
    k.kubectl(
        "-n",
        namespace,
        "create",
        "deployment",
        "web",
        "--image=example.invalid/web:1",
        "--replicas=3",
    )
    k.kubectl("-n", namespace, "rollout", "status", "deployment/web", "--timeout=120s", timeout=150)
    pods = k.kubectl_json("-n", namespace, "get", "pods", "-l", "app=web")["items"]
    assert len(pods) == 3
    assert {p["status"]["phase"] for p in pods} == {"Running"}
    assert {p["spec"]["nodeName"] for p in pods} <= kwok_nodes(k)
    assert {p["spec"]["schedulerName"] for p in pods} == {"default-scheduler"}
    events = k.kubectl_json(
        "-n", namespace, "get", "events", "--field-selector", "reason=Scheduled"
    )
    scheduled = {
        e["involvedObject"]["name"]
        for e in events["items"]
        if e.get("reportingComponent") == "default-scheduler"
        or e.get("source", {}).get("component") == "default-scheduler"
    }
    assert scheduled == {p["metadata"]["name"] for p in pods}


def test_job_with_four_completions_completes(k8s_cluster: Cluster, namespace: str) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "four", "namespace": namespace},
        "spec": {
            "completions": 4,
            "parallelism": 2,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": "example.invalid/batch:1",
                            "resources": {"requests": {"cpu": "100m"}},
                        }
                    ],
                }
            },
        },
    }
    k = k8s_cluster
    k.kubectl("apply", "-f", "-", input=json.dumps(job))
    k.kubectl(
        "-n",
        namespace,
        "wait",
        "--for=condition=Complete",
        "job/four",
        "--timeout=120s",
        timeout=150,
    )
    status = k.kubectl_json("-n", namespace, "get", "job", "four")["status"]
    assert status["succeeded"] == 4
    pods = k.kubectl_json("-n", namespace, "get", "pods", "-l", "job-name=four")["items"]
    assert len(pods) == 4
    assert {p["status"]["phase"] for p in pods} == {"Succeeded"}
    assert {p["spec"]["nodeName"] for p in pods} <= kwok_nodes(k)


def test_unschedulable_pod_stays_pending(k8s_cluster: Cluster, namespace: str) -> None:
    # 5 GPUs fit no node (each has 4): the real scheduler must refuse it
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "too-big", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "example.invalid/x:1",
                    "resources": {"limits": {GPU_RESOURCE: "5"}},
                }
            ]
        },
    }
    k = k8s_cluster
    k.kubectl("apply", "-f", "-", input=json.dumps(pod))
    k.kubectl(
        "-n",
        namespace,
        "wait",
        "--for=jsonpath={.status.conditions[?(@.type=='PodScheduled')].reason}=Unschedulable",
        "pod/too-big",
        "--timeout=60s",
        timeout=90,
    )
    got = k.kubectl_json("-n", namespace, "get", "pod", "too-big")
    assert got["status"]["phase"] == "Pending"
    assert not got["spec"].get("nodeName")


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.fluxnetes.io"},
    "spec": {
        "group": "test.fluxnetes.io",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                                "required": ["size"],
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_objects_are_validated_created_and_watched(
    k8s_cluster: Cluster, namespace: str
) -> None:
    from kubernetes_asyncio import client, config, watch

    k = k8s_cluster
    k.kubectl("apply", "-f", "-", input=json.dumps(CRD))
    k.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/widgets.test.fluxnetes.io",
        "--timeout=60s",
        timeout=90,
    )

    def widget(size: object) -> str:
        return json.dumps(
            {
                "apiVersion": "test.fluxnetes.io/v1",
                "kind": "Widget",
                "metadata": {"name": "w1", "namespace": namespace},
                "spec": {"size": size},
            }
        )

    # the real apiserver enforces the CRD's schema
    bad = k.kubectl("apply", "-f", "-", input=widget("big"), check=False)
    assert bad.returncode != 0 and "spec.size" in bad.stderr

    async def run() -> list[tuple[str, int]]:
        api_client = await config.new_client_from_config(config_file=str(k.kubeconfig))
        seen: list[tuple[str, int]] = []
        async with api_client:
            api = client.CustomObjectsApi(api_client)
            w = watch.Watch()

            async def consume() -> None:
                async for ev in w.stream(
                    api.list_namespaced_custom_object,
                    "test.fluxnetes.io",
                    "v1",
                    namespace,
                    "widgets",
                    timeout_seconds=60,
                ):
                    seen.append((ev["type"], ev["object"]["spec"]["size"]))
                    if len(seen) == 2:
                        w.stop()

            task = asyncio.create_task(consume())
            await asyncio.sleep(1.0)  # the watch is open before the object exists
            await asyncio.to_thread(k.kubectl, "apply", "-f", "-", input=widget(3))
            await asyncio.to_thread(
                k.kubectl,
                "-n",
                namespace,
                "patch",
                "widget",
                "w1",
                "--type=merge",
                "-p",
                '{"spec":{"size":5}}',
            )
            await asyncio.wait_for(task, 60)
        return seen

    assert asyncio.run(run()) == [("ADDED", 3), ("MODIFIED", 5)]
    k.kubectl("delete", "crd", "widgets.test.fluxnetes.io", "--wait=false")


# -- lifecycle of a cluster of its own ---------------------------------------------------------
def _cli_app():  # type: ignore[no-untyped-def]
    from fluxnetes.cli import dev_cmd

    return cli_app(dev_cmd)


def test_cli_up_status_down_leaves_no_process_and_no_port(tmp_path: Path) -> None:
    cdir = tmp_path / "c"
    runner = CliRunner()
    res = runner.invoke(
        _cli_app(), ["dev", "cluster", "up", "--nodes", "2", "--gpus", "1", "--dir", str(cdir)]
    )
    try:
        assert res.exit_code == 0, res.output
        assert f"kubeconfig : {cdir / 'kubeconfig'}" in res.output
        cluster = Cluster.attach(cdir)
        records = list(cluster.state.processes)
        ports = cluster.ports
        data_dir = Path(cluster.state.data_dir)
        assert {r.name for r in records} == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        }
        assert all(procs.is_running(r) for r in records)
        assert all(port_open(p) for p in ports.values())
        assert data_dir.is_dir()
        st = runner.invoke(_cli_app(), ["dev", "cluster", "status", "--dir", str(cdir)])
        assert st.exit_code == 0, st.output
        assert "nodes Ready: 2/2" in st.output
        again = runner.invoke(_cli_app(), ["dev", "cluster", "up", "--dir", str(cdir)])
        assert again.exit_code == 1 and "already running" in again.output
    finally:
        down = runner.invoke(_cli_app(), ["dev", "cluster", "down", "--dir", str(cdir)])
    assert down.exit_code == 0, down.output
    for rec in records:
        assert not procs.is_running(rec), rec
        assert (
            not psutil.pid_exists(rec.pid)
            or psutil.Process(rec.pid).status() == psutil.STATUS_ZOMBIE
        )
    assert [p for p in ports.values() if port_open(p)] == []
    assert not data_dir.exists()
    assert not (cdir / "state.json").exists()


def test_failed_start_stops_what_already_runs(tmp_path: Path) -> None:
    real = toolchain()
    home = tmp_path / "k8s"
    (home / "bin").mkdir(parents=True)
    (home / "stages").symlink_to(real.home / "stages")
    for name in ("etcd", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl"):
        (home / "bin" / name).symlink_to(real.binary(name))
    broken = home / "bin" / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'apiserver: cannot start (test)'\nexit 3\n")
    broken.chmod(0o755)
    data_root = tmp_path / "data"
    data_root.mkdir()
    with pytest.raises(ClusterError, match=r"kube-apiserver exited(.|\n)*cannot start \(test\)"):
        Cluster.up(
            ClusterOptions(
                nodes=NodeShape(count=1),
                dir=tmp_path / "c",
                k8s_home=home,
                data_root=data_root,
                timeout=60,
            )
        )
    leftovers = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(str(data_root) in arg for arg in (p.info["cmdline"] or []))
    ]
    assert leftovers == []  # etcd (started first) was stopped
    assert list(data_root.iterdir()) == []
    assert not (tmp_path / "c" / "state.json").exists()
    assert os.listdir(tmp_path / "c" / "logs")  # logs stay for diagnosis


def _job(name: str, annotations: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"template": {
            "metadata": {"annotations": annotations},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "example.invalid/x:1"}]}}},
    }


def _ran(cluster: Cluster, job: str) -> float:
    """Seconds a Job's (first) pod ran: from scheduled to its container's finishedAt."""
    from datetime import datetime

    pod = cluster.kubectl_json("get", "pods", "-l", f"job-name={job}")["items"][0]
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    running = next(c["lastTransitionTime"] for c in pod["status"]["conditions"]
                   if c["type"] == "PodScheduled")
    end = datetime.fromisoformat(term["finishedAt"].replace("Z", "+00:00"))
    return (end - datetime.fromisoformat(running.replace("Z", "+00:00"))).total_seconds()


def test_cli_pod_duration_lets_jobs_run_for_a_while(tmp_path: Path) -> None:
    """Issue #29 item 8: `dev cluster up --pod-duration 8s`: a Job's pod runs 8 s before it
    succeeds (not the instant it starts), and a pod's own annotation overrides it. Measured on
    the pod's own timestamps, so a slow machine only makes the runs longer."""
    from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION

    cdir = tmp_path / "c"
    runner = CliRunner()
    res = runner.invoke(_cli_app(), ["dev", "cluster", "up", "--nodes", "1", "--dir", str(cdir),
                                     "--pod-duration", "8s"])
    try:
        assert res.exit_code == 0, res.output
        assert "Job pods   : run 8 s" in res.output
        cluster = Cluster.attach(cdir)
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_job("default-run", {})))
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_job("own-run", {TIMED_POD_ANNOTATION: "1s"})))
        for name in ("default-run", "own-run"):
            cluster.kubectl("wait", "--for=condition=Complete", f"job/{name}", "--timeout=90s", timeout=100)
        assert _ran(cluster, "default-run") >= 7
        assert _ran(cluster, "own-run") < 7
    finally:
        down = runner.invoke(_cli_app(), ["dev", "cluster", "down", "--dir", str(cdir)])
        assert down.exit_code == 0, down.output


def test_faults_restart_the_apiserver_keeping_etcd_replace_nodes_and_timed_pods(
    tmp_path: Path,
) -> None:
    """What the chaos soak needs: API server restart with every object kept, nodes deleted and
    added, and Job pods that run for the time their annotation says."""
    from datetime import datetime

    from fluxnetes.devcluster.components import TIMED_POD_ANNOTATION

    shape = NodeShape(count=1, cpu="4", memory="8Gi")
    cluster = Cluster.up(ClusterOptions(nodes=shape, dir=tmp_path / "c", timed_pods=True,
                                        die_with_parent=True))
    try:
        cluster.kubectl("create", "configmap", "kept", "--from-literal=a=1")
        before = cluster.pids["kube-apiserver"]
        cluster.restart_component("kube-apiserver")
        assert cluster.pids["kube-apiserver"] != before
        assert Cluster.attach(cluster.dir).pids["kube-apiserver"] == cluster.pids["kube-apiserver"]
        assert cluster.kubectl_json("get", "configmap", "kept")["data"] == {"a": "1"}
        assert cluster.status().healthy

        cluster.add_node(shape, "extra-node", zone="zone-9", rack="rack-9")
        extra = cluster.kubectl_json("get", "node", "extra-node")
        assert extra["metadata"]["labels"][ZONE_LABEL] == "zone-9"
        assert cluster.delete_node("extra-node")
        assert "extra-node" not in kwok_nodes(cluster)
        assert not cluster.delete_node("extra-node")

        cluster.kubectl("apply", "-f", "-", input=json.dumps(_job("quick", {})))
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_job("timed", {TIMED_POD_ANNOTATION: "8s"})))
        for name in ("quick", "timed"):
            cluster.kubectl("wait", "--for=condition=Complete", f"job/{name}", "--timeout=90s", timeout=100)

        def ran(name: str) -> float:
            pod = cluster.kubectl_json("get", "pods", "-l", f"job-name={name}")["items"][0]
            term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
            running = next(c["lastTransitionTime"] for c in pod["status"]["conditions"]
                           if c["type"] == "PodScheduled")
            end = datetime.fromisoformat(term["finishedAt"].replace("Z", "+00:00"))
            return (end - datetime.fromisoformat(running.replace("Z", "+00:00"))).total_seconds()

        assert ran("timed") >= 7
        assert ran("quick") < 7
    finally:
        cluster.down()
