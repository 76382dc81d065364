#!/usr/bin/env bash
# Build the helm v3 CLI from its Go module (no release download) and cache it beside the local
# control plane's binaries: $FLUXNETES_K8S_HOME/bin/helm (default ~/.cache/fluxnetes/k8s/bin).
# Skips the build when the binary is already there. Used by hack/test.sh and hack/render-dist.sh.
set -euo pipefail
HELM=${HELM_VERSION:-v3.21.4}
HOME_DIR=${FLUXNETES_K8S_HOME:-$HOME/.cache/fluxnetes/k8s}
BIN=$HOME_DIR/bin
mkdir -p "$BIN"
if [ -x "$BIN/helm" ]; then
  echo "build-helm: helm present in $BIN ($("$BIN/helm" version --short 2>/dev/null || echo unknown))"
  exit 0
fi
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
echo "build-helm: building helm $HELM into $BIN"
start=$(date +%s)
# helm prints its version from these variables; without them `helm version` says v3.x-dev and
# charts' kubeVersion checks compare against a nonsense version.
LDF="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
if ! GOBIN="$BIN" go install -trimpath -ldflags "$LDF" "helm.sh/helm/v3/cmd/helm@$HELM"; then
  echo "build-helm: FAILED: go install helm.sh/helm/v3/cmd/helm@$HELM (retry: bash hack/build-helm.sh)" >&2
  exit 1
fi
echo "build-helm: done in $(( $(date +%s) - start ))s: $("$BIN/helm" version --short)"
