"""The operator, started out of cluster with nothing but the chart's ServiceAccount (a token
from the TokenRequest API), does its job: it starts, serves and registers its webhook, takes
the lease and places an opted-in pod. A verb the chart does not grant is refused. Its webhook
configurations are owned by the chart's ClusterRole: `kubectl delete -f dist/fluxnetes.yaml`
takes them away. The manifests are dist/fluxnetes.yaml itself, as shipped.

This test runs its own small control plane: the operator's webhook configurations are
cluster-wide objects, and it must not fight an operator started by another test over them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NS = "fluxnetes-system"

# `fluxnetes run`, without going through cli/main.py (which imports every command module)
RUN = """
import sys, typer
from fluxnetes.cli import run_cmd
app = typer.Typer()
run_cmd.register(app)
@app.callback()
def _root() -> None: pass
app(["run", *sys.argv[1:]])
"""


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Any]:
    from fluxnetes.devcluster import Cluster, ClusterOptions, NodeShape

    pytest.importorskip("fluxnetes.k8s.operator")
    cluster = Cluster.up(
        ClusterOptions(
            nodes=NodeShape(count=2, cpu="8", memory="32Gi"),
            dir=tmp_path / "cluster",
            die_with_parent=True,
        )
    )
    try:
        yield cluster
    finally:
        cluster.down()


def sa_kubeconfig(cluster: Any, path: Path) -> Path:
    token = cluster.kubectl(
        "create", "token", "fluxnetes", "-n", NS, "--duration=1h"
    ).stdout.strip()
    kc = yaml.safe_load(cluster.kubeconfig.read_text())
    kc["users"] = [{"name": "fluxnetes-sa", "user": {"token": token}}]
    for ctx in kc["contexts"]:
        ctx["context"]["user"] = "fluxnetes-sa"
    path.write_text(yaml.safe_dump(kc))
    return path


def wait_for(what: str, check: Any, timeout: float = 90) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.k8s
@pytest.mark.slow
def test_operator_runs_with_the_chart_service_account(own_cluster: Any, tmp_path: Path) -> None:
    cluster = own_cluster
    # the shipped file, as a user applies it: server-side dry run (into its namespace, which a
    # dry run cannot create), then for real
    rendered = (ROOT / "dist/fluxnetes.yaml").read_text()
    cluster.kubectl("create", "namespace", NS)
    dry = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=rendered)
    assert "deployment.apps/fluxnetes serverside-applied (server dry run)" in dry.stdout
    assert cluster.kubectl("get", "deploy,sts", "-n", NS, "-o", "name").stdout == ""
    cluster.kubectl("apply", "--server-side", "-f", "-", input=rendered)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/fluxjobs.fluxnetes.io")
    # no image to run in the fake cluster: the operator runs here, as the chart's identity
    cluster.kubectl("scale", "deployment/fluxnetes", "-n", NS, "--replicas=0")
    kubeconfig = sa_kubeconfig(cluster, tmp_path / "sa.kubeconfig")
    log = (tmp_path / "operator.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RUN,
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            NS,
            "--webhook-port",
            "0",
            # the ServiceAccount must be able to write FluxJobs: every group gets one, the pod
            # below placed at once too (the default, --fluxjobs waiting, would write none)
            "--fluxjobs",
            "all",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        wait_for(
            "the operator's lease",
            lambda: (
                cluster.kubectl(
                    "get", "lease", "fluxnetes-leader", "-n", NS, check=False
                ).returncode
                == 0
            ),
        )
        assert (
            cluster.kubectl(
                "get", "mutatingwebhookconfiguration", "fluxnetes.io", check=False
            ).returncode
            == 0
        )
        assert (
            cluster.kubectl(
                "get", "secret", "fluxnetes-webhook-cert", "-n", NS, check=False
            ).returncode
            == 0
        )
        cluster.kubectl("apply", "-f", str(ROOT / "examples/k8s/namespace.yaml"))
        cluster.kubectl("apply", "-f", str(ROOT / "examples/k8s/pod.yaml"))
        node = wait_for(
            "the pod to be placed",
            lambda: (
                cluster.kubectl(
                    "get", "pod", "pod", "-n", "flux-demo", "-o", "jsonpath={.spec.nodeName}"
                ).stdout
            ),
        )
        fj = wait_for(
            "its FluxJob to be Running",
            lambda: next(
                (
                    f
                    for f in cluster.kubectl_json("get", "fluxjobs", "-n", "flux-demo")["items"]
                    if (f.get("status") or {}).get("phase") == "Running"
                ),
                None,
            ),
        )
        assert fj["status"]["nodes"] == [node]
        assert proc.poll() is None, "the operator exited"
        # read with the chart's identity (`get` on its own ClusterRole only): the owner
        uid = cluster.kubectl_json("get", "clusterrole", "fluxnetes")["metadata"]["uid"]
        for kind in OPERATOR_OBJECTS:
            obj = cluster.kubectl_json("get", *kind)
            assert [(r["kind"], r["name"], r["uid"]) for r in obj["metadata"]["ownerReferences"]] == [
                ("ClusterRole", "fluxnetes", uid)
            ], kind
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    text = (tmp_path / "operator.log").read_text()
    assert "Forbidden" not in text and " 403" not in text and "HTTP 403" not in text, text[-3000:]
    # ... and nothing more: the same identity may not delete pods or read others' secrets
    for args in (
        ("delete", "pod", "pod", "-n", "flux-demo"),
        ("get", "secrets", "-n", "kube-system"),
    ):
        res = subprocess.run(
            [str(cluster.tools.binary("kubectl")), f"--kubeconfig={kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert res.returncode != 0 and "forbidden" in res.stderr.lower(), (args, res.stderr)
    # uninstall the way dist/fluxnetes.yaml is uninstalled: the garbage collector follows
    cluster.kubectl("delete", "-f", "-", "--wait=false", input=rendered)
    wait_for(
        "the webhook configuration and gate policy to be garbage-collected",
        lambda: not any(
            cluster.kubectl("get", *kind, "--ignore-not-found", "-o", "name").stdout.strip()
            for kind in OPERATOR_OBJECTS
        ),
        timeout=120,
    )


OPERATOR_OBJECTS = [
    ("mutatingwebhookconfiguration", "fluxnetes.io"),
    ("validatingadmissionpolicy", "fluxnetes.io-gate"),
    ("validatingadmissionpolicybinding", "fluxnetes.io-gate"),
]
