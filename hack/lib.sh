# Shared helpers for hack/*.sh (sourced, not run).

ensure_venv() {
  if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import fluxnetes, pytest, hypothesis' 2>/dev/null; then
    python3 -m venv .venv
    .venv/bin/pip install -q -U pip
    .venv/bin/pip install -q -e '.[dev]'
  fi
}

pg_bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && { echo "$d"; return 0; }; done
  return 1
}

ensure_postgres_installed() {
  if ! pg_bindir >/dev/null; then
    echo "lib.sh: installing PostgreSQL from Debian packages" >&2
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
      sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
  fi
}

# pg_start: initdb + pg_ctl start in a temporary directory on a free 127.0.0.1 port;
# exports FLUXNETES_TEST_PG_URL. PostgreSQL refuses to run as root, so as root the server runs
# as the `postgres` user that the Debian package creates.
pg_start() {
  local bin port
  bin=$(pg_bindir) || { echo "lib.sh: PostgreSQL is not installed" >&2; return 1; }
  PG_TMP=$(mktemp -d /tmp/fluxnetes-pg.XXXXXX)
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  PG_RUN=()
  if [ "$(id -u)" = 0 ]; then chown postgres "$PG_TMP"; PG_RUN=(runuser -u postgres --); fi
  "${PG_RUN[@]}" "$bin/initdb" -D "$PG_TMP/data" -U fluxnetes --auth=trust -E UTF8 >/dev/null
  "${PG_RUN[@]}" "$bin/pg_ctl" -D "$PG_TMP/data" -l "$PG_TMP/log" -w -o "-h 127.0.0.1 -p $port -k $PG_TMP -c fsync=off -c max_connections=200" start >/dev/null
  "${PG_RUN[@]}" "$bin/createdb" -h 127.0.0.1 -p "$port" -U fluxnetes fluxnetes_test
  export FLUXNETES_TEST_PG_URL="postgresql+psycopg://fluxnetes@127.0.0.1:$port/fluxnetes_test"
  PG_BIN=$bin
  echo "lib.sh: PostgreSQL on 127.0.0.1:$port ($PG_TMP)" >&2
}

pg_stop() {
  if [ -n "${PG_TMP:-}" ] && [ -d "$PG_TMP/data" ]; then
    "${PG_RUN[@]}" "$PG_BIN/pg_ctl" -D "$PG_TMP/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$PG_TMP"
  fi
}

# native_toolchain_missing: prints what the mypyc build (hack/build-native.sh) lacks and
# fails, or prints nothing and succeeds: the C compiler Python builds extensions with, and
# Python.h of the venv's Python.
native_toolchain_missing() {
  local cc inc
  cc=$(.venv/bin/python -c 'import sysconfig; print((sysconfig.get_config_var("CC") or "cc").split()[0])')
  inc=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  if ! command -v "$cc" >/dev/null 2>&1; then echo "no C compiler ($cc)"; return 1; fi
  if [ ! -f "$inc/Python.h" ]; then echo "no Python headers ($inc/Python.h)"; return 1; fi
  return 0
}
