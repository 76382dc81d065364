"""A real MPIJob placed by fluxnetes on the real-node dev cluster, and the DNS it needs
(devcluster/dns.py, hack/build-mpi-image.sh, docs/real-nodes.md).

One cluster for the module: two real nodes (2 cores each) beside a kwok node, the MPI Operator
(`--addons mpi`), CoreDNS, the MPI image imported into both nodes, and the operator from the
shell (as tests/test_realnode.py runs it). First the DNS: a pod resolves a Service's name and a
headless Service's pod by its hostname.subdomain, and nothing outside cluster.local. Then an
MPIJob of a launcher and 3 workers (a core each: both nodes full), held while a fluxnetes Job
holds a core, then placed as one gang; its mpirun runs an allreduce over ssh across the
workers on both nodes, every rank prints the right sum, the MPIJob succeeds and the group's
shares are released.

Needs root, hack/build-realnode.sh (binaries, CoreDNS, the MPI image) and hack/build-addons.sh;
skipped with the reason when missing, failed instead under FLUXNETES_REQUIRE_REALNODE=1 /
FLUXNETES_REQUIRE_ADDONS=1 (hack/test.sh sets them once the builds succeeded).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape, dns, realnode, realnode_config
from fluxnetes.devcluster import addons as addon_defs
from fluxnetes.devcluster.paths import toolchain

MPI_IMAGE = "localhost/fluxnetes-mpi:1"
JOB_NAME = "training.kubeflow.org/job-name"
JOB_ROLE = "training.kubeflow.org/job-role"
REAL = {realnode_config.REAL_NODE_LABEL: "true"}


def mpi_archive() -> Path:
    return realnode.images_dir(toolchain().home) / "mpi.tar"


def _missing() -> tuple[str | None, str | None]:
    absent = realnode.missing(toolchain())
    if not mpi_archive().is_file():
        absent.append(f"{mpi_archive()} (bash hack/build-realnode.sh)")
    addons = addon_defs.missing(("mpi",))
    return ("; ".join(absent) or None,
            addon_defs.missing_message(("mpi",), addons) if addons else None)


@pytest.fixture(scope="module")
def mpi_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    real, addons = _missing()
    for reason, var in ((real, "FLUXNETES_REQUIRE_REALNODE"), (addons, "FLUXNETES_REQUIRE_ADDONS")):
        if reason and os.environ.get(var) == "1":
            pytest.fail(f"required but missing: {reason}")
    if real or addons:
        pytest.skip(f"real nodes / MPI Operator cannot run here: {real or addons}")
    started = time.monotonic()
    cluster = Cluster.up(ClusterOptions(
        nodes=NodeShape(count=1, cpu="8", memory="32Gi"),
        dir=tmp_path_factory.mktemp("realnode-mpi"),
        die_with_parent=True,
        real_nodes=2,
        addons=("mpi",),
    ))
    try:
        realnode.import_images(cluster, mpi_archive())
        print(f"cluster up with the MPI image imported: {time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def operator(mpi_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from k8s_helpers import operator_session

    with operator_session(mpi_cluster, tmp_path_factory, "operator-real-mpi") as op:
        yield op


def _pod(name: str, node: str, command: list[str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                     "containers": [{"name": "c", "image": MPI_IMAGE, "imagePullPolicy": "Never",
                                     "command": command}], **spec}}


def _service(name: str, selector: str, headless: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"app": selector}, "ports": [{"port": 80}]}
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


# -- DNS ------------------------------------------------------------------------------------------
def test_dns_configuration_forwards_nothing(tmp_path: Path) -> None:
    conf = dns.corefile("10.251.7.2", tmp_path / "kubeconfig")
    directives = {line.split()[0] for line in conf.splitlines() if line.strip() and not line.lstrip().startswith("#")}
    assert "forward" not in directives and "bind" in directives and "bind 10.251.7.2" in conf
    assert f"kubernetes {dns.DOMAIN} " in conf and "pods insecure" in conf
    kc = realnode_config.kubelet_config(ip="10.251.7.10", slot=7, i=0, sock=tmp_path / "s", ca=tmp_path / "ca",
                                 cert=tmp_path / "c", key=tmp_path / "k", node_dir=tmp_path,
                                 dns_ip="10.251.7.2")
    assert kc["clusterDNS"] == ["10.251.7.2"] and kc["clusterDomain"] == "cluster.local"
    # the DNS address is on the node-IP interface, routed to the pods, apart from the nodes'
    assert dns.dns_ip(realnode_config.NODE_NET, 7) not in {realnode_config.node_ip(7, i) for i in range(2)}


@pytest.mark.k8s
def test_pods_resolve_services_and_headless_pods(mpi_cluster: Cluster) -> None:
    """From a pod on real-node-1: a ClusterIP Service's name gives its cluster IP, a headless
    Service's pod (hostname web-0, subdomain web, on real-node-0) its pod IP, by the full name
    and by the search path; a name outside cluster.local resolves to nothing."""
    from test_k8s_operator import apply, namespace, wait

    c = mpi_cluster
    server = dns.dns_ip(realnode_config.NODE_NET, c.state.real_nodes["slot"])
    with namespace(c) as ns:
        apply(c, ns, [
            _pod("web", "real-node-0", ["sleep", "300"], hostname="web-0", subdomain="web"),
            _pod("client", "real-node-1", ["sleep", "300"]),
            _service("web", "web", headless=True),
            _service("plain", "web", headless=False),
        ])
        ps = {n: wait(f"pod {n} Running", lambda n=n: (lambda p: p if p["status"].get("phase") == "Running"
                                                          else None)(c.kubectl_json("get", "pod", n, "-n", ns)),
                      timeout=120) for n in ("web", "client")}
        cluster_ip = c.kubectl_json("get", "service", "plain", "-n", ns)["spec"]["clusterIP"]
        resolv = c.kubectl("exec", "-n", ns, "client", "--", "cat", "/etc/resolv.conf").stdout
        assert f"nameserver {server}" in resolv and f"search {ns}.svc.cluster.local" in resolv, resolv

        def getent(name: str) -> str | None:
            res = c.kubectl("exec", "-n", ns, "client", "--", "getent", "hosts", name, check=False)
            return res.stdout.split()[0] if res.returncode == 0 and res.stdout.strip() else None

        web_ip = ps["web"]["status"]["podIP"]
        # a headless Service's records appear once its pod is Ready (EndpointSlice -> CoreDNS)
        assert wait("web-0.web resolves", lambda: getent(f"web-0.web.{ns}.svc.cluster.local"),
                    timeout=60) == web_ip
        assert getent("web-0.web") == web_ip  # the search path: <ns>.svc.cluster.local
        assert getent(f"plain.{ns}.svc.cluster.local") == cluster_ip
        assert getent("plain") == cluster_ip
        assert getent("kubernetes.default") == "10.0.0.1"
        assert getent(f"{web_ip.replace('.', '-')}.{ns}.pod.cluster.local") == web_ip
        assert getent("nothing.example") is None
    # from this machine too, by the same server (what `up` waits for)
    assert dns.query(server, "kubernetes.default.svc.cluster.local") == ["10.0.0.1"]


# -- the MPIJob -----------------------------------------------------------------------------------
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "k8s" / "realnode-mpijob.yaml"


def test_example_mpijob_fills_both_real_nodes() -> None:
    """docs/real-nodes.md's MPIJob: 3 workers + the launcher, a core each on 2 nodes of 2."""
    job = yaml.safe_load(EXAMPLE.read_text())
    specs = job["spec"]["mpiReplicaSpecs"]
    workers = specs["Worker"]["replicas"]
    assert workers + specs["Launcher"]["replicas"] == 2 * 2
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"][:4] == ["wait-hosts", "mpirun", "-n", str(workers)]
    for rs in specs.values():
        spec = rs["template"]["spec"]
        assert spec["nodeSelector"] == REAL
        assert spec["containers"][0]["image"] == MPI_IMAGE
        assert spec["containers"][0]["securityContext"]["runAsUser"] == 1000


def one_core_job(name: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"metadata": {"labels": {"app": name}}, "spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "nodeSelector": REAL,
                "containers": [{"name": "c", "image": realnode_config.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                "command": ["sleep", "600"],
                                "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}}}]}}}}


def _condition(obj: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


@pytest.mark.k8s
def test_mpijob_held_then_placed_as_one_gang_runs_allreduce_across_both_nodes(
        mpi_cluster: Cluster, operator: Any) -> None:
    from test_k8s_operator import apply, fluxjob, namespace, on_chosen_nodes, pods, wait

    c = mpi_cluster
    workers = 3  # the example's: + the launcher, 4 cores, both real nodes full
    group = "mpijob-allreduce"
    started = time.monotonic()
    with namespace(c) as ns:
        # a fluxnetes Job holds one of the 4 cores: the gang of 4 cannot be allocated
        apply(c, ns, [one_core_job("hold")])
        wait("the holding pod Running", lambda: [p for p in pods(c, ns, "app=hold")
                                                 if (p.get("status") or {}).get("phase") == "Running"],
             timeout=90)
        apply(c, ns, [yaml.safe_load(EXAMPLE.read_text())])
        wait("its FluxJob queued", lambda: (fluxjob(c, ns, group).get("status") or {}).get("phase")
             in ("Pending", "Reserved"), timeout=60)
        time.sleep(3)  # several cycles: nothing of it may be placed
        assert (fluxjob(c, ns, group).get("status") or {}).get("phase") in ("Pending", "Reserved")
        assert c.kubectl_json("get", "mpijob", "allreduce", "-n", ns)["spec"]["runPolicy"]["suspend"] is True
        assert not [p for p in pods(c, ns, f"{JOB_NAME}=allreduce") if p["spec"].get("nodeName")]
        released_at = time.monotonic()
        c.kubectl("delete", "job", "hold", "-n", ns, "--wait=false")

        def all_running() -> list[dict[str, Any]] | None:
            got = [p for p in pods(c, ns, f"{JOB_NAME}=allreduce") if not p["metadata"].get("deletionTimestamp")]
            return got if len(got) == workers + 1 and all(
                (p.get("status") or {}).get("phase") in ("Running", "Succeeded") for p in got) else None

        ps = wait("launcher and workers running", all_running, timeout=180)
        running_after = time.monotonic() - released_at
        used = on_chosen_nodes(c, ns, group, ps)  # each pod on its slot's node, as allocated
        worker_nodes = {p["spec"]["nodeName"] for p in ps if p["metadata"]["labels"][JOB_ROLE] == "worker"}
        assert worker_nodes == {"real-node-0", "real-node-1"} == used, worker_nodes
        status = fluxjob(c, ns, group)["status"]
        # while it runs the allocation holds a core on each pod's node
        held = {sh["node"]: sh.get("cores") for sh in status.get("shares") or []}
        assert held == {"real-node-0": 2, "real-node-1": 2}, status.get("shares")
        sets = {s["name"]: sorted(s["nodes"]) for s in status.get("podSets") or []}
        assert sets["worker"] == sorted(p["spec"]["nodeName"] for p in ps
                                        if p["metadata"]["labels"][JOB_ROLE] == "worker"), sets

        def finished() -> dict[str, Any] | None:
            obj = c.kubectl_json("get", "mpijob", "allreduce", "-n", ns)
            return obj if _condition(obj, "Succeeded") or _condition(obj, "Failed") else None

        obj = wait("the MPIJob finished", finished, timeout=180)
        launcher = next(p for p in ps if p["metadata"]["labels"][JOB_ROLE] == "launcher")
        log = c.kubectl("logs", "-n", ns, launcher["metadata"]["name"], check=False).stdout
        assert _condition(obj, "Succeeded"), (obj.get("status"), log)
        want = workers * (workers + 1) // 2
        # one rank per worker, in the hostfile's order (slotsPerWorker 1), each with the sum
        for rank in range(workers):
            assert (f"rank {rank} of {workers} on allreduce-worker-{rank}: allreduce sum {want} "
                    f"(expected {want})") in log, log
        assert f"allreduce OK: {workers} ranks, sum {want}" in log, log
        wait("the FluxJob Completed", lambda: fluxjob(c, ns, group)["status"]["phase"] == "Completed",
             timeout=60)
        final = fluxjob(c, ns, group)["status"]
        assert not final.get("shares"), final  # nothing held any more
        total = time.monotonic() - started
        print(json.dumps({"mpijob_running_after_release_s": round(running_after, 2),
                          "mpijob_test_s": round(total, 1)}))


def test_oci_archive_from_a_root_file_system_tar_keeps_owners(tmp_path: Path) -> None:
    """The MPI image's layer is a whole root file system packed by `tar` (hack/build-mpi-image.sh):
    taken as is, so /home/mpiuser stays mpiuser's (uid 1000)."""
    import io
    import tarfile

    from fluxnetes.devcluster.ociimage import ImageSpec, write_archive

    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        home = tarfile.TarInfo("home/mpiuser")
        home.type, home.uid, home.gid, home.mode = tarfile.DIRTYPE, 1000, 1000, 0o755
        tar.addfile(home)
        data = b"Port 2222\n"
        conf = tarfile.TarInfo("home/mpiuser/.sshd_config")
        conf.size, conf.uid = len(data), 1000
        tar.addfile(conf, io.BytesIO(data))
    out = tmp_path / "img.tar"
    digest = write_archive(ImageSpec(name="localhost/m:1", layer_tar=rootfs, cmd=("/bin/bash",)), out)
    with tarfile.open(out) as tar:
        manifest = json.load(tar.extractfile("blobs/sha256/" + digest.split(":")[1]))  # type: ignore[arg-type]
        layer = tar.extractfile("blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1])
        assert layer is not None
        assert layer.read() == rootfs.read_bytes()
    with pytest.raises(ValueError, match="layer_tar is the whole layer"):
        write_archive(ImageSpec(name="localhost/m:1", layer_tar=rootfs, dirs=("/tmp",)), out)
