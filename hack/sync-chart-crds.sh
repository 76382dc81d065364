#!/usr/bin/env bash
# The CRDs have one source: src/fluxnetes/k8s/crds/ (inside the Python package, so an installed
# wheel can install them: `fluxnetes run` does out of cluster). Copy them into deploy/crds (for
# `kubectl apply -f deploy/crds`) and the chart's crds/ directory (helm installs it before the
# templates). tests/test_chart.py fails when any copy differs.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=src/fluxnetes/k8s/crds
for dst in deploy/crds deploy/chart/crds; do
  mkdir -p "$dst"
  rm -f "$dst"/*.yaml
  cp "$SRC"/*.yaml "$dst"/
done
echo "sync-chart-crds: $(ls "$SRC"/*.yaml | wc -l) CRD file(s) copied from $SRC into deploy/crds and deploy/chart/crds"
