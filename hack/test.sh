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
# -- addons (1/2): the controllers of the multi-role workload kinds (JobSet, MPI Operator,
# LeaderWorkerSet, Kubeflow Trainer), from Go modules (hack/build-addons.sh; cached: seconds).
# Cold it takes minutes, so it runs in the background while the other builds run.
addons_pid=""
realnode_pid=""
if [ "${FLUXNETES_SKIP_K8S_BUILD:-0}" != "1" ] && [ "${FLUXNETES_SKIP_ADDONS_BUILD:-0}" != "1" ]; then
  addons_log=$(mktemp)
  bash hack/build-addons.sh >"$addons_log" 2>&1 &
  addons_pid=$!
  trap 'kill "$addons_pid" 2>/dev/null || true' EXIT
fi
if [ "${FLUXNETES_SKIP_K8S_BUILD:-0}" != "1" ]; then
  # The control plane's tests must run, never skip: a failed build fails the run (set
  # FLUXNETES_SKIP_K8S_BUILD=1 to run without them on purpose).
  bash hack/build-k8s.sh || { echo "test.sh: the Kubernetes binaries could not be built (hack/build-k8s.sh, above)" >&2; exit 1; }
  export FLUXNETES_REQUIRE_K8S=1
  # -- real nodes (1/2): kubelet, containerd and their images (hack/build-realnode.sh; cached:
  # seconds; cold ~2-3 min) in the background while helm and the image build
  if [ "${FLUXNETES_SKIP_REALNODE_BUILD:-0}" != "1" ]; then
    realnode_log=$(mktemp)
    bash hack/build-realnode.sh >"$realnode_log" 2>&1 &
    realnode_pid=$!
    trap 'kill "$addons_pid" "$realnode_pid" 2>/dev/null || true' EXIT
  fi
  bash hack/build-helm.sh || { echo "test.sh: helm could not be built (hack/build-helm.sh, above)" >&2; exit 1; }
fi

if [ "${FLUXNETES_SKIP_IMAGE_BUILD:-0}" != "1" ]; then
  # The operator image from the Dockerfile, without a container engine (docs/image.md; cached,
  # seconds when nothing changed). Once it builds, the image tests must run, never skip.
  bash hack/build-image.sh || { echo "test.sh: the operator image could not be built (hack/build-image.sh, above)" >&2; exit 1; }
  export FLUXNETES_REQUIRE_IMAGE=1
fi

# -- addons (2/2): once built, their tests must run, never skip (tests/test_addons.py)
if [ -n "$addons_pid" ]; then
  if wait "$addons_pid"; then
    cat "$addons_log"; rm -f "$addons_log"
    trap '[ -z "$realnode_pid" ] || kill "$realnode_pid" 2>/dev/null || true' EXIT
    export FLUXNETES_REQUIRE_ADDONS=1
  else
    cat "$addons_log" >&2
    echo "test.sh: the addon controllers could not be built (hack/build-addons.sh, above)" >&2; exit 1
  fi
fi

# -- real nodes (2/2): once built, their tests must run, never skip (tests/test_realnode*.py)
if [ -n "${realnode_pid:-}" ]; then
  if wait "$realnode_pid"; then
    cat "$realnode_log"; rm -f "$realnode_log"; trap - EXIT
    export FLUXNETES_REQUIRE_REALNODE=1
  else
    cat "$realnode_log" >&2
    echo "test.sh: the real-node binaries could not be built (hack/build-realnode.sh, above)" >&2; exit 1
  fi
fi

pg_start
trap pg_stop EXIT
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "test.sh: no test ran" >&2; exit 1; fi
exit "$rc"
