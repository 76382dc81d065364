"""Real kubelet nodes in the dev cluster (devcluster/realnode.py, docs/real-nodes.md).

The first tests start nothing: configuration files, the image archives, the errors a user
sees. The `k8s` tests start a cluster with two real nodes beside kwok nodes, run a real
process in a pod, and a Job of 4 sleeping pods placed by the operator (from the shell, as the
other k8s tests run it) whose shares are released as each process exits. They need root and hack/build-realnode.sh; they are skipped with the reason
when those are missing, unless FLUXNETES_REQUIRE_REALNODE=1 (hack/test.sh sets it once the
build succeeded), when they fail instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fluxnetes.cli.main import app
from fluxnetes.devcluster import (
    BinariesMissing,
    Cluster,
    ClusterError,
    ClusterOptions,
    NodeShape,
    dns,
    realnode,
    realnode_config,
    realnode_host,
)
from fluxnetes.devcluster.nodes import RACK_LABEL, ZONE_LABEL
from fluxnetes.devcluster.ociimage import ImageSpec, write_archive
from fluxnetes.devcluster.paths import toolchain


def test_oci_archive_is_an_image_layout_containerd_can_name(tmp_path: Path) -> None:
    exe = tmp_path / "hello"
    exe.write_text("#!/bin/sh\necho hi\n")
    exe.chmod(0o755)
    out = tmp_path / "img.tar"
    spec = ImageSpec(name="localhost/x:2", files={"/bin/hello": exe}, symlinks={"/bin/hi": "hello"},
                     dirs=("/tmp",), entrypoint=("/bin/hello",))
    digest = write_archive(spec, out)
    with tarfile.open(out) as tar:
        names = tar.getnames()
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        desc = index["manifests"][0]
        assert desc["digest"] == digest
        assert desc["annotations"]["io.containerd.image.name"] == "localhost/x:2"
        assert desc["annotations"]["org.opencontainers.image.ref.name"] == "2"
        manifest = json.load(tar.extractfile("blobs/sha256/" + digest.split(":")[1]))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(  # type: ignore[arg-type]
            "blobs/sha256/" + manifest["config"]["digest"].split(":")[1]))
        layer = tar.extractfile("blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1])
        assert layer is not None
        with tarfile.open(fileobj=layer) as lt:
            members = {m.name: m for m in lt.getmembers()}
    assert "oci-layout" in names
    assert config["config"]["Entrypoint"] == ["/bin/hello"]
    assert members["bin/hello"].mode == 0o755
    assert members["bin/hi"].issym() and members["bin/hi"].linkname == "hello"
    assert members["tmp"].mode == 0o1777
    # the same inputs give the same image
    assert write_archive(spec, tmp_path / "again.tar") == digest


def test_configs_carry_what_this_machine_needs(tmp_path: Path) -> None:
    kc = realnode_config.kubelet_config(ip="10.251.7.10", slot=7, i=0, sock=tmp_path / "c.sock",
                                 ca=tmp_path / "ca", cert=tmp_path / "c", key=tmp_path / "k",
                                 node_dir=tmp_path)
    assert kc["failCgroupV1"] is False and kc["cgroupDriver"] == "cgroupfs"
    assert kc["address"] == kc["healthzBindAddress"] == "10.251.7.10"
    assert kc["authentication"]["anonymous"]["enabled"] is False
    assert kc["cgroupRoot"] == "/fluxnetes-7-0"
    cd = realnode_config.containerd_config(root=tmp_path / "r", state=tmp_path / "s", sock=tmp_path / "c.sock",
                                    cni_conf=tmp_path / "net.d", opt=tmp_path / "o")
    assert "restrict_oom_score_adj = true" in cd and "SystemdCgroup = false" in cd
    assert f'sandbox = "{realnode_config.PAUSE_IMAGE}"' in cd
    cni = realnode_config.cni_config(7, 1, tmp_path / "ipam")["plugins"][0]
    assert cni["ipMasq"] is False and cni["bridge"] == "flxb7n1"
    assert cni["ipam"]["ranges"] == [[{"subnet": "10.253.7.0/24"}]]
    # the pods can reach nodes, pods and Services of this machine only: no default route
    assert "0.0.0.0/0" not in {r["dst"] for r in cni["ipam"]["routes"]}
    assert realnode_config.node_labels(0)[RACK_LABEL] == realnode_config.REAL_RACK


def test_up_names_everything_missing_and_never_falls_back(tmp_path: Path) -> None:
    home = tmp_path / "k8s"
    with pytest.raises(BinariesMissing) as exc:
        realnode.preflight(toolchain(home), 1)
    msg = str(exc.value)
    assert "--real-nodes 1 cannot run" in msg
    for b in ("kubelet", "containerd", "containerd-shim-runc-v2", "pause.tar"):
        assert b in msg
    assert "bash hack/build-realnode.sh" in msg
    realnode.preflight(toolchain(home), 0)  # nothing asked, nothing checked
    with pytest.raises(ClusterError, match="--real-nodes must be between 0 and 2"):
        realnode.check_count(3)


def test_cli_reports_bad_count_without_a_traceback(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["dev", "cluster", "up", "--real-nodes", "5",
                                   "--dir", str(tmp_path / "c")])
    assert res.exit_code != 0
    assert "--real-nodes must be between 0 and 2" in res.output
    assert "Traceback" not in res.output


# -- on a cluster ----------------------------------------------------------------------------
def realnode_missing() -> str | None:
    absent = realnode.missing(toolchain())
    return "; ".join(absent) if absent else None


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = realnode_missing()
    if reason and os.environ.get("FLUXNETES_REQUIRE_REALNODE") == "1":
        pytest.fail(f"real nodes required but missing: {reason}")
    if reason:
        pytest.skip(f"real nodes cannot run here: {reason}")
    cluster = Cluster.up(ClusterOptions(
        nodes=NodeShape(count=2, cpu="8", memory="32Gi"),
        dir=tmp_path_factory.mktemp("realnode"),
        die_with_parent=True,
        # two: the operator gives each pod whole cores, and a node here has 2
        real_nodes=2,
    ))
    try:
        yield cluster
    finally:
        cluster.down()


def _wait_phase(cluster: Cluster, name: str, phases: set[str], timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        pod = cluster.kubectl_json("get", "pod", name)
        if pod.get("status", {}).get("phase") in phases:
            return pod
        if time.monotonic() > deadline:
            events = cluster.kubectl("get", "events", "--field-selector",
                                     f"involvedObject.name={name}", check=False).stdout
            raise AssertionError(f"pod {name} not {phases}: {pod.get('status')}\n{events}")
        time.sleep(0.5)


@pytest.mark.k8s
def test_real_node_ready_beside_kwok_nodes(real_cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in real_cluster.kubectl_json("get", "nodes")["items"]}
    assert {"kwok-node-0", "kwok-node-1", "real-node-0", "real-node-1"} <= set(nodes)
    real = nodes["real-node-1"]
    labels = real["metadata"]["labels"]
    assert labels[ZONE_LABEL] == realnode_config.REAL_ZONE
    assert labels[RACK_LABEL] == realnode_config.REAL_RACK
    assert "kwok.x-k8s.io/node" not in (real["metadata"].get("annotations") or {})
    assert real["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.")
    assert real["status"]["nodeInfo"]["containerRuntimeVersion"] == "containerd://2.4.2"
    addr = {a["type"]: a["address"] for a in real["status"]["addresses"]}
    assert addr["InternalIP"].startswith(realnode_config.NODE_NET + ".")


@pytest.mark.k8s
def test_real_pod_runs_a_process(real_cluster: Cluster) -> None:
    """A pod on the real node runs busybox: its output comes back through `kubectl logs`
    (API server -> kubelet -> containerd), and `kubectl exec` runs a command in it. (`$$$$`:
    Kubernetes turns `$$` into `$` in a command, so the shell sees `$$`, its own pid: 1.)"""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "real-echo", "namespace": "default"},
        "spec": {
            "nodeSelector": {realnode_config.REAL_NODE_LABEL: "true"},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": realnode_config.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c",
                            "echo ran-as-pid-$$$$ on $(hostname); echo ok > /tmp/mark; sleep 30"],
                "resources": {"limits": {"cpu": "100m", "memory": "32Mi"}},
            }],
        },
    }
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    got = _wait_phase(real_cluster, "real-echo", {"Running", "Failed", "Succeeded"})
    assert got["status"]["phase"] == "Running", got["status"]
    node = got["spec"]["nodeName"]
    assert node in ("real-node-0", "real-node-1")
    ip = got["status"]["podIP"]
    assert ip.startswith("10.252." if node == "real-node-0" else "10.253."), ip
    deadline = time.monotonic() + 30
    while "ran-as-pid-1 on real-echo" not in (logs := real_cluster.kubectl(
            "logs", "real-echo", check=False).stdout):
        assert time.monotonic() < deadline, logs
        time.sleep(0.5)
    out = real_cluster.kubectl("exec", "real-echo", "--", "cat", "/tmp/mark").stdout
    assert out.strip() == "ok"
    real_cluster.kubectl("delete", "pod", "real-echo", "--wait=true", timeout=60)


@pytest.mark.k8s
def test_down_removes_interfaces_cgroups_and_mounts(tmp_path: Path) -> None:
    reason = realnode_missing()
    if reason and os.environ.get("FLUXNETES_REQUIRE_REALNODE") == "1":
        pytest.fail(f"real nodes required but missing: {reason}")
    if reason:
        pytest.skip(f"real nodes cannot run here: {reason}")
    others = realnode_host.other_kubelets()  # (another cluster's kubelets keep the kernel settings)
    before = realnode_host.read_tunables()
    cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=0), dir=tmp_path / "c",
                                        die_with_parent=True, real_nodes=1))
    rn = dict(cluster.state.real_nodes)
    slot = rn["slot"]
    node = rn["nodes"][0]
    dns_pid = next(p.pid for p in cluster.state.processes if p.name == dns.PROCESS)
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"containers": [{"name": "c", "image": realnode_config.BUSYBOX_IMAGE,
                                        "imagePullPolicy": "Never", "command": ["sleep", "300"]}],
                        "terminationGracePeriodSeconds": 1}}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
        _wait_phase(cluster, "p", {"Running"})
        assert realnode_host.cgroup_pids(node["cgroup"])  # the pod's processes are there
    finally:
        cluster.down()
    assert not Path(f"/proc/{dns_pid}").exists()  # the cluster's DNS stopped with it
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert realnode_config.dummy_name(slot) + ":" not in links
    assert realnode_config.bridge_name(slot, 0) + ":" not in links
    mounts = Path("/proc/self/mountinfo").read_text()
    assert node["dir"] not in mounts and node["run"] not in mounts
    assert not any(Path(h, node["cgroup"].strip("/")).exists()
                   for h in realnode_host.cgroup_hierarchies())
    assert not realnode_host.shim_pids(Path(node["run"]) / "containerd.sock")
    # what the kubelet and CNI put outside the node's directories
    logs = realnode_host.CONTAINER_LOG_LINKS
    links = [os.readlink(f) for f in logs.iterdir() if f.is_symlink()] if logs.is_dir() else []
    assert not [t for t in links if t.startswith(node["dir"] + "/")]
    assert not list(realnode_host.CNI_RESULTS.glob(f"fluxnetes-{slot}-*"))
    if not others and not realnode_host.other_kubelets():
        assert realnode_host.read_tunables() == before


# -- work placed by fluxnetes on the real node -------------------------------------------------
@pytest.fixture(scope="module")
def operator(real_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The operator from the shell (`python -m fluxnetes.k8s run`), as the k8s tests run it."""
    from k8s_helpers import operator_session

    # the test below reads the FluxJob's status (`released`) of a Job placed at once: every
    # group gets one (--fluxjobs all; the default, waiting, gives that Job none)
    with operator_session(real_cluster, tmp_path_factory, "operator-real", "--fluxjobs", "all") as op:
        yield op


def sleeping_job(name: str, size: int) -> dict[str, Any]:
    """Indexed Job whose pod i really sleeps 4 + 5*i seconds, then says so."""
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {
            "parallelism": size, "completions": size, "completionMode": "Indexed",
            "template": {"spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "nodeSelector": {realnode_config.REAL_NODE_LABEL: "true"},
                "containers": [{
                    "name": "c", "image": realnode_config.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "echo start $JOB_COMPLETION_INDEX; "
                                "sleep $((4 + 5 * JOB_COMPLETION_INDEX)); echo done $JOB_COMPLETION_INDEX"],
                    "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}},
                }],
            }},
        },
    }


def _terminated(pod: dict[str, Any]) -> bool:
    return any("terminated" in (c.get("state") or {})
               for c in (pod.get("status") or {}).get("containerStatuses") or [])


@pytest.mark.k8s
def test_sleeping_job_placed_as_one_group_each_share_released_on_exit(
        real_cluster: Cluster, operator: Any) -> None:
    """4 pods that really sleep (4, 9, 14, 19 s) are placed together on the real nodes by the
    operator (a core each: 2 nodes x 2 cores); while the group runs, each pod's slot is released once its process has exited
    (FluxJob status `released`), never before, and the others keep theirs."""
    from test_k8s_operator import apply, fluxjob, namespace, on_chosen_nodes, pods, wait

    with namespace(real_cluster) as ns:
        apply(real_cluster, ns, [sleeping_job("sleepy", 4)])
        group = "job-sleepy"
        wait("FluxJob Running", lambda: (fluxjob(real_cluster, ns, group).get("status") or {})
             .get("phase") == "Running", timeout=90)
        ps = wait("4 pods Running", lambda: (lambda got: got if len(got) == 4 and all(
            (p.get("status") or {}).get("phase") == "Running" for p in got) else None)(
            pods(real_cluster, ns, "job-name=sleepy")), timeout=90)
        assert on_chosen_nodes(real_cluster, ns, group, ps) <= {"real-node-0", "real-node-1"}
        partial_seen = False
        deadline = time.monotonic() + 120
        while True:
            status = fluxjob(real_cluster, ns, group).get("status") or {}
            if status.get("phase") != "Running":
                break
            released = set(status.get("released") or [])
            by_slot = {int(p["metadata"]["annotations"]["fluxnetes.io/slot"]): p
                       for p in pods(real_cluster, ns, "job-name=sleepy")}
            for s in released:  # released => its process had exited (pods read after)
                assert s not in by_slot or _terminated(by_slot[s]), (s, by_slot[s]["status"])
            if 0 < len(released) < 4 and any(not _terminated(p) for p in by_slot.values()):
                partial_seen = True
            assert time.monotonic() < deadline, status
            time.sleep(0.5)
        assert partial_seen, "no slot was released while others still ran"
        wait("FluxJob Completed", lambda: fluxjob(real_cluster, ns, group)["status"]["phase"]
             == "Completed", timeout=60)
        for p in pods(real_cluster, ns, "job-name=sleepy"):
            idx = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            out = real_cluster.kubectl("logs", "-n", ns, p["metadata"]["name"]).stdout
            assert f"start {idx}" in out and f"done {idx}" in out, out
