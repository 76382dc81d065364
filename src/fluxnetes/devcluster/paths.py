"""Where the control plane's binaries live and where a dev cluster keeps its files.

Kept free of heavy imports: tests/conftest.py uses it to decide whether `k8s` tests can run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# the binaries hack/build-k8s.sh builds, in start order (kubectl is used by the helpers)
BINARIES: tuple[str, ...] = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kubectl",
)

# kwok v0.8 has no built-in stages: these files (copied from its module by build-k8s.sh) drive
# node readiness, heartbeats and pod phases. Relative to $FLUXNETES_K8S_HOME/stages.
KWOK_STAGES: tuple[str, ...] = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


def k8s_home() -> Path:
    """The cache that hack/build-k8s.sh fills: $FLUXNETES_K8S_HOME or ~/.cache/fluxnetes/k8s."""
    env = os.environ.get("FLUXNETES_K8S_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fluxnetes" / "k8s"


def default_cluster_dir() -> Path:
    """Where `fluxnetes dev cluster up` keeps state, PKI, logs and the kubeconfig by default."""
    env = os.environ.get("FLUXNETES_DEV_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fluxnetes" / "dev"


def repo_build_script() -> Path | None:
    """hack/build-k8s.sh of the source checkout this package runs from, if there is one."""
    # src/fluxnetes/devcluster/paths.py -> repository root is three levels above `fluxnetes`
    candidate = Path(__file__).resolve().parents[3] / "hack" / "build-k8s.sh"
    return candidate if candidate.is_file() else None


@dataclass(frozen=True)
class Toolchain:
    """Resolved paths of every binary and kwok stage file."""

    home: Path

    @property
    def bin_dir(self) -> Path:
        return self.home / "bin"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def stage_files(self) -> list[Path]:
        return [self.home / "stages" / rel for rel in KWOK_STAGES]

    def missing(self) -> list[str]:
        """Human-readable list of what is absent (empty when everything is in place)."""
        out = [str(self.binary(b)) for b in BINARIES if not os.access(self.binary(b), os.X_OK)]
        out += [str(p) for p in self.stage_files if not p.is_file()]
        return out


def toolchain(home: Path | None = None) -> Toolchain:
    return Toolchain(home if home is not None else k8s_home())


def missing_message(missing: list[str]) -> str:
    """The one explanation given everywhere (CLI, pytest skip) when binaries are absent."""
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return (
        f"local Kubernetes binaries missing ({shown}); build them once with "
        "`bash hack/build-k8s.sh` or `fluxnetes dev build` (Go >= 1.26; about 7 min and 2 GB of RAM on 2 cores when cold), "
        "or point FLUXNETES_K8S_HOME at an existing build"
    )
