#!/usr/bin/env bash
# The README's main job: set up fluxnetes in .venv and replay the bundled real HPC trace
# (KTH-SP2, Parallel Workloads Archive) through the operator's engine (queue Scheduler + graph
# matcher, on a graph of the trace's 100 nodes; the reference simulator's numbers), comparing
# FCFS, EASY and conservative backfilling. No cluster needed. Extra arguments go to
# `fluxnetes simulate` (e.g. `bash hack/demo.sh --policy easy --plots out/`).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib.sh
. hack/lib.sh
ensure_venv
# The optional native build of the engine's hot path (mypyc; hack/build-native.sh, cached by
# source hash): `simulate` uses it when one was built from exactly these sources. The demo
# builds it only when asked (FLUXNETES_NATIVE=1): a cold build takes about two minutes, more
# than it saves on one run of the bundled trace (same numbers either way).
if [ "${FLUXNETES_NATIVE:-auto}" = "1" ]; then
  bash hack/build-native.sh
fi
if [ "$#" -eq 0 ]; then
  set -- --compare fcfs,easy,conservative --plots out/plots --csv out/jobs.csv
fi
exec .venv/bin/fluxnetes simulate "$@"
