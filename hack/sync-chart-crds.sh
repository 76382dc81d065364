#!/usr/bin/env bash
# Copy the CRDs (deploy/crds, the single source) into the chart's crds/ directory, which helm
# installs before the templates. tests/test_chart.py fails when the two differ.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p deploy/chart/crds
rm -f deploy/chart/crds/*.yaml
cp deploy/crds/*.yaml deploy/chart/crds/
echo "sync-chart-crds: $(ls deploy/crds/*.yaml | wc -l) CRD file(s) copied into deploy/chart/crds"
