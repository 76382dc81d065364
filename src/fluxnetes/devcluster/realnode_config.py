"""What a real node of the dev cluster is, without touching the machine: its name, addresses,
labels and cgroup root (from the cluster's slot and the node's index), and the configuration
files of its containerd, CNI bridge and kubelet (:mod:`fluxnetes.devcluster.realnode` writes
them and starts the processes).

Addresses: node IPs 10.251.<slot>.<10+i>, pod subnets 10.<252+i>.<slot>.0/24; the pods route
only to the node and pod ranges and the Service range (no default route).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from fluxnetes.devcluster import dns
from fluxnetes.devcluster.nodes import DEV_NODE_LABEL, RACK_LABEL, ZONE_LABEL

NODE_PREFIX = "real-node"
REAL_NODE_LABEL = "fluxnetes.io/real-node"
REAL_ZONE = "zone-0"  # beside kwok's first zone
REAL_RACK = "rack-real"
PAUSE_IMAGE = "localhost/fluxnetes-pause:1"
BUSYBOX_IMAGE = "localhost/fluxnetes-busybox:1"
CNI_DIR = Path("/usr/lib/cni")
NODE_NET = "10.251"  # node IPs: 10.251.<slot>.<10+i>
POD_NET_FIRST = 252  # pod subnets: 10.<252+i>.<slot>.0/24
# the pods' routes: node IPs, every pod subnet, the Service range; no default route
POD_ROUTES = ("10.251.0.0/16", "10.252.0.0/15", "10.0.0.0/24")


def node_name(i: int) -> str:
    return f"{NODE_PREFIX}-{i}"


def node_ip(slot: int, i: int) -> str:
    return f"{NODE_NET}.{slot}.{10 + i}"


def pod_subnet(slot: int, i: int) -> str:
    return f"10.{POD_NET_FIRST + i}.{slot}.0/24"


def dummy_name(slot: int) -> str:
    return f"flxd{slot}"


def bridge_name(slot: int, i: int) -> str:
    return f"flxb{slot}n{i}"


def cgroup_root(slot: int, i: int) -> str:
    return f"/fluxnetes-{slot}-{i}"


def runc_path() -> Path:
    found = shutil.which("runc") or "/usr/sbin/runc"
    return Path(found)


def containerd_config(*, root: Path, state: Path, sock: Path, cni_conf: Path, opt: Path) -> str:
    """containerd v2 configuration (version 3) of one node; every path its own."""
    return f"""\
version = 3  # containerd 2.4 migrates it at start, with a warning; its version 4 ignored [grpc] here
root = "{root}"
state = "{state}"
# NRI's socket is machine-wide (/var/run/nri): a second node's containerd would fight for it
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "{opt}"

[plugins.'io.containerd.grpc.v1.cri']
  # exec/attach/port-forward streams: the kubelet proxies them, so loopback is enough
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  # root without CAP_SYS_RESOURCE cannot lower oom_score_adj: without this every sandbox fails
  # with "can't get final child's PID from pipe: EOF"
  restrict_oom_score_adj = true
  # pod network namespaces under this node's state dir, so `down` finds and unmounts them
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_DIR}"]
    conf_dir = "{cni_conf}"
    max_conf_num = 1
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc_path()}"
        Root = "{state / 'runc'}"
        SystemdCgroup = false
"""


def cni_config(slot: int, i: int, ipam_dir: Path) -> dict[str, Any]:
    """A bridge for node i's pods: gateway on the host, no masquerade, no default route."""
    return {
        "cniVersion": "1.0.0",
        "name": f"fluxnetes-{slot}-{i}",
        "plugins": [{
            "type": "bridge",
            "bridge": bridge_name(slot, i),
            "isGateway": True,
            "ipMasq": False,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": pod_subnet(slot, i)}]],
                "routes": [{"dst": r} for r in POD_ROUTES],
                "dataDir": str(ipam_dir),
            },
        }],
    }


def kubelet_config(*, ip: str, slot: int, i: int, sock: Path, ca: Path, cert: Path, key: Path,
                   node_dir: Path, dns_ip: str | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": ip,
        "healthzPort": 10248,
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        # the API server presents a certificate of the cluster CA (kubectl logs/exec)
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{sock}",
        # cgroup v1 here: kubelet >= 1.35 refuses it unless told; cgroupfs as runc (SystemdCgroup=false)
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root(slot, i),
        # align pods to one NUMA node, as an HPC node's kubelet does: the agent publishes it in
        # the node's NodeResourceTopology, and the operator then builds sockets below the node
        "topologyManagerPolicy": "single-numa-node",
        "failSwapOn": False,
        "podLogsDir": str(node_dir / "pod-logs"),
        "volumePluginDir": str(node_dir / "volume-plugins"),
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": False,
        # a shared development machine: never evict or collect images because of its disk
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "shutdownGracePeriod": "0s",
    }
    if dns_ip:  # the pods' resolv.conf: the cluster's DNS (dns.py), its domain searched
        cfg |= {"clusterDNS": [dns_ip], "clusterDomain": dns.DOMAIN}
    return cfg


def kubeconfig(api_url: str, ca: Path, cert: Path, key: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": {"server": api_url, "certificate-authority": str(ca)}}],
        "users": [{"name": "node", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "node"}}],
        "current-context": "dev",
    }


def node_labels(i: int) -> dict[str, str]:
    return {
        ZONE_LABEL: REAL_ZONE,
        RACK_LABEL: REAL_RACK,
        REAL_NODE_LABEL: "true",
        DEV_NODE_LABEL: "true",
        "type": "real",
    }
