#!/usr/bin/env bash
# Build the operator image from the repository's Dockerfile without a container engine or an
# image registry (docs/image.md):
#   (a) a Debian bookworm root filesystem made by debootstrap (minbase + python3), cached under
#       $FLUXNETES_IMAGE_CACHE (default ~/.cache/fluxnetes/image) by a hash of its recipe;
#   (b) that tree as the local base image localhost/fluxnetes-base:bookworm (buildah);
#   (c) `buildah bud` of ./Dockerfile with --build-arg BASE_IMAGE=localhost/fluxnetes-base:bookworm;
#   (d) the result as an OCI archive, out/image/fluxnetes-oci.tar (reference = the version).
# The archive is cached by a hash of every input (the base's recipe, Dockerfile, .dockerignore,
# pyproject.toml, README.md, src/): a re-run with unchanged inputs takes a second or two.
#
# Usage: bash hack/build-image.sh [--refresh]
#   --refresh   rebuild the base (picks up Debian's updates) and the image, ignoring the caches
# Needs root (debootstrap, chroot); installs debootstrap, buildah, umoci and skopeo with apt-get
# when they are missing. STORAGE_DRIVER (overlay or vfs; default: overlay when it mounts here)
# picks buildah's storage driver; FLUXNETES_BUILD_CA names a CA bundle to trust while pip
# downloads (default: $PIP_CERT or the `cert` of /etc/pip.conf, for TLS-intercepting proxies).
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bookworm
MIRROR=${FLUXNETES_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${FLUXNETES_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
# python3-venv: ensurepip, so that the Dockerfile's `python3 -m venv` works as on python:*-slim
BASE_PACKAGES=python3,python3-venv,ca-certificates
BASE_IMAGE=localhost/fluxnetes-base:$SUITE
CACHE=${FLUXNETES_IMAGE_CACHE:-$HOME/.cache/fluxnetes/image}
OUT=out/image
ARCHIVE=$OUT/fluxnetes-oci.tar
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
IMAGE=localhost/fluxnetes:$VERSION
BUILD_STAGE=localhost/fluxnetes-build:cache
REFRESH=0
case "${1:-}" in
  "") ;;
  --refresh) REFRESH=1 ;;
  *) echo "usage: bash hack/build-image.sh [--refresh]" >&2; exit 2 ;;
esac

START_NS=$(date +%s%N)
STEP="start"
LOG=""
WORK=""
elapsed() { local ms=$((($(date +%s%N) - START_NS) / 1000000)); printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100)); }
say() { echo "build-image.sh: $*" >&2; }
step() { STEP=$1; say "$STEP"; }
on_exit() {
  local rc=$?
  if [ -n "$WORK" ] && [ -d "$WORK" ]; then
    # a debootstrap that failed half-way may leave /proc or /sys mounted in its tree
    awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount -l || true
    rm -rf "$WORK" || true
  fi
  if [ "$rc" -ne 0 ]; then
    if [ -n "$LOG" ] && [ -s "$LOG" ]; then tail -n 25 "$LOG" | sed 's/^/  | /' >&2; fi
    echo "build-image.sh: error: step '$STEP' failed (exit $rc)${LOG:+; full log: $LOG}" >&2
  fi
}
trap on_exit EXIT
die() { STEP="$STEP: $1"; exit 1; }
# noisy commands write to the log; on failure its tail is shown above the one-line error
logged() { "$@" >>"$LOG" 2>&1; }

# -- tools ------------------------------------------------------------------------------------
STEP="check tools"
[ -n "$VERSION" ] || die "no version in pyproject.toml"
[ "$(id -u)" = 0 ] || die "needs root (debootstrap and chroot): run it as root"
missing=()
for tool in debootstrap buildah umoci skopeo unshare chroot sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  step "install debootstrap buildah umoci skopeo (missing: ${missing[*]})"
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install ${missing[*]} by hand"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
          --no-install-recommends debootstrap buildah umoci skopeo >/dev/null; }; then
    die "apt-get install debootstrap buildah umoci skopeo failed"
  fi
fi

mkdir -p "$CACHE" "$OUT"
LOG=$PWD/$OUT/build.log  # emptied when a build starts: a cached run keeps the last build's log
exec 9>"$CACHE/.lock"
if ! flock -n 9; then say "waiting for another build-image.sh to finish"; flock 9; fi
WORK=$(mktemp -d "$CACHE/work.XXXXXX")

# buildah's storage lives in the cache, one directory per driver (a store cannot change driver)
if [ -z "${STORAGE_DRIVER:-}" ]; then
  STORAGE_DRIVER=vfs
  mkdir -p "$WORK/ov/l" "$WORK/ov/u" "$WORK/ov/w" "$WORK/ov/m"
  # shellcheck disable=SC2016  # $1 expands in the inner shell
  if unshare --mount sh -c 'mount -t overlay overlay -o "lowerdir=$1/l,upperdir=$1/u,workdir=$1/w" "$1/m"' \
       sh "$WORK/ov" 2>/dev/null; then STORAGE_DRIVER=overlay; fi
fi
export BUILDAH_ISOLATION=chroot STORAGE_DRIVER
bah() {
  buildah --root "$CACHE/storage-$STORAGE_DRIVER" --runroot "$CACHE/run-$STORAGE_DRIVER" \
    --storage-driver "$STORAGE_DRIVER" "$@"
}

# -- (a) the base root filesystem ----------------------------------------------------------------
# build_base_rootfs DIR TAR: debootstrap into DIR/rootfs, slim it, write TAR. Its text is part
# of the cache key, so any change here rebuilds the base.
build_base_rootfs() {
  local root=$1/rootfs tar=$2
  debootstrap --variant=minbase --components=main --include="$BASE_PACKAGES" \
    "$SUITE" "$root" "$MIRROR"
  # like Debian's slim images: no documentation or translations, now or in later installs
  cat >"$root/etc/dpkg/dpkg.cfg.d/01-fluxnetes-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$root/etc/apt/apt.conf.d/01-fluxnetes-slim"
  cat >"$root/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF
  # the security and point-release updates debootstrap does not know about
  # shellcheck disable=SC2016  # $1 expands in the inner shell
  unshare --mount --fork sh -c 'mount -t proc proc "$1/proc" && exec chroot "$1" sh -c \
    "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -qq && apt-get clean"' \
    sh "$root"
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
    "$root"/usr/share/lintian "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* \
    "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old "$root"/etc/resolv.conf \
    "$root"/etc/hostname "$root"/debootstrap
  find "$root/var/log" -type f -delete
  : >"$root/etc/machine-id"
  # the container runtime provides /dev, /proc and /sys
  tar --numeric-owner -C "$root" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
    -cf "$tar.part" .
  mv "$tar.part" "$tar"
}

ARCH=$(dpkg --print-architecture)
BASE_HASH=$({ declare -f build_base_rootfs; echo "$SUITE $ARCH $MIRROR $SECURITY_MIRROR $BASE_PACKAGES"; } \
  | sha256sum | cut -c1-16)
CONTEXT_HASH=$({
  echo "base $BASE_HASH"
  { printf '%s\n' Dockerfile .dockerignore pyproject.toml README.md
    find src -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*'
  } | LC_ALL=C sort | xargs -d '\n' sha256sum
} | sha256sum | cut -c1-16)
CACHED=$CACHE/fluxnetes-$CONTEXT_HASH.oci.tar

publish() {  # the cached archive to out/image/fluxnetes-oci.tar, then the summary
  STEP="publish $ARCHIVE"
  if [ ! "$ARCHIVE" -ef "$CACHED" ]; then
    rm -f "$ARCHIVE.part"
    ln "$CACHED" "$ARCHIVE.part" 2>/dev/null || cp "$CACHED" "$ARCHIVE.part"
    mv -f "$ARCHIVE.part" "$ARCHIVE"
  fi
  say "$ARCHIVE: $IMAGE ($1), archive $(du -h "$ARCHIVE" | cut -f1)," \
    "unpacked $(cat "$CACHED.size" 2>/dev/null || echo '?'), inputs $CONTEXT_HASH, $(elapsed)"
}

if [ "$REFRESH" = 0 ] && [ -s "$CACHED" ]; then
  publish "cached: inputs unchanged"
  exit 0
fi

: >"$LOG"
BASE_TAR=$CACHE/base-$SUITE-$BASE_HASH.tar
if [ "$REFRESH" = 1 ] || [ ! -s "$BASE_TAR" ]; then
  step "(a) debootstrap $SUITE minbase + $BASE_PACKAGES"
  say "    a few minutes; log: $LOG"
  logged build_base_rootfs "$WORK" "$BASE_TAR"
  find "$CACHE" -maxdepth 1 -name "base-$SUITE-*.tar" ! -name "base-$SUITE-$BASE_HASH.tar" -delete
fi

# -- (b) the base image --------------------------------------------------------------------------
have=$(bah inspect --type image --format '{{index .OCIv1.Config.Labels "io.fluxnetes.base"}}' \
  "$BASE_IMAGE" 2>/dev/null || true)
if [ "$REFRESH" = 1 ] || [ "$have" != "$SUITE-$BASE_HASH" ]; then
  step "(b) base image $BASE_IMAGE (buildah, storage driver $STORAGE_DRIVER)"
  ctr=$(bah from scratch 2>>"$LOG")
  logged bah add "$ctr" "$BASE_TAR" /
  logged bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd '["python3"]' --label "io.fluxnetes.base=$SUITE-$BASE_HASH" "$ctr"
  logged bah commit --rm "$ctr" "$BASE_IMAGE"
fi

# -- (c) the Dockerfile ----------------------------------------------------------------------------
step "(c) buildah bud Dockerfile --build-arg BASE_IMAGE=$BASE_IMAGE"
say "    log: $LOG"
ca=${FLUXNETES_BUILD_CA:-${PIP_CERT:-}}
if [ -z "$ca" ] && [ -r /etc/pip.conf ]; then
  ca=$(sed -n 's/^[[:space:]]*cert[[:space:]]*=[[:space:]]*//p' /etc/pip.conf | sed -n 1p)
fi
ca_args=()
if [ -n "$ca" ]; then
  [ -r "$ca" ] || die "CA bundle $ca is not readable"
  # a directory over the image's empty /mnt: a file mount would leave an empty file behind
  mkdir -p "$WORK/ca" && cp "$ca" "$WORK/ca/ca.pem"
  ca_args=(--volume "$WORK/ca:/mnt:ro" --build-arg PIP_CERT=/mnt/ca.pem)
fi
no_cache=()
[ "$REFRESH" = 1 ] && no_cache=(--no-cache)
bud() {
  bah bud --isolation chroot --layers --pull=never "${no_cache[@]}" "${ca_args[@]}" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" -f Dockerfile "$@" .
}
# the build stage gets a name of its own, so that pruning below keeps its layers (the
# dependencies layer above all) as the cache of the next build
logged bud --target build -t "$BUILD_STAGE"
no_cache=()
logged bud -t "$IMAGE"

# -- (d) the OCI archive -------------------------------------------------------------------------
step "(d) OCI archive"
rm -f "$CACHED.part"
logged bah push "$IMAGE" "oci-archive:$CACHED.part:$VERSION"
bah images --format '{{.Size}}' "$IMAGE" 2>>"$LOG" | sed -n 1p >"$CACHED.size"
mv "$CACHED.part" "$CACHED"
# keep the two newest archives; images nothing refers to any more (earlier builds) leave the store
find "$CACHE" -maxdepth 1 -name 'fluxnetes-*.oci.tar' -printf '%T@ %p\n' | sort -rn | tail -n +3 \
  | while read -r _ old; do rm -f "$old" "$old.size"; done
logged bah rmi --prune || true
publish "built"
