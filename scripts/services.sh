#!/usr/bin/env bash
# Brings up Postgres, Redis and RabbitMQ for the service, the tests and the
# load test — only those that are not already answering:
#   1. already running on the configured port  -> use it;
#   2. a Docker engine answers                 -> docker compose up (this repo's docker-compose.yml);
#   3. the servers are installed on this machine -> start them under ./.services/ (project-local).
#
#   scripts/services.sh up       start what is missing, wait until all answer; then (again)
#                                create the service's accounts on the servers step 3 runs
#   scripts/services.sh accounts only that last part
#   scripts/services.sh down     stop what step 3 started (never touches servers it did not start)
#   scripts/services.sh status   show which servers answer
#
# Ports come from DATABASE_URL, REDIS_URL and AMQP_URL (defaults: 5432, 6379, 5672 on 127.0.0.1).
#
# Two sets of accounts, on 127.0.0.1 only (docs/security.md, "The local servers"):
# - the test suite's and the load test's, as they have always been: Postgres's `postgres`
#   without a password (trust), Redis's default user without one, RabbitMQ's `guest` on `/`;
# - the service's own, with passwords, on the servers step 3 starts: a Postgres role
#   `seckill` (scram-sha-256, owner of the database `seckill`), a Redis ACL user `seckill`
#   (keys and channels under the prefix `seckill:` only), a RabbitMQ user `seckill` on the
#   virtual host `seckill` (names under `seckill.` only). The passwords are
#   generated once into .services/secrets.env; .services/service.env holds the URLs
#   with them, which scripts/serve.sh uses. Both files are readable by their owner only.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="$root/.services"

port_of() { # URL DEFAULT -> port
  local rest="${1#*://}"; rest="${rest#*@}"; rest="${rest%%/*}"
  if [[ "$rest" == *:* ]]; then echo "${rest##*:}"; else echo "$2"; fi
}
pg_port=$(port_of "${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/seckill}" 5432)
redis_port=$(port_of "${REDIS_URL:-redis://127.0.0.1:6379}" 6379)
amqp_port=$(port_of "${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}" 5672)

# The service's own accounts are limited to its default prefixes (SECKILL_REDIS_PREFIX,
# SECKILL_AMQP_PREFIX), whatever the environment of this run says.
redis_prefix=seckill
amqp_prefix=seckill
rabbit_node=seckill@localhost

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # NAME PORT SECONDS
  for _ in $(seq "$3"); do answers "$2" && return 0; sleep 1; done
  echo "services: $1 did not answer on port $2 within $3 s (logs under $state)" >&2
  return 1
}

docker_ok() { command -v docker >/dev/null && docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; }

as_postgres() { # run a command as the postgres user when we are root (postgres refuses root)
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start_postgres() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
  if [ -z "$bin" ] && command -v pg_ctl >/dev/null; then bin=$(dirname "$(command -v pg_ctl)"); fi
  [ -n "$bin" ] || { echo "services: Postgres is not running and not installed (install postgresql, or set DATABASE_URL)" >&2; return 1; }
  mkdir -p "$state/postgres"
  [ "$(id -u)" = 0 ] && chown postgres: "$state/postgres"
  if [ ! -f "$state/postgres/data/PG_VERSION" ]; then
    # Trust for the tests' `postgres`; `postgres_account` puts the service's role, which
    # must give its password, in front of it.
    as_postgres "$bin/initdb" -D "$state/postgres/data" -U postgres --auth=trust >"$state/postgres/initdb.log"
  fi
  as_postgres "$bin/pg_ctl" -D "$state/postgres/data" -l "$state/postgres/server.log" \
    -o "-p $pg_port -c listen_addresses=127.0.0.1 -k $state/postgres -c max_connections=200" start >/dev/null
  wait_for Postgres "$pg_port" 30
}

start_redis() {
  command -v redis-server >/dev/null || { echo "services: Redis is not running and not installed (install redis-server, or set REDIS_URL)" >&2; return 1; }
  mkdir -p "$state/redis"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --dir "$state/redis" --logfile "$state/redis/server.log" --pidfile "$state/redis/redis.pid"
  echo "$redis_port" >"$state/redis/port"
  wait_for Redis "$redis_port" 10
}

start_rabbitmq() {
  command -v rabbitmq-server >/dev/null || { echo "services: RabbitMQ is not running and not installed (install rabbitmq-server, or set AMQP_URL)" >&2; return 1; }
  mkdir -p "$state/rabbitmq/mnesia" "$state/rabbitmq/log"
  : >"$state/rabbitmq/enabled_plugins"
  # A configuration of its own: the machine's may pin the listener elsewhere.
  echo "listeners.tcp.local = 127.0.0.1:$amqp_port" >"$state/rabbitmq/rabbitmq.conf"
  # Debian's rabbitmq-server runs the node as the rabbitmq user.
  if [ "$(id -u)" = 0 ] && id rabbitmq >/dev/null 2>&1; then chown -R rabbitmq: "$state/rabbitmq"; fi
  # Every listener on the loopback interface only: AMQP, the Erlang
  # distribution port, and epmd when this start launches it.
  RABBITMQ_NODENAME=seckill@localhost RABBITMQ_NODE_PORT="$amqp_port" RABBITMQ_DIST_PORT=$((amqp_port + 20000)) \
  RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 ERL_EPMD_ADDRESS=127.0.0.1 \
  RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
  RABBITMQ_MNESIA_BASE="$state/rabbitmq/mnesia" RABBITMQ_LOG_BASE="$state/rabbitmq/log" \
  RABBITMQ_ENABLED_PLUGINS_FILE="$state/rabbitmq/enabled_plugins" \
  RABBITMQ_FEATURE_FLAGS_FILE="$state/rabbitmq/feature_flags" \
  RABBITMQ_CONFIG_FILE="$state/rabbitmq/rabbitmq.conf" \
    rabbitmq-server -detached
  echo "$amqp_port" >"$state/rabbitmq/started"
  wait_for RabbitMQ "$amqp_port" 90
}

# A secret of .services/secrets.env by name, generated (48 hex digits) on first use.
secret() { # NAME
  local file="$state/secrets.env" value
  mkdir -p "$state"
  (umask 077; touch "$file")
  value=$(sed -n "s/^$1=//p" "$file")
  if [ -z "$value" ]; then
    value=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
    echo "$1=$value" >>"$file"
  fi
  echo "$value"
}

# Adds the service's URL of a server to the next .services/service.env (`accounts`).
service_url() { # NAME URL
  (umask 077; echo "$1=$2" >>"$state/service.env.$$")
}

# The role `seckill` with its password (scram-sha-256), owner of the database `seckill`
# and of everything in it (a database an earlier `postgres` made is handed over);
# pg_hba.conf asks that role for its password, everyone else keeps trust. Idempotent.
postgres_account() {
  local data="$state/postgres/data" line="host all seckill 127.0.0.1/32 scram-sha-256" bin
  local password; password=$(secret POSTGRES_PASSWORD)
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
  if ! grep -qxF "$line" "$data/pg_hba.conf"; then
    { echo "# The service's role gives its password (scripts/services.sh)."; echo "$line"; cat "$data/pg_hba.conf"; } >"$data/pg_hba.conf.new"
    mv "$data/pg_hba.conf.new" "$data/pg_hba.conf" || return 1
    [ "$(id -u)" = 0 ] && chown postgres: "$data/pg_hba.conf"
    as_postgres "${bin:+$bin/}pg_ctl" -D "$data" reload >/dev/null || return 1
  fi
  local psql=(psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U postgres)
  # The password goes on standard input, never on a command line.
  "${psql[@]}" -d postgres >/dev/null <<SQL || return 1
SET password_encryption = 'scram-sha-256';
SELECT 'CREATE ROLE seckill LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'seckill') \gexec
ALTER ROLE seckill LOGIN PASSWORD '$password';
SELECT 'CREATE DATABASE seckill OWNER seckill' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'seckill') \gexec
ALTER DATABASE seckill OWNER TO seckill;
SQL
  "${psql[@]}" -d seckill >/dev/null <<'SQL' || return 1
DO $$
DECLARE o record;
BEGIN
  -- Tables and views (with the sequences of their columns), then the other sequences
  -- and the functions of a database that `postgres` migrated.
  FOR o IN SELECT c.oid::regclass AS name, c.relkind FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'S')
        AND pg_get_userbyid(c.relowner) <> 'seckill'
        AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                        AND d.objid = c.oid AND d.deptype IN ('a', 'i'))
      ORDER BY c.relkind = 'S'
  LOOP
    EXECUTE format('ALTER %s %s OWNER TO seckill',
      CASE o.relkind WHEN 'v' THEN 'VIEW' WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, o.name);
  END LOOP;
  FOR o IN SELECT p.oid::regprocedure AS name FROM pg_proc p
      JOIN pg_namespace n ON n.oid = p.pronamespace
      WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> 'seckill'
  LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO seckill', o.name);
  END LOOP;
END $$;
SQL
  service_url DATABASE_URL "postgres://seckill:$password@127.0.0.1:$pg_port/seckill"
}

# The ACL user `seckill`: its password, the keys and channels under the Redis prefix,
# every command but those Redis files as dangerous. The default user stays open (the
# tests). The server keeps nothing on disk: set again on every `up`.
redis_account() {
  local password; password=$(secret REDIS_PASSWORD)
  # On standard input: the password shows in no command line.
  printf 'ACL SETUSER seckill reset on >%s ~%s:* &%s:* +@all -@dangerous\n' \
    "$password" "$redis_prefix" "$redis_prefix" | redis-cli -p "$redis_port" | grep -qx OK || return 1
  service_url REDIS_URL "redis://seckill:$password@127.0.0.1:$redis_port"
}

# The user `seckill` on the virtual host `seckill`, allowed only the names under the AMQP
# prefix (docs/queue.md, "The broker user and its permissions"). Idempotent.
rabbitmq_account() {
  local password ctl=(rabbitmqctl -q -n "$rabbit_node") names
  password=$(secret RABBITMQ_PASSWORD)
  names="^${amqp_prefix//./\\.}\\."
  "${ctl[@]}" add_vhost seckill >/dev/null || return 1
  # The password on standard input, never on a command line.
  if "${ctl[@]}" list_users | cut -f1 | grep -qxF seckill; then
    echo "$password" | "${ctl[@]}" change_password seckill >/dev/null || return 1
  else
    echo "$password" | "${ctl[@]}" add_user seckill >/dev/null || return 1
  fi
  "${ctl[@]}" set_permissions -p seckill seckill \
    "$names" "^(${names#^}.*|amq\\.default)\$" "$names" >/dev/null || return 1
  service_url AMQP_URL "amqp://seckill:$password@127.0.0.1:$amqp_port/seckill"
}

# The tests need none of the service's accounts: a failure to create one is said, not fatal.
not_created() { # SERVER TOOL
  echo "services: the service's account on $1 was not created (is $2 installed?); scripts/serve.sh uses the tests' account there" >&2
}

# The service's accounts on the servers step 3 runs on the configured ports (not on
# others: they are not this script's to change); .services/service.env names those only.
accounts() {
  rm -f "$state/service.env.$$"
  local pg_pid="$state/postgres/data/postmaster.pid"
  # postmaster.pid's fourth line is the server's port.
  if [ -f "$pg_pid" ] && [ "$(sed -n 4p "$pg_pid")" = "$pg_port" ] && answers "$pg_port"; then
    postgres_account || not_created Postgres psql
  fi
  if [ "$(cat "$state/redis/port" 2>/dev/null)" = "$redis_port" ] && answers "$redis_port"; then
    redis_account || not_created Redis redis-cli
  fi
  if [ "$(cat "$state/rabbitmq/started" 2>/dev/null)" = "$amqp_port" ] && answers "$amqp_port"; then
    rabbitmq_account || not_created RabbitMQ rabbitmqctl
  fi
  # Replaced whole, at once: a concurrent reader sees the old file or the new one.
  if [ -s "$state/service.env.$$" ]; then
    mv "$state/service.env.$$" "$state/service.env"
    echo "services: the service's own accounts: .services/service.env (URLs with their passwords)"
  else
    rm -f "$state/service.env" "$state/service.env.$$"
  fi
}

up() {
  local missing=()
  answers "$pg_port" || missing+=(postgres)
  answers "$redis_port" || missing+=(redis)
  answers "$amqp_port" || missing+=(rabbitmq)
  [ ${#missing[@]} -eq 0 ] && { echo "services: Postgres, Redis and RabbitMQ answer"; accounts; return 0; }
  if docker_ok; then
    echo "services: starting ${missing[*]} with docker compose"
    # The tests' accounts (deploy/compose.local.yml over docker-compose.yml). The
    # file is interpolated whole, so its required credentials need a value: a
    # placeholder, which these servers do not use.
    SECKILL_ADMIN_TOKEN="${SECKILL_ADMIN_TOKEN:-unused-by-the-backing-servers-only}" \
    POSTGRES_PASSWORD=unused REDIS_PASSWORD=unused RABBITMQ_PASSWORD=unused \
      docker compose -f "$root/docker-compose.yml" -f "$root/deploy/compose.local.yml" \
      up -d --wait "${missing[@]}"
    return 0
  fi
  echo "services: starting ${missing[*]} from the installed servers under .services/"
  for service in "${missing[@]}"; do "start_$service"; done
  echo "services: Postgres, Redis and RabbitMQ answer"
  accounts
}

down() {
  local bin
  if [ -f "$state/postgres/data/postmaster.pid" ]; then
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
    as_postgres "${bin:+$bin/}pg_ctl" -D "$state/postgres/data" stop -m fast >/dev/null || true
  fi
  [ -f "$state/redis/redis.pid" ] && kill "$(cat "$state/redis/redis.pid")" 2>/dev/null || true
  rm -f "$state/redis/port"
  if [ -f "$state/rabbitmq/started" ]; then
    rabbitmqctl -n "$rabbit_node" stop >/dev/null 2>&1 || true
    rm -f "$state/rabbitmq/started"
  fi
  # The URLs name these servers' accounts; the passwords stay for the next `up`.
  rm -f "$state/service.env"
}

status() {
  for pair in "Postgres:$pg_port" "Redis:$redis_port" "RabbitMQ:$amqp_port"; do
    if answers "${pair#*:}"; then echo "${pair%%:*} answers on ${pair#*:}"; else echo "${pair%%:*} does not answer on ${pair#*:}"; fi
  done
}

case "${1:-up}" in
  up) up ;;
  accounts) accounts ;;
  down) down ;;
  status) status ;;
  *) echo "usage: scripts/services.sh up|accounts|down|status" >&2; exit 2 ;;
esac
