#!/usr/bin/env bash
# Build and cache the MPI image of the real-node dev cluster (docs/real-nodes.md):
# localhost/fluxnetes-mpi:1, a Debian bookworm root file system (debootstrap minbase) with
# Debian's Open MPI (openmpi-bin), mpi4py (python3-mpi4py) and OpenSSH, laid out as the MPI
# Operator's v2beta1 images expect: user mpiuser (uid 1000, /home/mpiuser), workers run
# `/usr/sbin/sshd -De -f /home/mpiuser/.sshd_config` on port 2222 with the job's key mounted at
# sshAuthMountPath /home/mpiuser/.ssh. Our files (hack/mpi-image/): the allreduce program
# /usr/local/bin/allreduce.py, /usr/local/bin/wait-hosts (the launcher waits until the
# workers' names resolve), ssh and sshd configuration, Open MPI's MCA defaults.
# Output: $FLUXNETES_K8S_HOME/realnode/images/mpi.tar (an OCI archive, `ctr images import`),
# keyed by a hash of this script and hack/mpi-image/ (mpi.key): skipped when unchanged.
# Needs root (debootstrap, chroot); installs debootstrap with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
HOME_DIR=${FLUXNETES_K8S_HOME:-$HOME/.cache/fluxnetes/k8s}
IMAGES=$HOME_DIR/realnode/images
SUITE=bookworm
MIRROR=${FLUXNETES_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=openmpi-bin,python3-mpi4py,openssh-server,openssh-client
IMAGE=localhost/fluxnetes-mpi:1
fail() { echo "build-mpi-image: FAILED: $*" >&2; echo "build-mpi-image: retry with: bash hack/build-mpi-image.sh" >&2; exit 1; }
KEY=$(cat "$0" hack/mpi-image/* | sha256sum | cut -c1-16)
mkdir -p "$IMAGES"
# hack/test.sh starts this early in the background and hack/build-realnode.sh runs it too: the
# second waits for the first, then finds the image built
exec 9>"$IMAGES/.mpi.lock"
flock 9
if [ -f "$IMAGES/mpi.tar" ] && [ "$(cat "$IMAGES/mpi.key" 2>/dev/null)" = "$KEY" ]; then exit 0; fi
[ "$(id -u)" = 0 ] || fail "needs root (debootstrap, chroot)"
if ! command -v debootstrap >/dev/null; then
  # other builds (hack/build-image.sh) may hold apt's locks: wait, retry
  ok=0
  for _ in 1 2 3 4 5; do
    if apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
       apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends debootstrap >/dev/null; then
      ok=1; break
    fi
    sleep 15
  done
  [ "$ok" = 1 ] || fail "apt-get install debootstrap"
fi
start=$(date +%s)
WORK=$(mktemp -d "$HOME_DIR/realnode/mpi-image.XXXXXX")
ROOT=$WORK/rootfs
cleanup() {
  # debootstrap's second stage mounts /proc and /sys in the tree; a failure may leave them
  awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount -l || true
  rm -rf "$WORK"
}
trap cleanup EXIT
echo "build-mpi-image: debootstrap $SUITE + $PACKAGES"
# two stages with a policy-rc.d between them: installing openssh-server in a chroot would
# otherwise start its sshd on this machine
debootstrap --foreign --variant=minbase --components=main --include="$PACKAGES" \
  "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log"; fail "debootstrap (first stage)"; }
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"; chmod 755 "$ROOT/usr/sbin/policy-rc.d"
chroot "$ROOT" /debootstrap/debootstrap --second-stage >>"$WORK/debootstrap.log" 2>&1 \
  || { tail -20 "$WORK/debootstrap.log"; fail "debootstrap (second stage)"; }
awk -v w="$ROOT/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount -l || true
chroot "$ROOT" useradd --create-home --uid 1000 --user-group --shell /bin/bash mpiuser || fail "useradd mpiuser"
M=$REPO/hack/mpi-image
install -m 644 -o 1000 -g 1000 "$M/sshd_config" "$ROOT/home/mpiuser/.sshd_config"
install -m 644 "$M/ssh_config" "$ROOT/etc/ssh/ssh_config.d/fluxnetes-mpi.conf"
cat "$M/openmpi-mca-params.conf" >>"$ROOT/etc/openmpi/openmpi-mca-params.conf"
install -m 755 "$M/wait-hosts" "$ROOT/usr/local/bin/wait-hosts"
install -m 644 "$M/allreduce.py" "$ROOT/usr/local/bin/allreduce.py"
mkdir -p -m 755 "$ROOT/run/sshd"
# slim: no host keys (each job brings its own), package caches, documentation or locales
rm -f "$ROOT/usr/sbin/policy-rc.d" "$ROOT"/etc/ssh/ssh_host_*
rm -rf "$ROOT"/var/cache/apt/* "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* \
       "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* "$ROOT"/usr/share/locale/* "$ROOT"/var/log/* \
       "$ROOT"/debootstrap
chroot "$ROOT" python3 -c 'import mpi4py; print("mpi4py", mpi4py.__version__)'
chroot "$ROOT" mpirun --version | sed -n 1p
# a container's /dev, /proc and /sys are its runtime's: their contents stay out of the layer
tar --numeric-owner --sort=name --mtime=@0 --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
  -C "$ROOT" -cf "$WORK/layer.tar" . || fail "packing the root file system"
python3 "$REPO/src/fluxnetes/devcluster/ociimage.py" "$IMAGES/mpi.tar" "$IMAGE" \
  --layer-tar "$WORK/layer.tar" --cmd /bin/bash >/dev/null || fail "writing the OCI archive"
echo "$KEY" >"$IMAGES/mpi.key"
echo "build-mpi-image: $IMAGE ($(du -m "$IMAGES/mpi.tar" | cut -f1) MB) in $(( $(date +%s) - start )) s"
