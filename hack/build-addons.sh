#!/usr/bin/env bash
# Build the controllers of the multi-role workload kinds from Go modules, at pinned versions,
# and keep their CRDs, admission webhook manifests and (Trainer) a training runtime next to
# them (the module proxy serves these exact versions but does not list them, so they are
# named here, never resolved as "latest"):
#   jobset       sigs.k8s.io/jobset v0.10.1              (JobSet)
#   mpi-operator github.com/kubeflow/mpi-operator v0.6.0 (MPIJob v2beta1)
#   trainer      github.com/kubeflow/trainer/v2 v2.0.0   (TrainJob, training runtimes)
#   lws          sigs.k8s.io/lws v0.7.0                  (LeaderWorkerSet)
#   kueue        sigs.k8s.io/kueue v0.17.0               (Kueue: a peer, for bench/peers.py and
#                                                         --addons kueue; cold build 55 min on 2
#                                                         cores shared at load ~25, 2026-11-29)
#   coscheduling sigs.k8s.io/scheduler-plugins v0.34.7   (a peer: kube-scheduler with the
#                                                         out-of-tree plugins, bin/scheduler, and
#                                                         the PodGroup controller, bin/controller;
#                                                         --addons coscheduling. v0.35.0 is refused
#                                                         by the module proxy; the module's own
#                                                         go.mod pins its k8s.io/* at v0.34.7)
# Usage: bash hack/build-addons.sh [jobset mpi trainer lws kueue coscheduling]   (default: all six)
# Cache: $FLUXNETES_K8S_HOME/addons/<name>/{bin/manager,crds/,webhooks/,runtimes/,VERSION}
# (default ~/.cache/fluxnetes/k8s); whatever is already built is skipped (seconds). An addon of
# several binaries names each (`package=binary`); a CRD file the release does not name
# <group>_<plural>.yaml is installed under that name (`file=name`: devcluster/addons.py reads
# the CRD's name from it).
#
# Three releases are built from a patched copy of their module in a temporary directory (the
# module cache itself is untouched; each patch is one line renamed plus one added file, and the
# build fails if the line is not found) so that several dev clusters can run on one machine,
# each as plain processes:
#   mpi:     the health server's address, hard-coded to :8080, comes from
#            $MPI_OPERATOR_HEALTH_ADDR when set (default unchanged).
#   trainer: FLUXNETES_EXTERNAL_CERTS=1 skips its built-in certificate rotator (which wants a
#            Secret in kubeflow-system and a Service DNS name); the dev cluster then provides
#            the serving certificate itself, as for the other three (default unchanged).
#   kueue:   with its internal certificates off, the metrics server's certificate is read from
#            the hard-coded /etc/kueue/metrics/certs; $KUEUE_METRICS_CERT_DIR overrides it, so
#            that each dev cluster gives its own (default unchanged).
# and one is built with one dependency moved, because the module proxy refuses the release's:
#   coscheduling: go.mod replaces k8s.io/csi-translation-lib with v0.34.7, which the proxy
#            refuses (403 "This module version is not available", 2026-11-29); v0.34.1 (same
#            minor release, served) instead, with its go.sum lines. The scheduler uses it in
#            the in-tree volume plugins (volume limits, volume binding: CSI migration of in-tree
#            volumes), which kwok pods without volumes never reach.
set -euo pipefail
HOME_DIR=${FLUXNETES_K8S_HOME:-$HOME/.cache/fluxnetes/k8s}
export GOFLAGS=-mod=readonly CGO_ENABLED=0 GOTOOLCHAIN=local

# name | module@version | main package(s) | CRD files | webhook manifests | patch tag | runtimes
ADDONS=(
  "jobset|sigs.k8s.io/jobset@v0.10.1|.|config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml|config/components/webhook/manifests.yaml||"
  "mpi|github.com/kubeflow/mpi-operator@v0.6.0|./cmd/mpi-operator|manifests/base/kubeflow.org_mpijobs.yaml||health-addr-1|"
  "trainer|github.com/kubeflow/trainer/v2@v2.0.0|./cmd/trainer-controller-manager|manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml|manifests/base/webhook/manifests.yaml|external-certs-1|manifests/base/runtimes/torch_distributed.yaml"
  "lws|sigs.k8s.io/lws@v0.7.0|./cmd|config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml|config/webhook/manifests.yaml||"
  "kueue|sigs.k8s.io/kueue@v0.17.0|./cmd/kueue|config/components/crd/bases/kueue.x-k8s.io_admissionchecks.yaml config/components/crd/bases/kueue.x-k8s.io_clusterqueues.yaml config/components/crd/bases/kueue.x-k8s.io_cohorts.yaml config/components/crd/bases/kueue.x-k8s.io_localqueues.yaml config/components/crd/bases/kueue.x-k8s.io_resourceflavors.yaml config/components/crd/bases/kueue.x-k8s.io_topologies.yaml config/components/crd/bases/kueue.x-k8s.io_workloadpriorityclasses.yaml config/components/crd/bases/kueue.x-k8s.io_workloads.yaml|config/components/webhook/manifests.yaml|metrics-certs-1|"
  "coscheduling|sigs.k8s.io/scheduler-plugins@v0.34.7|./cmd/scheduler=scheduler ./cmd/controller=controller|manifests/coscheduling/crd.yaml=scheduling.x-k8s.io_podgroups.yaml manifests/capacityscheduling/crd.yaml=scheduling.x-k8s.io_elasticquotas.yaml||csi-translation-lib-v0.34.1|"
)

fail() { echo "build-addons: FAILED: $*" >&2; echo "build-addons: retry with: bash hack/build-addons.sh (cache in $HOME_DIR/addons)" >&2; exit 1; }

# patch_copy <name> <module copy>: applies fluxnetes' patch to a writable copy of the module
patch_copy() {
  local name=$1 dir=$2
  python3 - "$name" "$dir" <<'EOF'
import pathlib, sys
name, mod = sys.argv[1], pathlib.Path(sys.argv[2])
def patched(rel, old, new):
    text = (mod / rel).read_text()
    if text.count(old) != 1:
        sys.exit(f"build-addons: {rel} does not contain exactly one {old!r}: the patch is out of date")
    (mod / rel).write_text(text.replace(old, new))
def added(rel, text):
    (mod / rel).write_text(text)
def appended(rel, text):
    (mod / rel).write_text((mod / rel).read_text() + text)
if name == "mpi":
    patched("cmd/mpi-operator/app/server.go", 'Addr:    fmt.Sprintf(":%d", healthCheckPort),', "Addr:    healthAddr(),")
    added("cmd/mpi-operator/app/zz_fluxnetes_health.go", '''package app

import (
	"fmt"
	"os"
)

// healthAddr: $MPI_OPERATOR_HEALTH_ADDR, else the release's :8080 (added by fluxnetes'
// hack/build-addons.sh so that several local clusters can run on one machine).
func healthAddr() string {
	if addr := os.Getenv("MPI_OPERATOR_HEALTH_ADDR"); addr != "" {
		return addr
	}
	return fmt.Sprintf(":%d", healthCheckPort)
}
''')
elif name == "trainer":
    patched("pkg/util/cert/cert.go", "func ManageCerts(", "func manageCertsRotator(")
    added("pkg/util/cert/zz_fluxnetes_certs.go", '''package cert

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
)

// ManageCerts: with FLUXNETES_EXTERNAL_CERTS=1 the serving certificate is provided by whoever
// runs the manager (in the webhook server's CertDir) and the webhook configuration's caBundle
// is theirs too; otherwise the release's rotator (added by fluxnetes' hack/build-addons.sh).
func ManageCerts(mgr ctrl.Manager, cfg Config, setupFinished chan struct{}) error {
	if os.Getenv("FLUXNETES_EXTERNAL_CERTS") == "1" {
		close(setupFinished)
		return nil
	}
	return manageCertsRotator(mgr, cfg, setupFinished)
}
''')
elif name == "kueue":
    patched("cmd/kueue/main.go", 'metricsCertPath := "/etc/kueue/metrics/certs"', "metricsCertPath := metricsCertDir()")
    added("cmd/kueue/zz_fluxnetes_metrics.go", '''package main

import "os"

// metricsCertDir: $KUEUE_METRICS_CERT_DIR, else the release's /etc/kueue/metrics/certs (added
// by fluxnetes' hack/build-addons.sh so that several local clusters can run on one machine).
func metricsCertDir() string {
	if dir := os.Getenv("KUEUE_METRICS_CERT_DIR"); dir != "" {
		return dir
	}
	return "/etc/kueue/metrics/certs"
}
''')
elif name == "coscheduling":
    patched("go.mod", "k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.34.7",
            "k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.34.1")
    # (the sums the checksum database gives for v0.34.1)
    appended("go.sum", "k8s.io/csi-translation-lib v0.34.1 h1:8+QMIWBwPGFsqWw9eAvimA2GaHXGgLLYT61I1NzDnXw=\n"
                       "k8s.io/csi-translation-lib v0.34.1/go.mod h1:QXytPJ1KzYQaiMgVm82ANG+RGAUf276m8l9gFT+R6Xg=\n")
else:
    sys.exit(f"build-addons: no patch for {name}")
EOF
}

# `package[=binary]` -> the binary's name (manager when not named)
bin_name() { case $1 in *=*) echo "${1#*=}" ;; *) echo manager ;; esac; }
# `file[=name]` -> the name the CRD file is installed under (its own when not named)
crd_dest() { case $1 in *=*) echo "${1#*=}" ;; *) basename "$1" ;; esac; }

command -v go >/dev/null || fail "the Go toolchain (>= 1.26) is not on PATH"

want=("$@"); [ ${#want[@]} -gt 0 ] || want=(jobset mpi trainer lws kueue coscheduling)
start=$(date +%s)
for entry in "${ADDONS[@]}"; do
  IFS='|' read -r name modver pkg crds webhooks patch runtimes <<<"$entry"
  case " ${want[*]} " in *" $name "*) ;; *) continue ;; esac
  out=$HOME_DIR/addons/$name
  version=$modver${patch:++$patch}
  files_ok=1
  for f in $crds; do [ -f "$out/crds/$(crd_dest "$f")" ] || files_ok=0; done
  [ -z "$webhooks" ] || [ -f "$out/webhooks/manifests.yaml" ] || files_ok=0
  [ -z "$runtimes" ] || [ -f "$out/runtimes/$(basename "$runtimes")" ] || files_ok=0
  built=0
  bins_ok=1
  for p in $pkg; do [ -x "$out/bin/$(bin_name "$p")" ] || bins_ok=0; done
  if [ "$bins_ok" = 1 ] && [ -f "$out/VERSION" ] && [ "$(cat "$out/VERSION")" = "$version" ]; then
    built=1
    if [ "$files_ok" = 1 ]; then echo "build-addons: $name ($version) present"; continue; fi
  fi
  echo "build-addons: $name ($version)"
  t0=$(date +%s)
  dir=$(go mod download -json "$modver" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])') \
    || fail "downloading $modver from the Go module proxy"
  mkdir -p "$out/bin" "$out/crds"
  if [ "$built" = 0 ]; then
    src=$dir
    if [ -n "$patch" ]; then
      tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
      cp -r "$dir" "$tmp/src" && chmod -R u+w "$tmp/src" && src=$tmp/src
      patch_copy "$name" "$src" || fail "patching a copy of $modver"
    fi
    # Built inside the module directory (or its patched copy) with its own go.mod and go.sum,
    # exactly as released; only the build cache is written.
    for p in $pkg; do
      bin=$(bin_name "$p")
      (cd "$src" && go build -p 2 -trimpath -ldflags "-s -w" -o "$out/bin/$bin.new" "${p%%=*}") \
        || fail "go build $modver ${p%%=*}"
    done
    if [ -n "$patch" ]; then rm -rf "$tmp"; trap - EXIT; fi
    for p in $pkg; do bin=$(bin_name "$p"); mv -f "$out/bin/$bin.new" "$out/bin/$bin"; done
  fi
  for crd in $crds; do
    [ -f "$dir/${crd%%=*}" ] || fail "$modver has no ${crd%%=*}"
    install -m 0644 "$dir/${crd%%=*}" "$out/crds/$(crd_dest "$crd")"
  done
  if [ -n "$webhooks" ]; then
    [ -f "$dir/$webhooks" ] || fail "$modver has no $webhooks"
    mkdir -p "$out/webhooks" && install -m 0644 "$dir/$webhooks" "$out/webhooks/manifests.yaml"
  fi
  for rt in $runtimes; do
    [ -f "$dir/$rt" ] || fail "$modver has no $rt"
    mkdir -p "$out/runtimes" && install -m 0644 "$dir/$rt" "$out/runtimes/"
  done
  echo "$version" >"$out/VERSION"
  echo "build-addons: $name built in $(( $(date +%s) - t0 )) s"
done
echo "build-addons: done in $(( $(date +%s) - start )) s"
