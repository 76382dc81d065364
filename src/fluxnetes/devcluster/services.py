"""Services for the real-node dev cluster: `fluxnetes dev cluster up --real-nodes N --services`.

kube-proxy (built by hack/build-realnode.sh from the control plane's own k8s.io/kubernetes
module) runs ONCE on this machine, not once per real node: every real node is this host, so
all of them share its one netfilter. Two kube-proxies writing the same KUBE-* chains would
rewrite each other's rules at every sync. For the same reason only one cluster on a machine
can have Services (their chain names and the Service range are fixed): `up` refuses a second
one and names the kube-proxy that runs.

Mode: iptables (through Debian's `iptables`, the nf_tables backend here). The nftables mode
needs the `nft` program, which is not installed; `up` names what is missing and never falls
back to another mode.

The API server must be reachable from pods: pods cannot reach the host's loopback. So with
Services the API server listens on API_HOST = 10.251.<slot>.1, an address on the cluster's
own node-IP interface flxd<slot> (realnode_host.py), advertised as the `kubernetes` Service's
endpoint; every client (kubectl, the kubelets, the operator from the shell) uses that address.
The slot is claimed before the control plane starts (claim()).

Host traffic to a ClusterIP (the API server calling a webhook's Service) is routed to flxd<slot>
(a bridge without ports, where anything kube-proxy does not rewrite is dropped) with source
API_HOST, so nothing aimed at the Service range ever takes the default route, and pods can
answer. kube-proxy masquerades Service traffic (masqueradeAll): a pod reaching a Service
backed by a pod on its own bridge gets the reply back through the host.

`down` stops kube-proxy, runs `kube-proxy --cleanup` (removes every chain and rule it made)
and deletes the route.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fluxnetes.devcluster import procs, realnode_config, realnode_host
from fluxnetes.devcluster.apicalls import http_ok
from fluxnetes.devcluster.components import SERVICE_CIDR
from fluxnetes.devcluster.errors import BinariesMissing, ClusterError
from fluxnetes.devcluster.paths import Toolchain
from fluxnetes.devcluster.pki import issue, load_ca

if TYPE_CHECKING:
    from fluxnetes.devcluster.cluster import Cluster

PROCESS = "kube-proxy"
BUILD_HINT = "bash hack/build-realnode.sh"
# netfilter programs kube-proxy's iptables mode runs
NETFILTER_TOOLS = ("iptables", "iptables-save", "iptables-restore", "ip6tables")
# chains kube-proxy's iptables mode makes (its --cleanup removes them); the kubelet makes
# KUBE-FIREWALL, KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT, which are not kube-proxy's
PROXY_CHAIN_PREFIXES = ("KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS",
                        "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-FORWARD", "KUBE-PROXY-",
                        "KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SVL-")


def api_host(slot: int) -> str:
    """The API server's address with Services: the first address of the node-IP range."""
    return f"10.251.{slot}.1"


def missing(tools: Toolchain) -> list[str]:
    """What Services need that is absent, each with how to get it (empty: all there)."""
    out = []
    if not os.access(tools.binary(PROCESS), os.X_OK):
        out.append(f"{tools.binary(PROCESS)} ({BUILD_HINT})")
    for t in NETFILTER_TOOLS:
        if shutil.which(t) is None:
            out.append(f"the `{t}` command (kube-proxy's iptables mode; apt-get install iptables)")
    if not Path("/proc/net/ip_tables_names").exists() and not Path("/proc/net/netfilter").is_dir():
        out.append("netfilter in the kernel (CONFIG_NETFILTER, CONFIG_NF_NAT, iptables or nf_tables)")
    return out


def running_proxy() -> str | None:
    """A kube-proxy process on this machine (another cluster's): its pid and command line."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (p / "cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"/" + PROCESS.encode()) and b"--cleanup" not in argv:
                return f"pid {p.name}: {b' '.join(argv).decode(errors='replace')}"
    return None


def preflight(tools: Toolchain, real_nodes: int) -> None:
    """Raise naming everything that keeps Services from running here; never fall back."""
    if real_nodes < 1:
        raise ClusterError("--services needs --real-nodes 1 or 2 (kwok pods run no process to "
                           "reach a Service)")
    absent = missing(tools)
    if absent:
        raise BinariesMissing("--services cannot run on this machine; missing:\n  - "
                              + "\n  - ".join(absent))
    other = running_proxy()
    if other:
        raise ClusterError(
            "--services: another dev cluster's kube-proxy runs on this machine and owns its "
            f"Service rules ({other}); only one cluster per machine can have Services "
            "(fixed chain names and Service range): stop that cluster or leave out --services")


def claim() -> int:
    """Before the control plane: claim the real nodes' slot (realnode_host.claim_slot creates
    flxd<slot>) and put the API server's address on it."""
    slot = realnode_host.claim_slot()
    for args in (("addr", "add", f"{api_host(slot)}/32", "dev", realnode_config.dummy_name(slot)),
                 ("link", "set", realnode_config.dummy_name(slot), "up")):
        res = realnode_host.ip_cmd(*args, check=False)
        if res.returncode != 0:
            realnode_host.ip_cmd("link", "del", realnode_config.dummy_name(slot), check=False)
            raise ClusterError(f"`ip {' '.join(args)}` failed: {res.stderr.strip()}")
    return slot


def proxy_config(*, kubeconfig: Path, node: str, slot: int, healthz_port: int,
                 metrics_port: int) -> dict[str, Any]:
    """KubeProxyConfiguration: iptables mode, and nothing machine-wide touched beyond the
    Service rules (no conntrack sysctls, no route_localnet, NodePorts on our node IPs only)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        # the Node it reads its IP from; the other real nodes are this same host
        "hostnameOverride": node,
        "clusterCIDR": "10.252.0.0/15",  # every real node's pod subnet (realnode_config.pod_subnet)
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "nodePortAddresses": [f"10.251.{slot}.0/24"],
        "iptables": {
            # replies of a pod reached through a Service from its own bridge come back
            # through the host (no br_netfilter needed)
            "masqueradeAll": True,
            # true would set net.ipv4.conf.all.route_localnet for the whole machine
            "localhostNodePorts": False,
            "syncPeriod": "30s",
            "minSyncPeriod": "0s",
        },
        # 0: leave the machine's conntrack sysctls as they are
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        "oomScoreAdj": 0,
    }


def _dir(cluster: Cluster) -> Path:
    return cluster.dir / "services"


def start(cluster: Cluster, deadline: float) -> None:
    """Route the Service range to flxd<slot>, start kube-proxy, wait until it synced."""
    from fluxnetes.devcluster.net import free_ports

    st = cluster.state
    slot = int(st.real_nodes["slot"])
    d = _dir(cluster)
    d.mkdir(parents=True, exist_ok=True)
    st.real_nodes["services"] = True  # recorded first: `down` cleans up a half-made start
    cluster.save_state()
    res = realnode_host.ip_cmd("route", "add", SERVICE_CIDR, "dev", realnode_config.dummy_name(slot),
                               "src", api_host(slot), check=False)
    if res.returncode != 0:
        raise ClusterError(f"routing the Service range {SERVICE_CIDR} to flxd{slot} failed "
                           f"({res.stderr.strip()}); does another cluster route it?")
    issue(load_ca(cluster.pki), "system:kube-proxy", client=True).write(d / "client.crt",
                                                                       d / "client.key")
    kc = d / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "dev", "cluster": {"server": cluster.api_url,
                                                 "certificate-authority": str(cluster.pki.ca_crt)}}],
        "users": [{"name": "proxy", "user": {"client-certificate": str(d / "client.crt"),
                                             "client-key": str(d / "client.key")}}],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "proxy"}}],
        "current-context": "dev",
    }))
    healthz, metrics = free_ports(2)
    cfg = d / "kube-proxy.yaml"
    cfg.write_text(yaml.safe_dump(proxy_config(kubeconfig=kc, node=realnode_config.node_name(0),
                                               slot=slot, healthz_port=healthz,
                                               metrics_port=metrics)))
    cluster.spawn_extra(PROCESS, [str(cluster.tools.binary(PROCESS)), f"--config={cfg}", "--v=1"],
                        cwd=d)
    # /healthz answers 200 once the first full sync of the rules is done
    cluster.wait_for("kube-proxy to sync the Service rules",
                     lambda: http_ok(f"http://127.0.0.1:{healthz}/healthz", None), deadline,
                     interval=0.3)


def proxy_chains() -> set[str]:
    """kube-proxy's chains in this machine's iptables (IPv4 and IPv6)."""
    chains: set[str] = set()
    for save in ("iptables-save", "ip6tables-save"):
        res = subprocess.run([save], capture_output=True, text=True, timeout=30, check=False)
        for line in res.stdout.splitlines():
            if line.startswith(":"):
                name = line[1:].split()[0]
                if name.startswith(PROXY_CHAIN_PREFIXES):
                    chains.add(name)
    return chains


def stop(cluster: Cluster) -> list[str]:
    """Stop kube-proxy, remove its rules and the route; returns what was left behind."""
    st = cluster.state
    rn = st.real_nodes or {}
    if not rn.get("services"):
        return []
    ours = [p for p in st.processes if p.name == PROCESS]
    procs.stop(ours, timeout=10.0)
    st.processes = [p for p in st.processes if p not in ours]
    left = []
    cfg = _dir(cluster) / "kube-proxy.yaml"
    argv = [str(cluster.tools.binary(PROCESS)), "--cleanup"]
    if cfg.is_file():  # the mode to clean up
        argv.append(f"--config={cfg}")
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    chains = proxy_chains()
    if chains:
        left.append("iptables chains of kube-proxy: " + ", ".join(sorted(chains)))
    slot = rn.get("slot")
    if slot is not None:
        realnode_host.ip_cmd("route", "del", SERVICE_CIDR, "dev", realnode_config.dummy_name(slot),
                             check=False)
    rn["services"] = False
    cluster.save_state()
    return left



def release(slot: int) -> None:
    """Undo claim() when the control plane could not start."""
    realnode_host.ip_cmd("link", "del", realnode_config.dummy_name(slot), check=False)
