"""The controllers of the multi-role workload kinds, run as processes of the dev cluster.

``fluxnetes dev cluster up --addons mpi,jobset,trainer,lws`` (``all``), and the peer
``kueue`` (Kueue, for bench/peers.py; only when named): each addon's CRDs are installed,
its manager binary (built by hack/build-addons.sh into $FLUXNETES_K8S_HOME/addons/<name>/) runs
on 127.0.0.1 like the other components, and its admission webhooks are served:

- serving certificate: issued by the dev cluster's CA (pki/) for 127.0.0.1, written where the
  manager's webhook server (and its metrics server) look for it: controller-runtime's default
  ``$TMPDIR/k8s-webhook-server/serving-certs``, with TMPDIR set to the addon's own run/
  directory (or the directory its configuration file names);
- webhook configurations: the ones the release ships (its kustomize ``manifests.yaml``, copied
  by the build script), with the same rules and the objectSelectors of the release's kustomize
  patches, each ``clientConfig`` pointing at the local process by URL with the cluster CA as
  caBundle. The four workload CRDs serve one version each, so no conversion webhook is
  needed; Kueue's serve v1beta1 and v1beta2 with no conversion configured here (the API
  server only relabels the version): write Kueue objects as v1beta2, its storage version.
- leader election off (the MPI Operator always elects: its lease lives in kube-system and a
  single instance wins at once), metrics and health endpoints on free ports of 127.0.0.1.

Trainer runs TrainJobs as JobSets, so ``trainer`` brings ``jobset`` with it; it also gets the
release's ``torch-distributed`` ClusterTrainingRuntime (kwok runs no containers: the image is
never pulled).

The peer ``coscheduling`` (scheduler-plugins, only when named) is two processes: a second
kube-scheduler built with the out-of-tree plugins, whose profile ``scheduler-plugins-scheduler``
places the pods naming it (coscheduling_configuration()), and the PodGroup controller that
keeps the PodGroups' status; its CRDs are PodGroup and ElasticQuota (scheduling.x-k8s.io).
Neither serves webhooks. Started together with ``mpi`` (``--addons mpi,coscheduling``), the MPI
Operator runs with ``--gang-scheduling=scheduler-plugins-scheduler``: it makes each MPIJob's
PodGroup and hands its pods to that scheduler.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fluxnetes.devcluster.paths import k8s_home

# start order (Trainer needs the JobSet CRD and controller)
# (Kueue after them: its integrations are set up for the workload kinds whose CRDs are installed)
ADDON_NAMES: tuple[str, ...] = ("jobset", "mpi", "lws", "trainer", "kueue", "coscheduling")
# ``--addons all``: the workload controllers (the peers, kueue and coscheduling, only when named)
WORKLOAD_ADDONS: tuple[str, ...] = ("jobset", "mpi", "lws", "trainer")
REQUIRES: dict[str, tuple[str, ...]] = {"trainer": ("jobset",)}
COMPONENT_PREFIX = "addon-"
HOST = "127.0.0.1"
PORT_KINDS = ("webhook", "metrics", "health")
SCHEDULER_NAME = "scheduler-plugins-scheduler"  # the coscheduling addon's profile (its chart's name)


class AddonError(ValueError):
    """Bad --addons value; the message names the option and the known names."""


@dataclass(frozen=True)
class Addon:
    name: str
    module: str  # what hack/build-addons.sh builds (for messages)
    kinds: tuple[str, ...]  # the workload kinds it serves
    has_webhooks: bool = True
    # its processes: one per binary of bin/ (the component of ``manager`` is addon-<name>, of
    # another binary addon-<name>-<binary>)
    binaries: tuple[str, ...] = ("manager",)
    port_kinds: tuple[str, ...] = PORT_KINDS  # the free ports it is given

    @property
    def components(self) -> tuple[str, ...]:
        return tuple(component_name(self.name, b) for b in self.binaries)


def component_name(name: str, binary: str) -> str:
    return COMPONENT_PREFIX + name + ("" if binary == "manager" else f"-{binary}")


ADDONS: dict[str, Addon] = {
    a.name: a
    for a in (
        Addon("jobset", "sigs.k8s.io/jobset@v0.10.1", ("JobSet",)),
        Addon("mpi", "github.com/kubeflow/mpi-operator@v0.6.0", ("MPIJob",), has_webhooks=False),
        Addon("lws", "sigs.k8s.io/lws@v0.7.0", ("LeaderWorkerSet",)),
        Addon("trainer", "github.com/kubeflow/trainer/v2@v2.0.0",
              ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")),
        # a peer, not a workload controller: queueing and admission in front of kube-scheduler
        # (bench/peers.py); its settings are kueue_configuration()'s
        Addon("kueue", "sigs.k8s.io/kueue@v0.17.0",
              ("ClusterQueue", "LocalQueue", "ResourceFlavor", "Workload", "Cohort")),
        # a peer: a second scheduler (gangs by PodGroup) beside kube-scheduler; the controller
        # first (the PodGroups' status), then the scheduler
        Addon("coscheduling", "sigs.k8s.io/scheduler-plugins@v0.34.7", ("PodGroup", "ElasticQuota"),
              has_webhooks=False, binaries=("controller", "scheduler"),
              port_kinds=("metrics", "health", "scheduler")),
    )
}
COMPONENTS: tuple[str, ...] = tuple(c for n in ADDON_NAMES for c in ADDONS[n].components)
# component -> (addon, binary)
COMPONENT_OF: dict[str, tuple[str, str]] = {
    component_name(a.name, b): (a.name, b) for a in ADDONS.values() for b in a.binaries
}


def parse(spec: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``"mpi,jobset"`` (or a list) -> the addons to run, in start order, with what they
    require (``trainer`` brings ``jobset``). Raises AddonError naming unknown ones."""
    if spec is None:
        return ()
    words = spec.split(",") if isinstance(spec, str) else list(spec)
    names = {w.strip().lower() for w in words if w.strip()}
    if "all" in names:
        names = (names - {"all"}) | set(WORKLOAD_ADDONS)
    unknown = sorted(names - set(ADDON_NAMES))
    if unknown:
        raise AddonError(
            f"--addons: unknown addon(s) {', '.join(unknown)} (known: {', '.join(sorted(ADDON_NAMES))}, or all: {', '.join(WORKLOAD_ADDONS)})"
        )
    for n in list(names):
        names.update(REQUIRES.get(n, ()))
    return tuple(n for n in ADDON_NAMES if n in names)


def addon_home(name: str, home: Path | None = None) -> Path:
    return (home if home is not None else k8s_home()) / "addons" / name


def manager(name: str, home: Path | None = None, binary: str = "manager") -> Path:
    return addon_home(name, home) / "bin" / binary


def crd_files(name: str, home: Path | None = None) -> list[Path]:
    return sorted((addon_home(name, home) / "crds").glob("*.yaml"))


def crd_name(path: Path) -> str:
    """The CRD's name from its file's (controller-gen's ``<group>_<plural>.yaml``)."""
    group, _, plural = path.stem.partition("_")
    return f"{plural}.{group}"


def runtime_files(name: str, home: Path | None = None) -> list[Path]:
    return sorted((addon_home(name, home) / "runtimes").glob("*.yaml"))


def missing(names: tuple[str, ...], home: Path | None = None) -> list[str]:
    """What hack/build-addons.sh has not built yet for ``names`` (empty when all is there)."""
    out: list[str] = []
    for n in names:
        out.extend(str(manager(n, home, b)) for b in ADDONS[n].binaries if not os.access(manager(n, home, b), os.X_OK))
        if not crd_files(n, home):
            out.append(str(addon_home(n, home) / "crds"))
        if ADDONS[n].has_webhooks and not (addon_home(n, home) / "webhooks" / "manifests.yaml").is_file():
            out.append(str(addon_home(n, home) / "webhooks" / "manifests.yaml"))
        if n == "trainer" and not runtime_files(n, home):
            out.append(str(addon_home(n, home) / "runtimes"))
    return out


def missing_message(names: tuple[str, ...], paths: list[str]) -> str:
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return (
        f"addon controllers not built ({shown}); build them once with "
        f"`bash hack/build-addons.sh {' '.join(names)}` (Go >= 1.26; a few minutes per controller "
        "when cold, seconds when cached), or point FLUXNETES_K8S_HOME at an existing build"
    )


def port_key(name: str, kind: str) -> str:
    return f"{name}_{kind}"


# -- command lines -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]
    health_url: str  # 200 once the manager is up (its webhook server listening, where it checks)
    webhook_port: int | None


def cert_dirs(run: Path) -> list[Path]:
    """Where the manager's webhook and metrics servers read tls.crt / tls.key (TMPDIR=run)."""
    return [run / "k8s-webhook-server" / "serving-certs", run / "k8s-metrics-server" / "serving-certs"]


def health_url(name: str, ports: dict[str, int], binary: str = "manager") -> str:
    """200 once the manager serves (controller-runtime's readyz waits for its webhook server);
    a scheduler's /healthz on its secure port (https, its self-signed certificate)."""
    if binary == "scheduler":
        return f"https://{HOST}:{ports[port_key(name, 'scheduler')]}/healthz"
    health = ports[port_key(name, "health")]
    return f"http://{HOST}:{health}/healthz" if name == "mpi" else f"http://{HOST}:{health}/readyz"


def manager_configuration(api_version: str, *, webhook: int, metrics: int, health: int,
                          certs: str) -> dict[str, Any]:
    """The controller-runtime manager fields every addon's Configuration shares: on 127.0.0.1,
    no leader election, the dev cluster's certificate (not the manager's own)."""
    return {
        "apiVersion": api_version,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook, "host": HOST, "certDir": certs},
        "metrics": {"bindAddress": f"{HOST}:{metrics}"},
        "health": {"healthProbeBindAddress": f"{HOST}:{health}"},
    }


def command(name: str, *, ports: dict[str, int], kubeconfig: str, run: Path,
            home: Path | None = None, binary: str = "manager", gang_scheduler: str | None = None) -> Command:
    """How addon ``name`` (its process ``binary``) is started; writes its configuration file
    into ``run``. ``gang_scheduler``: the scheduler-plugins scheduler the MPI Operator hands
    its MPIJobs' pods to (its ``--gang-scheduling``), when the cluster runs coscheduling."""
    exe = str(manager(name, home, binary))
    env = {"KUBECONFIG": kubeconfig, "TMPDIR": str(run)}
    url = health_url(name, ports, binary)
    if name == "coscheduling":
        return coscheduling_command(binary, exe, env, url, ports=ports, kubeconfig=kubeconfig, run=run)
    webhook, metrics, health = (ports[port_key(name, k)] for k in PORT_KINDS)
    certs = str(cert_dirs(run)[0])
    if name in ("jobset", "lws"):
        group = "config.jobset.x-k8s.io" if name == "jobset" else "config.lws.x-k8s.io"
        cfg = manager_configuration(f"{group}/v1alpha1", webhook=webhook, metrics=metrics, health=health,
                                    certs=certs)
        if name == "jobset":
            cfg["metrics"]["certDir"] = str(cert_dirs(run)[1])
        path = run / "config.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return Command([exe, f"--config={path}", "--zap-log-level=info"], env, url, webhook)
    if name == "trainer":
        env["FLUXNETES_EXTERNAL_CERTS"] = "1"  # see hack/build-addons.sh
        return Command(
            [exe, f"--metrics-bind-address={HOST}:{metrics}", "--metrics-secure=false",
             f"--health-probe-bind-address={HOST}:{health}", f"--webhook-server-port={webhook}",
             "--leader-elect=false"],
            env, url, webhook,
        )
    if name == "mpi":
        env["MPI_OPERATOR_HEALTH_ADDR"] = f"{HOST}:{health}"  # see hack/build-addons.sh
        # with a scheduler-plugins scheduler named, the operator makes each MPIJob's PodGroup
        # (minMember = workers + 1, named after it) and sets that scheduler and the PodGroup
        # label on its pods: the release's documented gang setup for coscheduling
        gang = [f"--gang-scheduling={gang_scheduler}"] if gang_scheduler else []
        return Command(
            [exe, "--lock-namespace=kube-system", f"--monitoring-port={metrics}",
             "--kube-api-qps=200", "--kube-api-burst=400", "--threadiness=4", *gang],
            env, url, None,
        )
    if name == "kueue":
        env["KUEUE_METRICS_CERT_DIR"] = str(cert_dirs(run)[1])  # see hack/build-addons.sh
        cfg = kueue_configuration(ports=ports, certs=certs, run=run)
        path = run / "config.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return Command([exe, f"--config={path}", "--zap-log-level=info"], env, url, webhook)
    raise ValueError(f"unknown addon {name}")


def coscheduling_command(binary: str, exe: str, env: dict[str, str], url: str, *, ports: dict[str, int],
                         kubeconfig: str, run: Path) -> Command:
    if binary == "controller":
        # (its --qps/--burst flags are read but not passed to its client in this release)
        return Command([exe, f"--metricsAddr={HOST}:{ports[port_key('coscheduling', 'metrics')]}",
                        f"--probeAddr={HOST}:{ports[port_key('coscheduling', 'health')]}"], env, url, None)
    if binary != "scheduler":
        raise ValueError(f"coscheduling has no binary {binary}")
    path = run / "scheduler-config.yaml"
    path.write_text(yaml.safe_dump(coscheduling_configuration(kubeconfig), sort_keys=False))
    return Command(
        [exe, f"--config={path}", f"--authentication-kubeconfig={kubeconfig}",
         f"--authorization-kubeconfig={kubeconfig}", f"--bind-address={HOST}",
         f"--secure-port={ports[port_key('coscheduling', 'scheduler')]}", f"--cert-dir={run / 'certs'}"],
        env, url, None,
    )


def coscheduling_configuration(kubeconfig: str) -> dict[str, Any]:
    """The second scheduler's KubeSchedulerConfiguration as scheduler-plugins' chart
    (as-a-second-scheduler) and manifests/coscheduling set it up, with only Coscheduling of
    its out-of-tree plugins: one profile ``scheduler-plugins-scheduler``, Coscheduling at every
    extension point it implements (multiPoint: queueSort, preFilter, postFilter, permit,
    reserve; PrioritySort, the default queue sort, disabled: one queue sort per profile), a
    gang's pods waiting at Permit 10 s for the rest (the chart's value; the plugin's default
    is 60). No leader election (one instance). Its client's rate limit is the dev cluster's
    kube-scheduler's (components.py), so that the two schedulers are compared at one setting."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": kubeconfig, "qps": 500, "burst": 1000},
        "profiles": [{
            "schedulerName": SCHEDULER_NAME,
            "plugins": {
                "multiPoint": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "PrioritySort"}]},
            },
            "pluginConfig": [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 10}}],
        }],
    }


# Kueue's frameworks for the kinds the dev cluster can serve: Jobs and plain pod groups always,
# MPIJobs / JobSets / LeaderWorkerSets / TrainJobs when their CRDs are installed (Kueue starts
# after the other addons: the integration of a kind without its CRD would wait for it)
_KUEUE_FRAMEWORKS = {"mpi": "kubeflow.org/mpijob", "jobset": "jobset.x-k8s.io/jobset",
                     "lws": "leaderworkerset.x-k8s.io/leaderworkerset", "trainer": "trainer.kubeflow.org/trainjob"}
# $FLUXNETES_KUEUE_CONFIG: a YAML file whose top-level keys replace kueue_configuration()'s
# (bench/peers.py runs single-pod Jobs without waitForPodsReady, gangs with it)
KUEUE_CONFIG_ENV = "FLUXNETES_KUEUE_CONFIG"


def kueue_configuration(*, ports: dict[str, int], certs: str, run: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) as its documentation sets it up
    for batch work: Jobs and pod groups (only those naming a LocalQueue), all-or-nothing with
    ``waitForPodsReady`` (sequential admission, the documented setting for gangs), fair sharing
    between ClusterQueues of a cohort; plus what a local process needs (its ports on
    127.0.0.1, no leader election, the dev cluster's certificate, no visibility API server)."""
    webhook, metrics, health = (ports[port_key("kueue", k)] for k in PORT_KINDS)
    others = [n for n in ADDON_NAMES if n in _KUEUE_FRAMEWORKS and port_key(n, "health") in ports]
    cfg = manager_configuration("config.kueue.x-k8s.io/v1beta2", webhook=webhook, metrics=metrics,
                                health=health, certs=certs)
    cfg.update({
        "clientConnection": {"qps": 50, "burst": 100},  # the release's manager config
        "manageJobsWithoutQueueName": False,
        "waitForPodsReady": {"timeout": "5m", "blockAdmission": True,
                             "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60}},
        "integrations": {"frameworks": ["batch/job", "pod", *(_KUEUE_FRAMEWORKS[n] for n in others)]},
        "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]},
        # its visibility API server would bind 0.0.0.0:8082 (one per machine; the pending
        # workloads' positions are not used here); MultiKueue (several clusters) needs CRDs
        # the build does not install
        "featureGates": {"VisibilityOnDemand": False, "MultiKueue": False},
    })
    override = os.environ.get(KUEUE_CONFIG_ENV)
    if override:
        extra = yaml.safe_load(Path(override).read_text()) or {}
        if not isinstance(extra, dict):
            raise AddonError(f"{KUEUE_CONFIG_ENV}={override}: must hold a YAML mapping of Configuration fields")
        for key, value in extra.items():
            if value is None:
                cfg.pop(key, None)
            else:
                cfg[key] = value
    return cfg


# -- webhook configurations ----------------------------------------------------------------------
# the objectSelectors the releases' kustomize patches put on their pod webhooks (only their own
# pods reach them); name of the addon -> webhook name -> (selector, operations)
_POD_WEBHOOK_PATCHES: dict[str, dict[str, tuple[dict[str, Any], list[str] | None]]] = {
    "jobset": {
        "mpod.kb.io": ({"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}, None),
        "vpod.kb.io": ({"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}, None),
    },
    "lws": {
        "mpod.kb.io": ({"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]},
                       ["CREATE", "UPDATE"]),
        "vpod.kb.io": ({"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]},
                       ["CREATE", "UPDATE"]),
    },
}


_SYSTEM_NAMESPACES = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                             "values": ["kube-system", "kueue-system"]}]}
_NAMESPACE_SELECTOR_PATCHES: dict[str, dict[str, dict[str, Any]]] = {
    "kueue": {f"{mv}{kind}.kb.io": _SYSTEM_NAMESPACES for mv in "mv" for kind in ("pod", "deployment", "statefulset")},
}


def webhook_configurations(name: str, port: int, ca_pem: bytes, home: Path | None = None) -> list[dict[str, Any]]:
    """The release's webhook configurations of addon ``name``, served at 127.0.0.1:``port``."""
    path = addon_home(name, home) / "webhooks" / "manifests.yaml"
    out: list[dict[str, Any]] = []
    patches = _POD_WEBHOOK_PATCHES.get(name, {})
    ns_patches = _NAMESPACE_SELECTOR_PATCHES.get(name, {})
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or not doc.get("webhooks"):
            continue
        short = "mutating" if doc["kind"].startswith("Mutating") else "validating"
        doc["metadata"] = {"name": f"{name}-{short}.fluxnetes-dev",
                           "labels": {"app.kubernetes.io/managed-by": "fluxnetes-dev-cluster"}}
        for wh in doc["webhooks"]:
            svc = (wh.get("clientConfig") or {}).get("service") or {}
            wh["clientConfig"] = {"url": f"https://{HOST}:{port}{svc.get('path', '/')}",
                                  "caBundle": base64.b64encode(ca_pem).decode()}
            if wh["name"] in patches:
                selector, ops = patches[wh["name"]]
                wh["objectSelector"] = selector
                if ops is not None:
                    for rule in wh.get("rules") or []:
                        rule["operations"] = list(ops)
            if wh["name"] in ns_patches:
                wh["namespaceSelector"] = ns_patches[wh["name"]]
            wh.setdefault("timeoutSeconds", 10)
        out.append(doc)
    return out
