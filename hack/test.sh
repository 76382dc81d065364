#!/usr/bin/env bash
# Set up everything the test suite needs and run it. This is the README's test command and
# what .ci/run calls. Extra arguments go to pytest (e.g. `bash hack/test.sh -k planner`).
#   - a virtualenv in .venv with fluxnetes and its dev dependencies
#   - PostgreSQL from Debian packages, started on 127.0.0.1 in a temporary data directory
#   - the local Kubernetes control plane's binaries, built from Go modules (cached outside the repo)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib.sh
. hack/lib.sh

ensure_venv
ensure_postgres_installed
# Builds that take minutes cold run in the background beside the others (cached: seconds).
# Each is awaited before the tests; once built, its tests must run, never skip.
bg_pids=()
stop_builds() { for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_builds EXIT
start_build() {  # start_build SCRIPT: runs hack/SCRIPT in the background, logging to a file
  local log; log=$(mktemp)
  bash "hack/$1" >"$log" 2>&1 &
  bg_pids+=("$!"); build_pid=$!; build_log=$log
}
await_build() {  # await_build PID LOG WHAT REQUIRE_VAR
  if wait "$1"; then
    cat "$2"; rm -f "$2"; export "$4=1"
  else
    cat "$2" >&2; echo "test.sh: $3 could not be built (above)" >&2; exit 1
  fi
}

# -- the controllers of the multi-role workload kinds (JobSet, MPI Operator, LeaderWorkerSet,
# Kubeflow Trainer) and the peers Kueue and scheduler-plugins' coscheduling, from Go modules
# (hack/build-addons.sh; tests/test_addons.py, tests/test_addons_kueue.py,
# tests/test_addons_coscheduling.py)
addons_pid=""
if [ "${FLUXNETES_SKIP_K8S_BUILD:-0}" != "1" ] && [ "${FLUXNETES_SKIP_ADDONS_BUILD:-0}" != "1" ]; then
  start_build build-addons.sh; addons_pid=$build_pid; addons_log=$build_log
fi
# -- the MPI image of the real-node tests (debootstrap: network and dpkg more than CPU), from the
# start beside the Go builds; hack/build-realnode.sh runs it too and waits for this one
mpi_pid=""
if [ "${FLUXNETES_SKIP_K8S_BUILD:-0}" != "1" ] && [ "${FLUXNETES_SKIP_REALNODE_BUILD:-0}" != "1" ]; then
  start_build build-mpi-image.sh; mpi_pid=$build_pid; mpi_log=$build_log
fi
# -- the optional native (mypyc) build of the simulator's hot path (hack/build-native.sh, cached
# by source hash: about two minutes of one core when the core's sources changed, seconds
# otherwise); tests/test_native.py then must run it, never skip
native_pid=""
if [ "${FLUXNETES_SKIP_NATIVE_BUILD:-0}" != "1" ]; then
  start_build build-native.sh; native_pid=$build_pid; native_log=$build_log
fi

realnode_pid=""
if [ "${FLUXNETES_SKIP_K8S_BUILD:-0}" != "1" ]; then
  # The control plane's tests must run, never skip: a failed build fails the run (set
  # FLUXNETES_SKIP_K8S_BUILD=1 to run without them on purpose).
  bash hack/build-k8s.sh || { echo "test.sh: the Kubernetes binaries could not be built (hack/build-k8s.sh, above)" >&2; exit 1; }
  export FLUXNETES_REQUIRE_K8S=1
  # -- real nodes: kubelet, containerd and their images (hack/build-realnode.sh, which needs
  # build-k8s.sh's module; tests/test_realnode*.py)
  if [ "${FLUXNETES_SKIP_REALNODE_BUILD:-0}" != "1" ]; then
    start_build build-realnode.sh; realnode_pid=$build_pid; realnode_log=$build_log
  fi
  bash hack/build-helm.sh || { echo "test.sh: helm could not be built (hack/build-helm.sh, above)" >&2; exit 1; }
fi

if [ "${FLUXNETES_SKIP_IMAGE_BUILD:-0}" != "1" ]; then
  # The operator image from the Dockerfile, without a container engine (docs/image.md; cached,
  # seconds when nothing changed). Once it builds, the image tests must run, never skip.
  bash hack/build-image.sh || { echo "test.sh: the operator image could not be built (hack/build-image.sh, above)" >&2; exit 1; }
  export FLUXNETES_REQUIRE_IMAGE=1
fi

[ -z "$native_pid" ] || await_build "$native_pid" "$native_log" "the native build (hack/build-native.sh)" FLUXNETES_REQUIRE_NATIVE
[ -z "$addons_pid" ] || await_build "$addons_pid" "$addons_log" "the addon controllers (hack/build-addons.sh)" FLUXNETES_REQUIRE_ADDONS
[ -z "$mpi_pid" ] || await_build "$mpi_pid" "$mpi_log" "the MPI image (hack/build-mpi-image.sh)" FLUXNETES_MPI_IMAGE_BUILT
[ -z "$realnode_pid" ] || await_build "$realnode_pid" "$realnode_log" "the real-node binaries (hack/build-realnode.sh)" FLUXNETES_REQUIRE_REALNODE

pg_start
trap 'stop_builds; pg_stop' EXIT
set +e
# pytest's own temporary root (/tmp/pytest-of-$USER/pytest-N) keeps only the last three runs:
# any other pytest started on the machine meanwhile deletes this run's directories under the
# clusters and files its tests still use. A directory of its own is never rotated away (a
# --basetemp given by the caller comes later on the line and wins).
basetemp=$(mktemp -d /tmp/fluxnetes-test-XXXXXX)
.venv/bin/python -m pytest --basetemp="$basetemp" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "test.sh: no test ran" >&2; exit 1; fi
exit "$rc"
