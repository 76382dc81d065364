"""What a dev cluster is asked for (ClusterOptions) and what it leaves on disk: state.json (the
processes, ports and addresses another process needs to find, check and stop it), the status
`fluxnetes dev cluster status` shows, and the lock that keeps one `up`/`down` per directory."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fluxnetes.devcluster import procs
from fluxnetes.devcluster.errors import ClusterError
from fluxnetes.devcluster.nodes import NodeShape

STATE_FILE = "state.json"
STATE_VERSION = 1


@dataclass
class ClusterOptions:
    nodes: NodeShape = field(default_factory=NodeShape)
    dir: Path | None = None  # default: $FLUXNETES_DEV_DIR or ~/.cache/fluxnetes/dev
    k8s_home: Path | None = None  # default: $FLUXNETES_K8S_HOME or ~/.cache/fluxnetes/k8s
    advertise_address: str | None = None  # default: first non-loopback IPv4 of `hostname -I`
    # seconds for the whole start, nodes Ready included; None: start_timeout(node count)
    timeout: float | None = None
    data_root: Path | None = None  # parent of etcd's data dir; default /dev/shm (else $TMPDIR)
    die_with_parent: bool = False  # tests: processes end when the starting process dies
    log: Callable[[str], None] | None = None  # progress messages (the CLI prints them)
    # Job pods annotated components.TIMED_POD_ANNOTATION="20s" run that long (default: at once)
    timed_pods: bool = False
    # seconds Job pods without that annotation run (0: at once); > 0 implies timed_pods
    pod_duration: float = 0.0
    # controllers of multi-role workload kinds to run (devcluster/addons.py): jobset, mpi, lws,
    # trainer (addons.parse() gives the order and what each requires)
    addons: tuple[str, ...] = ()
    # real kubelet nodes beside the kwok ones (realnode.py; 0, 1 or 2; needs root and
    # hack/build-realnode.sh)
    real_nodes: int = 0
    # Services (services.py: kube-proxy, the API server reachable from pods); needs real nodes
    services: bool = False


def start_timeout(nodes: int) -> float:
    """Default seconds for `up`: 300, plus 0.1 s per node above 1,000 (700 s for 5,000 nodes,
    which took 282 s on a loaded 2-core machine: docs/scale.md)."""
    return 300.0 + 0.1 * max(0, nodes - 1000)



@dataclass
class ClusterState:
    """What state.json holds: enough to find, check and stop the cluster from another process."""

    dir: str
    kubeconfig: str
    api_url: str
    ports: dict[str, int]
    advertise_address: str
    data_dir: str
    processes: list[procs.ProcessRecord] = field(default_factory=list)
    nodes: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    version: int = STATE_VERSION
    timed_pods: bool = False
    die_with_parent: bool = False
    addons: list[str] = field(default_factory=list)
    pod_duration: float = 0.0
    # slot, node names, dirs, cgroups of the real nodes (realnode.py); empty without them
    real_nodes: dict[str, Any] = field(default_factory=dict)
    # the API server's listen address: 127.0.0.1, or with Services one pods reach (services.py)
    api_host: str = "127.0.0.1"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        raw = json.loads(text)
        if raw.get("version") != STATE_VERSION:
            raise ClusterError(f"state file version {raw.get('version')!r} is not {STATE_VERSION}")
        raw["processes"] = [procs.ProcessRecord(**p) for p in raw.get("processes", [])]
        return cls(**raw)


@dataclass(frozen=True)
class ProcessStatus:
    name: str
    pid: int
    running: bool
    log: str
    rss_mib: float | None = None  # resident memory now (None when stopped)


@dataclass(frozen=True)
class ClusterStatus:
    dir: Path
    api_url: str
    kubeconfig: Path
    processes: list[ProcessStatus]
    api_ready: bool
    nodes_total: int
    nodes_ready: int

    @property
    def healthy(self) -> bool:
        return self.api_ready and all(p.running for p in self.processes)



def data_root() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


@contextlib.contextmanager
def dir_lock(directory: Path) -> Iterator[None]:
    """One `up`/`down` at a time per cluster directory."""
    with (directory / ".lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ClusterError(
                f"another `fluxnetes dev cluster` command is using {directory}"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load_state(directory: Path) -> ClusterState | None:
    path = directory / STATE_FILE
    if not path.is_file():
        return None
    try:
        return ClusterState.from_json(path.read_text())
    except (ValueError, TypeError, KeyError) as exc:
        raise ClusterError(
            f"unreadable state file {path}: {exc}; delete it if no cluster runs"
        ) from exc


def write_state(state: ClusterState) -> None:
    path = Path(state.dir) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    tmp.replace(path)


def cleanup(directory: Path, state: ClusterState) -> None:
    """Forget a stopped cluster: etcd data, state file and the now useless kubeconfig."""
    if state.data_dir and Path(state.data_dir).name.startswith("fluxnetes-etcd-"):
        shutil.rmtree(state.data_dir, ignore_errors=True)
    for name in (STATE_FILE, "kubeconfig"):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
