"""Experiment: does compiling the operator's per-event hot path with mypyc cut its CPU per
single-pod Job? (issue #31, item 3)

``build``: compiles :data:`OPERATOR_MODULES` (the simulator's list, fluxnetes.native's
NATIVE_MODULES, plus the operator's per-event modules from the py-spy split
bench/results/operator_profile_split_single_pod_200_s38.json) with fluxnetes.native's
machinery into its own cache (``~/.cache/fluxnetes/native-operator``: never the shared
native cache, whose pruning would remove other checkouts' builds). The hash also covers the
whole k8s package (the compiled modules' imported types).

``run``: bench/operator_bench.py with two variants of the same src, ``pure`` and
``compiled`` (the latter with bench/operator_native_shim on PYTHONPATH and
FLUXNETES_NATIVE_OPERATOR=1: its sitecustomize loads the build before anything imports the
compiled modules, and refuses to start on a missing or stale build).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fluxnetes import native

HERE = Path(__file__).resolve().parent
SHIM = HERE / "operator_native_shim"
CACHE = Path.home() / ".cache" / "fluxnetes" / "native-operator"

#: Per-event modules of the operator (py-spy split, 300 single-pod Jobs at 200 nodes).
OPERATOR_ONLY: tuple[str, ...] = (
    "fluxnetes.k8s.context",
    "fluxnetes.k8s.controller",
    "fluxnetes.k8s.informer",
    "fluxnetes.k8s.cluster.mirror",
    "fluxnetes.k8s.groups.groupbook",
    # not fluxnetes.k8s.groups.group: its __setattr__ reads self.__dict__ (a compiled class has none)
    # not fluxnetes.k8s.groups.grouptable: "Multiple assignment in class bodies not supported"
    "fluxnetes.k8s.scheduling.allocation",
    "fluxnetes.k8s.scheduling.cycle",
    "fluxnetes.k8s.persistence.status",
    "fluxnetes.k8s.persistence.fluxjob",
    "fluxnetes.jobspec.pods",
    # not fluxnetes.match.fast (now match.slotindex and its neighbours): compiles, but fails at run time (SlotIndex._refresh: "tuple[object, int] or None object expected; got int")
    "fluxnetes.match.walktree",  # the Engine's layers: a compiled class's bases are compiled too
    "fluxnetes.match.commit",
    "fluxnetes.match.walk",
    "fluxnetes.match.engine",
)
SKIP = tuple(m for m in os.environ.get("OPERATOR_NATIVE_SKIP", "").split(",") if m)
OPERATOR_MODULES: tuple[str, ...] = native.NATIVE_MODULES + tuple(
    m for m in OPERATOR_ONLY if m not in SKIP)


def _configure() -> dict[str, str]:
    native.NATIVE_MODULES = OPERATOR_MODULES  # read at call time by build/activate/hash
    native.HASHED_PACKAGES = (*native.HASHED_PACKAGES, "k8s")
    native.KEEP_BUILDS = 2
    return {**os.environ, native.ENV_CACHE: str(CACHE), native.ENV_SWITCH: "1"}


def activate_operator_build() -> native.NativeStatus:
    """Called by the shim's sitecustomize in the operator's process."""
    return native.activate(_configure())


def main(argv: list[str]) -> int:
    if argv[:1] == ["build"]:
        env = _configure()
        try:
            target = native.build(env)
        except native.NativeError as exc:
            print(f"operator_native: {exc}", file=sys.stderr)
            return 1
        print(f"operator_native: build {target} ({len(OPERATOR_MODULES)} modules)")
        return 0
    if argv[:1] == ["run"]:
        src = str((HERE.parent / "src").resolve())
        cmd = [sys.executable, str(HERE / "operator_bench.py"),
               "--variant-src", f"pure={src}", "--variant-src", f"compiled={src}",
               "--variant-args", "pure=--fluxjobs waiting",
               "--variant-args", "compiled=--fluxjobs waiting",
               "--variant-env", f"compiled=PYTHONPATH={SHIM}:{src}",
               "--variant-env", "compiled=FLUXNETES_NATIVE_OPERATOR=1", *argv[1:]]
        return subprocess.call(cmd)
    print("usage: operator_native.py build | run <operator_bench args>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
