"""`fluxnetes store ensure-secret` and the chart's password-made-in-the-cluster mode
(postgresql.auth.generateInCluster, how dist/fluxnetes.yaml is rendered), against the real
kube-apiserver of the session cluster.

kwok runs no containers, so the PostgreSQL pod's init container cannot run there: the test
runs the init container's exact command (taken from the rendered StatefulSet) here, with a
token of the ServiceAccount the chart gives that pod.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HELM = Path(os.environ.get("FLUXNETES_K8S_HOME", Path.home() / ".cache/fluxnetes/k8s")) / "bin/helm"


def fluxnetes(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The `fluxnetes` command as a user (or the init container) runs it; the identity comes
    from $KUBECONFIG as it would from the pod's token in cluster."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    env["HOME"] = os.environ.get("HOME", "/tmp")
    res = subprocess.run([sys.executable, "-m", "fluxnetes", *args], capture_output=True, text=True,
                         timeout=120, check=False, env=env, cwd=ROOT)
    res.stderr = " ".join(res.stderr.split())  # rich wraps long messages at the terminal width
    return res


def token_kubeconfig(cluster: Any, ns: str, sa: str, path: Path) -> Path:
    token = cluster.kubectl("create", "token", sa, "-n", ns, "--duration=1h").stdout.strip()
    kc = yaml.safe_load(cluster.kubeconfig.read_text())
    kc["users"] = [{"name": sa, "user": {"token": token}}]
    for ctx in kc["contexts"]:
        ctx["context"]["user"] = sa
    path.write_text(yaml.safe_dump(kc))
    return path


def secret_data(cluster: Any, ns: str, name: str) -> dict[str, str]:
    data = cluster.kubectl_json("get", "secret", name, "-n", ns)["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


@pytest.fixture
def namespace(k8s_cluster: Any) -> Iterator[tuple[Any, str]]:
    ns = f"fx-secret-{uuid.uuid4().hex[:6]}"
    k8s_cluster.kubectl("create", "namespace", ns)
    try:
        yield k8s_cluster, ns
    finally:
        k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_bad_arguments_are_refused_naming_the_option() -> None:
    for args, option in (
        (["--name", "Bad_Name", "--namespace", "x"], "--name"),
        (["--name", "ok", "--namespace", "x.y"], "--namespace"),
        (["--name", "ok", "--namespace", "x", "--key", "a b"], "--key"),
        (["--name", "ok", "--namespace", "x", "--length", "8"], "--length"),
    ):
        res = fluxnetes("store", "ensure-secret", *args)
        assert res.returncode == 1 and f"error: {option}:" in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr
    res = fluxnetes("store", "ensure-secret", "-n", "x", "--name", "y", "--kubeconfig", "/nonexistent/kc")
    assert res.returncode == 1 and "error: --kubeconfig: /nonexistent/kc is not a file" in res.stderr, res.stderr


def test_no_cluster_configuration_is_a_clear_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    res = subprocess.run([sys.executable, "-m", "fluxnetes", "store", "ensure-secret", "-n", "x", "--name", "y"],
                         capture_output=True, text=True, timeout=120, check=False, env=env, cwd=ROOT)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2, err
    assert "error: no usable Kubernetes configuration: not in a cluster" in err and "Traceback" not in err


def test_creates_once_then_keeps_the_secret(namespace: tuple[Any, str]) -> None:
    cluster, ns = namespace
    args = ("store", "ensure-secret", "--namespace", ns, "--name", "db-password")
    first = fluxnetes(*args, kubeconfig=cluster.kubeconfig)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"secret {ns}/db-password: created with a random password (32 characters)"
    password = secret_data(cluster, ns, "db-password")["password"]
    assert len(password) == 32 and password.isalnum()
    assert password not in first.stdout + first.stderr  # never printed
    labels = cluster.kubectl_json("get", "secret", "db-password", "-n", ns)["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "fluxnetes"
    again = fluxnetes(*args, kubeconfig=cluster.kubeconfig)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"secret {ns}/db-password: exists, kept unchanged"
    assert secret_data(cluster, ns, "db-password") == {"password": password}
    # another name gets another password
    assert fluxnetes("store", "ensure-secret", "-n", ns, "--name", "other", "--length", "40",
                     kubeconfig=cluster.kubeconfig).returncode == 0
    other = secret_data(cluster, ns, "other")["password"]
    assert len(other) == 40 and other != password


def test_keeps_an_existing_secret_and_refuses_one_without_the_key(namespace: tuple[Any, str]) -> None:
    cluster, ns = namespace
    cluster.kubectl("create", "secret", "generic", "mine", "-n", ns, "--from-literal=password=chosen-by-me")
    res = fluxnetes("store", "ensure-secret", "-n", ns, "--name", "mine", kubeconfig=cluster.kubeconfig)
    assert res.returncode == 0 and "kept unchanged" in res.stdout, res.stderr
    assert secret_data(cluster, ns, "mine") == {"password": "chosen-by-me"}
    cluster.kubectl("create", "secret", "generic", "nokey", "-n", ns, "--from-literal=user=x")
    res = fluxnetes("store", "ensure-secret", "-n", ns, "--name", "nokey", kubeconfig=cluster.kubeconfig)
    assert res.returncode == 2
    assert f"Secret {ns}/nokey exists but has no key 'password'; it was left unchanged" in res.stderr
    assert secret_data(cluster, ns, "nokey") == {"user": "x"}


def test_clear_errors_without_permission_or_namespace(namespace: tuple[Any, str], tmp_path: Path) -> None:
    cluster, ns = namespace
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", ns)
    kc = token_kubeconfig(cluster, ns, "nobody", tmp_path / "nobody.kubeconfig")
    res = fluxnetes("store", "ensure-secret", "-n", ns, "--name", "db", kubeconfig=kc)
    assert res.returncode == 2, res.stdout
    assert "error: permission denied: GET" in res.stderr
    assert f"needs `get` on secrets/db and `create` on secrets in namespace {ns}" in res.stderr
    assert "Traceback" not in res.stderr
    assert cluster.kubectl("get", "secret", "db", "-n", ns, "--ignore-not-found", "-o", "name").stdout == ""
    res = fluxnetes("store", "ensure-secret", "-n", f"{ns}-absent", "--name", "db", kubeconfig=cluster.kubeconfig)
    assert res.returncode == 2 and f"namespace {ns}-absent not found" in res.stderr, res.stderr


@pytest.mark.skipif(not HELM.exists(), reason=f"helm is not built ({HELM} missing): run `bash hack/build-helm.sh`")
def test_dist_mode_init_container_makes_the_password_with_least_privilege(
    namespace: tuple[Any, str], tmp_path: Path
) -> None:
    """Rendered like dist/fluxnetes.yaml (password made in the cluster), applied to the real
    API server: the init container's command, run as the PostgreSQL pod's ServiceAccount,
    creates the Secret both pods read; that identity can do nothing else."""
    cluster, ns = namespace
    text = subprocess.run(
        [str(HELM), "template", ns, str(ROOT / "deploy/chart"), "-n", ns,
         "--set", "postgresql.auth.generateInCluster=true"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    objs = [d for d in yaml.safe_load_all(text) if d]
    cluster.kubectl("apply", "--server-side", "-f", "-", input=text)
    try:
        sts = next(o for o in objs if o["kind"] == "StatefulSet")
        pod = sts["spec"]["template"]["spec"]
        sa = pod["serviceAccountName"]
        (init,) = pod["initContainers"]
        command = [a.replace("$(POD_NAMESPACE)", ns) for a in init["command"]]
        assert command[0] == "fluxnetes"
        kc = token_kubeconfig(cluster, ns, sa, tmp_path / "pg.kubeconfig")
        first = fluxnetes(*command[1:], kubeconfig=kc)
        assert first.returncode == 0 and "created" in first.stdout, first.stderr
        secret_name = next(a.split("=", 1)[1] for a in command if a.startswith("--name="))
        password = secret_data(cluster, ns, secret_name)["password"]
        # a restart of the pod keeps it (the data directory was initialised with it)
        again = fluxnetes(*command[1:], kubeconfig=kc)
        assert again.returncode == 0 and "kept unchanged" in again.stdout, again.stderr
        assert secret_data(cluster, ns, secret_name)["password"] == password
        # what PostgreSQL and the operator read is that Secret's key
        pg_env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": secret_name, "key": "password"}
        dep = next(o for o in objs if o["kind"] == "Deployment")
        env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["FLUXNETES_PG_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": secret_name, "key": "password"}
        url = env["FLUXNETES_STORE_URL"]["value"].replace("$(FLUXNETES_PG_PASSWORD)", password)
        from fluxnetes.store import check_url

        check_url(url)
        assert url == f"postgresql+psycopg://fluxnetes:{password}@{secret_name}.{ns}.svc:5432/fluxnetes"

        # least privilege: that Secret only (create cannot be limited by name in RBAC)
        def can_i(*args: str) -> bool:
            res = cluster.kubectl("auth", "can-i", *args, f"--as=system:serviceaccount:{ns}:{sa}", check=False)
            return res.stdout.strip() == "yes"

        assert can_i("get", f"secrets/{secret_name}", "-n", ns)
        assert can_i("create", "secrets", "-n", ns)
        for args in (("get", "secrets/other", "-n", ns), ("list", "secrets", "-n", ns),
                     ("update", f"secrets/{secret_name}", "-n", ns), ("delete", f"secrets/{secret_name}", "-n", ns),
                     ("create", "secrets", "-n", "default"), ("get", "pods", "-n", ns),
                     ("get", "secrets", "--all-namespaces")):
            assert not can_i(*args), args
    finally:
        for o in objs:
            if o["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                cluster.kubectl("delete", o["kind"].lower(), o["metadata"]["name"], "--ignore-not-found", check=False)
