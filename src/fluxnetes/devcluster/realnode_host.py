"""What real nodes change on this machine, and how it is put back: the interfaces (``ip``), the
cgroup roots in every mounted hierarchy, mounts below the nodes' directories, containerd's
shims, the files the kubelet and CNI leave outside the nodes' directories, and the kernel
settings the kubelet changes. Everything here acts on the machine; the cluster's bookkeeping
(which slot, which nodes) is :mod:`fluxnetes.devcluster.realnode`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import signal
import subprocess
from pathlib import Path

from fluxnetes.devcluster.errors import ClusterError
from fluxnetes.devcluster.realnode_config import dummy_name

# the kubelet sets these (as on every Kubernetes node) unless protectKernelDefaults; they are
# put back when the cluster's real nodes stop
# ip_forward: we set it, so that pods on one node's bridge reach those on another's (MPI ranks)
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "net/ipv4/ip_forward")


def ip_cmd(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
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
        res = ip_cmd("link", "add", dummy_name(slot), "type", "bridge", check=False)
        if res.returncode == 0:
            return slot
        last = res.stderr.strip()
        if "File exists" not in last:
            raise ClusterError(
                f"cannot create an interface for the real nodes' IPs (`ip link add "
                f"{dummy_name(slot)} type bridge`: {last}); the kernel needs bridge support "
                "(CONFIG_BRIDGE, also used by the pods' CNI bridge) and this process CAP_NET_ADMIN")
    raise ClusterError(f"no free slot for real-node interfaces after {tries} tries ({last})")


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, the named systemd one, or the v2 root)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] in ("cgroup", "cgroup2"):
            out.append(Path(parts[1]))
    return out


def make_cgroup_root(path: str) -> None:
    """The kubelet insists its cgroup root exists in every hierarchy; cpuset needs cpus/mems."""
    for h in cgroup_hierarchies():
        d = h / path.strip("/")
        d.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):
            if (d / f).exists() and not (d / f).read_text().strip():
                (d / f).write_text((h / f).read_text())


def cgroup_pids(path: str) -> set[int]:
    pids: set[int] = set()
    for h in cgroup_hierarchies():
        d = h / path.strip("/")
        if d.is_dir():
            for f in d.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(x) for x in f.read_text().split())
    return pids


def remove_cgroup_root(path: str) -> list[str]:
    """rmdir the tree in every hierarchy, deepest first; returns what could not be removed."""
    left = []
    for h in cgroup_hierarchies():
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


def kill(pids: set[int] | list[int]) -> None:
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

