#!/usr/bin/env bash
# The optional native build of the simulator's hot path: the queue engine's modules
# (fluxnetes.native.NATIVE_MODULES) compiled with mypyc (ships with mypy) into
# $FLUXNETES_NATIVE_CACHE (default ~/.cache/fluxnetes/native)/<hash of the sources>/.
# Cached: seconds when a build for these exact sources is there; a cold build takes about
# two minutes of one core (gcc). `fluxnetes simulate` loads it only when the hash matches
# the sources it imports, else runs pure Python and says why (FLUXNETES_NATIVE=0: never).
# Exit 3 (with the reason) when there is no C compiler or no Python headers.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib.sh
. hack/lib.sh
ensure_venv
if ! why=$(native_toolchain_missing); then
  echo "build-native.sh: cannot build the native modules: $why" >&2
  exit 3
fi
# this checkout's sources, whatever the venv's editable install points at
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python -m fluxnetes.native build
