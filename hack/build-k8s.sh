#!/usr/bin/env bash
# Build the local control plane's binaries from Go modules and cache them outside the repo.
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes)
#   etcd (go.etcd.io/etcd/server/v3, the version kubernetes pins), kwok (sigs.k8s.io/kwok)
# Skips everything that is already built. Cache: $FLUXNETES_K8S_HOME (default ~/.cache/fluxnetes/k8s).
set -euo pipefail
K8S=${K8S_VERSION:-1.36.3}
KWOK=${KWOK_VERSION:-v0.8.0}
MINOR=$(echo "$K8S" | cut -d. -f2); PATCH=$(echo "$K8S" | cut -d. -f3)
STAGING=v0.$MINOR.$PATCH
HOME_DIR=${FLUXNETES_K8S_HOME:-$HOME/.cache/fluxnetes/k8s}
BIN=$HOME_DIR/bin; SRC=$HOME_DIR/src
mkdir -p "$BIN" "$SRC"
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local

need=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok; do
  [ -x "$BIN/$b" ] || need+=("$b")
done
# kwok v0.8 has no built-in stages: fluxnetes.devcluster reads them from $HOME_DIR/stages
[ -f "$HOME_DIR/stages/node/fast/node-initialize.yaml" ] || need+=("kwok-stages")
if [ ${#need[@]} -eq 0 ]; then
  echo "build-k8s: all binaries present in $BIN"; exit 0
fi

fail() { echo "build-k8s: FAILED: $*" >&2; echo "build-k8s: retry with: bash hack/build-k8s.sh (cache in $HOME_DIR; delete $SRC to start over)" >&2; exit 1; }
command -v go >/dev/null || fail "the Go toolchain (>= 1.26) is not on PATH"
echo "build-k8s: building ${need[*]} into $BIN (kubernetes v$K8S, kwok $KWOK; ~7 min and ~2 GB RAM on 2 cores when cold)"
start=$(date +%s)

cd "$SRC"
if [ ! -f go.mod ]; then go mod init local.test/fluxnetes-k8s-bins >/dev/null 2>&1 || fail "go mod init"; fi
if ! grep -q "k8s.io/kubernetes v$K8S" go.mod 2>/dev/null; then
  GOMOD=$(go mod download -json "k8s.io/kubernetes@v$K8S" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])') \
    || fail "downloading k8s.io/kubernetes@v$K8S from the Go module proxy"
  mods=$(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$GOMOD")
  [ -n "$mods" ] || fail "no staging modules found in $GOMOD"
  for m in $mods; do go mod edit -replace="$m=$m@$STAGING"; done
  go get "k8s.io/kubernetes@v$K8S" || fail "go get k8s.io/kubernetes@v$K8S"
fi
LDF="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=v$K8S \
 -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$MINOR"
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  [ -x "$BIN/$b" ] && continue
  echo "build-k8s: $b"
  go build -p 2 -trimpath -ldflags "$LDF" -o "$BIN/$b" "k8s.io/kubernetes/cmd/$b" || fail "go build $b"
done

if [ ! -x "$BIN/etcd" ]; then
  echo "build-k8s: etcd"
  mkdir -p "$SRC/etcd"; cd "$SRC/etcd"
  [ -f go.mod ] || go mod init local.test/fluxnetes-etcd >/dev/null 2>&1
  ETCDV=$(cd "$SRC" && go list -m -f '{{.Version}}' go.etcd.io/etcd/client/v3) || fail "reading the etcd version kubernetes pins"
  go get "go.etcd.io/etcd/server/v3@$ETCDV" || fail "go get etcd server $ETCDV"
  go build -trimpath -o "$BIN/etcd" go.etcd.io/etcd/server/v3 || fail "go build etcd"
  cd "$SRC"
fi

if [ ! -x "$BIN/kwok" ]; then
  echo "build-k8s: kwok $KWOK"
  GOBIN="$BIN" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK" || fail "go install kwok@$KWOK"
fi
# kwok v0.8 needs explicit stages: keep the module's stage files next to the binaries.
if [ ! -f "$HOME_DIR/stages/node/fast/node-initialize.yaml" ]; then
  KW=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK/kustomize/stage
  [ -d "$KW" ] || (cd "$SRC" && go mod download "sigs.k8s.io/kwok@$KWOK") || fail "go mod download sigs.k8s.io/kwok@$KWOK"
  mkdir -p "$HOME_DIR/stages"; cp -r "$KW"/. "$HOME_DIR/stages/"; chmod -R u+w "$HOME_DIR/stages"
fi
"$BIN/kube-apiserver" --version
# sed reads to the end; head would close the pipe early, and a SIGPIPE fails the step under pipefail
"$BIN/etcd" --version | sed -n 1p; { "$BIN/kwok" --version 2>/dev/null | sed -n 1p; } || true
echo "build-k8s: done in $(( $(date +%s) - start )) s"
