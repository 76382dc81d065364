"""`fluxnetes dev cluster up --addons ...` without starting anything: which addons, their
command lines and configuration, their webhook configurations, and the errors a user sees
(an unknown addon; controllers not built yet, naming hack/build-addons.sh). The controllers
themselves run in tests/test_addons.py."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fluxnetes.cli.main import app
from fluxnetes.devcluster import BinariesMissing, Cluster, ClusterError, ClusterOptions, k8s_home
from fluxnetes.devcluster import addons as addon_defs
from fluxnetes.devcluster.paths import BINARIES, KWOK_STAGES

JOBSET_MANIFEST = """\
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-jobset-x-k8s-io-v1alpha2-jobset}
  failurePolicy: Fail
  name: mjobset.kb.io
  rules:
  - {apiGroups: [jobset.x-k8s.io], apiVersions: [v1alpha2], operations: [CREATE], resources: [jobsets]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  sideEffects: None
"""


def test_parse_orders_and_adds_requirements() -> None:
    assert addon_defs.parse("") == ()
    assert addon_defs.parse("trainer") == ("jobset", "trainer")
    assert addon_defs.parse("lws, MPI,jobset") == ("jobset", "mpi", "lws")
    # all: the workload controllers; a peer (kueue) only when named, started after them
    assert addon_defs.parse("all") == addon_defs.WORKLOAD_ADDONS
    assert addon_defs.parse("kueue,all") == (*addon_defs.WORKLOAD_ADDONS, "kueue")
    assert addon_defs.parse("kueue,mpi") == ("mpi", "kueue")
    assert addon_defs.parse("coscheduling,kueue") == ("kueue", "coscheduling")
    with pytest.raises(addon_defs.AddonError,
                       match=r"--addons: unknown addon\(s\) volcano .*known: coscheduling, jobset, kueue, lws, mpi, trainer"):
        addon_defs.parse("volcano,mpi")


def test_crd_name_from_controller_gen_file_name() -> None:
    assert addon_defs.crd_name(Path("x/kubeflow.org_mpijobs.yaml")) == "mpijobs.kubeflow.org"
    assert addon_defs.crd_name(Path("jobset.x-k8s.io_jobsets.yaml")) == "jobsets.jobset.x-k8s.io"


def test_missing_names_the_build_script(tmp_path: Path) -> None:
    absent = addon_defs.missing(("mpi", "trainer"), tmp_path)
    assert str(tmp_path / "addons" / "mpi" / "bin" / "manager") in absent
    assert str(tmp_path / "addons" / "trainer" / "runtimes") in absent
    msg = addon_defs.missing_message(("mpi", "trainer"), absent)
    assert "bash hack/build-addons.sh mpi trainer" in msg
    # an addon of two processes needs both binaries and its CRDs (no webhooks)
    bin_dir = tmp_path / "addons" / "coscheduling" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "controller").write_text("#!/bin/sh\n")
    (bin_dir / "controller").chmod(0o755)
    assert addon_defs.missing(("coscheduling",), tmp_path) == [
        str(bin_dir / "scheduler"), str(tmp_path / "addons" / "coscheduling" / "crds")]
    assert "bash hack/build-addons.sh coscheduling" in addon_defs.missing_message(("coscheduling",), ["x"])


def _fake_k8s_home(tmp_path: Path) -> Path:
    """Control plane binaries as (non-working) executables, no addon."""
    home = tmp_path / "k8s"
    (home / "bin").mkdir(parents=True)
    for b in BINARIES:
        exe = home / "bin" / b
        exe.write_text("#!/bin/sh\nexit 1\n")
        exe.chmod(0o755)
    for rel in KWOK_STAGES:
        (home / "stages" / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / "stages" / rel).write_text("")
    return home


def test_up_refuses_unbuilt_addons_before_starting_anything(tmp_path: Path) -> None:
    home = _fake_k8s_home(tmp_path)
    with pytest.raises(BinariesMissing, match=r"hack/build-addons\.sh jobset trainer"):
        Cluster.up(ClusterOptions(dir=tmp_path / "c", k8s_home=home, addons=("trainer",)))
    with pytest.raises(ClusterError, match="unknown addon"):
        Cluster.up(ClusterOptions(dir=tmp_path / "c", k8s_home=home, addons=("nope",)))
    assert not (tmp_path / "c" / "state.json").exists()


def test_cli_rejects_unknown_addon() -> None:
    res = CliRunner().invoke(app, ["dev", "cluster", "up", "--addons", "volcano", "--dir", "/nonexistent"])
    assert res.exit_code == 2
    assert "unknown addon(s) volcano" in res.output


def test_command_lines(tmp_path: Path) -> None:
    ports = {addon_defs.port_key(n, k): 10000 + i * 3 + j
             for i, n in enumerate(addon_defs.ADDON_NAMES) for j, k in enumerate(addon_defs.ADDONS[n].port_kinds)}
    for name in addon_defs.ADDON_NAMES:
        if name == "coscheduling":
            continue  # test_coscheduling_command_lines
        run = tmp_path / name
        run.mkdir()
        cmd = addon_defs.command(name, ports=ports, kubeconfig="/kc", run=run, home=tmp_path)
        assert cmd.argv[0] == str(tmp_path / "addons" / name / "bin" / "manager")
        assert cmd.env["KUBECONFIG"] == "/kc" and cmd.env["TMPDIR"] == str(run)
        health = ports[addon_defs.port_key(name, "health")]
        assert cmd.health_url.startswith(f"http://127.0.0.1:{health}/")
        if name in ("jobset", "lws"):
            cfg = yaml.safe_load((run / "config.yaml").read_text())
            assert cfg["leaderElection"] == {"leaderElect": False}
            assert cfg["internalCertManagement"] == {"enable": False}
            assert cfg["webhook"] == {"port": ports[addon_defs.port_key(name, "webhook")], "host": "127.0.0.1",
                                      "certDir": str(addon_defs.cert_dirs(run)[0])}
        elif name == "trainer":
            assert cmd.env["FLUXNETES_EXTERNAL_CERTS"] == "1" and "--leader-elect=false" in cmd.argv
        elif name == "kueue":
            cfg = yaml.safe_load((run / "config.yaml").read_text())
            assert cfg["apiVersion"] == "config.kueue.x-k8s.io/v1beta2" and not cfg["manageJobsWithoutQueueName"]
            assert cfg["webhook"]["certDir"] == str(addon_defs.cert_dirs(run)[0])
            assert cfg["waitForPodsReady"]["blockAdmission"] is True and "fairSharing" in cfg
            assert cmd.env["KUEUE_METRICS_CERT_DIR"] == str(addon_defs.cert_dirs(run)[1])
            # every other addon running is a kind Kueue admits
            assert cfg["integrations"]["frameworks"] == [
                "batch/job", "pod", "jobset.x-k8s.io/jobset", "kubeflow.org/mpijob",
                "leaderworkerset.x-k8s.io/leaderworkerset", "trainer.kubeflow.org/trainjob"]
        else:
            assert cmd.env["MPI_OPERATOR_HEALTH_ADDR"] == f"127.0.0.1:{health}" and cmd.webhook_port is None
            assert not any(a.startswith("--gang-scheduling") for a in cmd.argv)  # kube-scheduler's pods


def test_mpi_operator_gangs_for_coscheduling(tmp_path: Path) -> None:
    """With coscheduling beside it, the MPI Operator is named that scheduler as its gang
    scheduler: it then makes each MPIJob's PodGroup and points the pods at that scheduler."""
    ports = {addon_defs.port_key("mpi", k): 20000 + j for j, k in enumerate(addon_defs.ADDONS["mpi"].port_kinds)}
    cmd = addon_defs.command("mpi", ports=ports, kubeconfig="/kc", run=tmp_path, home=tmp_path,
                             gang_scheduler=addon_defs.SCHEDULER_NAME)
    assert "--gang-scheduling=scheduler-plugins-scheduler" in cmd.argv


def test_coscheduling_command_lines(tmp_path: Path) -> None:
    """Two processes, each on its own ports of 127.0.0.1: the PodGroup controller and the second
    scheduler, whose configuration is scheduler-plugins' documented coscheduling profile."""
    addon = addon_defs.ADDONS["coscheduling"]
    assert addon.components == ("addon-coscheduling-controller", "addon-coscheduling-scheduler")
    assert all(c in addon_defs.COMPONENTS for c in addon.components)
    assert addon_defs.COMPONENT_OF["addon-coscheduling-scheduler"] == ("coscheduling", "scheduler")
    assert addon_defs.COMPONENT_OF["addon-kueue"] == ("kueue", "manager")
    ports = {addon_defs.port_key("coscheduling", k): 30000 + j for j, k in enumerate(addon.port_kinds)}
    ctl = addon_defs.command("coscheduling", ports=ports, kubeconfig="/kc", run=tmp_path, home=tmp_path,
                             binary="controller")
    assert ctl.argv == [str(tmp_path / "addons" / "coscheduling" / "bin" / "controller"),
                        "--metricsAddr=127.0.0.1:30000", "--probeAddr=127.0.0.1:30001"]
    assert ctl.health_url == "http://127.0.0.1:30001/readyz" and ctl.env["KUBECONFIG"] == "/kc"
    sched = addon_defs.command("coscheduling", ports=ports, kubeconfig="/kc", run=tmp_path, home=tmp_path,
                               binary="scheduler")
    assert sched.argv[0] == str(tmp_path / "addons" / "coscheduling" / "bin" / "scheduler")
    assert "--secure-port=30002" in sched.argv and "--bind-address=127.0.0.1" in sched.argv
    assert sched.health_url == "https://127.0.0.1:30002/healthz"
    cfg = yaml.safe_load((tmp_path / "scheduler-config.yaml").read_text())
    assert f"--config={tmp_path / 'scheduler-config.yaml'}" in sched.argv
    assert cfg["leaderElection"] == {"leaderElect": False} and cfg["clientConnection"]["kubeconfig"] == "/kc"
    (profile,) = cfg["profiles"]
    assert profile["schedulerName"] == "scheduler-plugins-scheduler"
    # Coscheduling at every point it implements, the default queue sort off (one per profile)
    assert profile["plugins"] == {"multiPoint": {"enabled": [{"name": "Coscheduling"}],
                                                 "disabled": [{"name": "PrioritySort"}]}}
    assert profile["pluginConfig"] == [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 10}}]
    with pytest.raises(ValueError, match="no binary manager"):
        addon_defs.command("coscheduling", ports=ports, kubeconfig="/kc", run=tmp_path, home=tmp_path)


def test_kueue_frameworks_ignore_the_other_peer(tmp_path: Path) -> None:
    """A cluster running kueue and coscheduling: Kueue's integrations are the workload kinds'
    only (coscheduling serves none)."""
    ports = {addon_defs.port_key(n, k): 20000 + 10 * i + j for i, n in enumerate(("kueue", "coscheduling"))
             for j, k in enumerate(addon_defs.ADDONS[n].port_kinds)}
    cfg = addon_defs.kueue_configuration(ports=ports, certs="/c", run=tmp_path)
    assert cfg["integrations"]["frameworks"] == ["batch/job", "pod"]


def test_webhook_configurations_point_at_the_local_process(tmp_path: Path) -> None:
    d = tmp_path / "addons" / "jobset" / "webhooks"
    d.mkdir(parents=True)
    (d / "manifests.yaml").write_text(JOBSET_MANIFEST)
    (cfg,) = addon_defs.webhook_configurations("jobset", 9999, b"CA-PEM", tmp_path)
    assert cfg["metadata"]["name"] == "jobset-mutating.fluxnetes-dev"
    js, pod = cfg["webhooks"]
    assert js["clientConfig"] == {"url": "https://127.0.0.1:9999/mutate-jobset-x-k8s-io-v1alpha2-jobset",
                                  "caBundle": base64.b64encode(b"CA-PEM").decode()}
    assert "objectSelector" not in js and js["rules"][0]["resources"] == ["jobsets"]
    # the release's kustomize patch: only JobSet pods reach its pod webhook
    assert pod["objectSelector"] == {"matchExpressions": [
        {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}


def test_kueue_configuration_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$FLUXNETES_KUEUE_CONFIG replaces top-level fields (null removes one); a file that is not
    a mapping is refused naming the variable."""
    ports = {addon_defs.port_key("kueue", k): 20000 + j for j, k in enumerate(addon_defs.PORT_KINDS)}
    over = tmp_path / "over.yaml"
    over.write_text("waitForPodsReady: null\nclientConnection: {qps: 500, burst: 1000}\n")
    monkeypatch.setenv(addon_defs.KUEUE_CONFIG_ENV, str(over))
    cfg = addon_defs.kueue_configuration(ports=ports, certs="/c", run=tmp_path)
    assert "waitForPodsReady" not in cfg and cfg["clientConnection"] == {"qps": 500, "burst": 1000}
    assert cfg["integrations"]["frameworks"] == ["batch/job", "pod"]
    over.write_text("- a list\n")
    with pytest.raises(addon_defs.AddonError, match=r"FLUXNETES_KUEUE_CONFIG=.*YAML mapping"):
        addon_defs.kueue_configuration(ports=ports, certs="/c", run=tmp_path)


def test_kueue_pod_webhooks_skip_system_namespaces(tmp_path: Path) -> None:
    """Kueue's kustomize patch: its pod webhooks never see kube-system's (or its own) pods."""
    d = tmp_path / "addons" / "kueue" / "webhooks"
    d.mkdir(parents=True)
    (d / "manifests.yaml").write_text(JOBSET_MANIFEST)
    (cfg,) = addon_defs.webhook_configurations("kueue", 9999, b"CA-PEM", tmp_path)
    js, pod = cfg["webhooks"]
    assert "namespaceSelector" not in js
    assert pod["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kueue-system"]


@pytest.mark.skipif(addon_defs.missing(addon_defs.WORKLOAD_ADDONS) != [], reason="hack/build-addons.sh not run")
def test_built_manifests_are_the_releases() -> None:
    """What hack/build-addons.sh copied: every webhook has a path and a rule."""
    for name in ("jobset", "lws", "trainer"):
        docs = addon_defs.webhook_configurations(name, 1, b"x")
        hooks = [w for d in docs for w in d["webhooks"]]
        assert hooks and all(w["clientConfig"]["url"].startswith("https://127.0.0.1:1/") for w in hooks)
        assert all(w["rules"] for w in hooks)
    assert [p.name for p in addon_defs.runtime_files("trainer")] == ["torch_distributed.yaml"]
    assert os.access(addon_defs.manager("mpi"), os.X_OK)
    assert (k8s_home() / "addons" / "mpi" / "VERSION").read_text().strip().endswith("+health-addr-1")


@pytest.mark.skipif(addon_defs.missing(("coscheduling",)) != [], reason="hack/build-addons.sh coscheduling not run")
def test_built_coscheduling_crds_are_named_for_what_they_hold() -> None:
    """The release ships its CRDs as crd.yaml; the build names them <group>_<plural>.yaml, which
    is how the dev cluster knows which CRD to wait for."""
    files = addon_defs.crd_files("coscheduling")
    assert [addon_defs.crd_name(f) for f in files] == ["elasticquotas.scheduling.x-k8s.io",
                                                       "podgroups.scheduling.x-k8s.io"]
    assert all(yaml.safe_load(f.read_text())["metadata"]["name"] == addon_defs.crd_name(f) for f in files)
    version = (k8s_home() / "addons" / "coscheduling" / "VERSION").read_text().strip()
    assert version == "sigs.k8s.io/scheduler-plugins@v0.34.7+csi-translation-lib-v0.34.1"
