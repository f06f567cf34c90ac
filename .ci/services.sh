#!/usr/bin/env bash
# Makes sure the services the tests use answer: Redis on 127.0.0.1:6379 and
# PostgreSQL on 127.0.0.1:5432 (user postgres, trust). If one is down it is
# started: first the machine's own instance, else a throwaway one from the local
# binaries. Tests never flush or stop these; tests that need to kill or flush a
# Redis start their own.
set -euo pipefail

REDIS_PORT=${IDEMGATE_TEST_REDIS_PORT:-6379}
PG_PORT=${IDEMGATE_TEST_PG_PORT:-5432}
RUN_DIR=${IDEMGATE_SERVICES_DIR:-/tmp/idemgate-services}

say() { echo "services: $*"; }
die() { echo "services: $*" >&2; exit 1; }

redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }
pg_up() { pg_isready -q -h 127.0.0.1 -p "$PG_PORT" 2>/dev/null; }

wait_for() { # name, check function
  for _ in $(seq 1 100); do "$2" && return 0; sleep 0.1; done
  return 1
}

command -v redis-server >/dev/null || die "redis-server not found: apt-get install -y redis-server"
command -v redis-cli >/dev/null || die "redis-cli not found: apt-get install -y redis-tools"
command -v pg_isready >/dev/null || die "pg_isready not found: apt-get install -y postgresql"

if ! redis_up; then
  if [ "$REDIS_PORT" = 6379 ] && [ -d /var/lib/redis ]; then
    say "starting the machine's Redis on :6379"
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  fi
  if ! wait_for redis redis_up; then
    say "starting a throwaway Redis on :$REDIS_PORT"
    mkdir -p "$RUN_DIR/redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
      --dir "$RUN_DIR/redis" --logfile "$RUN_DIR/redis/redis.log"
    wait_for redis redis_up || die "Redis did not come up on 127.0.0.1:$REDIS_PORT (see $RUN_DIR/redis/redis.log)"
  fi
fi
say "Redis answers on 127.0.0.1:$REDIS_PORT"

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ] && [ "$PG_PORT" = 5432 ]; then
    say "starting the machine's PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  fi
  if ! wait_for pg pg_up; then
    initdb_bin=$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -n1 || true)
    [ -n "$initdb_bin" ] || die "PostgreSQL is down and initdb is missing: apt-get install -y postgresql"
    bindir=$(dirname "$initdb_bin")
    data="$RUN_DIR/pg"
    say "starting a throwaway PostgreSQL on :$PG_PORT in $data"
    run_as=()
    if [ "$(id -u)" = 0 ]; then
      id postgres >/dev/null 2>&1 || die "PostgreSQL refuses to run as root and there is no postgres user"
      mkdir -p "$RUN_DIR"; chown postgres "$RUN_DIR" 2>/dev/null || true
      run_as=(runuser -u postgres --)
    fi
    if [ ! -f "$data/PG_VERSION" ]; then
      "${run_as[@]}" "$bindir/initdb" -D "$data" -U postgres --auth=trust >/dev/null
    fi
    "${run_as[@]}" "$bindir/pg_ctl" -D "$data" -l "$data/server.log" \
      -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=300" -w start >/dev/null
    wait_for pg pg_up || die "PostgreSQL did not come up on 127.0.0.1:$PG_PORT (see $data/server.log)"
  fi
fi
say "PostgreSQL answers on 127.0.0.1:$PG_PORT"
