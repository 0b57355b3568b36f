#!/usr/bin/env bash
# PostgreSQL for the server tests: install from Debian's packages when missing, run a throw-away
# cluster as a non-root user on a loopback port, print its URL.
#   scripts/postgres.sh start [DIR]   -> prints postgresql+psycopg://ember@127.0.0.1:PORT/postgres
#   scripts/postgres.sh stop  [DIR]
# Fails loudly (exit 1) when PostgreSQL cannot be installed or started: never a silent skip.
set -euo pipefail
action="${1:-start}"
dir="${2:-${TMPDIR:-/tmp}/ember-postgres}"
port="${EMBER_PG_PORT:-55432}"

die() { echo "scripts/postgres.sh: ERROR: $*" >&2; exit 1; }

pg_bin() {
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    [ -n "$found" ] && [ -x "$found/initdb" ] && echo "$found"
}

as_user() {  # run a command as the cluster's owner (initdb and postgres refuse root)
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$action" in
start)
    bin=$(pg_bin || true)
    if [ -z "$bin" ]; then
        echo "scripts/postgres.sh: installing PostgreSQL from Debian's packages" >&2
        [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed and installing it needs root"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
            || die "apt-get install postgresql failed"
        bin=$(pg_bin || true)
        [ -n "$bin" ] || die "PostgreSQL installed but no initdb under /usr/lib/postgresql/*/bin"
    fi
    if [ "$(id -u)" = 0 ]; then id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres; fi
    if [ -f "$dir/data/postmaster.pid" ]; then as_user "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; fi
    rm -rf "$dir"
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    as_user "$bin/initdb" -D "$dir/data" -U ember --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 \
        || die "initdb failed: $(tail -5 "$dir/initdb.log")"
    as_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200 -c fsync=off" start >/dev/null \
        || die "PostgreSQL did not start: $(tail -5 "$dir/server.log")"
    echo "postgresql+psycopg://ember@127.0.0.1:$port/postgres"
    ;;
stop)
    bin=$(pg_bin || true)
    [ -n "$bin" ] && [ -f "$dir/data/postmaster.pid" ] && as_user "$bin/pg_ctl" -D "$dir/data" -m fast stop >/dev/null
    rm -rf "$dir"
    ;;
*)
    die "usage: scripts/postgres.sh start|stop [DIR]"
    ;;
esac
