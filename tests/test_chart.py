"""The Helm chart (deploy/chart) and dist/fluxnetes.yaml rendered from it.

Rendering needs the helm binary built by hack/build-helm.sh; without it those tests skip and
say so. The `k8s` tests apply the rendered manifests to the real kube-apiserver of the
`k8s_cluster` fixture (server-side dry run, then for real) and check the chart's RBAC by
impersonating its ServiceAccount.
"""

from __future__ import annotations

import filecmp
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "chart"
DIST = ROOT / "dist" / "fluxnetes.yaml"
HELM = Path(os.environ.get("FLUXNETES_K8S_HOME", Path.home() / ".cache/fluxnetes/k8s")) / "bin/helm"

needs_helm = pytest.mark.skipif(
    not HELM.exists(),
    reason=f"helm is not built ({HELM} missing): run `bash hack/build-helm.sh` (builds it from Go modules)",
)

# What the operator needs (fluxnetes.k8s: operator.py, leader.py, controller.py), checked both on
# the rendered roles and against the apiserver. (verb, resource[/name][#subresource], where):
# where = None for all namespaces / cluster-scoped, "OWN" for the release namespace.
ALLOWED = [
    ("create", "pods#binding", None),  # placement auto (the default) binds pods that need no kube-scheduler check
    ("get", "pods", None),
    ("list", "pods", None),
    ("watch", "pods", None),
    ("patch", "pods", None),
    ("list", "nodes", None),
    ("watch", "nodes", None),
    ("create", "events", None),
    ("watch", "priorityclasses.scheduling.k8s.io", None),
    ("patch", "jobs.batch", None),
    ("watch", "jobs.batch", None),
    ("list", "replicasets.apps", None),
    ("watch", "statefulsets.apps", None),
    ("create", "fluxjobs.fluxnetes.io", None),
    ("list", "fluxjobs.fluxnetes.io", None),
    ("list", "fluxaccounts.fluxnetes.io", None),
    ("watch", "fluxaccounts.fluxnetes.io", None),
    ("patch", "fluxaccounts.fluxnetes.io#status", None),
    ("list", "namespaces", None),
    ("watch", "namespaces", None),
    ("get", "customresourcedefinitions.apiextensions.k8s.io/fluxjobs.fluxnetes.io", None),
    ("update", "customresourcedefinitions.apiextensions.k8s.io/fluxjobs.fluxnetes.io", None),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io/noderesourcetopologies.topology.node.k8s.io", None),
    ("list", "customresourcedefinitions.apiextensions.k8s.io/noderesourcetopologies.topology.node.k8s.io", None),
    ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io", None),
    ("update", "mutatingwebhookconfigurations.admissionregistration.k8s.io/fluxnetes.io", None),
    ("get", "validatingwebhookconfigurations.admissionregistration.k8s.io/fluxnetes.io", None),
    ("create", "validatingadmissionpolicies.admissionregistration.k8s.io", None),
    ("update", "validatingadmissionpolicies.admissionregistration.k8s.io/fluxnetes.io-gate", None),
    ("create", "validatingadmissionpolicybindings.admissionregistration.k8s.io", None),
    ("get", "validatingadmissionpolicybindings.admissionregistration.k8s.io/fluxnetes.io-gate", None),
    ("update", "validatingadmissionpolicybindings.admissionregistration.k8s.io/fluxnetes.io-gate", None),
    ("create", "leases.coordination.k8s.io", "OWN"),
    ("update", "leases.coordination.k8s.io/fluxnetes-leader", "OWN"),
    ("get", "secrets/fluxnetes-webhook-cert", "OWN"),
    ("create", "secrets", "OWN"),
    ("update", "secrets/fluxnetes-webhook-cert", "OWN"),
]
FORBIDDEN = [
    ("delete", "pods", None),  # fluxnetes never deletes user pods
    ("create", "pods", None),
    ("update", "pods", None),
    ("delete", "nodes", None),
    ("patch", "nodes", None),
    ("get", "secrets", "default"),  # secrets only in its own namespace ...
    ("get", "secrets/other", "OWN"),  # ... and only its own Secret there
    ("list", "secrets", None),
    ("update", "leases.coordination.k8s.io/kube-scheduler", "OWN"),
    ("create", "leases.coordination.k8s.io", "default"),
    ("delete", "jobs.batch", None),
    ("update", "deployments.apps", None),
    ("delete", "fluxjobs.fluxnetes.io", None),
    ("update", "fluxaccounts.fluxnetes.io", None),  # accounts are the users' to write
    ("patch", "namespaces", None),
    ("update", "customresourcedefinitions.apiextensions.k8s.io/other.example.com", None),
    ("list", "customresourcedefinitions.apiextensions.k8s.io", None),  # only the NRT one, by name
    ("update", "customresourcedefinitions.apiextensions.k8s.io/noderesourcetopologies.topology.node.k8s.io", None),
    ("update", "mutatingwebhookconfigurations.admissionregistration.k8s.io/someone-else", None),
    ("list", "mutatingwebhookconfigurations.admissionregistration.k8s.io", None),
    ("update", "validatingadmissionpolicies.admissionregistration.k8s.io/someone-else", None),
    ("delete", "validatingadmissionpolicybindings.admissionregistration.k8s.io/someone-else", None),
    ("create", "namespaces", None),
    ("get", "namespaces/kube-system", None),
    ("create", "clusterroles.rbac.authorization.k8s.io", None),
    ("escalate", "roles.rbac.authorization.k8s.io", "OWN"),
]


def helm_template(
    *args: str, namespace: str = "fluxnetes-system", release: str = "fluxnetes"
) -> str:
    res = subprocess.run(
        [str(HELM), "template", release, str(CHART), "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if res.returncode != 0:
        raise AssertionError(f"helm template failed: {res.stderr}")
    return res.stdout


def helm_fails(*args: str) -> str:
    res = subprocess.run(
        [str(HELM), "template", "fluxnetes", str(CHART), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode != 0, f"helm template accepted {args}"
    return res.stderr


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def operator_args(objs: list[dict[str, Any]]) -> dict[str, str]:
    container = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return dict(a.removeprefix("--").split("=", 1) for a in container["args"] if "=" in a)


def assert_restricted(pod_spec: dict[str, Any]) -> None:
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert pod_spec["securityContext"]["runAsUser"] != 0
    assert pod_spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for c in pod_spec["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert "add" not in sc["capabilities"], c["name"]


# -- the CRD has one source ------------------------------------------------------------------


def test_crd_copies_are_identical_to_the_packaged_source() -> None:
    """src/fluxnetes/k8s/crds (shipped in the wheel) is the source; deploy/crds and the
    chart's crds/ are byte-identical copies made by hack/sync-chart-crds.sh."""
    source = ROOT / "src" / "fluxnetes" / "k8s" / "crds"
    src = sorted(p.name for p in source.glob("*.yaml"))
    assert src, "src/fluxnetes/k8s/crds holds no CRD"
    for copy in (ROOT / "deploy" / "crds", CHART / "crds"):
        dst = sorted(p.name for p in copy.glob("*.yaml"))
        assert src == dst, f"{copy} differs from {source}: run `bash hack/sync-chart-crds.sh`"
        for name in src:
            assert filecmp.cmp(source / name, copy / name, shallow=False), (
                f"{copy / name} is stale: run `bash hack/sync-chart-crds.sh`"
            )


def test_crd_ships_in_the_package() -> None:
    """pyproject's package-data includes the CRD, and the operator reads that packaged copy."""
    import fnmatch
    import tomllib

    from fluxnetes.k8s.persistence import fluxjob

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "fluxnetes"
    ]
    rel = f"k8s/crds/{fluxjob.CRD_FILE}"
    assert any(fnmatch.fnmatch(rel, g) for g in globs), (rel, globs)
    assert fluxjob.crd_manifest() == yaml.safe_load(
        (ROOT / "src/fluxnetes/k8s/crds" / fluxjob.CRD_FILE).read_text()
    )


# -- rendering -------------------------------------------------------------------------------


@needs_helm
def test_default_render() -> None:
    objs = docs(helm_template())
    kinds = {o["kind"] for o in objs}
    assert {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "StatefulSet",
        "Secret",
        "PodDisruptionBudget",
        "NetworkPolicy",
    } <= kinds
    assert "ServiceMonitor" not in kinds and "Namespace" not in kinds
    dep = one(objs, "Deployment")
    assert dep["metadata"]["namespace"] == "fluxnetes-system"
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(objs, "ServiceAccount")["metadata"]["name"]
    assert_restricted(pod)
    assert_restricted(one(objs, "StatefulSet")["spec"]["template"]["spec"])
    # the writable /tmp the read-only root filesystem needs
    assert {"name": "tmp", "mountPath": "/tmp"} in pod["containers"][0]["volumeMounts"]
    args = operator_args(objs)
    assert args["policy"] == "easy" and args["match-policy"] == "lonode"
    assert args["namespace-label"] == "fluxnetes.io/enabled=true"
    assert args["service-name"] == "fluxnetes-webhook"
    # the webhook must listen on the pod IP for the Service to reach it
    assert args["webhook-host"] == "0.0.0.0"
    assert args["namespace"] == "$(POD_NAMESPACE)" and args["store"] == "$(FLUXNETES_STORE_URL)"
    # the outage story (docs/high-availability.md): opted-in namespaces refuse what would bypass
    # the queue while no replica serves the webhook; 2 replicas and a PodDisruptionBudget keep one
    assert args["failure-policy"] == "Fail"
    assert (args["lease-duration"], args["renew-deadline"], args["retry-period"]) == ("10", "7", "2")
    # issue 31: only work that waits gets a FluxJob, as `fluxnetes run` does by default
    assert args["fluxjobs"] == "waiting"
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    # the webhook configurations the operator creates are owned by the chart's ClusterRole,
    # which the operator may read (that one only)
    assert args["owner-cluster-role"] == one(objs, "ClusterRole")["metadata"]["name"] == "fluxnetes"
    owner_rule = next(r for r in one(objs, "ClusterRole")["rules"] if r["resources"] == ["clusterroles"])
    assert owner_rule == {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                          "resourceNames": ["fluxnetes"], "verbs": ["get"]}
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["FLUXNETES_STORE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "fluxnetes-store"
    store = one(objs, "Secret", "-store")
    assert store["stringData"]["url"].startswith("postgresql+psycopg://fluxnetes:") and store[
        "stringData"
    ]["url"].endswith("@fluxnetes-postgresql.fluxnetes-system.svc:5432/fluxnetes")
    webhook_svc = one(objs, "Service", "-webhook")
    assert webhook_svc["spec"]["ports"][0]["port"] == 443
    # helm installs the CRD from crds/ (rendered with --include-crds)
    with_crds = docs(helm_template("--include-crds"))
    crd = one(with_crds, "CustomResourceDefinition", "fluxjobs.fluxnetes.io")
    assert crd["metadata"]["name"] == "fluxjobs.fluxnetes.io"
    assert one(with_crds, "CustomResourceDefinition", "fluxaccounts.fluxnetes.io")["spec"]["scope"] == "Cluster"


@needs_helm
def test_operator_args_are_accepted_by_fluxnetes_run() -> None:
    """Every flag the chart passes exists in `fluxnetes run` and parses (no cluster needed)."""
    import typer

    run_cmd = pytest.importorskip("fluxnetes.cli.run_cmd")
    app = typer.Typer()
    run_cmd.register(app)

    @app.callback()
    def _root() -> None:
        pass

    group = typer.main.get_command(app)
    run = group.commands["run"]  # type: ignore[attr-defined]
    env = {"$(POD_NAMESPACE)": "fluxnetes-system", "$(FLUXNETES_STORE_URL)": "sqlite:///tmp/x.db"}
    for values in ([], ["--set", "scheduler.queuePolicy=hybrid"]):
        objs = docs(helm_template(*values))
        container = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        args = []
        for arg in container["args"]:
            for var, value in env.items():
                arg = arg.replace(var, value)
            args.append(arg)
        ctx = run.make_context("run", args)
        assert ctx.params["webhook_host"] == "0.0.0.0"
        assert ctx.params["namespace"] == "fluxnetes-system"


@needs_helm
def test_random_password_differs_between_installs_and_is_not_empty() -> None:
    def password(text: str) -> str:
        return one(docs(text), "Secret", "-postgresql")["stringData"]["password"]

    a, b = password(helm_template()), password(helm_template())
    assert len(a) == 32 and a != b


@needs_helm
def test_rbac_is_least_privilege() -> None:
    objs = docs(helm_template())
    cluster_rules = one(objs, "ClusterRole")["rules"]
    ns_rules = one(objs, "Role")["rules"]
    for rule in cluster_rules + ns_rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "*" not in rule["apiGroups"], rule
        assert "resourceNames" not in rule or rule["resourceNames"], rule
    # Secrets and Leases only through the namespaced Role
    assert not any("secrets" in r["resources"] for r in cluster_rules)
    assert not any("leases" in r["resources"] for r in cluster_rules)
    assert any("secrets" in r["resources"] for r in ns_rules)
    assert one(objs, "Role")["metadata"]["namespace"] == "fluxnetes-system"
    pods = next(r for r in cluster_rules if r["resources"] == ["pods"])
    assert "delete" not in pods["verbs"] and "create" not in pods["verbs"]
    # only the requeue node-loss policy deletes pods (the survivors of a group that lost a node)
    requeue = one(docs(helm_template("--set", "scheduler.onNodeLost=requeue")), "ClusterRole")["rules"]
    pods = next(r for r in requeue if r["resources"] == ["pods"])
    assert "delete" in pods["verbs"] and "create" not in pods["verbs"]
    # Bindings only where the operator binds (placement auto or bind, not affinity)
    assert any(r["resources"] == ["pods/binding"] for r in cluster_rules)
    affinity = one(docs(helm_template("--set", "scheduler.placement=affinity")), "ClusterRole")["rules"]
    assert not any("pods/binding" in r["resources"] for r in affinity)


# (apiGroup, resource) -> verbs: what the operator calls on each multi-role kind (informers in
# k8s/groups/podset_groups.py; resume and requeue patches in k8s/scheduling/allocation.py); it never creates,
# updates or deletes them, and an LWS (no suspend field) is only read
MULTI_ROLE = {
    ("kubeflow.org", "mpijobs"): {"get", "list", "watch", "patch"},
    ("jobset.x-k8s.io", "jobsets"): {"get", "list", "watch", "patch"},
    ("trainer.kubeflow.org", "trainjobs"): {"get", "list", "watch", "patch"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {"get", "list", "watch"},
}


def multi_role_grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                if (group, res) in MULTI_ROLE:
                    assert "resourceNames" not in rule, rule  # every workload, not some
                    out.setdefault((group, res), set()).update(rule["verbs"])
    return out


@needs_helm
def test_rbac_grants_the_multi_role_kinds() -> None:
    """Without these rules a chart install keeps MPIJob, JobSet, TrainJob and LWS off
    (podset_groups.watchable): exactly the verbs the operator uses, in the chart and in dist."""
    rendered = one(docs(helm_template()), "ClusterRole")["rules"]
    assert multi_role_grants(rendered) == MULTI_ROLE
    shipped = [o for o in docs(DIST.read_text()) if o.get("kind") == "ClusterRole"
               and o["metadata"]["name"] == "fluxnetes"]
    assert len(shipped) == 1 and multi_role_grants(shipped[0]["rules"]) == MULTI_ROLE


@needs_helm
def test_non_default_values() -> None:
    objs = docs(
        helm_template(
            "--set",
            "replicas=3",
            "--set",
            "scheduler.queuePolicy=conservative",
            "--set",
            "scheduler.matchPolicy=hinodex",
            "--set",
            "scheduler.reservationDepth=8",
            "--set",
            "webhook.namespaceLabel=example.com/hpc",
            "--set",
            "webhook.failurePolicy=Ignore",
            "--set",
            "postgresql.enabled=false",
            "--set",
            "store.url=postgresql+psycopg://u:p@db.example.com:5432/fx",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "image.tag=9.9.9",
            "--set",
            "resources.requests.cpu=2",
            "--set",
            "extraArgs={--verbose}",
            "--set",
            "scheduler.fluxjobs=all",
            "--set",
            "createNamespace=true",
            namespace="hpc",
            release="sched",
        )
    )
    kinds = [o["kind"] for o in objs]
    assert "StatefulSet" not in kinds and "NetworkPolicy" not in kinds
    assert "ServiceMonitor" in kinds and "Namespace" in kinds
    ns = one(objs, "Namespace")
    assert ns["metadata"]["name"] == "hpc"
    assert ns["metadata"]["labels"]["example.com/hpc"] == "false"
    dep = one(objs, "Deployment")
    assert dep["metadata"]["name"] == "sched-fluxnetes"
    assert dep["spec"]["replicas"] == 3
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].endswith(":9.9.9")
    assert container["resources"]["requests"]["cpu"] == 2
    assert container["args"][-1] == "--verbose"
    args = operator_args(objs)
    assert args["policy"] == "conservative" and args["match-policy"] == "hinodex"
    assert args["namespace-label"] == "example.com/hpc=true"
    assert args["failure-policy"] == "Ignore"
    assert args["fluxjobs"] == "all"
    assert args["owner-cluster-role"] == one(objs, "ClusterRole")["metadata"]["name"] == "sched-fluxnetes"
    hybrid = docs(
        helm_template(
            "--set", "scheduler.queuePolicy=hybrid", "--set", "scheduler.reservationDepth=8"
        )
    )
    assert operator_args(hybrid)["policy"] == "hybrid:8"
    secrets = by_kind(objs, "Secret")
    assert [s["metadata"]["name"] for s in secrets] == ["sched-fluxnetes-store"]
    assert secrets[0]["stringData"]["url"] == "postgresql+psycopg://u:p@db.example.com:5432/fx"
    # one replica: no PodDisruptionBudget (it could never be satisfied during a drain)
    single = docs(helm_template("--set", "replicas=1"))
    assert "PodDisruptionBudget" not in [o["kind"] for o in single]


@needs_helm
def test_existing_secret_for_the_store() -> None:
    objs = docs(
        helm_template("--set", "postgresql.enabled=false", "--set", "store.existingSecret=my-db")
    )
    assert by_kind(objs, "Secret") == []
    env = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    ref = next(e for e in env if e["name"] == "FLUXNETES_STORE_URL")
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "my-db", "key": "url"}


@needs_helm
@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("--set", "scheduler.matchPolicy=best"), "scheduler.matchPolicy"),
        (("--set", "scheduler.matchPolicy=nearest"), "scheduler.matchPolicy"),
        (("--set", "scheduler.queuePolicy=lifo"), "scheduler.queuePolicy"),
        (("--set", "scheduler.reservationDepth=-1"), "scheduler.reservationDepth"),
        (("--set", "webhook.failurePolicy=Maybe"), "webhook.failurePolicy"),
        (("--set", "postgresql.enabled=false"), "store"),
        (("--set", "store.url=postgresql+psycopg://x@y/z"), "store"),
        (("--set", "replicas=0"), "replicas"),
        (("--set", "scheduler.onNodeLost=ignore"), "scheduler.onNodeLost"),
        (("--set", "scheduler.placement=nearby"), "scheduler.placement"),
        (("--set", "scheduler.jobMode=pause"), "scheduler.jobMode"),
        (("--set", "scheduler.fluxjobs=some"), "scheduler.fluxjobs"),
        (("--set", "webhook.namespaceLabel=a=b"), "webhook.namespaceLabel"),
        (
            ("--set", "postgresql.auth.generateInCluster=true", "--set", "postgresql.auth.password=x"),
            "postgresql.auth.generateInCluster",
        ),
        (("--set", "postgresql.auth.username=a@b"), "postgresql.auth.username"),
    ],
)
def test_bad_values_are_refused_naming_the_field(args: tuple[str, ...], field: str) -> None:
    assert f"{field}:" in helm_fails(*args)


# -- dist/fluxnetes.yaml -----------------------------------------------------------------------

DIST_VALUES = ("--include-crds", "--set", "createNamespace=true", "--set", "postgresql.auth.generateInCluster=true")

@needs_helm
def test_dist_is_up_to_date() -> None:
    assert DIST.exists(), "dist/fluxnetes.yaml is missing: run `bash hack/render-dist.sh`"
    committed = DIST.read_text()
    # the file is a comment header, then exactly what `helm template` printed
    body = committed[committed.index("---\n") :]
    fresh = helm_template(*DIST_VALUES)
    # nothing random is rendered into it: two renders are byte-identical
    assert fresh == helm_template(*DIST_VALUES)
    assert body == fresh, "dist/fluxnetes.yaml is stale: run `bash hack/render-dist.sh`"
    objs = docs(committed)
    assert one(objs, "Namespace")["metadata"]["name"] == "fluxnetes-system"
    assert one(objs, "CustomResourceDefinition", "fluxjobs.fluxnetes.io")["metadata"]["name"] == "fluxjobs.fluxnetes.io"
    assert one(objs, "CustomResourceDefinition", "fluxaccounts.fluxnetes.io")


@needs_helm
def test_dist_ships_no_password() -> None:
    """The static manifest carries no secret: no Secret object, no password value, and the
    store URL's password is a reference to the Secret made in the cluster."""
    text = DIST.read_text()
    objs = docs(text)
    assert by_kind(objs, "Secret") == []
    assert "stringData" not in text
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"password:\s*\S", code.replace("key: password", "")), "a password value in dist"
    urls = re.findall(r"postgresql\+psycopg://[^\s\"]+", text)
    assert urls == [
        "postgresql+psycopg://fluxnetes:$(FLUXNETES_PG_PASSWORD)@fluxnetes-postgresql.fluxnetes-system.svc:5432/fluxnetes"
    ]
    # ... and the helm-generated mode does render one (the check above would see it)
    assert re.search(r"password:\s*\S", helm_template().replace("key: password", ""))


@needs_helm
def test_password_made_in_the_cluster_render() -> None:
    """postgresql.auth.generateInCluster: the PostgreSQL pod's init container runs
    `fluxnetes store ensure-secret` with an identity that may create that Secret and nothing
    more; only the init container gets an API token; the operator reads the password from the
    Secret it makes and builds its store URL from it."""
    objs = docs(helm_template("--set", "postgresql.auth.generateInCluster=true"))
    assert by_kind(objs, "Secret") == []
    sts = one(objs, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "fluxnetes-postgresql"
    assert pod["automountServiceAccountToken"] is False
    (init,) = pod["initContainers"]
    assert init["command"] == [
        "fluxnetes", "store", "ensure-secret", "--namespace=$(POD_NAMESPACE)", "--name=fluxnetes-postgresql",
        "--key=password",
    ]
    assert init["image"] == one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    token_mounts = [
        (c["name"], m["mountPath"])
        for c in pod["initContainers"] + pod["containers"]
        for m in c.get("volumeMounts", [])
        if m["name"] == "api-token"
    ]
    assert token_mounts == [("ensure-secret", "/var/run/secrets/kubernetes.io/serviceaccount")]
    assert_restricted({**pod, "containers": pod["containers"] + pod["initContainers"]})
    pg_env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "fluxnetes-postgresql", "key": "password"}
    role = one(objs, "Role", "-postgresql")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["fluxnetes-postgresql"], "verbs": ["get"]},
    ]
    binding = one(objs, "RoleBinding", "-postgresql")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fluxnetes-postgresql",
                                    "namespace": "fluxnetes-system"}]
    env = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    # $(VAR) in a value only expands variables defined before it
    assert names.index("FLUXNETES_PG_PASSWORD") < names.index("FLUXNETES_STORE_URL")
    by_name = {e["name"]: e for e in env}
    assert by_name["FLUXNETES_PG_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "fluxnetes-postgresql", "key": "password"}
    from fluxnetes.store import check_url

    url = by_name["FLUXNETES_STORE_URL"]["value"]
    check_url(url.replace("$(FLUXNETES_PG_PASSWORD)", "Abc123"))
    # the init container pulls the operator's image: with the operator's pull secrets
    pulled = docs(helm_template("--set", "postgresql.auth.generateInCluster=true", "--set", "imagePullSecrets[0].name=reg"))
    assert one(pulled, "StatefulSet")["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "reg"}]
    # without the bundled PostgreSQL the option changes nothing
    ext = docs(helm_template("--set", "postgresql.auth.generateInCluster=true", "--set", "postgresql.enabled=false",
                             "--set", "store.url=postgresql+psycopg://u:p@db:5432/fx"))
    assert [s["metadata"]["name"] for s in by_kind(ext, "Secret")] == ["fluxnetes-store"]
    assert "StatefulSet" not in [o["kind"] for o in ext]


# -- against the real kube-apiserver ------------------------------------------------------------


@pytest.fixture
def installed(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str, str]]:
    """Apply the chart (rendered into a fresh namespace) to the dev cluster; yield
    (cluster, namespace, service account); delete what was created afterwards."""
    if not HELM.exists():
        pytest.skip(f"helm is not built ({HELM} missing): run `bash hack/build-helm.sh`")
    try:
        cluster = request.getfixturevalue("k8s_cluster")
    except pytest.FixtureLookupError:
        pytest.skip("no k8s_cluster fixture (tests/conftest.py) in this checkout")
    ns = f"fx-chart-{uuid.uuid4().hex[:6]}"
    release = ns
    text = helm_template(
        "--include-crds", "--set", "createNamespace=true", namespace=ns, release=release
    )
    objs = docs(text)
    # a server-side dry run cannot create the namespace its objects go into: create that first
    cluster.kubectl("create", "namespace", ns)
    try:
        dry = cluster.kubectl(
            "apply", "--dry-run=server", "--server-side", "--force-conflicts", "-f", "-", input=text
        )
        assert "serverside-applied (server dry run)" in dry.stdout
        # the dry run created nothing
        assert cluster.kubectl("get", "deploy,sts,role,secret", "-n", ns, "-o", "name").stdout == ""
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=text)
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", "crd/fluxjobs.fluxnetes.io"
        )
        sa = one(objs, "ServiceAccount")["metadata"]["name"]
        yield cluster, ns, sa
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for kind in ("ClusterRole", "ClusterRoleBinding"):
            for o in by_kind(objs, kind):
                cluster.kubectl("delete", kind.lower(), o["metadata"]["name"], check=False)


def can_i(cluster: Any, ns: str, sa: str, verb: str, resource: str, where: str | None) -> bool:
    scope = ["--all-namespaces"] if where is None else ["-n", ns if where == "OWN" else where]
    if "#" in resource:  # kubectl takes a subresource as a flag (TYPE/NAME is a named object)
        resource, sub = resource.split("#", 1)
        scope.append(f"--subresource={sub}")
    res = cluster.kubectl(
        "auth",
        "can-i",
        verb,
        resource,
        f"--as=system:serviceaccount:{ns}:{sa}",
        *scope,
        check=False,
    )
    answer = res.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl auth can-i: {res.stdout} {res.stderr}"
    return answer == "yes"


def sar_allows(cluster: Any, ns: str, sa: str, verb: str, group: str, resource: str) -> bool:
    """A SubjectAccessReview for the ServiceAccount, cluster-wide. `kubectl auth can-i` cannot
    name a resource whose CRD is not installed (it drops the group), so the multi-role kinds
    are asked this way: RBAC does not need their CRDs."""
    review = {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{ns}:{sa}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource},
        },
    }
    res = cluster.kubectl("create", "-o", "json", "-f", "-", input=yaml.safe_dump(review))
    return bool(yaml.safe_load(res.stdout)["status"].get("allowed"))


@pytest.mark.k8s
def test_rendered_manifests_apply_to_the_real_apiserver(installed: tuple[Any, str, str]) -> None:
    cluster, ns, sa = installed
    dep = cluster.kubectl_json("get", "deployment", "-n", ns)["items"]
    assert len(dep) == 1 and dep[0]["spec"]["replicas"] == 2
    sts = cluster.kubectl_json("get", "statefulset", "-n", ns)["items"]
    assert len(sts) == 1
    crd = cluster.kubectl_json("get", "crd", "fluxjobs.fluxnetes.io")
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    # the CRD serves FluxJobs
    assert cluster.kubectl("get", "fluxjobs", "-n", ns).returncode == 0
    assert cluster.kubectl_json("get", "serviceaccount", sa, "-n", ns)["metadata"]["name"] == sa


@pytest.mark.k8s
def test_service_account_can_do_its_job_and_nothing_more(installed: tuple[Any, str, str]) -> None:
    cluster, ns, sa = installed
    denied = [a for a in ALLOWED if not can_i(cluster, ns, sa, *a)]
    assert denied == [], f"the operator's ServiceAccount lacks {denied}"
    granted = [f for f in FORBIDDEN if can_i(cluster, ns, sa, *f)]
    assert granted == [], f"the operator's ServiceAccount may {granted}"
    # the owner of its webhook configurations: its own ClusterRole, read only
    role = f"clusterroles.rbac.authorization.k8s.io/{ns}-fluxnetes"
    assert can_i(cluster, ns, sa, "get", role, None)
    assert not can_i(cluster, ns, sa, "update", role, None)
    assert not can_i(cluster, ns, sa, "delete", role, None)
    assert not can_i(cluster, ns, sa, "get", "clusterroles.rbac.authorization.k8s.io/admin", None)
    assert not can_i(cluster, ns, sa, "list", "clusterroles.rbac.authorization.k8s.io", None)
    # the multi-role kinds: exactly their verbs
    every = {"get", "list", "watch", "patch", "create", "update", "delete"}
    wrong = [(verb, group, res) for (group, res), verbs in MULTI_ROLE.items() for verb in sorted(every)
             if sar_allows(cluster, ns, sa, verb, group, res) != (verb in verbs)]
    assert wrong == [], f"multi-role kinds: these answers differ from {MULTI_ROLE}: {wrong}"


def test_agent_mounts_the_secret_the_operator_makes_whatever_the_release_name() -> None:
    """The operator names its webhook-certificate Secret itself (install.SECRET_NAME); the
    agent DaemonSet mounts its CA from that Secret and the Role grants exactly it. A release not
    called `fluxnetes` once mounted `<release>-fluxnetes-webhook-cert`, which never exists: the
    agent pods waited in ContainerCreating (found by tests/test_realnode_chart.py)."""
    from fluxnetes.k8s.admission.install import SECRET_NAME

    objs = docs(helm_template("--set", "agent.enabled=true", release="flx"))
    ds = one(objs, "DaemonSet")
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert vols["ca"]["secret"]["secretName"] == SECRET_NAME
    role = next(r for r in by_kind(objs, "Role") if r["metadata"]["name"] == "flx-fluxnetes")
    granted = {n for rule in role["rules"] if "secrets" in rule["resources"]
               for n in rule.get("resourceNames") or []}
    assert granted == {SECRET_NAME}
