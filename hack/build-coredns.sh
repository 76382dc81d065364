#!/usr/bin/env bash
# Build and cache the dev cluster's DNS server (docs/real-nodes.md, devcluster/dns.py): CoreDNS
# from its Go module github.com/coredns/coredns at one pinned version (the module proxy serves
# it; the version is named here, never resolved), with hack/coredns/main.go as its main
# package: only the plugins bind, errors, log and kubernetes.
# Cache: $FLUXNETES_K8S_HOME/bin/coredns, its version in $FLUXNETES_K8S_HOME/realnode/COREDNS_VERSION
# (default ~/.cache/fluxnetes/k8s); skipped when built at this version and main.go is older.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
COREDNS=${COREDNS_VERSION:-v1.15.0}
HOME_DIR=${FLUXNETES_K8S_HOME:-$HOME/.cache/fluxnetes/k8s}
BIN=$HOME_DIR/bin; SRC=$HOME_DIR/src/coredns-$COREDNS
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
fail() { echo "build-coredns: FAILED: $*" >&2; echo "build-coredns: retry with: bash hack/build-coredns.sh (cache in $HOME_DIR)" >&2; exit 1; }
mkdir -p "$BIN" "$HOME_DIR/realnode"
exec 9>"$HOME_DIR/realnode/.coredns.lock"  # one build at a time (several worktrees, one cache)
flock 9
if [ -x "$BIN/coredns" ] && [ "$(cat "$HOME_DIR/realnode/COREDNS_VERSION" 2>/dev/null)" = "$COREDNS" ] \
   && [ ! "$REPO/hack/coredns/main.go" -nt "$BIN/coredns" ]; then
  exit 0
fi
command -v go >/dev/null || fail "the Go toolchain (>= 1.26) is not on PATH"
start=$(date +%s)
echo "build-coredns: coredns $COREDNS"
mkdir -p "$SRC"
cp "$REPO/hack/coredns/main.go" "$SRC/main.go"
cd "$SRC"
[ -f go.mod ] || go mod init local.test/fluxnetes-coredns >/dev/null 2>&1 || fail "go mod init"
# a requirement, not `go get`: that would fetch what every plugin of the release imports
go mod edit -require="github.com/coredns/coredns@$COREDNS" || fail "go mod edit"
go build -p 2 -trimpath -ldflags "-s -w" -o "$BIN/coredns" . || fail "go build coredns"
echo "$COREDNS" > "$HOME_DIR/realnode/COREDNS_VERSION"
"$BIN/coredns" -version | sed -n 1,2p
echo "build-coredns: done in $(( $(date +%s) - start )) s"
