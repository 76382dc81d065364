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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fluxnetes.devcluster import dns, procs
from fluxnetes.devcluster.errors import BinariesMissing, ClusterError
from fluxnetes.devcluster.nodes import DEV_NODE_LABEL, RACK_LABEL, ZONE_LABEL, is_ready
from fluxnetes.devcluster.paths import Toolchain
from fluxnetes.devcluster.pki import issue, load_ca

if TYPE_CHECKING:
    from fluxnetes.devcluster.cluster import Cluster

MAX_REAL_NODES = 2
NODE_PREFIX = "real-node"
REAL_NODE_LABEL = "fluxnetes.io/real-node"
REAL_ZONE = "zone-0"  # beside kwok's first zone
REAL_RACK = "rack-real"
PAUSE_IMAGE = "localhost/fluxnetes-pause:1"
BUSYBOX_IMAGE = "localhost/fluxnetes-busybox:1"
CNI_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
RUN_ROOT = Path("/run/fluxnetes")
NODE_NET = "10.251"  # node IPs: 10.251.<slot>.<10+i>
POD_NET_FIRST = 252  # pod subnets: 10.<252+i>.<slot>.0/24
# the pods' routes: node IPs, every pod subnet, the Service range; no default route
POD_ROUTES = ("10.251.0.0/16", "10.252.0.0/15", "10.0.0.0/24")
BUILD_HINT = "bash hack/build-realnode.sh"
# the kubelet sets these (as on every Kubernetes node) unless protectKernelDefaults; they are
# put back when the cluster's real nodes stop
# ip_forward: we set it, so that pods on one node's bridge reach those on another's (MPI ranks)
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "net/ipv4/ip_forward")
BINARIES = ("kubelet", "containerd", "ctr", "containerd-shim-runc-v2", dns.BINARY)
IMAGE_ARCHIVES = ("pause.tar", "busybox.tar")


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


# -- configuration files ----------------------------------------------------------------------
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


# -- the machine: interfaces, cgroups, mounts, processes ----------------------------------------
def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and res.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed: {res.stderr.strip()}")
    return res


def claim_slot(tries: int = 64) -> int:
    """Create the node-IP interface of a free slot; its name is the claim."""
    slots = list(range(1, 255))
    random.shuffle(slots)
    last = ""
    for slot in slots[:tries]:
        res = _ip("link", "add", dummy_name(slot), "type", "bridge", check=False)
        if res.returncode == 0:
            return slot
        last = res.stderr.strip()
        if "File exists" not in last:
            raise ClusterError(
                f"cannot create an interface for the real nodes' IPs (`ip link add "
                f"{dummy_name(slot)} type bridge`: {last}); the kernel needs bridge support "
                "(CONFIG_BRIDGE, also used by the pods' CNI bridge) and this process CAP_NET_ADMIN")
    raise ClusterError(f"no free slot for real-node interfaces after {tries} tries ({last})")


def _cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, the named systemd one, or the v2 root)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] in ("cgroup", "cgroup2"):
            out.append(Path(parts[1]))
    return out


def make_cgroup_root(path: str) -> None:
    """The kubelet insists its cgroup root exists in every hierarchy; cpuset needs cpus/mems."""
    for h in _cgroup_hierarchies():
        d = h / path.strip("/")
        d.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):
            if (d / f).exists() and not (d / f).read_text().strip():
                (d / f).write_text((h / f).read_text())


def cgroup_pids(path: str) -> set[int]:
    pids: set[int] = set()
    for h in _cgroup_hierarchies():
        d = h / path.strip("/")
        if d.is_dir():
            for f in d.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(x) for x in f.read_text().split())
    return pids


def remove_cgroup_root(path: str) -> list[str]:
    """rmdir the tree in every hierarchy, deepest first; returns what could not be removed."""
    left = []
    for h in _cgroup_hierarchies():
        d = h / path.strip("/")
        if not d.is_dir():
            continue
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                sub.rmdir()
        try:
            d.rmdir()
        except OSError as exc:
            left.append(f"{d}: {exc.strerror}")
    return left


def _unescape_mount(path: str) -> str:
    return path.encode().decode("unicode_escape")


def unmount_under(*dirs: Path) -> list[str]:
    """Unmount (lazily, deepest first) every mount point below `dirs`; returns failures."""
    roots = [str(d.resolve()) + "/" for d in dirs]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = _unescape_mount(line.split()[4])
        if any((mp + "/").startswith(r) for r in roots):
            points.append(mp)
    failed = []
    for mp in sorted(set(points), key=lambda p: -p.count("/")):
        res = subprocess.run(["umount", "-l", mp], capture_output=True, text=True, check=False)
        if res.returncode != 0 and "not mounted" not in res.stderr:
            failed.append(f"{mp}: {res.stderr.strip()}")
    return failed


SHIM_SOCKETS = Path("/run/containerd/s")  # fixed in containerd, whatever its state dir


def shim_pids(sock: Path) -> list[int]:
    """containerd-shim-runc-v2 processes started by the containerd listening on `sock`."""
    return list(_shims(sock))


def _shims(sock: Path) -> dict[int, list[bytes]]:
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(sock).encode() in argv:
            out[int(p.name)] = argv
    return out


def shim_sockets(sock: Path) -> list[Path]:
    """The sockets of those shims: containerd names each by sha256(<address>/<namespace>/<id>)
    under /run/containerd/s; a killed shim leaves its socket behind."""
    out = []
    for argv in _shims(sock).values():
        args = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a in (b"-namespace", b"-id")}
        ns, sid = args.get(b"-namespace"), args.get(b"-id")
        if ns and sid:
            key = "/".join((str(sock), ns.decode(), sid.decode()))
            out.append(SHIM_SOCKETS / hashlib.sha256(key.encode()).hexdigest())
    return out


def _kill(pids: set[int] | list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# paths the kubelet and CNI use whatever their configuration says (cleaned up by `stop`)
CONTAINER_LOG_LINKS = Path("/var/log/containers")
CNI_RESULTS = Path("/var/lib/cni/results")
KUBELET_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")


def other_kubelets() -> bool:
    """A kubelet process is running (another cluster's): machine-wide leftovers stay."""
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError):
                if (p / "cmdline").read_bytes().split(b"\0")[0].endswith(b"/kubelet"):
                    return True
    return False


def remove_host_leftovers(slot: int, node_dirs: list[Path]) -> None:
    """What the kubelets and CNI left outside the nodes' directories: the kubelet's links in
    /var/log/containers into this cluster's pod logs, CNI's cached results of this cluster's
    networks; with no kubelet left, the kubelet's device-plugin socket and empty dirs."""
    roots = tuple(str(d) + "/" for d in node_dirs)
    if CONTAINER_LOG_LINKS.is_dir():
        for link in CONTAINER_LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(roots):
                    link.unlink()
    if CNI_RESULTS.is_dir():
        for f in CNI_RESULTS.glob(f"fluxnetes-{slot}-*"):
            with contextlib.suppress(OSError):
                f.unlink()
    if other_kubelets():
        return
    with contextlib.suppress(OSError):
        (KUBELET_DEVICE_PLUGINS / "kubelet.sock").unlink()
    for d in (KUBELET_DEVICE_PLUGINS, KUBELET_DEVICE_PLUGINS.parent, CNI_RESULTS,
              CNI_RESULTS.parent, CONTAINER_LOG_LINKS):
        with contextlib.suppress(OSError):  # only when empty
            d.rmdir()


def read_tunables() -> dict[str, str]:
    out = {}
    for t in KERNEL_TUNABLES:
        with contextlib.suppress(OSError):
            out[t] = (Path("/proc/sys") / t).read_text().strip()
    return out


def restore_tunables(saved: dict[str, str]) -> None:
    for t, value in saved.items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / t).write_text(value)


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
    _ip("link", "set", dummy_name(slot), "up")
    (Path("/proc/sys") / "net/ipv4/ip_forward").write_text("1")  # between the nodes' bridges
    server = dns.dns_ip(NODE_NET, slot)
    _ip("addr", "add", f"{server}/32", "dev", dummy_name(slot))
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
        _ip("addr", "add", f"{ip}/32", "dev", dummy_name(slot))
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
            _kill(cgroup_pids(n["cgroup"]))
            _kill(shim_pids(sock))
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
            _ip("link", "del", bridge_name(slot, i), check=False)
        _ip("link", "del", dummy_name(slot), check=False)
        for d in (RUN_ROOT / str(slot), RUN_ROOT, SHIM_SOCKETS, SHIM_SOCKETS.parent):
            with contextlib.suppress(OSError):  # only when empty: another cluster may use them
                d.rmdir()
        remove_host_leftovers(int(slot), [Path(n["dir"]) for n in nodes])
    if not other_kubelets():  # another cluster's kubelets still want them
        restore_tunables(rn.get("tunables") or {})
    st.real_nodes = {}
    cluster.save_state()
    return left
