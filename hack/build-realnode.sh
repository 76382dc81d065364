#!/usr/bin/env bash
# Build and cache what the dev cluster's real (kubelet) nodes run (docs/real-nodes.md):
#   kubelet, kube-proxy        k8s.io/kubernetes (the module hack/build-k8s.sh pins: the same version
#                              as the control plane), into $FLUXNETES_K8S_HOME/bin; kube-proxy runs
#                              the Services (devcluster/services.py)
#   containerd, ctr,           github.com/containerd/containerd/v2 v2.4.2 (pinned: kubelet 1.36 warns
#   containerd-shim-runc-v2    that containerd 1.x, Debian bookworm's, loses support in 1.37), CGO off
#   runc, CNI plugins,         Debian packages runc, containernetworking-plugins, busybox-static
#   busybox (test image)       (installed with apt-get when missing)
#   images (OCI archives)      localhost/fluxnetes-pause:1 (hack/pause, our own few lines of Go) and
#                              localhost/fluxnetes-busybox:1 (Debian's static busybox) into
#                              $FLUXNETES_K8S_HOME/realnode/images
#   coredns (cluster DNS)      hack/build-coredns.sh (github.com/coredns/coredns, pinned)
#   MPI image                  hack/build-mpi-image.sh (Debian's Open MPI, mpi4py, OpenSSH)
# Needs hack/build-k8s.sh first (it holds the Kubernetes module). Skips whatever is built (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
CONTAINERD=${CONTAINERD_VERSION:-v2.4.2}
HOME_DIR=${FLUXNETES_K8S_HOME:-$HOME/.cache/fluxnetes/k8s}
BIN=$HOME_DIR/bin; SRC=$HOME_DIR/src; IMAGES=$HOME_DIR/realnode/images
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
fail() { echo "build-realnode: FAILED: $*" >&2; echo "build-realnode: retry with: bash hack/build-realnode.sh (cache in $HOME_DIR)" >&2; exit 1; }
start=$(date +%s)
mkdir -p "$BIN" "$IMAGES"

# -- Debian packages ------------------------------------------------------------------------------
pkgs=()
command -v runc >/dev/null || pkgs+=(runc)
[ -x /usr/lib/cni/bridge ] || pkgs+=(containernetworking-plugins)
[ -x /bin/busybox ] || pkgs+=(busybox-static)
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "build-realnode: apt-get install ${pkgs[*]}"
  [ "$(id -u)" = 0 ] || fail "installing ${pkgs[*]} needs root (apt-get install ${pkgs[*]})"
  # hack/test.sh runs this beside hack/build-image.sh, which may hold apt's locks: wait, retry
  ok=0
  for _ in 1 2 3 4 5; do
    if apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null && \
       DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
         --no-install-recommends "${pkgs[@]}" >/dev/null; then ok=1; break; fi
    sleep 15
  done
  [ "$ok" = 1 ] || fail "apt-get install ${pkgs[*]}"
fi

# -- kubelet, kube-proxy: from the control plane's own module -------------------------------------
for CMD in kubelet kube-proxy; do
if [ ! -x "$BIN/$CMD" ]; then
  [ -f "$SRC/go.mod" ] || fail "$SRC/go.mod is missing: run hack/build-k8s.sh first"
  K8S=$(cd "$SRC" && go list -m -f '{{.Version}}' k8s.io/kubernetes) || fail "reading the kubernetes version of $SRC"
  MINOR=$(echo "${K8S#v}" | cut -d. -f2)
  echo "build-realnode: $CMD $K8S"
  LDF="-s -w -X k8s.io/component-base/version.gitVersion=$K8S \
   -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR \
   -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$SRC" && go build -p 2 -trimpath -ldflags "$LDF" -o "$BIN/$CMD" "k8s.io/kubernetes/cmd/$CMD") || fail "go build $CMD"
fi
done

# -- containerd -----------------------------------------------------------------------------------
if [ ! -x "$BIN/containerd" ] || [ ! -x "$BIN/ctr" ] || [ ! -x "$BIN/containerd-shim-runc-v2" ] \
   || [ "$(cat "$HOME_DIR/realnode/CONTAINERD_VERSION" 2>/dev/null)" != "$CONTAINERD" ]; then
  echo "build-realnode: containerd $CONTAINERD"
  M=github.com/containerd/containerd/v2
  GOBIN="$BIN" GOFLAGS= go install -trimpath -tags "no_btrfs no_devmapper no_zfs no_aufs" \
    -ldflags "-s -w -X $M/version.Version=$CONTAINERD" \
    "$M/cmd/containerd@$CONTAINERD" "$M/cmd/ctr@$CONTAINERD" "$M/cmd/containerd-shim-runc-v2@$CONTAINERD" \
    || fail "go install containerd $CONTAINERD"
  echo "$CONTAINERD" > "$HOME_DIR/realnode/CONTAINERD_VERSION"
fi

# -- images ---------------------------------------------------------------------------------------
if [ ! -x "$BIN/fluxnetes-pause" ] || [ "$REPO/hack/pause/main.go" -nt "$BIN/fluxnetes-pause" ]; then
  echo "build-realnode: pause"
  go build -C "$REPO/hack/pause" -trimpath -ldflags "-s -w" -o "$BIN/fluxnetes-pause" . || fail "go build hack/pause"
fi
OCI="python3 $REPO/src/fluxnetes/devcluster/ociimage.py"
if [ ! -f "$IMAGES/pause.tar" ] || [ "$BIN/fluxnetes-pause" -nt "$IMAGES/pause.tar" ]; then
  $OCI "$IMAGES/pause.tar" localhost/fluxnetes-pause:1 --file "/pause=$BIN/fluxnetes-pause" \
    --entrypoint /pause >/dev/null || fail "writing the pause image"
fi
if [ ! -f "$IMAGES/busybox.tar" ]; then
  links=()
  for a in sh ash echo sleep cat ls hostname env true false date ps id nc wget grep head tail \
           mkdir rm cp mv touch kill seq wc uname; do
    links+=(--symlink "/bin/$a=busybox")
  done
  $OCI "$IMAGES/busybox.tar" localhost/fluxnetes-busybox:1 --file /bin/busybox=/bin/busybox \
    "${links[@]}" --dir /tmp --dir /etc --cmd /bin/sh >/dev/null || fail "writing the busybox image"
fi
# -- the cluster's DNS (CoreDNS) and the MPI image: their own scripts ---------------------------
bash "$REPO/hack/build-coredns.sh" || fail "hack/build-coredns.sh"
bash "$REPO/hack/build-mpi-image.sh" || fail "hack/build-mpi-image.sh"
"$BIN/kubelet" --version; "$BIN/kube-proxy" --version; "$BIN/containerd" --version; runc --version | sed -n 1p
echo "build-realnode: done in $(( $(date +%s) - start )) s"
