#!/usr/bin/env bash
# Build the controllers of the multi-role workload kinds from Go modules, at pinned versions,
# and keep their CRDs next to them (the module proxy serves these exact versions but does not
# list them, so they are named here, never resolved as "latest"):
#   jobset       sigs.k8s.io/jobset v0.10.1              (JobSet)
#   mpi-operator github.com/kubeflow/mpi-operator v0.6.0 (MPIJob v2beta1)
#   trainer      github.com/kubeflow/trainer/v2 v2.0.0   (TrainJob, training runtimes)
#   lws          sigs.k8s.io/lws v0.7.0                  (LeaderWorkerSet)
# Usage: bash hack/build-addons.sh [jobset mpi trainer lws]   (default: all four)
# Cache: $FLUXNETES_K8S_HOME/addons/<name>/{bin/manager,crds/*.yaml} (default ~/.cache/fluxnetes/k8s);
# whatever is already built is skipped.
set -euo pipefail
HOME_DIR=${FLUXNETES_K8S_HOME:-$HOME/.cache/fluxnetes/k8s}
export GOFLAGS=-mod=readonly CGO_ENABLED=0 GOTOOLCHAIN=local

# name | module@version | main package inside the module | CRD files inside the module
ADDONS=(
  "jobset|sigs.k8s.io/jobset@v0.10.1|.|config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
  "mpi|github.com/kubeflow/mpi-operator@v0.6.0|./cmd/mpi-operator|manifests/base/kubeflow.org_mpijobs.yaml"
  "trainer|github.com/kubeflow/trainer/v2@v2.0.0|./cmd/trainer-controller-manager|manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml"
  "lws|sigs.k8s.io/lws@v0.7.0|./cmd|config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
)

fail() { echo "build-addons: FAILED: $*" >&2; echo "build-addons: retry with: bash hack/build-addons.sh (cache in $HOME_DIR/addons)" >&2; exit 1; }
command -v go >/dev/null || fail "the Go toolchain (>= 1.26) is not on PATH"

want=("$@"); [ ${#want[@]} -gt 0 ] || want=(jobset mpi trainer lws)
start=$(date +%s)
for entry in "${ADDONS[@]}"; do
  IFS='|' read -r name modver pkg crds <<<"$entry"
  case " ${want[*]} " in *" $name "*) ;; *) continue ;; esac
  out=$HOME_DIR/addons/$name
  if [ -x "$out/bin/manager" ] && [ -f "$out/VERSION" ] && [ "$(cat "$out/VERSION")" = "$modver" ]; then
    echo "build-addons: $name ($modver) present"; continue
  fi
  echo "build-addons: $name ($modver)"
  dir=$(go mod download -json "$modver" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])') \
    || fail "downloading $modver from the Go module proxy"
  mkdir -p "$out/bin" "$out/crds"
  # Built inside the (read-only) module directory with its own go.mod and go.sum, exactly as
  # released; only the build cache is written.
  (cd "$dir" && go build -p 2 -trimpath -ldflags "-s -w" -o "$out/bin/manager" "$pkg") || fail "go build $modver $pkg"
  for crd in $crds; do
    [ -f "$dir/$crd" ] || fail "$modver has no $crd"
    install -m 0644 "$dir/$crd" "$out/crds/"
  done
  echo "$modver" >"$out/VERSION"
done
echo "build-addons: done in $(( $(date +%s) - start )) s"
