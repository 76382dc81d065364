"""What the operator creates at run time goes away with the installation.

The operator creates its MutatingWebhookConfiguration and the gate's ValidatingAdmissionPolicy
and binding itself (and its certificate Secret and leader Lease) (the chart cannot: they carry a CA made at start-up and the operator's own
identity). Each carries an ownerReference to the installation's ClusterRole, so when
`helm uninstall` (or `kubectl delete -f dist/fluxnetes.yaml`) deletes that ClusterRole, the
garbage collector of kube-controller-manager deletes them too. Here: a real `helm install`
into the session cluster, the operator run out of cluster with `--owner-cluster-role`, a real
`helm uninstall`, and a poll until the configurations are gone.

tests/test_chart_operator_rbac.py covers the same with the chart's own identity and
`kubectl delete -f` of the rendered manifests (on a cluster of its own).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELM = Path(os.environ.get("FLUXNETES_K8S_HOME", Path.home() / ".cache/fluxnetes/k8s")) / "bin/helm"

# (kubectl kind, name) of everything the operator creates cluster-wide on a 1.30+ API server
OPERATOR_OBJECTS = [
    ("mutatingwebhookconfiguration", "fluxnetes.io"),
    ("validatingadmissionpolicy", "fluxnetes.io-gate"),
    ("validatingadmissionpolicybinding", "fluxnetes.io-gate"),
]


def wait_for(what: str, check: Any, timeout: float = 90) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def exists(cluster: Any, kind: str, name: str) -> bool:
    res = cluster.kubectl("get", kind, name, "--ignore-not-found", "-o", "name", check=False)
    return bool(res.stdout.strip())


def owner_refs(cluster: Any, kind: str, name: str) -> list[dict[str, Any]]:
    return list(cluster.kubectl_json("get", kind, name)["metadata"].get("ownerReferences") or [])


def start_operator(kubeconfig: Path, namespace: str, log: Path, *extra: str,
                   leader_elect: bool = False) -> subprocess.Popen[bytes]:
    elect = "--leader-elect" if leader_elect else "--no-leader-elect"
    return subprocess.Popen(
        [sys.executable, "-m", "fluxnetes.k8s", "run", "--kubeconfig", str(kubeconfig),
         "--namespace", namespace, "--webhook-port", "0", elect, *extra],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def helm(cluster: Any, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    res = subprocess.run([str(HELM), "--kubeconfig", str(cluster.kubeconfig), *args],
                         capture_output=True, text=True, timeout=180, check=False, env=env)
    assert res.returncode == 0, f"helm {' '.join(args)}: {res.stderr}"
    return res


@pytest.fixture
def no_operator_objects(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session cluster, with none of the operator's cluster-wide objects before or after."""
    if not HELM.exists():
        pytest.skip(f"helm is not built ({HELM} missing): run `bash hack/build-helm.sh`")
    cluster = request.getfixturevalue("k8s_cluster")

    def clean() -> None:
        for kind, name in OPERATOR_OBJECTS:
            cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)

    clean()
    try:
        yield cluster
    finally:
        clean()


@pytest.mark.k8s
def test_helm_uninstall_removes_the_operators_webhook_configurations(
    no_operator_objects: Any, tmp_path: Path
) -> None:
    cluster = no_operator_objects
    release = f"fx-life-{uuid.uuid4().hex[:6]}"
    ns = release
    role = f"{release}-fluxnetes"  # the chart's fullname
    helm(cluster, tmp_path, "install", release, str(ROOT / "deploy/chart"), "-n", ns, "--create-namespace",
         "--set", "replicas=1")
    # the chart tells the operator which ClusterRole owns its objects
    dep = cluster.kubectl_json("get", "deployment", role, "-n", ns)
    assert f"--owner-cluster-role={role}" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    uid = cluster.kubectl_json("get", "clusterrole", role)["metadata"]["uid"]
    log = tmp_path / "operator.log"
    # leader election on: its Lease is one of the objects the operator makes (issue #28)
    proc = start_operator(cluster.kubeconfig, ns, log, f"--owner-cluster-role={role}", leader_elect=True)
    uninstalled = False
    try:
        wait_for("the operator's objects",
                 lambda: all(exists(cluster, k, n) for k, n in OPERATOR_OBJECTS) or proc.poll() is not None)
        assert proc.poll() is None, log.read_text()[-3000:]
        wait_for("the operator to be ready", lambda: "operator ready" in log.read_text() or proc.poll() is not None)
        for kind, name in OPERATOR_OBJECTS:
            refs = owner_refs(cluster, kind, name)
            assert refs == [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                             "name": role, "uid": uid}], (kind, refs)
        # the certificate Secret in the release namespace has the same owner
        cert = cluster.kubectl_json("get", "secret", "fluxnetes-webhook-cert", "-n", ns)
        assert [r["uid"] for r in cert["metadata"]["ownerReferences"]] == [uid]
        lease = cluster.kubectl_json("get", "lease", "fluxnetes-leader", "-n", ns)
        assert [r["uid"] for r in lease["metadata"].get("ownerReferences") or []] == [uid], lease["metadata"]
        # the probe namespace, when this operator made it (an earlier one may have)
        probe = cluster.kubectl_json("get", "namespace", "fluxnetes-probe")["metadata"]
        probe_owned = [r["uid"] for r in probe.get("ownerReferences") or []] == [uid]
        stop(proc)
        helm(cluster, tmp_path, "uninstall", release, "-n", ns)
        uninstalled = True
        assert not exists(cluster, "clusterrole", role)
        wait_for("the garbage collector to delete the operator's objects",
                 lambda: not any(exists(cluster, k, n) for k, n in OPERATOR_OBJECTS), timeout=120)
        wait_for("the certificate Secret to go",
                 lambda: not cluster.kubectl("get", "secret", "fluxnetes-webhook-cert", "-n", ns,
                                             "--ignore-not-found", "-o", "name").stdout.strip(), timeout=120)
        wait_for("the leader Lease to go",
                 lambda: not cluster.kubectl("get", "lease", "fluxnetes-leader", "-n", ns,
                                             "--ignore-not-found", "-o", "name").stdout.strip(), timeout=120)
        if probe_owned:  # gone completely, so that the next operator can make it again
            wait_for("the probe namespace to go", lambda: not exists(cluster, "namespace", "fluxnetes-probe"),
                     timeout=120)
    finally:
        stop(proc)
        if not uninstalled:
            subprocess.run([str(HELM), "--kubeconfig", str(cluster.kubeconfig), "uninstall", release, "-n", ns],
                           capture_output=True, timeout=180, check=False,
                           env={**os.environ, "HELM_CACHE_HOME": str(tmp_path / "cache"),
                                "HELM_CONFIG_HOME": str(tmp_path / "config"),
                                "HELM_DATA_HOME": str(tmp_path / "data")})
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.k8s
def test_without_the_owner_cluster_role_the_operator_still_runs(no_operator_objects: Any, tmp_path: Path) -> None:
    """Out of cluster with no installation: the default owner (`fluxnetes`) does not exist;
    the operator says so and works, its objects simply have no owner."""
    cluster = no_operator_objects
    assert not exists(cluster, "clusterrole", "fluxnetes-absent")
    ns = f"fx-noown-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "operator.log"
    proc = start_operator(cluster.kubeconfig, ns, log, "--owner-cluster-role=fluxnetes-absent")
    try:
        wait_for("the operator to be ready", lambda: "operator ready" in log.read_text() or proc.poll() is not None)
        assert proc.poll() is None, log.read_text()[-3000:]
        assert "ClusterRole fluxnetes-absent not found" in log.read_text()
        for kind, name in OPERATOR_OBJECTS:
            assert owner_refs(cluster, kind, name) == [], kind
    finally:
        stop(proc)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
