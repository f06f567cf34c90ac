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

# A fresh machine: install what is missing (as .ci/run does) when we can, i.e. as
# root on Debian/Ubuntu; otherwise stop with the packages to install by hand.
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v psql >/dev/null || missing+=(postgresql-client)
# A PostgreSQL server: the machine's (Debian's pg_ctlcluster) or initdb for a
# throwaway one; an instance already answering on the port also does.
if ! command -v pg_isready >/dev/null || { ! command -v initdb >/dev/null \
     && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! pg_up; }; then
  missing+=(postgresql)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ -f /etc/debian_version ]; then
    say "installing ${missing[*]} (apt-get)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
      die "apt-get install ${missing[*]} failed"
  else
    die "missing ${missing[*]}: install these packages (Debian/Ubuntu: sudo apt-get install -y ${missing[*]}; others: Redis >= 7 and PostgreSQL >= 15 with its client tools), or run as root on Debian, where \`make test\` installs them"
  fi
fi

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

# pg_isready answering proves nothing about authentication: Debian's fresh
# cluster asks host connections for a password (scram) and allows 100
# connections. The tests log in as postgres over TCP with no password, so
# that login is what is checked.
pg_trusts() { psql -w -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c 'select 1' >/dev/null 2>&1; }
pg_max_conn() { psql -w -X -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c 'show max_connections' 2>/dev/null || echo 0; }

# machine_cluster prints "version name" of the machine's Debian cluster, if any.
machine_cluster() {
  command -v pg_lsclusters >/dev/null || return 1
  pg_lsclusters -h 2>/dev/null | awk -v port="$PG_PORT" '$3 == port {print $1, $2; exit}'
}

# trust_machine_cluster rewrites the machine's cluster for the tests: trust on
# loopback for host connections, 300 connections. It is a test machine's
# cluster; the edit is marked so a later run does not repeat it.
trust_machine_cluster() { # version name
  local conf="/etc/postgresql/$1/$2"
  [ -f "$conf/pg_hba.conf" ] || return 1
  if ! grep -q 'idemgate-tests' "$conf/pg_hba.conf"; then
    say "configuring the machine's PostgreSQL $1/$2: trust on loopback, max_connections=300"
    { echo "# idemgate-tests: loopback trusted for the test suite"
      echo "host all all 127.0.0.1/32 trust"
      echo "host all all ::1/128 trust"
      grep -v '^[[:space:]]*host' "$conf/pg_hba.conf"; } > "$conf/pg_hba.conf.new"
    mv "$conf/pg_hba.conf.new" "$conf/pg_hba.conf"
    chown postgres:postgres "$conf/pg_hba.conf" 2>/dev/null || true
  fi
  mkdir -p "$conf/conf.d"
  printf "listen_addresses = '127.0.0.1,::1'\nmax_connections = 300\n" > "$conf/conf.d/idemgate-tests.conf"
  pg_ctlcluster --skip-systemctl-redirect "$1" "$2" restart >/dev/null 2>&1 ||
    pg_ctlcluster --skip-systemctl-redirect "$1" "$2" start
}

start_throwaway_pg() {
  initdb_bin=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -n1 || true)
  [ -n "$initdb_bin" ] || initdb_bin=$(command -v initdb || true)
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
}

cluster=$(machine_cluster || true)
if ! pg_up && [ -n "$cluster" ]; then
  say "starting the machine's PostgreSQL $cluster"
  pg_ctlcluster --skip-systemctl-redirect $cluster start || true
  wait_for pg pg_up || true
fi
if pg_up && { ! pg_trusts || [ "$(pg_max_conn)" -lt 300 ]; }; then
  [ -n "$cluster" ] || die "PostgreSQL on 127.0.0.1:$PG_PORT refuses a password-less login as postgres (or allows fewer than 300 connections) and is not the machine's cluster: stop it or set IDEMGATE_TEST_PG_PORT"
  trust_machine_cluster $cluster
  wait_for pg pg_up || die "the machine's PostgreSQL did not come back on 127.0.0.1:$PG_PORT"
fi
pg_up || start_throwaway_pg
pg_trusts || die "PostgreSQL on 127.0.0.1:$PG_PORT answers but refuses a password-less login as postgres"
say "PostgreSQL answers on 127.0.0.1:$PG_PORT (user postgres, trust, max_connections $(pg_max_conn))"
