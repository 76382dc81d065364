"""How each control-plane component is started: command lines, kwok's configuration, the
admin kubeconfig."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from fluxnetes.devcluster.paths import Toolchain
from fluxnetes.devcluster.pki import ClusterPKI

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
POD_CIDR = "10.128.0.0/16"  # kwok's fake pod IPs; never dialled
PORT_NAMES = ("etcd", "etcd_peer", "apiserver", "controller_manager", "scheduler")
# start order; stopped in reverse
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

# FLUXNETES_DEV_PROFILING=1 serves /debug/pprof on the components (for benchmark analysis:
# `kubectl get --raw /debug/pprof/profile?seconds=10`); off by default, as in production
def _profiling() -> str:
    return "true" if os.environ.get("FLUXNETES_DEV_PROFILING") == "1" else "false"


# FLUXNETES_DEV_AUDIT=DIR makes the API server write an audit log (Metadata level, JSON, one
# event per finished request; Leases left out) to DIR/audit.log: who (user agent) made which
# request on which object when, for benchmark analysis (bench/apiserver_profile.py). Off by
# default: the log costs the API server CPU.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  resources: [{group: "coordination.k8s.io", resources: ["leases"]}]
- level: Metadata
"""


def _audit_flags() -> list[str]:
    where = os.environ.get("FLUXNETES_DEV_AUDIT")
    if not where:
        return []
    d = Path(where)
    d.mkdir(parents=True, exist_ok=True)
    (d / "audit-policy.yaml").write_text(AUDIT_POLICY)
    return [f"--audit-policy-file={d / 'audit-policy.yaml'}", f"--audit-log-path={d / 'audit.log'}",
            "--audit-log-format=json", "--audit-log-mode=batch", "--audit-log-maxsize=0"]


def argv(
    name: str,
    tools: Toolchain,
    *,
    ports: dict[str, int],
    kubeconfig: str,
    data_dir: str,
    advertise_address: str,
    pki: ClusterPKI,
    api_host: str = "127.0.0.1",
    run: Path,
    timed_pods: bool = False,
    nodes: int = 0,
    pod_duration: float = 0.0,
) -> list[str]:
    """Command line of one component; every listener and every client URL is on 127.0.0.1.

    timed_pods: Job pods carrying the annotation TIMED_POD_ANNOTATION (a duration such as
    "20s") complete that long after they run instead of at once (kwok stages below).
    pod_duration: seconds Job pods without that annotation run (0: they complete at once);
    above 0 it implies timed_pods.
    nodes: how many kwok nodes the cluster is made for (sets the node lease duration and the
    controller-manager's grace period above 1,000 nodes: node_lease_seconds).
    """
    p = ports
    kc = kubeconfig
    exe = str(tools.binary(name))
    etcd_url = f"http://127.0.0.1:{p['etcd']}"
    peer_url = f"http://127.0.0.1:{p['etcd_peer']}"
    if name == "etcd":
        return [
            exe,
            "--name=dev",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=dev={peer_url}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        return [
            exe,
            f"--etcd-servers={etcd_url}",
            # 127.0.0.1, or with Services an address of the real nodes' interface (services.py)
            f"--bind-address={api_host}",
            f"--secure-port={p['apiserver']}",
            f"--advertise-address={advertise_address}",
            f"--cert-dir={run / 'apiserver'}",
            f"--tls-cert-file={pki.apiserver_crt}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_crt}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--kubelet-preferred-address-types=InternalIP",
            # real nodes (realnode.py) trust the cluster CA: kubectl logs/exec reach them
            f"--kubelet-client-certificate={pki.admin_crt}",
            f"--kubelet-client-key={pki.admin_key}",
            f"--profiling={_profiling()}",
            *_audit_flags(),
        ]
    common = [
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--profiling={_profiling()}",
        # the default client rate limit (20 qps) makes untainting 1,000 new nodes take minutes
        "--kube-api-qps=500",
        "--kube-api-burst=1000",
    ]
    if name == "kube-controller-manager":
        return [
            exe,
            *common,
            f"--secure-port={p['controller_manager']}",
            f"--cert-dir={run / 'controller-manager'}",
            f"--root-ca-file={pki.ca_crt}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--cluster-signing-cert-file={pki.ca_crt}",
            f"--cluster-signing-key-file={pki.ca_key}",
            # the TTL controller rewrites every node's node.alpha.kubernetes.io/ttl annotation
            # each time the node count crosses 100, 500, 1,000 or 2,000: up to 4 PATCHes per
            # node while a big cluster is created (still ~35/s two minutes after 5,000 nodes
            # were Ready), for a value only kubelets read, and kwok nodes have none
            "--controllers=*,-ttl-controller",
            *_grace_flags(nodes),
        ]
    if name == "kube-scheduler":
        return [
            exe,
            *common,
            f"--secure-port={p['scheduler']}",
            f"--cert-dir={run / 'scheduler'}",
        ]
    if name == "kwok":
        config = run / "kwok.yaml"
        config.write_text(KWOK_CONFIG)
        files = [config, *tools.stage_files]
        if timed_pods or pod_duration > 0:
            timed = run / "kwok-timed-stages.yaml"
            timed.write_text(timed_stages(pod_duration))
            files = [f for f in files if not str(f).endswith("pod/fast/pod-complete.yaml")] + [timed]
        stages = [f"--config={s}" for s in files]
        return [
            exe,
            f"--kubeconfig={kc}",
            *stages,
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-ip=127.0.0.1",
            f"--cidr={POD_CIDR}",
            f"--node-lease-duration-seconds={node_lease_seconds(nodes)}",
            "--v=WARN",  # INFO logs every lease renewal: ~25 KB/s with 1,000 nodes
        ]
    raise ValueError(f"unknown component {name}")


# kwok renews every node's Lease each quarter of its duration, as a kubelet does: with 40 s that
# is 100 renewals/s at 1,000 nodes but 500/s at 5,000, more than the API server of a 2-core
# machine serves next to any work (each is a PUT written to etcd). Above 1,000 nodes the
# duration grows with the node count so that renewals stay at ~100/s (200 s at 5,000 nodes),
# and the controller-manager's grace period (how long a Lease may go unrenewed before the node
# is marked NotReady: 50 s by default, for 40 s leases) grows with it. The price: a stopped
# kwok is noticed after that grace period instead of 50 s.
NODE_LEASE_SECONDS = 40
LEASE_RENEWALS_PER_SECOND = 100
DEFAULT_GRACE_SECONDS = 50  # kube-controller-manager's --node-monitor-grace-period


def node_lease_seconds(nodes: int) -> int:
    return max(NODE_LEASE_SECONDS, -(-4 * nodes // LEASE_RENEWALS_PER_SECOND))


def node_monitor_grace_seconds(nodes: int) -> int:
    return node_lease_seconds(nodes) + DEFAULT_GRACE_SECONDS - NODE_LEASE_SECONDS


def _grace_flags(nodes: int) -> list[str]:
    grace = node_monitor_grace_seconds(nodes)
    return [] if grace == DEFAULT_GRACE_SECONDS else [f"--node-monitor-grace-period={grace}s"]


# kwok plays node and pod stages 4 at a time by default: too slow to bring up 1,000 nodes or to
# run thousands of pods through their phases
KWOK_CONFIG = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  nodePlayStageParallelism: 16
  podPlayStageParallelism: 16
  nodeLeaseParallelism: 16
"""


# the annotation kwok's own "general" stages read for a pod's run time; with timed_pods the dev
# cluster honours it for Job pods (a duration: "20s"), and Job pods without it end at once
TIMED_POD_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"

_COMPLETE_STATUS = """\
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"""

def timed_stages(default_seconds: float = 0.0) -> str:
    """The kwok stages replacing its fast pod-complete stage: Job pods with the annotation end
    after its duration; the others after ``default_seconds`` (0: at once, as before)."""
    if default_seconds <= 0:
        return TIMED_STAGES
    delay = f"  delay:\n    durationMilliseconds: {round(default_seconds * 1000)}\n"
    untimed, timed = TIMED_STAGES.split("---\n", 1)
    head, tail = untimed.split("  next:\n", 1)
    return f"{head}{delay}  next:\n{tail}---\n{timed}"


# replaces kwok's fast pod-complete stage: untimed Job pods end at once (as before), timed ones
# after their annotation's duration
TIMED_STAGES = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values: ['Job']
    - key: '.metadata.annotations["{TIMED_POD_ANNOTATION}"]'
      operator: 'DoesNotExist'
  next:
{_COMPLETE_STATUS}---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete-timed
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values: ['Job']
    - key: '.metadata.annotations["{TIMED_POD_ANNOTATION}"]'
      operator: 'Exists'
  delay:
    durationMilliseconds: 1000
    durationFrom:
      expressionFrom: '.metadata.annotations["{TIMED_POD_ANNOTATION}"]'
  next:
{_COMPLETE_STATUS}"""


def kubeconfig_doc(api_url: str, pki: ClusterPKI) -> dict[str, Any]:
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "fluxnetes-dev",
                "cluster": {"server": api_url, "certificate-authority-data": b64(pki.ca_crt)},
            }
        ],
        "users": [
            {
                "name": "fluxnetes-dev-admin",
                "user": {
                    "client-certificate-data": b64(pki.admin_crt),
                    "client-key-data": b64(pki.admin_key),
                },
            }
        ],
        "contexts": [
            {
                "name": "fluxnetes-dev",
                "context": {"cluster": "fluxnetes-dev", "user": "fluxnetes-dev-admin"},
            }
        ],
        "current-context": "fluxnetes-dev",
    }
