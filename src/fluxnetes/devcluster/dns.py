"""Cluster DNS of the real-node dev cluster: CoreDNS (hack/build-coredns.sh) as a process of the
cluster on this machine, like the control plane's components.

It listens on 10.251.<slot>.2:53, an address of the run's own node-IP interface (flxd<slot>,
realnode.py) that the pods reach through their bridge's gateway, and each kubelet's
clusterDNS points at it. Its kubernetes plugin answers cluster.local from the API server (as
admin, through the cluster's kubeconfig): Services (<svc>.<ns>.svc.cluster.local), the pods
behind a headless Service (<hostname>.<subdomain>.<ns>.svc.cluster.local: how the MPI
Operator's launcher reaches its workers) and pod IPs (1-2-3-4.<ns>.pod.cluster.local). There is
no forward plugin: every other name is refused, nothing is asked outside the machine.
"""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fluxnetes.devcluster import procs
from fluxnetes.devcluster.components import SERVICE_IP
from fluxnetes.devcluster.errors import ClusterError

if TYPE_CHECKING:
    from fluxnetes.devcluster.cluster import Cluster

DOMAIN = "cluster.local"
PROCESS = "coredns"
BINARY = "coredns"
BUILD_HINT = "bash hack/build-realnode.sh (it runs hack/build-coredns.sh)"
# answered by every cluster: the API server's own Service
PROBE_NAME = f"kubernetes.default.svc.{DOMAIN}"


def dns_ip(node_net: str, slot: int) -> str:
    """The server's address on the node-IP interface: .2 (the nodes take .10 and up)."""
    return f"{node_net}.{slot}.2"


def corefile(ip: str, kubeconfig: Path) -> str:
    return f"""\
# the real-node dev cluster's DNS (fluxnetes.devcluster.dns): cluster.local only, no forwarding
{DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {ip}
    errors
    log
    kubernetes {DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 5
    }}
}}
"""


def start(cluster: Cluster, ip: str, deadline: float, log: Callable[[str], None]) -> None:
    """Run CoreDNS on `ip` (already an address of this machine) and wait until it answers the
    `kubernetes` Service's name with its cluster IP."""
    binary = cluster.tools.binary(BINARY)
    conf = cluster.dir / "Corefile"
    conf.write_text(corefile(ip, cluster.kubeconfig))
    log(f"starting DNS (CoreDNS) on {ip}:53")
    cluster.spawn_extra(PROCESS, [str(binary), "-conf", str(conf)], cwd=cluster.dir)

    def answers() -> bool:
        try:
            return query(ip, PROBE_NAME, timeout=1.0) == [SERVICE_IP]
        except OSError:
            return False

    cluster.wait_for(f"DNS on {ip} to answer {PROBE_NAME} (log: {cluster.dir}/logs/{PROCESS}.log)",
                     answers, deadline, interval=0.3)


def stop(cluster: Cluster) -> None:
    ours = [p for p in cluster.state.processes if p.name == PROCESS]
    procs.stop(ours, timeout=10.0)
    cluster.state.processes = [p for p in cluster.state.processes if p not in ours]
    cluster.save_state()


# -- a minimal DNS client: one A question over UDP (readiness, tests) -------------------------
def _skip_name(msg: bytes, at: int) -> int:
    while True:
        n = msg[at]
        if n & 0xC0 == 0xC0:  # a compression pointer ends the name
            return at + 2
        if n == 0:
            return at + 1
        at += 1 + n


def query(server: str, name: str, *, port: int = 53, timeout: float = 2.0) -> list[str]:
    """The A records of `name` from `server` ([] when the name does not exist). Raises
    ClusterError when the server refuses or fails, OSError when it does not answer."""
    qid = random.randrange(1 << 16)
    qname = b"".join(bytes([len(label)]) + label.encode() for label in name.rstrip(".").split("."))
    msg = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + b"\0" + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(msg, (server, port))
        while True:
            data, _ = s.recvfrom(4096)
            if len(data) >= 12 and struct.unpack(">H", data[:2])[0] == qid:
                break
    _, flags, qd, an, _, _ = struct.unpack(">HHHHHH", data[:12])
    rcode = flags & 0xF
    if rcode == 3:  # NXDOMAIN
        return []
    if rcode != 0:
        raise ClusterError(f"DNS server {server} answered {name} with rcode {rcode}")
    at = 12
    for _ in range(qd):
        at = _skip_name(data, at) + 4
    out = []
    for _ in range(an):
        at = _skip_name(data, at)
        rtype, _, _, rdlen = struct.unpack(">HHIH", data[at:at + 10])
        at += 10
        if rtype == 1 and rdlen == 4:
            out.append(socket.inet_ntoa(data[at:at + 4]))
        at += rdlen
    return out
