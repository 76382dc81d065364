"""The local Kubernetes control plane for development and tests (`fluxnetes dev cluster`).

Binaries come from hack/build-k8s.sh (cached in $FLUXNETES_K8S_HOME, default
~/.cache/fluxnetes/k8s), the optional addon controllers (JobSet, MPI Operator, LeaderWorkerSet,
Kubeflow Trainer; the peers Kueue and scheduler-plugins' coscheduling) from
hack/build-addons.sh; every process listens on 127.0.0.1 only.
"""

from fluxnetes.devcluster.cluster import Cluster
from fluxnetes.devcluster.errors import BinariesMissing, ClusterError
from fluxnetes.devcluster.net import free_ports, port_open
from fluxnetes.devcluster.nodes import (
    GPU_RESOURCE,
    RACK_LABEL,
    ZONE_LABEL,
    NodeShape,
    NodeSpecError,
)
from fluxnetes.devcluster.paths import k8s_home, toolchain
from fluxnetes.devcluster.state import ClusterOptions, ClusterStatus

__all__ = [
    "GPU_RESOURCE",
    "RACK_LABEL",
    "ZONE_LABEL",
    "BinariesMissing",
    "Cluster",
    "ClusterError",
    "ClusterOptions",
    "ClusterStatus",
    "NodeShape",
    "NodeSpecError",
    "free_ports",
    "k8s_home",
    "port_open",
    "toolchain",
]
