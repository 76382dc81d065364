"""The chart as users install it, on the real-node dev cluster (docs/real-nodes.md).

One cluster for the module: a real kubelet node with Services (kube-proxy,
devcluster/services.py), the operator image of hack/build-image.sh imported into the node's
containerd, a PostgreSQL on the cluster's own interface as the store. Then, in order:
`helm install` from deploy/chart (2 operator replicas, the agent DaemonSet), the operator
pods Ready, /metrics through its Service, the webhook reached through its Service (a pod of
an opted-in namespace is held, placed by fluxnetes and runs), the agent's
NodeResourceTopology read from this machine's /sys made into NUMA zones by the operator (a
pod asking for one socket is placed), the leader pod killed and the other replica taking
over, `helm upgrade` of one value, `helm uninstall` leaving nothing behind, and `down`
removing kube-proxy's rules.

Needs root, hack/build-realnode.sh, hack/build-helm.sh, PostgreSQL and hack/build-image.sh;
skipped with the reason when those are missing, unless FLUXNETES_REQUIRE_REALNODE=1 (for the
first ones) or FLUXNETES_REQUIRE_IMAGE=1 (for the image; hack/test.sh sets both once the builds
succeeded), when it fails instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluxnetes.devcluster import (
    Cluster,
    ClusterError,
    ClusterOptions,
    NodeShape,
    realnode,
    realnode_config,
    services,
)
from fluxnetes.devcluster.paths import toolchain
from fluxnetes.devcluster.soak_processes import Postgres, pg_bindir

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "chart"
ARCHIVE = Path(os.environ.get("FLUXNETES_IMAGE_ARCHIVE") or ROOT / "out" / "image" / "fluxnetes-oci.tar")
IMAGE_REPO = "localhost/fluxnetes"
RELEASE = "flx"  # not the chart's name: names derived from the release must agree
NS = "flx-system"
# The operator counts each pod not its own as whole cores on its node (foreign pods), and a
# real node has this machine's 2: the operator replicas go to one node, the agent and the
# pods fluxnetes places to the other (on one host, two agents would share one port).
NODE = realnode_config.node_name(0)
OPERATOR_NODE = realnode_config.node_name(1)
HOSTNAME = "kubernetes.io/hostname"
LABEL = "app.kubernetes.io/instance=flx,app.kubernetes.io/component=operator"

def _version() -> str:
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise AssertionError("no version in pyproject.toml")


def missing() -> tuple[list[str], list[str]]:
    """(what the real node, Services and helm need; what the image needs) that is absent."""
    tools = toolchain()
    absent = realnode.missing(tools) + services.missing(tools)
    if not os.access(tools.binary("helm"), os.X_OK):
        absent.append(f"{tools.binary('helm')} (bash hack/build-helm.sh)")
    if pg_bindir() is None:
        absent.append("PostgreSQL's initdb (apt-get install postgresql)")
    image = [] if ARCHIVE.is_file() else [f"the operator image {ARCHIVE} (bash hack/build-image.sh)"]
    return absent, image


# -- without a cluster -------------------------------------------------------------------------
def test_kube_proxy_config_touches_nothing_machine_wide(tmp_path: Path) -> None:
    cfg = services.proxy_config(kubeconfig=tmp_path / "kc", node="real-node-0", slot=7,
                                healthz_port=1, metrics_port=2)
    assert cfg["mode"] == "iptables"
    assert cfg["iptables"]["localhostNodePorts"] is False  # would set route_localnet
    assert cfg["iptables"]["masqueradeAll"] is True
    assert cfg["conntrack"]["maxPerCore"] == 0 and cfg["conntrack"]["min"] == 0
    assert cfg["nodePortAddresses"] == ["10.251.7.0/24"]
    assert cfg["healthzBindAddress"].startswith("127.0.0.1:")
    assert services.api_host(7) == "10.251.7.1"


def test_services_need_real_nodes_and_name_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="--services needs --real-nodes"):
        services.preflight(toolchain(tmp_path), 0)
    with pytest.raises(ClusterError) as exc:
        services.preflight(toolchain(tmp_path), 1)
    assert "kube-proxy (bash hack/build-realnode.sh)" in str(exc.value)


def test_cli_services_without_real_nodes_is_a_clear_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fluxnetes.cli.main import app

    res = CliRunner().invoke(app, ["dev", "cluster", "up", "--services", "--dir", str(tmp_path / "c")])
    assert res.exit_code != 0
    assert "--services needs --real-nodes" in res.output, res.output
    assert "Traceback" not in res.output


def test_api_server_listens_where_pods_reach_it_with_services(tmp_path: Path) -> None:
    from fluxnetes.devcluster import components
    from fluxnetes.devcluster.pki import ClusterPKI

    def argv(**kw: str) -> list[str]:
        return components.argv("kube-apiserver", toolchain(tmp_path), ports={"etcd": 1, "etcd_peer": 3, "apiserver": 2},
                               kubeconfig="kc", data_dir="d", advertise_address="10.251.7.1",
                               pki=ClusterPKI(tmp_path), run=tmp_path, **kw)

    assert "--bind-address=127.0.0.1" in argv()
    assert "--bind-address=10.251.7.1" in argv(api_host="10.251.7.1")


# -- on the cluster ----------------------------------------------------------------------------
@dataclass
class Env:
    cluster: Cluster
    store: Postgres
    values: Path
    chains_before: set[str]
    tmp: Path

    def helm(self, *args: str, timeout: float = 300) -> str:
        res = subprocess.run([str(self.cluster.tools.binary("helm")), *args, "--kubeconfig",
                              str(self.cluster.kubeconfig)], capture_output=True, text=True,
                             timeout=timeout, check=False)
        assert res.returncode == 0, f"helm {' '.join(args)}: {res.stderr}{res.stdout}"
        return res.stdout


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    absent, image = missing()
    required = (absent if os.environ.get("FLUXNETES_REQUIRE_REALNODE") == "1" else []) + (
        image if os.environ.get("FLUXNETES_REQUIRE_IMAGE") == "1" else [])
    if required:
        pytest.fail(f"the real-node chart test needs: {'; '.join(required)}")
    if absent or image:
        pytest.skip(f"the real-node chart test cannot run here: {'; '.join(absent + image)}")
    tmp = tmp_path_factory.mktemp("realnode-chart")
    chains_before = services.proxy_chains()
    cluster = Cluster.up(ClusterOptions(nodes=NodeShape(count=0), dir=tmp / "cluster",
                                        die_with_parent=True, real_nodes=2, services=True))
    store: Postgres | None = None
    try:
        slot = int(cluster.state.real_nodes["slot"])
        # the store on the cluster's own interface: the operator pods reach it directly
        store = Postgres(host=services.api_host(slot), clients="10.252.0.0/15").start()
        realnode.import_images(cluster, ARCHIVE, base_name=IMAGE_REPO)
        values = tmp / "values.yaml"
        values.write_text(yaml.safe_dump({
            "image": {"repository": IMAGE_REPO, "tag": _version(), "pullPolicy": "Never"},
            "replicas": 2,
            "postgresql": {"enabled": False},
            "store": {"url": store.url},
            "nodeSelector": {HOSTNAME: OPERATOR_NODE},
            "agent": {
                "enabled": True,
                "nodeSelector": {HOSTNAME: NODE},
                "dataDir": str(tmp / "agent-data"),
                # the real kubelet's configuration: its topologyManagerPolicy
                "kubeletConfig": str(Path(cluster.state.real_nodes["nodes"][0]["dir"]) / "kubelet.yaml"),
            },
        }))
        yield Env(cluster, store, values, chains_before, tmp)
    finally:
        if store is not None:
            store.stop()
        cluster.down()


def wait(what: str, check: Callable[[], Any], timeout: float = 120, interval: float = 0.5,
         diag: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AssertionError, KeyError, IndexError, ClusterError, OSError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})"
                         + (f"\n{diag()}" if diag else ""))


def operator_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return [p for p in cluster.kubectl_json("get", "pods", "-n", NS, "-l", LABEL)["items"]
            if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def diagnose(cluster: Cluster) -> str:
    out = cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
    out += cluster.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False).stdout[-3000:]
    for p in cluster.kubectl_json("get", "pods", "-n", NS)["items"]:
        name = p["metadata"]["name"]
        out += f"\n--- logs {name}\n" + cluster.kubectl("logs", "-n", NS, name, "--all-containers",
                                                         "--tail=30", check=False).stdout
    return out


def busybox_pod(name: str, command: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {HOSTNAME: NODE},
            "containers": [{
                "name": "c", "image": realnode_config.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", command],
                "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}},
            }],
        },
    }


def create(cluster: Cluster, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
    """Create a pod and return it as the API server stored it (after the webhooks)."""
    res = cluster.kubectl("create", "-n", ns, "-o", "json", "-f", "-", input=json.dumps(pod))
    return dict(json.loads(res.stdout))


def running(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    pod = cluster.kubectl_json("get", "pod", "-n", ns, name)
    phase = pod["status"].get("phase")
    assert phase not in ("Failed", "Succeeded"), pod["status"]
    return pod if phase == "Running" else None


@pytest.fixture(scope="module")
def opted_in(env: Env) -> str:
    """A namespace opted in to fluxnetes (kept: the last test creates a pod there after the
    uninstall)."""
    ns = f"fx-{uuid.uuid4().hex[:6]}"
    env.cluster.kubectl("create", "namespace", ns)
    env.cluster.kubectl("label", "namespace", ns, "fluxnetes.io/enabled=true")
    return ns


@pytest.mark.k8s
def test_pods_reach_the_api_server_through_the_kubernetes_service(env: Env) -> None:
    c = env.cluster
    eps = c.kubectl_json("get", "endpointslices", "-n", "default", "-l",
                         "kubernetes.io/service-name=kubernetes")["items"][0]
    slot = int(c.state.real_nodes["slot"])
    assert eps["endpoints"][0]["addresses"] == [services.api_host(slot)]
    c.kubectl("apply", "-n", "default", "-f", "-", input=json.dumps(busybox_pod(
        "api-probe", "nc -w 5 10.0.0.1 443 </dev/null && echo reached")))
    wait("the probe pod to finish", lambda: c.kubectl_json("get", "pod", "-n", "default", "api-probe")
         ["status"].get("phase") in ("Succeeded", "Failed"), timeout=60)
    assert "reached" in c.kubectl("logs", "-n", "default", "api-probe").stdout
    c.kubectl("delete", "pod", "-n", "default", "api-probe", "--wait=false")


@pytest.mark.k8s
def test_helm_install_runs_the_operator_as_pods(env: Env) -> None:
    c = env.cluster
    env.helm("install", RELEASE, str(CHART), "-n", NS, "--create-namespace", "-f", str(env.values))
    pods = wait("2 operator pods Ready (readiness probe)",
                lambda: (lambda ps: ps if len(ps) == 2 and all(ready(p) for p in ps) else None)(
                    operator_pods(c)), timeout=240, diag=lambda: diagnose(c))
    assert {p["spec"]["nodeName"] for p in pods} == {OPERATOR_NODE}
    # the in-cluster client (KUBERNETES_SERVICE_HOST: the `kubernetes` Service) took the lease
    lease = wait("the leader lease", lambda: c.kubectl_json("get", "lease", "-n", NS, "fluxnetes-leader")
                 ["spec"].get("holderIdentity"), timeout=60)
    assert any(p["metadata"]["name"] in lease for p in pods), lease
    wait("the agent pod Ready", lambda: [p for p in c.kubectl_json(
        "get", "pods", "-n", NS, "-l", "app.kubernetes.io/component=agent")["items"] if ready(p)],
         timeout=120, diag=lambda: diagnose(c))


@pytest.mark.k8s
def test_metrics_served_through_the_service(env: Env) -> None:
    svc = env.cluster.kubectl_json("get", "service", "-n", NS, f"{RELEASE}-fluxnetes-metrics")
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:  # from the host, through kube-proxy
        body = resp.read().decode()
    assert "fluxnetes_" in body, body[:500]


@pytest.mark.k8s
def test_webhook_through_its_service_holds_then_places_a_real_pod(env: Env, opted_in: str) -> None:
    c = env.cluster
    hook = c.kubectl_json("get", "mutatingwebhookconfiguration", "fluxnetes.io")["webhooks"][0]
    assert hook["clientConfig"]["service"] == {
        "name": f"{RELEASE}-fluxnetes-webhook", "namespace": NS, "path": hook["clientConfig"]["service"]["path"],
        "port": 443}
    stored = create(c, opted_in, busybox_pod("held", "echo ran on $(hostname); sleep 600"))
    # the webhook took it: fluxnetes, not kube-scheduler, places it
    spec = stored["spec"]
    assert spec.get("schedulerName") == "fluxnetes" or spec.get("schedulingGates"), spec
    pod = wait("the held pod Running", lambda: running(c, opted_in, "held"), timeout=90,
               diag=lambda: diagnose(c))
    assert pod["spec"]["nodeName"] == NODE
    assert pod["metadata"]["annotations"].get("fluxnetes.io/fluxjob"), pod["metadata"]
    wait("its output", lambda: "ran on held" in c.kubectl("logs", "-n", opted_in, "held").stdout,
         timeout=30)
    c.kubectl("delete", "pod", "-n", opted_in, "held", "--wait=true", timeout=60)


@pytest.mark.k8s
def test_agent_topology_from_real_sys_becomes_numa_zones(env: Env, opted_in: str) -> None:
    c = env.cluster
    nrt = wait("the real node's NodeResourceTopology", lambda: c.kubectl_json(
        "get", "noderesourcetopologies.topology.node.k8s.io", NODE), timeout=60,
        diag=lambda: diagnose(c))
    numa = sorted(p.name for p in Path("/sys/devices/system/node").glob("node[0-9]*"))
    zones = [z for z in nrt["zones"] if z["type"] == "Node"]
    assert len(zones) == len(numa), (zones, numa)
    cpus = sum(int(r["capacity"]) for z in zones for r in z.get("resources", []) if r["name"] == "cpu")
    assert cpus == os.cpu_count(), zones
    attrs = {a["name"]: a["value"] for a in nrt.get("attributes") or []}
    assert attrs.get("topologyManagerPolicy") == "single-numa-node", attrs
    # The operator builds sockets below a node only from such an object; a pod asking for one
    # socket finds "0 sockets" (Unsatisfiable) without them. (The agent installs the NRT CRD
    # after the operator started, which looks for it again every 60 s: until then the pod is
    # Unsatisfiable, then queued again when the node's socket appears.) Then it is placed in
    # the node's only socket beside the agent, a pod fluxnetes did not place, which holds a
    # core of that socket but not the socket (issue #28: the socket-local pod's socket was
    # exclusive, inside its slot, so the agent kept it off the node).
    create(c, opted_in, busybox_pod("socket-local", "sleep 600",
                                    {"fluxnetes.io/topology": "socket"}))
    pod = wait("the socket-local pod Running on the real node", lambda: running(c, opted_in, "socket-local"),
               timeout=180, diag=lambda: diagnose(c))
    assert pod["spec"]["nodeName"] == NODE
    c.kubectl("delete", "pod", "-n", opted_in, "socket-local", "--wait=true", timeout=60)


@pytest.mark.k8s
def test_killing_the_leader_pod_hands_over_to_the_other_replica(env: Env, opted_in: str) -> None:
    c = env.cluster
    holder = c.kubectl_json("get", "lease", "-n", NS, "fluxnetes-leader")["spec"]["holderIdentity"]
    names = [p["metadata"]["name"] for p in operator_pods(c)]
    leader = next(n for n in names if n in holder)
    other = next(n for n in names if n != leader)
    c.kubectl("delete", "pod", "-n", NS, leader, "--grace-period=0", "--force", "--wait=false")
    wait("the other replica to hold the lease", lambda: other in (c.kubectl_json(
        "get", "lease", "-n", NS, "fluxnetes-leader")["spec"].get("holderIdentity") or ""),
         timeout=90, diag=lambda: diagnose(c))
    create(c, opted_in, busybox_pod("after-failover", "sleep 600"))
    pod = wait("a pod placed after the failover", lambda: running(c, opted_in, "after-failover"),
               timeout=90, diag=lambda: diagnose(c))
    assert pod["metadata"]["annotations"].get("fluxnetes.io/fluxjob")
    c.kubectl("delete", "pod", "-n", opted_in, "after-failover", "--wait=true", timeout=60)


@pytest.mark.k8s
def test_helm_upgrade_of_one_value_takes_effect(env: Env) -> None:
    """leaderElection.leaseDuration 10 -> 13: both replicas are replaced with the new flag and
    the leader writes the new duration into its Lease."""
    c = env.cluster
    lease = c.kubectl_json("get", "lease", "-n", NS, "fluxnetes-leader")["spec"]
    assert lease["leaseDurationSeconds"] == 10
    env.helm("upgrade", RELEASE, str(CHART), "-n", NS, "-f", str(env.values),
             "--set", "leaderElection.leaseDuration=13")

    def rolled() -> list[dict[str, Any]] | None:
        ps = operator_pods(c)
        new = [p for p in ps if "--lease-duration=13" in p["spec"]["containers"][0]["args"]]
        return ps if len(ps) == 2 and len(new) == 2 and all(ready(p) for p in ps) else None

    pods = wait("both replicas replaced with the new value and Ready", rolled, timeout=240,
                diag=lambda: diagnose(c))
    names = {p["metadata"]["name"] for p in pods}

    def new_lease() -> bool:
        spec = c.kubectl_json("get", "lease", "-n", NS, "fluxnetes-leader")["spec"]
        holder = str(spec.get("holderIdentity") or "")
        return spec.get("leaseDurationSeconds") == 13 and any(n in holder for n in names)

    wait("a new replica leading with the new lease duration", new_lease, timeout=90,
         diag=lambda: diagnose(c))


@pytest.mark.k8s
def test_helm_uninstall_leaves_nothing_that_blocks_or_lingers(env: Env, opted_in: str) -> None:
    c = env.cluster
    env.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s")
    gone = [("mutatingwebhookconfiguration", "fluxnetes.io"),
            ("validatingadmissionpolicy", "fluxnetes.io-gate"),
            ("validatingadmissionpolicybinding", "fluxnetes.io-gate")]
    wait("the operator's webhook configuration and policy gone (garbage collector)", lambda: not any(
        c.kubectl("get", kind, name, "--ignore-not-found", "-o", "name").stdout.strip()
        for kind, name in gone), timeout=90)
    wait("the release's pods gone", lambda: not c.kubectl_json("get", "pods", "-n", NS)["items"],
         timeout=90)
    left = {kind: [o["metadata"]["name"] for o in c.kubectl_json("get", kind, "-n", NS)["items"]]
            for kind in ("secrets", "services", "serviceaccounts", "roles", "rolebindings",
                         "configmaps")}
    left["configmaps"] = [n for n in left["configmaps"] if n != "kube-root-ca.crt"]
    left["serviceaccounts"] = [n for n in left["serviceaccounts"] if n != "default"]
    assert not any(left.values()), left
    cluster_wide = c.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").stdout
    assert f"{RELEASE}-fluxnetes" not in cluster_wide
    # CRDs stay (deploy/chart/README.md: helm never deletes a chart's crds/)
    for crd in ("fluxjobs.fluxnetes.io", "noderesourcetopologies.topology.node.k8s.io"):
        c.kubectl("get", "crd", crd)
    # a plain pod in the once opted-in namespace is admitted and runs without fluxnetes
    stored = create(c, opted_in, busybox_pod("plain", "echo plain; sleep 600"))
    assert not stored["spec"].get("schedulingGates") and stored["spec"].get("schedulerName") != "fluxnetes"
    wait("a plain pod Running after the uninstall", lambda: running(c, opted_in, "plain"), timeout=60)


@pytest.mark.k8s
def test_helm_uninstall_leaves_no_lease(env: Env) -> None:
    """The leader Lease is owned by the chart's ClusterRole (issue #28): the garbage collector
    deletes it once the uninstall has deleted that ClusterRole."""
    def leases() -> list[str]:
        return [o["metadata"]["name"] for o in env.cluster.kubectl_json("get", "leases", "-n", NS)["items"]]

    wait("the leader Lease gone (garbage collector)", lambda: not leases(), timeout=60,
         diag=lambda: str(leases()))


@pytest.mark.k8s
def test_down_removes_kube_proxys_rules_and_the_route(env: Env) -> None:
    c = env.cluster
    slot = int(c.state.real_nodes["slot"])
    assert services.proxy_chains() - env.chains_before  # kube-proxy's rules are there now
    c.down()
    assert services.proxy_chains() <= env.chains_before
    routes = subprocess.run(["ip", "route", "show", "10.0.0.0/24"], capture_output=True, text=True).stdout
    assert not routes.strip(), routes
    assert services.running_proxy() is None
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert realnode_config.dummy_name(slot) + ":" not in links
