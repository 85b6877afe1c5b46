#!/usr/bin/env bash
# Brings up Postgres, Redis and RabbitMQ for the service, the tests and the
# load test — only those that are not already answering:
#   1. already running on the configured port  -> use it;
#   2. a Docker engine answers                 -> docker compose up (this repo's docker-compose.yml);
#   3. the servers are installed on this machine -> start them under ./.services/ (project-local).
#
#   scripts/services.sh up     start what is missing, wait until all answer
#   scripts/services.sh down   stop what step 3 started (never touches servers it did not start)
#   scripts/services.sh status show which servers answer
#
# Ports come from DATABASE_URL, REDIS_URL and AMQP_URL (defaults: 5432, 6379, 5672 on 127.0.0.1).
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
  touch "$state/rabbitmq/started"
  wait_for RabbitMQ "$amqp_port" 90
}

up() {
  local missing=()
  answers "$pg_port" || missing+=(postgres)
  answers "$redis_port" || missing+=(redis)
  answers "$amqp_port" || missing+=(rabbitmq)
  [ ${#missing[@]} -eq 0 ] && { echo "services: Postgres, Redis and RabbitMQ answer"; return 0; }
  if docker_ok; then
    echo "services: starting ${missing[*]} with docker compose"
    # The app service (not started here) requires an admin token; the file
    # is interpolated whole, so any placeholder lets the servers start.
    SECKILL_ADMIN_TOKEN="${SECKILL_ADMIN_TOKEN:-unused-by-the-backing-servers-only}" \
      docker compose -f "$root/docker-compose.yml" up -d --wait "${missing[@]}"
    return 0
  fi
  echo "services: starting ${missing[*]} from the installed servers under .services/"
  for service in "${missing[@]}"; do "start_$service"; done
  echo "services: Postgres, Redis and RabbitMQ answer"
}

down() {
  local bin
  if [ -f "$state/postgres/data/postmaster.pid" ]; then
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
    as_postgres "${bin:+$bin/}pg_ctl" -D "$state/postgres/data" stop -m fast >/dev/null || true
  fi
  [ -f "$state/redis/redis.pid" ] && kill "$(cat "$state/redis/redis.pid")" 2>/dev/null || true
  if [ -f "$state/rabbitmq/started" ]; then
    rabbitmqctl -n seckill@localhost stop >/dev/null 2>&1 || true
    rm -f "$state/rabbitmq/started"
  fi
}

status() {
  for pair in "Postgres:$pg_port" "Redis:$redis_port" "RabbitMQ:$amqp_port"; do
    if answers "${pair#*:}"; then echo "${pair%%:*} answers on ${pair#*:}"; else echo "${pair%%:*} does not answer on ${pair#*:}"; fi
  done
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: scripts/services.sh up|down|status" >&2; exit 2 ;;
esac
