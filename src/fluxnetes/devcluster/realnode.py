"""Real (kubelet) nodes of the dev cluster: `fluxnetes dev cluster up --real-nodes N`.

Each real node is a kubelet and its own containerd (v2, built by hack/build-realnode.sh), with
runc and the CNI bridge plugin from Debian, in its own state directory
(<cluster dir>/nodes/real-node-<i>; sockets and runtime state under /run/fluxnetes/<slot>/).
They stand beside the kwok nodes; kwok manages only nodes annotated as fake.

Network rule: everything stays on this machine. The run creates, and `down` removes:
  - one interface flxd<slot> holding the node IPs 10.251.<slot>.<10+i>/32 (the kubelet
    refuses a loopback node IP): a bridge without ports, since the `dummy` module is missing
    from some kernels (this machine's among them) and a bridge is built into every one that
    runs containers;
  - per node a bridge flxb<slot>n<i> for its pods' subnet 10.<252+i>.<slot>.0/24. The pods' only
    routes are to the node and pod ranges (no default route), and nothing is masqueraded.
The slot (1..254) is chosen by creating that interface: creating a name that exists
fails, so two clusters on one machine never share addresses.

On cgroup v1 the kubelet needs `failCgroupV1: false`; both kubelet and runc use the cgroupfs
driver, each node under its own cgroup root /fluxnetes-<slot>-<i>. Root without
CAP_SYS_RESOURCE cannot lower oom_score_adj, hence containerd's `restrict_oom_score_adj`.
There is no registry: images are OCI archives imported with `ctr images import` (pods use
`imagePullPolicy: Never`).

This module is the nodes' lifecycle (check the machine, start, import images, stop) and the
cluster's record of them (``state.real_nodes``); a node's names, addresses and configuration
files are :mod:`~fluxnetes.devcluster.realnode_config`'s, and what is done to the machine and
undone (interfaces, cgroups, mounts, shims, kernel settings) :mod:`~fluxnetes.devcluster.realnode_host`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from fluxnetes.devcluster import dns, procs
from fluxnetes.devcluster.errors import BinariesMissing, ClusterError
from fluxnetes.devcluster.nodes import is_ready
from fluxnetes.devcluster.paths import Toolchain
from fluxnetes.devcluster.pki import issue, load_ca
from fluxnetes.devcluster.realnode_config import (
    CNI_DIR,
    NODE_NET,
    bridge_name,
    cgroup_root,
    cni_config,
    containerd_config,
    dummy_name,
    kubeconfig,
    kubelet_config,
    node_ip,
    node_labels,
    node_name,
    runc_path,
)
from fluxnetes.devcluster.realnode_host import (
    SHIM_SOCKETS,
    cgroup_pids,
    claim_slot,
    ip_cmd,
    kill,
    make_cgroup_root,
    other_kubelets,
    read_tunables,
    remove_cgroup_root,
    remove_host_leftovers,
    restore_tunables,
    shim_pids,
    shim_sockets,
    unmount_under,
)

if TYPE_CHECKING:
    from fluxnetes.devcluster.cluster import Cluster

MAX_REAL_NODES = 2
CNI_PLUGINS = ("bridge", "host-local", "loopback")
RUN_ROOT = Path("/run/fluxnetes")
BUILD_HINT = "bash hack/build-realnode.sh"
BINARIES = ("kubelet", "containerd", "ctr", "containerd-shim-runc-v2", dns.BINARY)
IMAGE_ARCHIVES = ("pause.tar", "busybox.tar")


def images_dir(home: Path) -> Path:
    return home / "realnode" / "images"


def missing(tools: Toolchain) -> list[str]:
    """Everything real nodes need that is absent, each with how to get it (empty: all there)."""
    out: list[str] = []
    if os.geteuid() != 0:
        out.append("root (the kubelet, containerd and runc manage cgroups, mounts and network "
                   "namespaces): run as root")
    for b in BINARIES:
        if not os.access(tools.binary(b), os.X_OK):
            out.append(f"{tools.binary(b)} ({BUILD_HINT})")
    for a in IMAGE_ARCHIVES:
        if not (images_dir(tools.home) / a).is_file():
            out.append(f"{images_dir(tools.home) / a} ({BUILD_HINT})")
    if not os.access(runc_path(), os.X_OK):
        out.append("runc (apt-get install runc, or bash hack/build-realnode.sh)")
    for p in CNI_PLUGINS:
        if not os.access(CNI_DIR / p, os.X_OK):
            out.append(f"{CNI_DIR / p} (apt-get install containernetworking-plugins, or "
                       f"{BUILD_HINT})")
    for tool, pkg in (("ip", "iproute2"), ("umount", "mount")):
        if shutil.which(tool) is None:
            out.append(f"the `{tool}` command (apt-get install {pkg})")
    if not Path("/sys/fs/cgroup").is_dir():
        out.append("a cgroup file system at /sys/fs/cgroup (mount cgroup v1 or v2 there)")
    return out


def check_count(count: int) -> None:
    if not 0 <= count <= MAX_REAL_NODES:
        raise ClusterError(f"--real-nodes must be between 0 and {MAX_REAL_NODES} (got {count})")


def preflight(tools: Toolchain, count: int) -> None:
    """Raise BinariesMissing naming everything absent and how to get it; never fall back."""
    check_count(count)
    if count == 0:
        return
    absent = missing(tools)
    if absent:
        raise BinariesMissing(
            f"--real-nodes {count} cannot run on this machine; missing:\n  - "
            + "\n  - ".join(absent)
        )



# -- one node ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodePaths:
    dir: Path  # <cluster>/nodes/real-node-i: configs, certificates, containerd's root
    run: Path  # /run/fluxnetes/<slot>/real-node-i: sockets, containerd state, kubelet root

    @property
    def sock(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.run / "containerd"


def node_paths(cluster_dir: Path, slot: int, i: int) -> NodePaths:
    return NodePaths(cluster_dir / "nodes" / node_name(i), RUN_ROOT / str(slot) / node_name(i))


def ctr(tools: Toolchain, sock: Path, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools.binary("ctr")), "--address", str(sock), "--namespace", "k8s.io",
                           *args], capture_output=True, text=True, timeout=timeout, check=False)


def import_image(tools: Toolchain, sock: Path, archive: Path, *flags: str) -> None:
    res = ctr(tools, sock, "images", "import", "--snapshotter", "overlayfs", *flags, str(archive))
    if res.returncode != 0:
        raise ClusterError(f"ctr images import {archive} failed: {(res.stderr or res.stdout).strip()}")


def start(cluster: Cluster, count: int, deadline: float, log: Callable[[str], None]) -> None:
    """Start `count` real nodes (containerd, images, kubelet) and wait until they are Ready."""
    tools = cluster.tools
    st = cluster.state
    prev = st.real_nodes or {}
    slot = prev.get("slot") or claim_slot()  # claimed before the control plane with Services
    # recorded at once: `down` removes what exists even if the start fails half-way
    st.real_nodes = {**prev, "slot": slot, "count": count, "tunables": read_tunables(), "nodes": []}
    cluster.save_state()
    ip_cmd("link", "set", dummy_name(slot), "up")
    (Path("/proc/sys") / "net/ipv4/ip_forward").write_text("1")  # between the nodes' bridges
    server = dns.dns_ip(NODE_NET, slot)
    ip_cmd("addr", "add", f"{server}/32", "dev", dummy_name(slot))
    dns.start(cluster, server, deadline, log)
    ca = load_ca(cluster.pki)
    names = []
    for i in range(count):
        name = node_name(i)
        ip = node_ip(slot, i)
        paths = node_paths(cluster.dir, slot, i)
        if paths.dir.exists():
            unmount_under(paths.dir)
            shutil.rmtree(paths.dir, ignore_errors=True)
        for d in (paths.dir / "pki", paths.dir / "cni" / "net.d", paths.containerd_state):
            d.mkdir(parents=True, exist_ok=True)
        st.real_nodes["nodes"].append({"name": name, "ip": ip, "dir": str(paths.dir),
                                       "run": str(paths.run), "cgroup": cgroup_root(slot, i)})
        cluster.save_state()
        ip_cmd("addr", "add", f"{ip}/32", "dev", dummy_name(slot))
        make_cgroup_root(cgroup_root(slot, i))
        pki = paths.dir / "pki"
        issue(ca, f"system:node:{name}", organizations=["system:nodes"], client=True).write(
            pki / "client.crt", pki / "client.key")
        issue(ca, f"system:node:{name}", ips=[ip], dns_names=[name], server=True).write(
            pki / "serving.crt", pki / "serving.key")
        (paths.dir / "cni" / "net.d" / "10-bridge.conflist").write_text(
            json.dumps(cni_config(slot, i, paths.dir / "cni" / "ipam"), indent=2))
        cfg = paths.dir / "containerd.toml"
        cfg.write_text(containerd_config(root=paths.dir / "containerd", state=paths.containerd_state,
                                         sock=paths.sock, cni_conf=paths.dir / "cni" / "net.d",
                                         opt=paths.dir / "containerd-opt"))
        log(f"starting containerd of {name}")
        env = {"PATH": f"{tools.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}:/usr/sbin:/sbin"}
        cluster.spawn_extra(f"containerd-{name}", [str(tools.binary("containerd")), f"--config={cfg}"],
                            cwd=paths.dir, env=env)
        sock = paths.sock

        def serving(sock: Path = sock) -> bool:
            return sock.exists() and ctr(tools, sock, "version", timeout=10).returncode == 0

        cluster.wait_for(f"containerd of {name}", serving, deadline)
        for a in IMAGE_ARCHIVES:
            import_image(tools, paths.sock, images_dir(tools.home) / a)
        kc = paths.dir / "kubeconfig"
        kc.write_text(yaml.safe_dump(kubeconfig(cluster.api_url, cluster.pki.ca_crt,
                                                pki / "client.crt", pki / "client.key")))
        kcfg = paths.dir / "kubelet.yaml"
        kcfg.write_text(yaml.safe_dump(kubelet_config(
            ip=ip, slot=slot, i=i, sock=paths.sock, ca=cluster.pki.ca_crt,
            cert=pki / "serving.crt", key=pki / "serving.key", node_dir=paths.dir, dns_ip=server)))
        labels = ",".join(f"{k}={v}" for k, v in node_labels(i).items())
        log(f"starting kubelet of {name} ({ip})")
        cluster.spawn_extra(f"kubelet-{name}", [
            str(tools.binary("kubelet")),
            f"--config={kcfg}",
            f"--kubeconfig={kc}",
            # under /run: the kubelet's sockets there (pod-resources, plugins) must stay within
            # the 107 bytes of a unix socket path, which a pytest tmp dir exceeds
            f"--root-dir={paths.run / 'kubelet'}",
            f"--cert-dir={pki}",
            f"--hostname-override={name}",
            f"--node-ip={ip}",
            f"--node-labels={labels}",
            "--v=1",
        ], cwd=paths.dir, env=env)
        names.append(name)
    log(f"waiting for {count} real node(s) to be Ready")
    cluster.wait_for(f"real nodes {', '.join(names)} to be Ready",
                     lambda: all(_ready(cluster, n) for n in names), deadline, interval=0.5)


def _ready(cluster: Cluster, name: str) -> bool:
    try:
        return is_ready(cluster.api_get(f"/api/v1/nodes/{name}"))
    except (urllib.error.URLError, OSError, ValueError):
        return False


def import_images(cluster: Cluster, archive: Path, base_name: str | None = None) -> None:
    """Import an OCI/docker archive into every real node's containerd (pods then use it with
    imagePullPolicy: Never). base_name: the repository for an archive whose references are bare
    tags (hack/build-image.sh's: `0.1.0` becomes `<base_name>:0.1.0`)."""
    extra = ("--base-name", base_name) if base_name else ()
    for n in (cluster.state.real_nodes or {}).get("nodes", []):
        import_image(cluster.tools, Path(n["run"]) / "containerd.sock", archive, *extra)


def _drain(cluster: Cluster, names: list[str], cgroups: list[str], timeout: float) -> None:
    """Delete the pods bound to the real nodes and wait until their kubelets stopped every
    container and sandbox (so CNI tears their network down); best effort."""
    deadline = time.monotonic() + timeout
    for name in names:
        with contextlib.suppress(ClusterError):
            cluster.kubectl("delete", "pods", "--all-namespaces", "--grace-period=1",
                            "--wait=false", f"--field-selector=spec.nodeName={name}",
                            check=True, timeout=30)
    while time.monotonic() < deadline:
        if not any(cgroup_pids(f"{cg}/kubepods") for cg in cgroups):
            return
        time.sleep(0.5)


def stop(cluster: Cluster) -> list[str]:
    """Stop the real nodes and remove everything they made: pods first (while the API server
    runs), then kubelets and containerds, leftover containers and shims, mounts, cgroups and
    interfaces. Returns what could not be removed (for the caller to report)."""
    st = cluster.state
    rn = st.real_nodes or {}
    if not rn:
        return []
    nodes = rn.get("nodes", [])
    names = [n["name"] for n in nodes]
    cgroups = [n["cgroup"] for n in nodes]
    ours = [p for p in st.processes if p.name.endswith(tuple(names)) and
            p.name.startswith(("kubelet-", "containerd-"))]
    if nodes and any(procs.is_running(p) for p in ours if p.name.startswith("kubelet-")):
        with contextlib.suppress(Exception):
            _drain(cluster, names, cgroups, timeout=30.0)
    procs.stop([p for p in ours if p.name.startswith("kubelet-")], timeout=10.0)
    procs.stop([p for p in ours if p.name.startswith("containerd-")], timeout=10.0)
    st.processes = [p for p in st.processes if p not in ours]
    dns.stop(cluster)
    left: list[str] = []
    for n in nodes:
        sock = Path(n["run"]) / "containerd.sock"
        sockets = shim_sockets(sock)
        for _ in range(3):  # containers may still start a process while being killed
            kill(cgroup_pids(n["cgroup"]))
            kill(shim_pids(sock))
            time.sleep(0.2)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.unlink()
        left += unmount_under(Path(n["dir"]), Path(n["run"]))
        left += remove_cgroup_root(n["cgroup"])
        # the big parts (containerd's snapshots, kubelet's pod dirs); logs stay in <dir>/logs
        for sub in ("containerd", "kubelet", "containerd-opt"):
            shutil.rmtree(Path(n["dir"]) / sub, ignore_errors=True)
        shutil.rmtree(n["run"], ignore_errors=True)
    slot = rn.get("slot")
    if slot is not None:
        for i in range(int(rn.get("count", 0))):
            ip_cmd("link", "del", bridge_name(slot, i), check=False)
        ip_cmd("link", "del", dummy_name(slot), check=False)
        for d in (RUN_ROOT / str(slot), RUN_ROOT, SHIM_SOCKETS, SHIM_SOCKETS.parent):
            with contextlib.suppress(OSError):  # only when empty: another cluster may use them
                d.rmdir()
        remove_host_leftovers(int(slot), [Path(n["dir"]) for n in nodes])
    if not other_kubelets():  # another cluster's kubelets still want them
        restore_tunables(rn.get("tunables") or {})
    st.real_nodes = {}
    cluster.save_state()
    return left
